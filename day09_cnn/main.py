"""Day 9 — a small ResNet against Day 4's MLP: inductive bias, measured.

A ResNet-style CNN (BasicBlock: conv-BN-ReLU-conv-BN + identity/projection shortcut) trained on MNIST with
SGD + Nesterov and a one-cycle schedule, next to Day 4's MLP trained by Day 4's own `train()`: both on the
same in-memory tensors, timed from the same starting line and scored by the same `evaluate()`. The
"10-line conclusion" is generated from the measured numbers. Two side lessons: state_dict reconciliation
(strict=False, the DDP `module.` prefix, shape mismatches) and why residual connections keep gradients alive.

Run:    python day09_cnn/main.py        (~90 s of CPU time on a 2-core CPU; writes day09_cnn/results/)
Gates:  python day09_cnn/check.py
"""
import argparse
import copy
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from day04_mlp_mnist import main as day04
from day09_cnn.report import comparison_table, conclusion, plot, reconciliation_text
from sprint.data import mnist_tensors
from sprint.device import pick_device

OUT_DIR = Path(__file__).resolve().parent / "results"


# --- the model ------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus a shortcut: identity, or a 1x1 conv + BN when the shape changes."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, padding=1, bias=False)  # BN's shift makes a bias redundant
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Identity()
        if stride != 1 or in_ch != out_ch:  # x must have the block output's shape before it can be added
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))  # the identity path: gradients reach early layers undiminished


class ResNet(nn.Module):
    """Stem (stride 2: 28x28 -> 14x14, 4x fewer positions for every later conv), one BasicBlock per stage,
    global average pooling, linear head. widths=(16, 32, 64): 14x14 -> 7x7 -> 4x4."""

    def __init__(self, widths=(16, 32, 64), num_classes: int = 10):
        super().__init__()
        self.widths = tuple(widths)  # enough to rebuild the same architecture (see reconciliation_demo)
        self.stem = nn.Sequential(nn.Conv2d(1, widths[0], 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, in_ch = [], widths[0]
        for i, width in enumerate(widths):
            stages.append(BasicBlock(in_ch, width, stride=1 if i == 0 else 2))
            in_ch = width
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x):
        x = self.stages(self.stem(x))
        return self.fc(x.mean(dim=(2, 3)))  # global average pool: the head sees "which features", not "where"


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- training -------------------------------------------------------------------------------------------
@dataclass
class Config:
    epochs: int = 2
    batch_size: int = 128
    lr: float = 0.1  # peak LR of the one-cycle schedule (SGD + Nesterov momentum)
    momentum: float = 0.9
    weight_decay: float = 5e-4
    widths: tuple = (16, 32, 64)
    channels_last: bool = True  # NHWC is the layout CPU convolution kernels prefer (~14% faster here)
    seed: int = 0
    device: str | None = None
    train_subset: int | None = None  # first N images only (smoke runs and tests)
    test_subset: int | None = None

    def __post_init__(self):
        for name in ("epochs", "batch_size", "lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"Config.{name} must be > 0, got {getattr(self, name)!r}")
        self.widths = tuple(self.widths)
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"Config.widths must be positive channel counts, got {self.widths!r}")


def train(cfg: Config, log=print) -> dict:
    """Train the ResNet; return test_acc, params, wall_s, history and the model, like Day 4's train()."""
    t0 = time.perf_counter()
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    x_train, y_train = mnist_tensors(train=True, device=device)
    x_test, y_test = mnist_tensors(train=False, device=device)
    x_train, y_train = x_train[:cfg.train_subset], y_train[:cfg.train_subset]
    x_test, y_test = x_test[:cfg.test_subset], y_test[:cfg.test_subset]

    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = ResNet(cfg.widths).to(device, memory_format=memory_format)
    log(f"ResNet widths {cfg.widths}: {count_params(model):,} parameters | {len(x_train):,} train / "
        f"{len(x_test):,} test | {device}")
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True,
                                weight_decay=cfg.weight_decay)
    steps = len(x_train) // cfg.batch_size
    if steps == 0:
        raise ValueError(f"batch_size {cfg.batch_size} exceeds the {len(x_train)} training samples")
    # Warm up for a quarter of the steps, then anneal to ~0: a flat LR stalls around 98.3-98.9% here.
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=cfg.epochs * steps,
                                                    pct_start=0.25)
    history = []
    for epoch in range(cfg.epochs):
        model.train()  # BatchNorm uses (and updates running averages from) batch statistics
        order = torch.randperm(len(x_train), generator=shuffle).to(device)
        total = torch.zeros((), device=device)
        for idx in order[:steps * cfg.batch_size].view(steps, cfg.batch_size):
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.detach()
        train_loss = total.item() / steps
        if not math.isfinite(train_loss):
            raise FloatingPointError(f"training loss became {train_loss}; lower --lr (now {cfg.lr:g})")
        ev = day04.evaluate(model, x_test, y_test)  # Day 4's evaluation: eval mode, no_grad, same test set
        row = {"epoch": epoch + 1, "train_loss": train_loss, "test_loss": ev["loss"], "test_acc": ev["acc"],
               "elapsed_s": time.perf_counter() - t0}
        history.append(row)
        log(f"epoch {epoch + 1}  train loss {train_loss:.4f}  test loss {ev['loss']:.4f}  "
            f"test acc {100 * ev['acc']:.2f}%  ({row['elapsed_s']:.1f} s)")
    wall_s = time.perf_counter() - t0
    log(f"ResNet: {100 * history[-1]['test_acc']:.2f}% test accuracy in {wall_s:.1f} s")
    return {"test_acc": history[-1]["test_acc"], "params": count_params(model), "wall_s": wall_s,
            "history": history, "config": asdict(cfg), "n_test": len(x_test), "model": model}


