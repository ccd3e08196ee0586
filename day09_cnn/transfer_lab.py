"""Day 9 lab — transfer learning: what an MNIST-trained ResNet is worth on Fashion-MNIST, at 100 to 55,000 labels.

The curriculum's week-4 deliverable, measured. Day 9's ResNet is trained on MNIST digits (Day 9's own `train()`,
its chosen recipe), then Fashion-MNIST (clothes: a related task, not the same one) is learned with N labelled
images, four ways and a control:

- scratch            a fresh ResNet, every layer trained;
- linear probe       the pretrained backbone frozen, a new head trained: what the features alone are worth;
- last stage + head  the stem and the first two stages frozen, the last stage and a new head trained;
- full fine-tune     every layer trained, the backbone at a tenth of the head's learning rate (layer-wise LR:
                     the pretrained weights should move less than the new, random head);
- control            last stage + head on a *random* frozen backbone: what training fewer parameters gives by itself,
                     so that the pretrained regimes' gain over it is what the MNIST features add.

"Frozen" means two things, and forgetting the second is the classic bug: `requires_grad_(False)` (no gradient, no
optimizer state) *and* BatchNorm layers kept in eval mode, or a train-mode forward would keep rewriting their
running statistics with Fashion-MNIST's, even though no weight moves. Every run takes the same number of SGD
steps (Day 9's optimizer and one-cycle schedule), on a class-balanced labelled subset drawn by its seed; accuracy
is read on Fashion-MNIST's validation split (5,000 training images held out) and, once, on its test set. No
hyper-parameter was tuned on the test set: the recipe is Day 9's, the backbone's factor 0.1 was fixed beforehand.

Run:    python day09_cnn/transfer_lab.py                              (writes runs/day09_cnn/transfer.*)
        python day09_cnn/transfer_lab.py --out day09_cnn/results      (refreshes the committed table and plot)
Gates:  python day09_cnn/check.py
"""
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F

from day04_mlp_mnist import main as day04
from day09_cnn import main as day
from sprint import machine, runs_dir, write_results
from sprint.cli import UserError, arg, parse, progress, run, validate
from sprint.data import fashion_split, fashion_tensors
from sprint.device import pick_device
from sprint.measure import count_params
from sprint.plots import save, subplots

N_TRAIN = 55_000  # Fashion-MNIST's training images after the 5,000 held out for validation


@dataclass(frozen=True)
class Regime:
    name: str
    pretrained: bool  # start from the MNIST backbone (a new head either way)
    trained: tuple[str, ...]  # parameter-name prefixes that learn; everything else is frozen
    backbone_lr: float  # the trained backbone's learning rate, as a fraction of the head's


REGIMES = (
    Regime("scratch", pretrained=False, trained=("stem.", "stages.", "fc."), backbone_lr=1.0),
    Regime("linear probe", pretrained=True, trained=("fc.",), backbone_lr=1.0),
    Regime("last stage + head", pretrained=True, trained=("stages.2.", "fc."), backbone_lr=1.0),
    Regime("full fine-tune", pretrained=True, trained=("stem.", "stages.", "fc."), backbone_lr=0.1),
    Regime("control: random frozen backbone", pretrained=False, trained=("stages.2.", "fc."), backbone_lr=1.0),
)
CONTROL = REGIMES[-1].name
REGIME_NAMES = tuple(r.name for r in REGIMES)


@dataclass
class Config:
    labels: tuple[int, ...] = arg((100, 1000, N_TRAIN), "labelled Fashion-MNIST images per run (multiples of 10: "
                                  "class-balanced)", ge=10, le=N_TRAIN)
    steps: int = arg(200, "SGD steps of every fine-tuning run, whatever the number of labels", gt=0)
    batch_size: int = arg(128, "batch size (all the labelled images when there are fewer)", gt=0)
    lr: float = arg(0.2, "peak learning rate of the head (Day 9's chosen one-cycle recipe)", gt=0)
    seeds: tuple[int, ...] = arg((0, 1), "seeds: the labelled subset, the new head, the scratch model, the order",
                                 ge=0)
    pretrain_epochs: int = arg(2, "epochs of Day 9's MNIST training that make the backbone (its default)", gt=0)
    regimes: tuple[str, ...] = arg(REGIME_NAMES, "regimes compared", choices=REGIME_NAMES)
    device: str | None = arg(None, "cpu, cuda, cuda:N or mps (default: cuda, then mps, then cpu)")

    def __post_init__(self):
        validate(self)
        if any(n % 10 and n != N_TRAIN for n in self.labels):
            raise ValueError(f"--labels must be multiples of 10 (one tenth per class) or {N_TRAIN}, got {self.labels}")
        for name in ("labels", "seeds", "regimes"):
            values = getattr(self, name)
            if len(set(values)) < len(values):
                raise ValueError(f"--{name} lists a value twice: {values}")


