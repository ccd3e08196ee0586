"""The learning-rate range test (Leslie Smith): one short run whose learning rate grows exponentially, step by step.

Plotted against the learning rate on a log axis, the loss is flat where the rate is too small to move the weights,
then falls, then turns up and diverges. Exponential steps give every decade the same number of steps. The suggested
rate is one decade left of the valley bottom (the lowest smoothed loss / 10): still fast, clearly short of where
the loss turns up. Use it as the peak rate (`optim.lr`) of the warmup + cosine schedule.
"""
import contextlib
import csv
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LRRange:
    lrs: list[float]
    losses: list[float]  # the loss of each step
    smoothed: list[float]  # exponential moving average, bias-corrected
    best_lr: float  # where the smoothed loss is lowest (the valley bottom)
    steepest_lr: float  # where the smoothed loss falls fastest per decade
    suggestion: float  # best_lr / 10
    diverged_at: float | None  # where the sweep stopped: smoothed loss > 4x its minimum, or a NaN/inf loss or gradient


def lr_range_test(model: nn.Module, optimizer: torch.optim.Optimizer, batches, lr_min: float = 1e-6,
                  lr_max: float = 1.0, steps: int = 100, beta: float = 0.9, diverge: float = 4.0,
                  loss_fn=F.cross_entropy, autocast=contextlib.nullcontext) -> LRRange:
    """Sweep `optimizer`'s learning rate from lr_min to lr_max in `steps` exponential steps, one batch of
    `batches` (an iterator of (x, y)) each, in train mode. Modifies the model's weights: give it a fresh copy."""
    model.train()
    lrs, losses, smoothed, avg, diverged = [], [], [], 0.0, None
    for i, (x, y) in zip(range(steps), batches):
        lr = lr_min * (lr_max / lr_min) ** (i / (steps - 1))
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = loss_fn(model(x).float(), y)
        loss.backward()
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=loss.device)
        value, grad_norm = torch.stack([loss.detach().float(), norm.float()]).tolist()  # one host sync a step
        if not (math.isfinite(value) and math.isfinite(grad_norm)):
            diverged = lr
            break
        optimizer.step()
        avg = beta * avg + (1 - beta) * value
        lrs.append(lr)
        losses.append(value)
        smoothed.append(avg / (1 - beta ** (i + 1)))
        if i >= 10 and smoothed[-1] > diverge * min(smoothed):
            diverged = lr
            break
    optimizer.zero_grad(set_to_none=True)
    if diverged is None and len(lrs) < steps:
        raise ValueError(f"the batches ran out after {len(lrs)} of {steps} steps: pass an endless iterator")
    if len(smoothed) < 3:
        raise ValueError(f"the sweep met a NaN/inf loss or gradient after {len(smoothed)} steps (lr {lr:.2g}): fix "
                         f"that first (doctor.py --symptom nan), or lower lr_min (now {lr_min:g})")
    low = min(range(len(smoothed)), key=smoothed.__getitem__)
    span = max(1, round((steps - 1) / math.log10(lr_max / lr_min) / 4))  # a quarter decade: no single noisy step
    falls = [smoothed[i + span] - smoothed[i] for i in range(low + 1 - span)]  # before the valley bottom
    steep = min(range(len(falls)), key=falls.__getitem__) + span // 2 if falls else 0
    return LRRange(lrs, losses, smoothed, lrs[low], lrs[steep], lrs[low] / 10, diverged)


def save(result: LRRange, folder: Path, config_lr: float | None = None) -> list[Path]:
    """`lr_range.csv` (lr, loss, smoothed) and `lr_range.png` (loss vs lr, the suggestion and the config's rate
    marked) in `folder`; the PNG only if matplotlib is installed. Returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lr_range.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lr", "loss", "smoothed"])
        writer.writerows(zip(result.lrs, result.losses, result.smoothed))
    written = [folder / "lr_range.csv"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.semilogx(result.lrs, result.losses, color="0.75", lw=1, label="loss per step")
    ax.semilogx(result.lrs, result.smoothed, color="C0", lw=2, label="smoothed")
    ax.axvline(result.suggestion, color="C2", ls="--", label=f"suggested {result.suggestion:.2g}")
    ax.axvline(result.best_lr, color="C1", ls=":", label=f"lowest loss {result.best_lr:.2g}")
    if config_lr:
        ax.axvline(config_lr, color="C3", ls="-.", label=f"config {config_lr:.2g}")
    top = max(result.smoothed[0] * 1.5, min(result.smoothed) * 2)
    ax.set(xlabel="learning rate (log scale)", ylabel="training loss", ylim=(0, top), title="LR range test")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(folder / "lr_range.png")
    plt.close(fig)
    return written + [folder / "lr_range.png"]
