"""Day 9 — a small ResNet against Day 4's MLP: inductive bias, measured.

A ResNet-style CNN (BasicBlock: conv-BN-ReLU-conv-BN + identity/projection shortcut) trained on MNIST with
SGD + Nesterov and a one-cycle schedule, next to Day 4's MLP trained by Day 4's own `train()`. Both use the same
in-memory tensors, are timed from the same starting line and are scored once, at the end, on the same test
images by the same `evaluate()`. The ResNet's schedule was chosen on a validation split carved from the training
set (`bench.py --tune`), never on the test set. The "10-line conclusion" is generated from the measured numbers
(`report.py`). Two side lessons: state_dict reconciliation (strict=False, the DDP `module.` prefix, shape
mismatches) and why residual connections keep gradients alive. Normalisation has its own lab: `norms_lab.py`.

Run:    python day09_cnn/main.py                                   (writes runs/day09_cnn/)
        python day09_cnn/main.py --epochs 1 --train-subset 2000 --test-subset 500 --val-size 500
        python day09_cnn/main.py --out day09_cnn/results           (refreshes the committed figures)
Gates:  python day09_cnn/check.py
"""
import copy
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
from day09_cnn.report import write_report
from sprint import runs_dir
from sprint.cli import UserError, arg, parse, progress, run, validate
from sprint.data import mnist_split, mnist_tensors
from sprint.device import pick_device
from sprint.measure import count_params

N_TRAIN = 60_000  # MNIST's training images, before the validation split


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


# --- training -------------------------------------------------------------------------------------------
@dataclass
class Config:
    epochs: int = arg(2, "ResNet epochs (the MLP keeps Day 4's own recipe)", gt=0)
    batch_size: int = arg(128, "ResNet batch size", gt=0)
    lr: float = arg(0.2, "peak learning rate (SGD + Nesterov momentum), chosen by `bench.py --tune`", gt=0)
    schedule: str = arg("onecycle", "learning-rate schedule over all steps", choices=("onecycle", "linear", "constant"))
    momentum: float = arg(0.9, "SGD momentum", ge=0, lt=1)
    weight_decay: float = arg(5e-4, "L2 weight decay", ge=0)
    widths: tuple[int, ...] = arg((16, 32, 64), "channels per stage (one BasicBlock each)", gt=0)
    channels_last: bool = arg(True, "NHWC memory layout, which CPU convolution kernels prefer")
    val_size: int = arg(5000, "training images held out to choose the schedule on", gt=0, lt=N_TRAIN)
    seed: int = arg(0, "initialisation and shuffling seed", ge=0)
    device: str | None = arg(None, "cpu, cuda, cuda:N or mps (default: cuda, then mps, then cpu)")
    train_subset: int | None = arg(None, "first N training images only, for both models (a quick run)", gt=0)
    test_subset: int | None = arg(None, "first N test images only, for both models", gt=0, le=10_000)

    def __post_init__(self):
        self.widths = tuple(self.widths)
        validate(self)
        n_train = min(self.train_subset or N_TRAIN, N_TRAIN - self.val_size)
        smallest = max(self.batch_size, day04.Config().batch_size)  # both models need one full batch
        if n_train < smallest:
            raise ValueError(f"--train-subset/--val-size leave {n_train} training images, fewer than one batch "
                             f"({smallest}, the larger of --batch-size and Day 4's)")


