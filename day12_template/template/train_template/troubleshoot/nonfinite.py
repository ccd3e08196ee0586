"""Where a NaN or inf comes from: in the forward pass (hooks on every module) or in the backward pass (anomaly mode).

When a step's loss (or gradient norm) is NaN/inf, the trainer stops *before* the optimizer applies that step and
calls `first_nonfinite_module` on the step's micro-batches, with the weights still as they were: forward hooks on
every module record the first one, in execution order, whose output holds a NaN or inf. When every forward output
is finite, the NaN was born in backward: `backward_nan_op` replays the step under anomaly mode, which names the
backward function that first returned a NaN and the forward line that created it.
"""
import contextlib
import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH_DIR = str(Path(torch.__file__).resolve().parent)


class NonFinite(RuntimeError):
    """The loss or the gradient norm became NaN/inf; nothing of that step was applied or saved."""


def _tensors(out):
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for o in out:
            yield from _tensors(o)
    elif isinstance(out, dict):
        for o in out.values():
            yield from _tensors(o)


def first_nonfinite_module(model: nn.Module, batches, autocast=contextlib.nullcontext) -> str | None:
    """`name (Type)` of the first module whose forward output is not finite, over `batches` ((x, y) pairs), or
    None if every output is finite (then the non-finite value arose in the loss or in backward)."""
    found = []

    def hook(name):
        def check(module, args, out):
            if not found and any(not torch.isfinite(t).all() for t in _tensors(out) if t.is_floating_point()):
                found.append(f"{name} ({type(module).__name__})")
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules() if n]
    try:
        with torch.no_grad(), autocast():
            for x, _ in batches:
                model(x)
                if found:
                    break
    finally:
        for h in handles:
            h.remove()
    return found[0] if found else None


@dataclass
class BackwardNaN:
    """What anomaly mode reported: the backward function (`SqrtBackward0`), the forward op it undoes (`sqrt`) and
    the last line outside torch of the forward call that created it (`models.py:42  return x.sqrt()`)."""
    function: str
    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.function} (the backward of `{self.op}`), created at {self.where}"


def _op_name(function: str) -> str:
    """SqrtBackward0 -> sqrt, LogSoftmaxBackward0 -> log_softmax, MmBackward0 -> mm."""
    stem = re.sub(r"Backward\d*$", "", function)
    return re.sub(r"(?<!^)(?=[A-Z])", "_", stem).lower()


def _forward_site(messages: list[str]) -> str:
    """The last frame outside torch's own files in anomaly mode's "Traceback of forward call" warning."""
    frames = []
    for text in messages:
        if "Traceback of forward call" in text:
            frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s+(.*)', text)
    user = [f for f in frames if not f[0].startswith(TORCH_DIR)] or frames
    if not user:
        return "an unknown line (no forward traceback was recorded)"
    path, line, func, code = user[-1]
    return f"{Path(path).name}:{line} in {func}: `{code.strip()}`"


def backward_nan_op(model: nn.Module, batches, loss_fn=F.cross_entropy, autocast=contextlib.nullcontext
                    ) -> BackwardNaN | None:
    """Forward and backward over `batches` under `torch.autograd.set_detect_anomaly(True)` (2-5x slower: only for
    finding the op). Returns the first backward function that produced a NaN, or None. Gradients are left cleared.
    Anomaly mode checks for NaN, not inf, and names the first NaN *in backward order*: a NaN made in forward is
    reported at the op that consumed it last (the loss), which is why the forward hooks run first."""
    try:
        for x, y in batches:
            model.zero_grad(set_to_none=True)
            with warnings.catch_warnings(record=True) as records:
                warnings.simplefilter("always")
                try:
                    with torch.autograd.set_detect_anomaly(True):  # forward: record tracebacks; backward: check
                        with autocast():
                            loss = loss_fn(model(x).float(), y)
                        loss.backward()
                except RuntimeError as exc:
                    found = re.search(r"Function '(\w+)' returned nan values", str(exc))
                    if not found:
                        raise
                    site = _forward_site([str(r.message) for r in records])
                    return BackwardNaN(found.group(1), _op_name(found.group(1)), site)
        return None
    finally:
        model.zero_grad(set_to_none=True)


def nonfinite_error(step: int, epoch: int, loss: float, norm: float, model, batches, autocast, d,
                    last) -> NonFinite:
    """The error for a non-finite step, naming it and (on every rank, gathered) the first module at fault, the
    checkpoint `last` (the run's last.pt) if one was written, and advice that works: a resume keeps optim.lr (a
    changed one is refused), so a lower rate means a new run, from scratch or from last.pt's weights (init_from)."""
    what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
    where = d.gather(first_nonfinite_module(model, batches, autocast))
    found = next((f"rank {r}: {w}" if d.enabled else w for r, w in enumerate(where) if w), None)
    found = found or "none (it arose in the loss or in backward)"
    if Path(last).exists():  # a file, or a sharded checkpoint's folder
        kept = (f"the last good checkpoint is {last}. A resume keeps optim.lr (a changed one is refused): start a new "
                f"run (another run.out_dir) with a lower optim.lr, from scratch or from these weights with "
                f"`--set checkpoint.init_from={last} optim.lr=...` (weights only: a new optimizer and schedule)")
    else:
        kept = "no checkpoint was written yet. Run again with a lower optim.lr (the same run.out_dir is fine)"
    return NonFinite(f"non-finite {what} at step {step} (epoch {epoch + 1}); first module with a non-finite "
                     f"output: {found}. That step was not applied and nothing was saved; {kept}. Under fp16 "
                     f"autocast, train.amp_dtype=bfloat16 (a new run too) avoids fp16 overflow. `python doctor.py "
                     f"--config ... --symptom nan` checks the data, the modules and (anomaly mode) the backward ops")
