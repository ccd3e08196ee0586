"""Fault drills: break a run on purpose to see that it fails safely (the gates use these; so can you). They attach
to train.py from outside its loop, as a `train.Hook`; run them through this module, which is train.py plus drills:

    TEMPLATE_FAULTS="nan_step=7,nan_module=blocks.0" python -m train_template.troubleshoot.faults --config ... --set ...

    nan_step=N, nan_module=NAME   the output of module NAME (default: the first one) turns NaN at optimizer step N
    inf_grad_step=N               one gradient turns inf at optimizer step N (an fp16 overflow: the scaler skips)
    eval_fail_at=N                the evaluation after optimizer step N raises torch.OutOfMemoryError (what a too
                                  large evaluation batch does on a GPU)
    eval_stop_at=N                SIGTERM to this process in the first forward of the evaluation after step N (a
                                  scheduler's stop during a long evaluation)
    kill_between_links=N          SIGKILL this process between linking last.pt and best.pt, at the Nth best
    step_sleep=S                  sleep S seconds after each optimizer step (gives a signal time to land mid-run)
    stop_at=N                     SIGTERM to this process during step N, so the run stops after it (a
                                  scheduler's stop at a chosen step: a period's last one, the run's last one)
    audit_writes=DIR              at the end, write DIR/audit-rank<R>.json: every file this process created, renamed,
                                  linked or deleted (proves that only rank 0 writes)
    grad_syncs=DIR                at the end, write DIR/grad-syncs-rank<R>.json: DDP's gradient all-reduces and the
                                  optimizer steps they served (proves no_sync skips all but the last micro-batch)
    breaks=A+B                    break the model or the data for good (below), e.g. breaks=explode@head+leak=100

Breaks: the bugs the troubleshooting toolkit finds (its gates and `doctor.py --fault` use them):

    nan@MODULE       MODULE's output times NaN (a forward NaN: the forward hooks name MODULE)
    sqrt_neg@MODULE  where(out > 0, sqrt(out), 0): finite forward, NaN in sqrt's backward (anomaly mode names it)
    log0@MODULE      where(out > 0, log(clamp(out, 0)), 0): log(0) hidden in forward, NaN in log's backward
    explode@MODULE   MODULE's parameter gradients times 1e4 (the gradient norms name MODULE)
    vanish@MODULE    MODULE's parameter gradients times 1e-6 (named as vanishing)
    detach@MODULE    MODULE's output detached: no gradient reaches MODULE or anything before it
    freeze[@MODULE]  requires_grad=False on MODULE (default: the whole model)
    nan_input[=K]    every K-th training sample (default 1000) holds NaN inputs
    leak[=N]         the first N test samples (default 100) replace training samples: exact train/test duplicates
    drop_class[=C]   class C (default 0) removed from the training split
    slow_data[=S]    every training batch takes S more seconds to load (default 0.05): a data-bound loop
"""
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import checkpoint, train
from ..data import BatchData, Splits

MODEL_BREAKS = ("nan", "sqrt_neg", "log0", "explode", "vanish", "detach", "freeze")
DATA_BREAKS = {"nan_input": 1000, "leak": 100, "drop_class": 0, "slow_data": 0.05}  # kind -> default value


