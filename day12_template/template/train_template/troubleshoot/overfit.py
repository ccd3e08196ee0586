"""Overfit one batch: the first test when the loss does not go down.

Train on the same handful of samples again and again, dropout off (the doctor builds the model with dropout 0:
dropout fights memorising by design). A model that works memorises them: the loss falls to about 0 within a few
hundred steps. If it cannot, the bug is in the code (no gradient reaches the weights, the optimizer
does not move them, the loss is wrong, labels do not match inputs), not in the hyperparameters. Shuffled labels are
no test of this: a few samples with wrong labels are memorised just as well. What truly cannot learn is a graph
cut from the weights (all frozen, a `.detach()` or `no_grad` in forward) or an optimizer that never moves them
(learning rate 0, parameters not handed to it); those are what this check flags, with the layers concerned.
"""
import contextlib
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .gradients import layers

TARGET = 0.05  # "about 0": the curriculum's pass mark for memorising one batch


@dataclass
class OverfitResult:
    memorised: bool  # the loss fell below the target
    steps: int  # steps run (the run stops as soon as the loss is below the target)
    first_loss: float
    last_loss: float
    unchanged: list[str] = field(default_factory=list)  # trainable layers whose weights never moved
    error: str | None = None  # why training could not even start

    @property
    def flagged(self) -> bool:
        return not self.memorised or bool(self.unchanged) or self.error is not None


def overfit_one_batch(model: nn.Module, optimizer: torch.optim.Optimizer, batch, steps: int = 300,
                      target: float = TARGET, loss_fn=F.cross_entropy, autocast=contextlib.nullcontext
                      ) -> OverfitResult:
    """Train `model` on `batch` ((x, y), e.g. 8 samples) for up to `steps` steps in train mode; stop once the loss
    is below `target`. Modifies the model's weights: give it a fresh copy."""
    x, y = batch
    before = {name: [p.detach().clone() for p in params] for name, params in layers(model).items()}
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(x).float(), y)
        losses.append(loss.item())
        if not loss.requires_grad:
            return OverfitResult(False, 0, losses[0], losses[0], list(before), error=(
                "the loss does not depend on any trainable parameter: every weight is frozen (requires_grad=False) "
                "or the graph is cut (.detach(), torch.no_grad(), a NumPy/.item() round trip in forward)"))
        if losses[-1] < target or not math.isfinite(losses[-1]):
            break
        loss.backward()
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    moved = len(losses) > 1  # at least one optimizer step ran (a batch already below the target needs none)
    unchanged = [name for name, params in layers(model).items()
                 if moved and all(torch.equal(p, old) for p, old in zip(params, before[name]))]
    return OverfitResult(losses[-1] < target, len(losses), losses[0], losses[-1], unchanged)