def compare(cfg: Config = Config(), log=print) -> dict:
    """ResNet vs Day 4's MLP (its default Config), measured the same way on the same data and device."""
    device = pick_device(cfg.device)
    mnist_tensors(train=True, device=device), mnist_tensors(train=False, device=device)  # decode once, untimed
    resnet = train(cfg, log)
    mlp_cfg = day04.Config(device=cfg.device, train_subset=cfg.train_subset, test_subset=cfg.test_subset)
    mlp = day04.train(mlp_cfg, log=log)
    return {"resnet": resnet, "mlp": mlp, "residual": residual_experiment()}


# --- why residual connections: gradient norm of the first layer in a deep stack ---------------------------
def first_layer_grad_norm(residual: bool, depth: int = 40, dim: int = 64, seed: int = 0) -> float:
    """The curriculum's experiment: `depth` x (Linear + ReLU), default init, loss = sum of the outputs."""
    torch.manual_seed(seed)
    layers = [nn.Sequential(nn.Linear(dim, dim), nn.ReLU()) for _ in range(depth)]
    h = torch.randn(8, dim)
    for layer in layers:
        h = h + layer(h) if residual else layer(h)
    h.sum().backward()
    return layers[0][0].weight.grad.norm().item()


def residual_experiment(depths=(5, 10, 20, 40), seeds=range(5)) -> dict:
    """Per depth: the first layer's gradient norm with and without the identity path, for each seed."""
    return {"depths": list(depths), "seeds": list(seeds),
            "residual": [[first_layer_grad_norm(True, d, seed=s) for s in seeds] for d in depths],
            "plain": [[first_layer_grad_norm(False, d, seed=s) for s in seeds] for d in depths]}


# --- state_dict reconciliation ----------------------------------------------------------------------------
def strip_prefix(state: dict, prefix: str) -> dict:
    """A copy of `state` without `prefix` on its keys (DDP's `module.`, torch.compile's `_orig_mod.`)."""
    state = dict(state)  # the library helper edits in place; keep the caller's dict intact
    consume_prefix_in_state_dict_if_present(state, prefix)
    return state