def schedule(optimizer, cfg: Config, total_steps: int):
    if cfg.schedule == "onecycle":  # warm up for a quarter of the steps, then anneal to ~0
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=total_steps, pct_start=0.25)
    if cfg.schedule == "linear":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def train(cfg: Config, log=print) -> dict:
    """Train the ResNet on the training images minus the validation split; return the model, parameters and the
    per-epoch validation history. The test images are not touched here."""
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    shuffle = torch.Generator().manual_seed(cfg.seed)
    (x_train, y_train), (x_val, y_val) = mnist_split(cfg.val_size, device)
    x_train, y_train = x_train[:cfg.train_subset], y_train[:cfg.train_subset]

    memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format
    model = ResNet(cfg.widths).to(device, memory_format=memory_format)
    log(f"ResNet widths {cfg.widths}: {count_params(model):,} parameters | {len(x_train):,} train / "
        f"{len(x_val):,} validation | {device}")
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, nesterov=True,
                                weight_decay=cfg.weight_decay)
    steps = len(x_train) // cfg.batch_size  # the last partial batch is dropped (a fresh one each epoch)
    scheduler = schedule(optimizer, cfg, cfg.epochs * steps)
    history, t0 = [], time.perf_counter()
    bar = progress(total=cfg.epochs * steps, desc="ResNet", unit="step")
    for epoch in range(cfg.epochs):
        model.train()  # BatchNorm uses (and updates running averages from) batch statistics
        order = torch.randperm(len(x_train), generator=shuffle).to(device)
        total = torch.zeros((), device=device)
        for i, idx in enumerate(order[:steps * cfg.batch_size].view(steps, cfg.batch_size)):
            loss = F.cross_entropy(model(x_train[idx]), y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.detach()  # stays on the device: no sync per step
            bar.update()
            if i % 50 == 49:
                bar.set_postfix(epoch=epoch + 1, loss=f"{total.item() / (i + 1):.4f}")
        train_loss = total.item() / steps
        if not math.isfinite(train_loss):
            raise UserError(f"training loss became {train_loss}; lower --lr (now {cfg.lr:g})")
        ev = day04.evaluate(model, x_val, y_val)  # eval mode, no_grad
        history.append({"epoch": epoch + 1, "train_loss": train_loss, "val_loss": ev["loss"], "val_acc": ev["acc"],
                        "elapsed_s": time.perf_counter() - t0})
        log(f"epoch {epoch + 1}  train loss {train_loss:.4f}  validation loss {ev['loss']:.4f}  "
            f"validation acc {100 * ev['acc']:.2f}%  ({history[-1]['elapsed_s']:.1f} s)")
    bar.close()
    return {"model": model, "params": count_params(model), "epochs": cfg.epochs, "history": history,
            "config": asdict(cfg), "n_train": len(x_train), "n_val": len(x_val)}


def score(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """The one test-set evaluation of a trained model: accuracy, errors, loss."""
    ev = day04.evaluate(model, x, y)
    return {"test_acc": ev["acc"], "test_errors": int((ev["preds"] != y).sum()), "test_loss": ev["loss"],
            "n_test": len(y)}


def compare(cfg: Config = Config(), log=print) -> dict:
    """ResNet vs Day 4's MLP (its default Config), trained and timed the same way, scored once on the same test
    images."""
    device = pick_device(cfg.device)
    mnist_tensors(train=True, device=device)  # decode once, before either clock starts
    x_test, y_test = mnist_tensors(train=False, device=device)
    x_test, y_test = x_test[:cfg.test_subset], y_test[:cfg.test_subset]
    mlp_cfg = day04.Config(device=cfg.device, train_subset=cfg.train_subset, test=False)  # scored below, once

    t0 = time.perf_counter()
    resnet = train(cfg, log)
    resnet["wall_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    mlp = {"model": day04.train(mlp_cfg, log=log)["model"], "epochs": mlp_cfg.epochs}
    mlp["wall_s"] = time.perf_counter() - t0
    for result in (resnet, mlp):
        result |= score(result["model"], x_test, y_test)  # the only look at the test set
    log(f"test accuracy: ResNet {resnet['test_acc']:.2%}, MLP {mlp['test_acc']:.2%}")
    return {"resnet": resnet, "mlp": mlp | {"params": count_params(mlp["model"])}, "residual": residual_experiment()}


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
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    result = compare(cfg)
    demo = reconciliation_demo(result["resnet"]["model"])
    lines = write_report(out, result, demo)
    return result | {"conclusion": lines, "state_dict": demo}


if __name__ == "__main__":
    run(main)
