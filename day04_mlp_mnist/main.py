"""Day 4 — an MLP on MNIST past 98% test accuracy (the G0 gate), as fast as a 2-core CPU allows.

The first complete training loop: an `nn.Module` written by hand (Linear → ReLU → Linear, He init, logits out),
`CrossEntropyLoss` with label smoothing on those logits, `AdamW` with a one-cycle learning-rate schedule, a
seeded shuffle, and the `model.train()` / `model.eval()` + `torch.no_grad()` switch around evaluation.
The recipe was chosen on a validation split carved from the training set (`tune.py`); the 10,000 test images
are evaluated once, at the very end. The data is MNIST as normalised tensors in memory (`sprint.data`): one
index operation per batch, and no torchvision import at all on this path.

Run:    python day04_mlp_mnist/main.py      (writes runs/day04_mlp_mnist/: metrics.jsonl, curves.png, summary.json)
Tune:   python day04_mlp_mnist/tune.py      (the validation sweep that chose the defaults below)
Bench:  python day04_mlp_mnist/bench.py     (this command vs a plain reference MLP, both timed from launch)
Gates:  python day04_mlp_mnist/check.py
"""
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn

from day04_mlp_mnist.report import plot_curves, run_table
from sprint import machine, runs_dir, write_results
from sprint.cli import UserError, arg, parse, progress, run, validate
from sprint.data import SIZES, mnist_split, mnist_tensors
from sprint.device import pick_device
from sprint.measure import count_params

GOAL_ACC = 0.98  # the G0 gate: test accuracy on the official 10,000-image test set
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh}
INITS = ("he", "xavier", "trunc_normal", "default")


def init_linear(layer: nn.Linear, scheme: str) -> None:
    """Random, not zero, weights (zero keeps every hidden unit identical forever), scaled to the activation:
    He N(0, 2/fan_in) for ReLU, Xavier N(0, 2/(fan_in+fan_out)) for tanh; `default` keeps PyTorch's own."""
    if scheme == "default":
        return
    if scheme == "he":
        nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
    elif scheme == "xavier":
        nn.init.xavier_normal_(layer.weight)
    else:  # "trunc_normal": a small fixed std, cut at ±2 std (trunc_normal_'s default cut is ±2 *absolute*)
        nn.init.trunc_normal_(layer.weight, std=0.02, a=-0.04, b=0.04)
    nn.init.zeros_(layer.bias)