# --- what a regime trains ---------------------------------------------------------------------------------
def learns(name: str, regime: Regime) -> bool:
    return name.startswith(regime.trained)


def set_trainable(model: nn.Module, regime: Regime) -> None:
    """Frozen parameters get no gradient, so autograd skips them and the optimizer keeps no state for them."""
    for name, p in model.named_parameters():
        p.requires_grad_(learns(name, regime))


def train_mode(model: nn.Module, regime: Regime) -> None:
    """`model.train()`, except the frozen BatchNorm layers: they keep normalising with MNIST's running statistics
    and must not overwrite them (a train-mode forward updates them even when no weight can move)."""
    model.train()
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d) and not learns(name + ".", regime):
            module.eval()


def param_groups(model: nn.Module, regime: Regime, lr: float) -> list[dict]:
    """The head at `lr`, the trained backbone at `lr * regime.backbone_lr` (layer-wise learning rates)."""
    head = [p for name, p in model.named_parameters() if p.requires_grad and name.startswith("fc.")]
    backbone = [p for name, p in model.named_parameters() if p.requires_grad and not name.startswith("fc.")]
    groups = [{"params": head, "lr": lr, "name": "head"}]
    if backbone:
        groups.append({"params": backbone, "lr": lr * regime.backbone_lr, "name": "backbone"})
    return groups


def starting_model(regime: Regime, backbone: nn.Module, seed: int, device) -> nn.Module:
    """A fresh ResNet, or a copy of the MNIST backbone; a new 10-way head, drawn from `seed`, in both cases."""
    torch.manual_seed(seed)
    model = day.ResNet(backbone.widths)
    if regime.pretrained:
        state = {k: v for k, v in backbone.state_dict().items() if not k.startswith("fc.")}
        model.load_state_dict(state, strict=False)  # the missing keys are exactly the head's (Day 9's demo)
    return model.to(device, memory_format=torch.channels_last)


