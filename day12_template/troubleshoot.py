"""Finding what went wrong in a run. Today: which module first produced a non-finite value.

When a step's loss (or gradient norm) is NaN/inf, the trainer stops *before* the optimizer applies that step and
calls `first_nonfinite_module` on the step's micro-batches, with the weights still as they were: forward hooks on
every module record the first one, in execution order, whose output holds a NaN or inf.
"""
import math

import torch
import torch.nn as nn


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


def first_nonfinite_module(model: nn.Module, batches, autocast) -> str | None:
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


def nonfinite_error(step: int, epoch: int, loss: float, norm: float, model, batches, autocast, d,
                    last: str) -> NonFinite:
    """The error for a non-finite step, naming it and (on every rank, gathered) the first module at fault."""
    what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}"
    where = d.gather(first_nonfinite_module(model, batches, autocast))
    found = next((f"rank {r}: {w}" if d.enabled else w for r, w in enumerate(where) if w), None)
    return NonFinite(f"non-finite {what} at step {step} (epoch {epoch + 1}); first module with a non-finite "
                     f"output: {found or 'none (it arose in the loss or in backward)'}. That step was not applied and "
                     f"nothing was saved; the last good checkpoint is {last}. Try a lower optim.lr, "
                     f"train.amp_dtype=bfloat16, or look at the data")