class MLP(nn.Module):
    """784 → hidden → 10; `forward` returns logits (no softmax). The defaults (LayerNorm, GELU, Dropout 0.1, small
    init) are the model Days 5–11 build with `MLP()`; Day 4's tuned recipe drops LayerNorm and uses ReLU + He."""

    def __init__(self, in_features: int = 784, hidden: int = 512, num_classes: int = 10, dropout: float = 0.1, *,
                 norm: bool = True, act: str = "gelu", init: str = "trunc_normal"):
        super().__init__()  # must run first: it sets up the registries that attribute assignment fills
        self.fc1 = nn.Linear(in_features, hidden)  # assigning a Module as an attribute registers its parameters
        self.norm = nn.LayerNorm(hidden) if norm else nn.Identity()
        self.act = ACTIVATIONS[act]()
        self.drop = nn.Dropout(dropout)  # active only in train mode: this is why eval() matters
        self.fc2 = nn.Linear(hidden, num_classes)
        for layer in (self.fc1, self.fc2):
            init_linear(layer, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # (B, 1, 28, 28) or (B, 784) -> (B, 784)
        x = self.drop(self.act(self.norm(self.fc1(x))))
        return self.fc2(x)  # logits: CrossEntropyLoss applies log-softmax itself


@dataclass
class Config:
    epochs: int = arg(4, "passes over the training split", gt=0)
    batch_size: int = arg(256, "images per optimizer step", gt=0)
    lr: float = arg(6e-3, "peak learning rate of the one-cycle schedule", gt=0)
    warmup: float = arg(0.15, "share of the steps spent warming up to the peak LR", gt=0, lt=1)
    weight_decay: float = arg(0.05, "AdamW's decoupled decay, on weight matrices only", ge=0)
    label_smoothing: float = arg(0.1, "share of the target probability spread over the other classes", ge=0, lt=1)
    hidden: int = arg(512, "hidden units", gt=0)
    dropout: float = arg(0.0, "dropout probability after the activation", ge=0, lt=1)
    norm: bool = arg(False, "LayerNorm after the first layer")
    act: str = arg("relu", "activation", choices=tuple(ACTIVATIONS))
    init: str = arg("he", "weight init", choices=INITS)
    seed: int = arg(0, "seed of the init, the Dropout masks and the shuffle", ge=0)
    device: str | None = arg(None, "cpu, cuda, cuda:1 or mps; none given: the best this machine has")
    val_size: int = arg(5000, "training images held out for validation (the test set is used once, at the end)",
                        gt=0, lt=SIZES[True])
    train_subset: int | None = arg(None, "train on the first N images of the training split only", gt=0)
    test_subset: int | None = arg(None, "evaluate the first N test images only", gt=0, le=SIZES[False])
    test: bool = arg(True, "evaluate the test set once at the end (tune.py turns it off: it tunes on validation)")
    evals_per_epoch: int = arg(1, "validation passes per epoch", gt=0)
    eval_batch_size: int = arg(5000, "images per forward pass in evaluation", gt=0)

    def __post_init__(self):
        validate(self)
        available = SIZES[True] - self.val_size
        if self.train_subset is not None and self.train_subset > available:
            raise ValueError(f"--train-subset must be <= {available} (60000 minus --val-size), "
                             f"got {self.train_subset}")
        steps = self.n_train // self.batch_size
        if steps == 0:
            raise ValueError(f"--batch-size {self.batch_size} exceeds the {self.n_train} training images")
        if self.evals_per_epoch > steps:
            raise ValueError(f"--evals-per-epoch must be <= the {steps} steps per epoch, got {self.evals_per_epoch}")

    @property
    def n_train(self) -> int:
        return min(self.train_subset or SIZES[True], SIZES[True] - self.val_size)


class NonFiniteLoss(UserError, FloatingPointError):
    """The training loss became NaN or inf."""


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2000) -> dict:
    """Mean loss, accuracy and predictions, with Dropout off (eval) and no autograd graph (no_grad)."""
    was_training = model.training
    model.eval()
    loss_sum, preds = 0.0, []
    with torch.no_grad():
        for i in range(0, len(x), batch_size):
            logits = model(x[i:i + batch_size])
            loss_sum += nn.functional.cross_entropy(logits, y[i:i + batch_size], reduction="sum").item()
            preds.append(logits.argmax(1))
    model.train(was_training)  # leave the model in the mode we found it in
    preds = torch.cat(preds)
    return {"loss": loss_sum / len(x), "acc": (preds == y).float().mean().item(), "preds": preds}


def train_steps(model, optimizer, scheduler, criterion, x, y, batches, bar=None) -> float:
    """One run over `batches` (index tensors) in train mode; returns the mean training loss."""
    model.train()  # Dropout on
    total = torch.zeros((), device=x.device)
    for idx in batches:
        logits = model(x[idx])
        loss = criterion(logits, y[idx])
        optimizer.zero_grad(set_to_none=True)  # gradients accumulate across backward() unless cleared
        loss.backward()
        optimizer.step()
        scheduler.step()  # the LR schedule advances per step, not per epoch
        total += loss.detach()  # stays on the device: no sync per step
        if bar is not None:
            bar.update()
    mean = total.item() / len(batches)
    if not math.isfinite(mean):
        raise NonFiniteLoss(f"the training loss became {mean}; lower --lr (now {optimizer.defaults['lr']:g})")
    return mean


