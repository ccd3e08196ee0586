"""Fault drills: break a run on purpose to see that it fails safely (the gates use these; so can you).

Set in the environment, e.g. `TEMPLATE_FAULTS="nan_step=7,nan_module=blocks.0" python train.py ...`:

    nan_step=N, nan_module=NAME   the output of module NAME (default: the first one) turns NaN at optimizer step N
    inf_grad_step=N               one gradient turns inf at optimizer step N (an fp16 overflow: the scaler skips)
    kill_between_links=N          SIGKILL this process between linking best.pt and last.pt, at the Nth save
    step_sleep=S                  sleep S seconds after each optimizer step (gives a signal time to land mid-run)
    audit_writes=DIR              at exit, write DIR/audit-rank<R>.json: every file this process created, renamed,
                                  linked or deleted (proves that only rank 0 writes)
"""
import atexit
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

import torch


@dataclass
class Faults:
    nan_step: int = 0
    nan_module: str = ""
    inf_grad_step: int = 0
    kill_between_links: int = 0
    step_sleep: float = 0.0
    audit_writes: str = ""

    @classmethod
    def from_env(cls, text: str | None = None) -> "Faults":
        text = os.environ.get("TEMPLATE_FAULTS", "") if text is None else text
        values = dict(item.split("=", 1) for item in text.split(",") if item.strip())
        return cls(**{k: type(getattr(cls, k))(v) for k, v in values.items()})

    def install(self, model: torch.nn.Module, step_now) -> None:
        """Hooks on the model (NaN output, inf gradient) and the process (write audit); `step_now()`: the step done."""
        if self.nan_step:
            name = self.nan_module or next(n for n, _ in model.named_modules() if n)
            module = dict(model.named_modules())[name]
            module.register_forward_hook(
                lambda m, a, out: out * float("nan") if m.training and step_now() + 1 == self.nan_step else None)
        if self.inf_grad_step:
            first = next(model.parameters())
            first.register_hook(lambda g: g * float("inf") if step_now() + 1 == self.inf_grad_step else g)
        if self.audit_writes:
            audit_writes(self.audit_writes)

    def after_step(self) -> None:
        if self.step_sleep:
            time.sleep(self.step_sleep)

    def between_links(self):
        """Called by checkpoint.save between linking best.pt and last.pt; the Nth call SIGKILLs this process."""
        if not self.kill_between_links:
            return None
        count = [0]

        def maybe_kill():
            count[0] += 1
            if count[0] == self.kill_between_links:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        return maybe_kill


WRITES: list[str] = []


def audit_writes(folder: str) -> None:
    """Record file creations, renames, links and deletions (Python audit events); dump them at exit."""
    def hook(event, args):
        if event == "open" and (isinstance(args[1], str) and any(c in args[1] for c in "wax+")
                                or args[1] is None and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)):
            WRITES.append(os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else str(args[0]))
        elif event in ("os.rename", "os.remove", "os.mkdir"):
            WRITES.append(os.fsdecode(args[0]))
        elif event == "os.link":
            WRITES.append(os.fsdecode(args[1]))

    def dump():
        rank = int(os.environ.get("RANK", "0"))
        with open(os.path.join(folder, f"audit-rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "writes": WRITES}, f)

    sys.addaudithook(hook)
    atexit.register(dump)