@dataclass
class Faults(train.Hook):
    nan_step: int = 0
    nan_module: str = ""
    inf_grad_step: int = 0
    eval_fail_at: int = 0
    eval_stop_at: int = 0
    kill_between_links: int = 0
    step_sleep: float = 0.0
    stop_at: int = 0
    audit_writes: str = ""
    grad_syncs: str = ""
    breaks: str = ""

    @classmethod
    def from_env(cls, text: str | None = None) -> "Faults":
        text = os.environ.get("TEMPLATE_FAULTS", "") if text is None else text
        values = dict(item.split("=", 1) for item in text.split(",") if item.strip())
        return cls(**{k: type(getattr(cls, k))(v) for k, v in values.items()})

    def data(self, splits: Splits) -> Splits:
        for spec in parse_breaks(self.breaks):
            if spec[0] in DATA_BREAKS:
                splits = break_data(splits, *spec)
        return splits

    def attach(self, model: torch.nn.Module, module: torch.nn.Module, progress) -> None:
        """Hooks on the model (NaN output, inf gradient, breaks) and on DDP's gradient all-reduce."""
        if self.nan_step:
            name = self.nan_module or next(n for n, _ in model.named_modules() if n)
            dict(model.named_modules())[name].register_forward_hook(self.nan_output(progress))
        if self.inf_grad_step:
            next(model.parameters()).register_hook(self.inf_gradient(progress))
        if self.eval_fail_at:
            model.register_forward_pre_hook(self.failing_evaluation(progress))
        if self.eval_stop_at:
            model.register_forward_pre_hook(self.stop_in_evaluation(progress))
        if self.grad_syncs:
            count_grad_syncs(module, progress, self.grad_syncs)
        self.stop_if_next(progress)  # stop_at=1, or a resume that starts one step before it
        for spec in parse_breaks(self.breaks):
            if spec[0] in MODEL_BREAKS:
                break_model(model, *spec)

    def nan_output(self, progress):
        """A forward hook: the module's output times NaN in training step `nan_step`."""
        def hook(module, args, out):
            if module.training and progress.step + 1 == self.nan_step:
                return out * float("nan")
            return None
        return hook

    def inf_gradient(self, progress):
        """A gradient hook: the gradient times inf in step `inf_grad_step` (what an fp16 overflow looks like)."""
        def hook(grad):
            if progress.step + 1 == self.inf_grad_step:
                return grad * float("inf")
            return grad
        return hook

    def failing_evaluation(self, progress):
        """A forward pre-hook: the model in eval mode after step `eval_fail_at` runs out of memory."""
        def hook(module, args):
            if not module.training and progress.step == self.eval_fail_at:
                raise torch.OutOfMemoryError(f"fault drill: out of memory in the evaluation after step "
                                             f"{self.eval_fail_at}")
        return hook

    def stop_in_evaluation(self, progress):
        """A forward pre-hook: SIGTERM in the first eval-mode forward after step `eval_stop_at`, once."""
        sent = []

        def hook(module, args):
            if not module.training and progress.step == self.eval_stop_at and not sent:
                sent.append(True)
                signal.raise_signal(signal.SIGTERM)
        return hook

    def step(self, progress) -> None:
        if self.step_sleep:
            time.sleep(self.step_sleep)
        self.stop_if_next(progress)

    def stop_if_next(self, progress) -> None:
        """stop_at: the signal lands before step N's host sync, which sums the stop flag over the ranks."""
        if self.stop_at and progress.step == self.stop_at - 1:
            signal.raise_signal(signal.SIGTERM)

    def install_process_drills(self) -> None:
        """The drills that act on the process rather than the run: the write audit, the kill between two links."""
        if self.audit_writes:
            audit_writes(self.audit_writes)
        if self.kill_between_links:
            kill_between_links(self.kill_between_links)


def kill_between_links(n: int) -> None:
    """SIGKILL this process between the two links of a better period's checkpoint: last.pt linked before the
    evaluation, best.pt not yet after it, at the Nth time best.pt is about to be linked."""
    link, count = checkpoint.files.link, [0]

    def maybe_die_then_link(src: Path, dst: Path) -> None:
        if dst.name == "best.pt":
            count[0] += 1
            if count[0] == n:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        link(src, dst)

    checkpoint.files.link = maybe_die_then_link


AT_END: list = []  # what write_at_end() writes (a rank ends without running atexit handlers)


def write_at_end() -> None:
    """Write what the drills recorded (audit_writes, grad_syncs): main() calls it when train.py's main returns."""
    for dump in AT_END:
        dump()


def count_grad_syncs(module: torch.nn.Module, progress, folder: str) -> None:
    """DDP's default all-reduce, counted per bucket; the counts are written at the end (write_at_end)."""
    if not hasattr(module, "register_comm_hook"):
        return
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    counts = {"syncs": 0, "steps": 0}

    def counted_allreduce(state, bucket):
        counts["syncs"] += 1
        counts["steps"] = progress.step + 1  # this all-reduce serves the step being computed
        return allreduce_hook(None, bucket)

    def dump():
        rank = int(os.environ.get("RANK", "0"))
        Path(folder, f"grad-syncs-rank{rank}.json").write_text(json.dumps(counts))

    module.register_comm_hook(None, counted_allreduce)
    AT_END.append(dump)