def make_optimizer(model: nn.Module, cfg: Config, device: torch.device) -> torch.optim.AdamW:
    """AdamW, decay on weight matrices only (shrinking biases and norm gains toward 0 does not regularise);
    `fused`: the whole update in one kernel, several times cheaper per step than the default on a CPU."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr,
                             fused=True if device.type in ("cpu", "cuda") else None)


def train(cfg: Config, out_dir: Path | None = None, log=print) -> dict:
    """Train an MLP on MNIST with `cfg`: validation after each epoch, the test set once at the end.

    Returns the figures, the per-evaluation history and the model. With `out_dir`, the history is also written
    as JSON lines (`metrics.jsonl`) plus `curves.png` and `summary.json`."""
    t0 = time.perf_counter()
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)  # model init and Dropout masks
    shuffle = torch.Generator().manual_seed(cfg.seed)  # its own RNG: the batch order depends on the seed alone
    (x_train, y_train), (x_val, y_val) = mnist_split(cfg.val_size, device, cfg.train_subset)

    model = MLP(hidden=cfg.hidden, dropout=cfg.dropout, norm=cfg.norm, act=cfg.act, init=cfg.init).to(device)
    n_params = count_params(model)
    log(f"MLP 784-{cfg.hidden}-10: {n_params:,} parameters | {len(x_train):,} train / {len(x_val):,} validation | "
        f"{device}")
    optimizer = make_optimizer(model, cfg, device)
    steps_per_epoch = len(x_train) // cfg.batch_size  # the last partial batch is dropped (a fresh one each epoch)
    # Warm up, then cosine-decay to ~0: a constant LR leaves AdamW hovering around 98%.
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, pct_start=cfg.warmup,
                                                    total_steps=cfg.epochs * steps_per_epoch)
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.label_smoothing)

    history = []
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    with (open(Path(out_dir) / "metrics.jsonl", "w") if out_dir else contextlib.nullcontext()) as metrics_file, \
            progress(total=cfg.epochs * steps_per_epoch, desc="training", unit="step") as bar:
        for epoch in range(cfg.epochs):
            perm = torch.randperm(len(x_train), generator=shuffle).to(device)
            batches = perm[:steps_per_epoch * cfg.batch_size].view(steps_per_epoch, cfg.batch_size)
            for chunk_i, chunk in enumerate(batches.tensor_split(cfg.evals_per_epoch)):
                train_loss = train_steps(model, optimizer, scheduler, criterion, x_train, y_train, chunk, bar)
                ev = evaluate(model, x_val, y_val, cfg.eval_batch_size)
                row = {"epoch": round(epoch + (chunk_i + 1) / cfg.evals_per_epoch, 4), "train_loss": train_loss,
                       "val_loss": ev["loss"], "val_acc": ev["acc"], "lr": scheduler.get_last_lr()[0],
                       "elapsed_s": time.perf_counter() - t0}
                history.append(row)
                bar.set_postfix(loss=f"{train_loss:.4f}", val_acc=f"{100 * ev['acc']:.2f}%")
                log(f"epoch {row['epoch']:6.2f}  train loss {train_loss:.4f}  val loss {ev['loss']:.4f}  "
                    f"val acc {100 * ev['acc']:.2f}%  ({row['elapsed_s']:.1f} s)")
                if metrics_file:
                    metrics_file.write(json.dumps(row) + "\n")
                    metrics_file.flush()  # readable while the run goes on

    test = {"acc": None, "loss": None, "preds": []}
    if cfg.test:  # the only look at the test set, after every decision has been taken
        x_test, y_test = mnist_tensors(train=False, device=device)
        test = evaluate(model, x_test[:cfg.test_subset], y_test[:cfg.test_subset], cfg.eval_batch_size)
        log(f"test accuracy {100 * test['acc']:.2f}% on {len(test['preds']):,} images, evaluated once after "
            f"{cfg.epochs} epochs ({'above' if test['acc'] > GOAL_ACC else 'BELOW'} the {100 * GOAL_ACC:.0f}% gate)")
    wall_s = time.perf_counter() - t0
    result = {"test_acc": test["acc"], "test_loss": test["loss"], "val_acc": history[-1]["val_acc"],
              "params": n_params, "wall_s": wall_s, "n_train": len(x_train), "n_val": len(x_val),
              "n_test": len(test["preds"]), "history": history, "config": asdict(cfg), "device": str(device),
              "machine": machine(), "torch": torch.__version__, "model": model}
    if out_dir is not None:
        plot_curves(history, test["acc"], GOAL_ACC, Path(out_dir) / "curves.png")
        summary = {k: v for k, v in result.items() if k not in ("history", "model")}
        log(f"wrote {Path(out_dir) / 'metrics.jsonl'} and curves.png")
        write_results(Path(out_dir), "summary", run_table(summary, history), summary)
    return result


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    return train(cfg, out)


if __name__ == "__main__":
    run(main)
