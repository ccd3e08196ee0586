"""The plain reference MLP that `bench.py` races Day 4's main job against.

784-512-256-10 with ReLU and PyTorch's default init, AdamW at 2e-3 (its default weight decay), batch 256, the
learning rate decayed linearly to 0 over `--epochs`, on the same in-memory tensors as `main.py`
(`sprint.data.mnist_tensors`). It evaluates the test set `--evals-per-epoch` times per epoch and prints one line
per evaluation, `<epoch> <test accuracy>`, flushed, so that the bench can time each line from launch.

Run:  python day04_mlp_mnist/reference.py --epochs 3
"""
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F

from sprint.cli import arg, parse, run, validate
from sprint.data import mnist_tensors


@dataclass
class Config:
    epochs: int = arg(3, "length of the linear decay, in epochs", gt=0)
    evals_per_epoch: int = arg(4, "test evaluations per epoch (each one is timed by bench.py)", gt=0, le=234)
    seed: int = arg(0, "seed of the init and the shuffle", ge=0)

    def __post_init__(self):
        validate(self)


def reference_model() -> nn.Sequential:
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def main(argv=None) -> None:
    cfg, _ = parse(Config, argv, __doc__)
    torch.manual_seed(cfg.seed)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    (x, y), (x_test, y_test) = mnist_tensors(train=True), mnist_tensors(train=False)
    model = reference_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    steps = len(x) // 256
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / (cfg.epochs * steps))
    for epoch in range(cfg.epochs):
        batches = torch.randperm(len(x), generator=shuffle)[:steps * 256].view(steps, 256)
        for part, chunk in enumerate(batches.tensor_split(cfg.evals_per_epoch)):
            model.train()
            for idx in chunk:
                loss = F.cross_entropy(model(x[idx]), y[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
            model.eval()
            with torch.no_grad():
                acc = (model(x_test).argmax(1) == y_test).float().mean().item()
            print(f"{epoch + (part + 1) / cfg.evals_per_epoch:.4g} {acc:.4f}", flush=True)


if __name__ == "__main__":
    run(main)