def labelled_subset(y: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """n indices, n/10 per class, drawn by `seed`; all of them when n is the whole training split. A UserError
    when a class has fewer than n/10 images."""
    if n >= len(y):
        return torch.arange(len(y))
    g = torch.Generator().manual_seed(seed)
    per_class = [torch.nonzero(y.cpu() == c).flatten() for c in range(10)]
    fewest = min(len(idx) for idx in per_class)
    if n // 10 > fewest:
        raise UserError(f"--labels {n}: a class-balanced subset takes at most {10 * fewest} images (the smallest class "
                        f"has {fewest} training images), or all {len(y)}")
    picks = [idx[torch.randperm(len(idx), generator=g)[:n // 10]] for idx in per_class]
    return torch.cat(picks)


# --- one fine-tuning run ----------------------------------------------------------------------------------
def fine_tune(model: nn.Module, regime: Regime, x: torch.Tensor, y: torch.Tensor, cfg: Config, seed: int,
              bar=None) -> torch.optim.Optimizer:
    """`cfg.steps` SGD steps on (x, y), Day 9's optimizer and schedule; returns the optimizer (its state is the
    proof of what was trained)."""
    set_trainable(model, regime)
    groups = param_groups(model, regime, cfg.lr)
    optimizer = torch.optim.SGD(groups, lr=cfg.lr, momentum=0.9, nesterov=True, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[g["lr"] for g in groups],
                                                    total_steps=cfg.steps, pct_start=0.25)
    batch = min(cfg.batch_size, len(x))
    order = torch.Generator().manual_seed(seed)
    batches = iter(())
    for _ in range(cfg.steps):
        idx = next(batches, None)
        if idx is None:  # a new epoch: reshuffle, drop the last partial batch
            perm = torch.randperm(len(x), generator=order).to(x.device)
            batches = iter(perm[:len(x) // batch * batch].view(-1, batch))
            idx = next(batches)
        train_mode(model, regime)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        if bar is not None:
            bar.update()
    if not math.isfinite(loss.item()):
        raise UserError(f"{regime.name}: the training loss became {loss.item()}; lower --lr (now {cfg.lr:g})")
    return optimizer


def trainable_counts(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"trainable_params": count_params(model), "all_params": count_params(model, trainable_only=False),
            "optimizer_state_tensors": len(optimizer.state)}


# --- the lab ------------------------------------------------------------------------------------------------
def pretrain(cfg: Config, log=print) -> dict:
    """Day 9's ResNet on MNIST, its own `train()` and recipe (validation split only; the test set is not read)."""
    t0 = time.perf_counter()
    result = day.train(day.Config(epochs=cfg.pretrain_epochs, device=cfg.device), log=log)
    last = result["history"][-1]
    return {"model": result["model"], "mnist_val_acc": last["val_acc"], "epochs": cfg.pretrain_epochs,
            "wall_s": time.perf_counter() - t0}


def run_lab(cfg: Config, backbone: nn.Module | None = None, log=print) -> dict:
    """Every (labels, seed, regime) run, scored on Fashion-MNIST's validation split and test set.

    `backbone`: an MNIST-trained ResNet to start from (default: train one with Day 9's recipe)."""
    device = pick_device(cfg.device)
    (x_train, y_train), (x_val, y_val) = fashion_split(5000, device)
    x_test, y_test = fashion_tensors(train=False, device=device)
    # drawn first: a --labels that the classes cannot balance fails before the pretraining, not after it
    subsets = {(n, seed): labelled_subset(y_train, n, seed).to(device) for n in cfg.labels for seed in cfg.seeds}
    pretraining = {} if backbone is not None else pretrain(cfg, log)
    backbone = pretraining.pop("model", backbone)  # only its state_dict is read: the caller's model is left as it is
    regimes = [r for r in REGIMES if r.name in cfg.regimes]
    runs = []
    bar = progress(total=len(cfg.labels) * len(cfg.seeds) * len(regimes) * cfg.steps, desc="fine-tuning",
                   unit="step")
    for n in cfg.labels:
        for seed in cfg.seeds:
            idx = subsets[n, seed]
            for regime in regimes:
                model = starting_model(regime, backbone, seed, device)
                t0 = time.perf_counter()
                optimizer = fine_tune(model, regime, x_train[idx], y_train[idx], cfg, seed, bar)
                wall_s = time.perf_counter() - t0
                val, test = day04.evaluate(model, x_val, y_val), day04.evaluate(model, x_test, y_test)
                runs.append({"labels": n, "seed": seed, "regime": regime.name, "val_acc": val["acc"],
                             "test_acc": test["acc"], "wall_s": wall_s, **trainable_counts(model, optimizer)})
                bar.write(f"{n:6d} labels  seed {seed}  {regime.name:18s}  validation {val['acc']:.2%}  "
                          f"test {test['acc']:.2%}  ({wall_s:.1f} s)")
    bar.close()
    return {"config": asdict(cfg), "machine": machine(), "pretraining": pretraining, "runs": runs}


def accuracies(result: dict, labels: int, regime: str, split: str = "test_acc") -> list[float]:
    """One accuracy per seed, in the order of the config's seeds."""
    return [r[split] for r in result["runs"] if (r["labels"], r["regime"]) == (labels, regime)]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def best_pretrained(result: dict, labels: int) -> str:
    """The pretrained regime with the best mean validation accuracy at `labels` (never chosen on the test set)."""
    def validation_accuracy(regime: str) -> float:
        return mean(accuracies(result, labels, regime, "val_acc"))

    pretrained = [r.name for r in REGIMES if r.pretrained and r.name in result["config"]["regimes"]]
    return max(pretrained, key=validation_accuracy)


def gains(result: dict, labels: int, regime: str, baseline: str) -> list[float]:
    """Test-accuracy points of `regime` over `baseline`, seed by seed."""
    pairs = zip(accuracies(result, labels, regime), accuracies(result, labels, baseline))
    return [100 * (a - b) for a, b in pairs]


def points(values: list[float]) -> str:
    return " / ".join(f"{v:+.1f}" for v in values)


def transfer_finding(result: dict, labels: int) -> str:
    """One sentence per label count: the best pretrained regime against scratch, seed by seed, on the test set."""
    best = best_pretrained(result, labels)
    gained = gains(result, labels, best, "scratch")
    if min(gained) > 0:
        verdict = "transfer helps on every seed"
    elif max(gained) < 0:
        verdict = "transfer hurts on every seed: scratch wins"
    else:
        verdict = "no consistent effect: the sign changes with the seed"
    return (f"- **{labels:,} labels:** the best pretrained regime on validation, {best}, against scratch on the test "
            f"set: {points(gained)} points per seed; {verdict}.")


def control_finding(result: dict) -> str:
    """The MNIST features' own share: last stage + head on the MNIST backbone over the same regime on a random one."""
    parts = [f"{points(gains(result, n, 'last stage + head', CONTROL))} at {n:,} labels"
             for n in result["config"]["labels"]]
    return (f"- **Control:** last stage + head on the MNIST backbone against the same regime on a random frozen "
            f"backbone (what training fewer parameters gives by itself), points per seed: {'; '.join(parts)}.")


def report(result: dict) -> str:
    """The README's table and findings, every sentence chosen by the figures of this run."""
    cfg, p = result["config"], result["pretraining"]
    seeds = ", ".join(str(s) for s in cfg["seeds"])
    backbone = (f"Day 9's ResNet after {p['epochs']} epoch(s) of MNIST (validation accuracy {p['mnist_val_acc']:.2%})"
                if p else "a given MNIST ResNet")
    lines = [f"Fashion-MNIST test accuracy, mean of seeds {seeds} (each seed's figure in brackets); every run "
             f"{cfg['steps']} SGD steps of up to {cfg['batch_size']} images. Backbone: {backbone}.", "",
             "| regime | trained parameters | " + " | ".join(f"{n:,} labels" for n in cfg["labels"]) + " |",
             "|---|---:|" + "---:|" * len(cfg["labels"])]
    for regime in cfg["regimes"]:
        trained = next(r["trainable_params"] for r in result["runs"] if r["regime"] == regime)
        cells = []
        for n in cfg["labels"]:
            accs = accuracies(result, n, regime)
            cells.append(f"{mean(accs):.2%} ({' / '.join(f'{100 * a:.1f}' for a in accs)})")
        lines.append(f"| {regime} | {trained:,} | " + " | ".join(cells) + " |")
    pretrained = [r.name for r in REGIMES if r.pretrained and r.name in cfg["regimes"]]
    if "scratch" in cfg["regimes"] and pretrained:
        lines += [""] + [transfer_finding(result, n) for n in cfg["labels"]]
    if {"last stage + head", CONTROL} <= set(cfg["regimes"]):
        lines.append(control_finding(result))
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    cfg = result["config"]
    fig, ax = subplots(1, 1, figsize=(7, 4.5))
    for regime in cfg["regimes"]:
        means = [100 * mean(accuracies(result, n, regime)) for n in cfg["labels"]]
        ax.plot(cfg["labels"], means, marker="o", label=regime)
    ax.set(xscale="log", xlabel="labelled Fashion-MNIST images", ylabel="test accuracy (%)",
           title=f"transfer from MNIST: mean of {len(cfg['seeds'])} seeds, {cfg['steps']} steps each")
    ax.legend()
    save(fig, path)


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    result = run_lab(cfg)
    text = report(result)
    print("\n" + text)
    write_results(out, "transfer", text, result)
    plot(result, out / "transfer.png")
    print(f"wrote {out / 'transfer.png'}")
    return result


if __name__ == "__main__":
    run(main)
