"""Gradient norms per layer and over the whole model: which layer explodes, which gets nothing.

A layer is a module that owns parameters directly (`blocks.0.0` = a Linear, `blocks.0.1` = its LayerNorm). Its
norm is the L2 norm of all its parameters' gradients; the global norm is the L2 norm over every layer, the figure
`clip_grad_norm_` returns (and train.py logs as `grad_norm`). Healthy layers sit within a factor of ~10-50 of each
other at initialisation (the MLP's LayerNorm gain and its Linear: ~50; the ResNet's 19 layers: within ~10 of
their median), so a layer 100x above the median is named as exploding and one 1000x below it as vanishing, whatever
the scale of the loss.
"""
import contextlib
import math
import statistics
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

EXPLODE_RATIO = 100.0  # a layer this many times the median layer norm is exploding
EXPLODE_TOTAL = 1e3  # a global norm above this is exploding (the curriculum's red light), even if no layer stands out
VANISH_RATIO = 1e-3  # a layer below this fraction of the median layer norm is vanishing


def layers(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Module name -> its own trainable parameters, for every module that has some (`""` is the root)."""
    out = {}
    for name, module in model.named_modules():
        params = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if params:
            out[name or "(root)"] = params
    return out


@dataclass
class GradientReport:
    norms: dict[str, float]  # layer -> gradient norm (0.0 when no gradient reached it)
    total: float  # the global norm
    median: float  # the median of the finite, non-zero layer norms: the yardstick for exploding and vanishing
    exploding: list[str] = field(default_factory=list)  # layers > EXPLODE_RATIO x the median layer
    no_gradient: list[str] = field(default_factory=list)  # trainable layers whose gradient is missing or exactly 0
    vanishing: list[str] = field(default_factory=list)  # layers < VANISH_RATIO x the median layer (but not 0)
    nonfinite: list[str] = field(default_factory=list)  # layers with a NaN/inf gradient

    @property
    def healthy(self) -> bool:
        return (not (self.exploding or self.no_gradient or self.vanishing or self.nonfinite)
                and math.isfinite(self.total) and self.total <= EXPLODE_TOTAL)


def read_gradients(model: nn.Module) -> GradientReport:
    """The report for the gradients `model` holds now (after a backward)."""
    norms, missing = {}, []
    for name, params in layers(model).items():
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])).item() \
            if grads else 0.0
        norms[name] = norm
        if norm == 0.0:
            missing.append(name)
    if not norms:  # every parameter frozen: nothing can learn
        missing = ["(every parameter: none requires grad)"]
    nonfinite = [n for n, v in norms.items() if not math.isfinite(v)]
    total = math.sqrt(sum(v * v for v in norms.values()))
    finite = [v for v in norms.values() if math.isfinite(v) and v > 0]
    median = statistics.median(finite) if finite else 0.0
    exploding = [n for n, v in norms.items() if math.isfinite(v) and median and v > EXPLODE_RATIO * median]
    vanishing = [n for n, v in norms.items() if 0 < v < VANISH_RATIO * median]
    return GradientReport(norms, total, median, exploding, missing, vanishing, nonfinite)


def gradient_norms(model: nn.Module, batch, loss_fn=F.cross_entropy, autocast=contextlib.nullcontext
                   ) -> GradientReport:
    """One forward and backward on `batch` ((x, y)); the per-layer report. Gradients are cleared before and after.
    A loss that does not depend on any trainable parameter (all frozen, or a detached graph) reports every layer
    under `no_gradient`."""
    model.zero_grad(set_to_none=True)
    x, y = batch
    with autocast():
        loss = loss_fn(model(x).float(), y)
    if loss.requires_grad:
        loss.backward()
    report = read_gradients(model)
    model.zero_grad(set_to_none=True)
    return report