WRITES: list[str] = []


def audit_writes(folder: str) -> None:
    """Record file creations, renames, links and deletions (Python audit events); dump them at the end."""
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
    AT_END.append(dump)


# -- breaks: bugs put in on purpose ------------------------------------------------------------------------------
def parse_breaks(text: str) -> list[tuple[str, str]]:
    """"explode@head+leak=5" -> [("explode", "head"), ("leak", "5")]; ValueError naming an unknown kind."""
    specs = []
    for item in filter(None, text.split("+")):
        kind, _, arg = item.replace("=", "@").partition("@")
        if kind not in MODEL_BREAKS and kind not in DATA_BREAKS:
            raise ValueError(f"unknown fault {item!r}; known: {', '.join([*MODEL_BREAKS, *DATA_BREAKS])}")
        if kind in MODEL_BREAKS and kind != "freeze" and not arg:
            raise ValueError(f"fault {kind} needs a module: {kind}@NAME (e.g. {kind}@head)")
        specs.append((kind, arg))
    return specs


def break_model(model: torch.nn.Module, kind: str, name: str = "") -> None:
    """Put bug `kind` into module `name` of `model` (hooks and flags; the weights are untouched)."""
    modules = dict(model.named_modules())
    if name not in modules:
        raise ValueError(f"fault {kind}@{name}: no module {name!r}; modules: {', '.join(n for n in modules if n)}")
    module = modules[name]
    if isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict)) and kind in ("nan", "sqrt_neg", "log0", "detach"):
        raise ValueError(f"fault {kind}@{name}: {name} is a {type(module).__name__}, never called itself; name one of "
                         f"its items ({name}.0)")
    if kind in ("explode", "vanish"):
        factor = 1e4 if kind == "explode" else 1e-6
        for p in list(module.parameters(recurse=False)) or list(module.parameters()):
            p.register_hook(lambda g: g * factor)
    elif kind == "freeze":
        module.requires_grad_(False)
    else:
        change = {"nan": lambda out: out * float("nan"),
                  "sqrt_neg": lambda out: torch.where(out > 0, out.sqrt(), 0.0),
                  "log0": lambda out: torch.where(out > 0, out.clamp(min=0).log(), 0.0),
                  "detach": lambda out: out.detach()}[kind]
        module.register_forward_hook(lambda m, args, out: change(out))


class BrokenData(BatchData):
    """A training split with a data fault (see DATA_BREAKS); picklable, so it also runs in DataLoader workers."""

    def __init__(self, inner: BatchData, kind: str, value, test: BatchData | None = None):
        self.inner, self.kind, self.value, self.test = inner, kind, value, test
        self.keep = (inner.y != value).nonzero().flatten() if kind == "drop_class" else None

    def __len__(self) -> int:
        return len(self.keep) if self.keep is not None else len(self.inner)

    def batch(self, epoch, indices):
        if self.kind == "drop_class":
            return self.inner.batch(epoch, self.keep[indices])
        x, y = self.inner.batch(epoch, indices)
        if self.kind == "slow_data":
            time.sleep(self.value)
        elif self.kind == "nan_input":
            x[indices % self.value == 0] = float("nan")
        elif self.kind == "leak" and (hit := indices < self.value).any():
            x[hit], y[hit] = self.test.batch(-1, indices[hit])
        return x, y


def break_data(splits: Splits, kind: str, arg: str = "") -> Splits:
    """`splits` with its training split broken by `kind` (the value in `arg`, or the kind's default)."""
    value = type(DATA_BREAKS[kind])(arg) if arg else DATA_BREAKS[kind]
    if kind == "leak" and splits.test is None:
        raise ValueError("fault leak needs a test split")
    broken = BrokenData(splits.train, kind, value, splits.test)
    return Splits(broken, splits.val, splits.test, splits.info)


def main(argv=None) -> int:
    """train.py's command line with the drills of TEMPLATE_FAULTS attached."""
    faults = Faults.from_env()
    faults.install_process_drills()
    try:
        return train.main(argv, [faults])
    finally:
        write_at_end()


if __name__ == "__main__":
    train.exit_with(main)