def reconciliation_demo(model: ResNet) -> dict:
    """Load a checkpoint the ways real projects break it, and report what PyTorch says each time."""
    model = copy.deepcopy(model).cpu().to(memory_format=torch.contiguous_format)  # same layout as a fresh model
    ddp_state = {f"module.{k}": v for k, v in model.state_dict().items()}  # DDP(model).state_dict() looks so
    out = {}

    fresh = ResNet(model.widths)
    try:
        fresh.load_state_dict(ddp_state)  # strict=True (the default): every key must match
    except RuntimeError as exc:
        out["strict_error"] = " ".join(str(exc).split())[:160] + " ..."
    loose = fresh.load_state_dict(ddp_state, strict=False)  # loads nothing, but says why
    out["prefixed"] = {"missing": len(loose.missing_keys), "unexpected": len(loose.unexpected_keys),
                       "example_missing": loose.missing_keys[:2], "example_unexpected": loose.unexpected_keys[:2]}

    clean = strip_prefix(ddp_state, "module.")
    fixed = fresh.load_state_dict(clean, strict=False)
    out["stripped"] = {"missing": fixed.missing_keys, "unexpected": fixed.unexpected_keys}
    x = torch.randn(4, 1, 28, 28)
    model.eval(), fresh.eval()
    with torch.no_grad():
        out["stripped"]["max_logit_diff"] = (model(x) - fresh(x)).abs().max().item()

    backbone = {k: v for k, v in clean.items() if not k.startswith("fc.")}  # transfer: keep features, new head
    five_way = ResNet(model.widths, num_classes=5)
    partial = five_way.load_state_dict(backbone, strict=False)
    out["backbone_only"] = {"missing": partial.missing_keys, "unexpected": partial.unexpected_keys}
    try:
        five_way.load_state_dict(clean, strict=False)  # strict=False forgives names, never shapes
    except RuntimeError as exc:
        out["shape_error"] = next(line.strip() for line in str(exc).splitlines() if "size mismatch" in line)
    return out


def main(argv=None) -> dict:
    d = Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=d.epochs, help="ResNet epochs (the MLP keeps Day 4's)")
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr, help="peak LR of the one-cycle schedule")
    parser.add_argument("--widths", type=int, nargs="+", default=list(d.widths), help="channels per stage")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--device", default=d.device, help="cpu, cuda, mps (default: best available)")
    parser.add_argument("--train-subset", type=int, default=None, help="first N training images (both models)")
    parser.add_argument("--test-subset", type=int, default=None, help="first N test images (both models)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the tables and plots go")
    args = parser.parse_args(argv)
    try:
        cfg = Config(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, widths=args.widths,
                     seed=args.seed, device=args.device, train_subset=args.train_subset,
                     test_subset=args.test_subset)
    except ValueError as exc:
        parser.error(str(exc))

    result = compare(cfg)
    res, mlp, grads = result["resnet"], result["mlp"], result["residual"]
    table = comparison_table(res, mlp)
    lines = conclusion(res, mlp, grads)
    demo = reconciliation_demo(res["model"])
    print("\n" + table + "\n\nConclusion (generated from the figures above):\n" + "\n".join(lines))
    print("\nstate_dict reconciliation:\n" + reconciliation_text(demo))

    args.out.mkdir(parents=True, exist_ok=True)
    plot(res, mlp, grads, args.out / "comparison.png")
    (args.out / "comparison.md").write_text(table + "\n\n" + "\n".join(lines) + "\n")
    (args.out / "state_dict.md").write_text(reconciliation_text(demo) + "\n")
    summary = {name: {k: v for k, v in r.items() if k != "model"} for name, r in (("resnet", res), ("mlp", mlp))}
    summary |= {"residual": grads, "state_dict": demo}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}/comparison.png, comparison.md, state_dict.md, summary.json")
    return result | {"conclusion": lines, "state_dict": demo}


if __name__ == "__main__":
    main(sys.argv[1:])
