"""Day 6 lab — overfitting, proven: on a small training subset with no regularisation the model reaches ~100%
training accuracy while its validation loss turns up; early stopping stops at the right epoch and `best.pt` holds the
lowest validation loss; Dropout, weight decay and augmentation each narrow the gap, one change at a time.

Every run is Day 6's own `Trainer` (validation, checkpoints, early stopping, best.pt) with three lab changes: the
training subset is also evaluated each epoch in eval mode (the same footing as validation: Dropout off), the model is
a plain one-hidden-layer ReLU MLP, and one run augments its batches. Day 4's MLP has a LayerNorm after its first layer:
that makes the first layer's scale irrelevant and its gain is exempt from decay, so weight decay would have little
to act on there.

Run:    python day06_ckpt_resume/overfit_lab.py                   # writes to runs/day06_ckpt_resume/overfit/
        python day06_ckpt_resume/overfit_lab.py --out day06_ckpt_resume/results  # refresh the committed figures
Gates:  python day06_ckpt_resume/check.py
"""
import contextlib
import dataclasses
import io
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
from torchvision.transforms import v2

from day04_mlp_mnist.main import evaluate
from day06_ckpt_resume.checkpoint import load_checkpoint, read_metrics
from day06_ckpt_resume.main import MNIST_TRAIN, Config, Trainer
from day06_ckpt_resume.report import plot_overfit, write_overfit_table, write_results
from sprint import runs_dir
from sprint.cli import arg, parse, progress, run, validate
from sprint.data import MEAN, STD


@dataclass
class LabConfig:
    subset: int = arg(500, "training images: few enough to memorise", gt=0, le=MNIST_TRAIN - 2000)
    epochs: int = arg(30, "epochs of every run", gt=0)
    patience: int = arg(3, "epochs without a better validation loss before the early-stopping run stops", gt=0)
    hidden: int = arg(128, "hidden units of the MLP", gt=0)
    lr: float = arg(2e-3, "peak learning rate (AdamW, warmup + cosine)", gt=0)
    dropout: float = arg(0.5, "Dropout probability of the Dropout run", ge=0, lt=1)
    weight_decay: float = arg(3.0, "AdamW weight decay of the weight-decay run (weight matrices only)", ge=0)
    shift: float = arg(0.1, "augmentation run: random shifts up to this fraction of the image", ge=0, lt=0.5)
    degrees: float = arg(10.0, "augmentation run: random rotations up to this many degrees", ge=0, le=180)
    seed: int = arg(0, "seed of every run", ge=0)
    device: str = arg("", "cpu, cuda, cuda:N or mps; empty: cuda, then mps, then cpu")

    def __post_init__(self):
        validate(self)

    def run_config(self, **changes) -> Config:
        """Day 6's config for one run: 2,000 validation images, batch 50, no regularisation unless `changes` add it;
        patience = epochs (no early stop) unless changed; checkpoints at epoch ends only."""
        base = Config(seed=self.seed, epochs=self.epochs, batch_size=50, lr=self.lr, weight_decay=0.0, warmup_steps=20,
                      hidden=self.hidden, dropout=0.0, val_size=2000, train_subset=self.subset, patience=self.epochs,
                      ckpt_every=10 ** 9, keep_last=2, device=self.device, log_every=10 ** 9)
        return dataclasses.replace(base, **changes)


class LabTrainer(Trainer):
    """Day 6's trainer with a plain ReLU MLP, optional batch augmentation, and the training subset evaluated (eval
    mode) next to the validation split at every epoch end."""

    def __init__(self, cfg: Config, run_dir: Path, augment=None):
        self.augment = augment
        super().__init__(cfg, run_dir)

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, self.cfg.hidden), nn.ReLU(), nn.Dropout(self.cfg.dropout),
                             nn.Linear(self.cfg.hidden, 10))

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        return super().train_step(self.augment(x) if self.augment else x, y)

    def validate(self) -> dict:
        seen = evaluate(self.model, self.loader.dataset.x, self.loader.dataset.y, 2000)
        return {**super().validate(), "train_loss": seen["loss"], "train_acc": seen["acc"]}


@dataclass
class Curve:
    """One run, epoch by epoch (eval mode throughout), and where it ended."""
    name: str
    val_loss: list[float]
    val_acc: list[float]
    train_loss: list[float]
    train_acc: list[float]
    best_epoch: int  # 1-based: the epoch of the lowest validation loss
    gap: float  # val_loss - train_loss at the last epoch: what regularisation should narrow


@dataclass
class EarlyStop:
    """The unregularised run again, with early stopping, and what its best.pt holds (loaded back from disk)."""
    patience: int
    stopped_after_epoch: int
    val_loss: list[float]
    best_pt_step: int
    best_pt_val_loss: float  # best.pt's weights evaluated on the validation split again
    step_of_best_epoch: int


@dataclass
class Lab:
    config: LabConfig
    curves: dict[str, Curve]
    early_stop: EarlyStop


def train_run(cfg: Config, run_dir: Path, augment=None) -> list[dict]:
    """A LabTrainer run (its printing silenced); returns its validation records, one per epoch."""
    with contextlib.redirect_stdout(io.StringIO()):
        LabTrainer(cfg, run_dir, augment).fit()
    return [r for r in read_metrics(run_dir) if r["kind"] == "val"]


def curve(name: str, records: list[dict]) -> Curve:
    val = [r["val_loss"] for r in records]
    return Curve(name, val, [r["val_acc"] for r in records], [r["train_loss"] for r in records],
                 [r["train_acc"] for r in records], 1 + val.index(min(val)), val[-1] - records[-1]["train_loss"])


def run_lab(lab: LabConfig, work: Path) -> Lab:
    """Five runs in `work`: none, early stopping, Dropout, weight decay, augmentation (same seed, same subset)."""
    augment = v2.RandomAffine(degrees=lab.degrees, translate=(lab.shift, lab.shift), fill=-MEAN / STD)
    runs = {"no regularisation": (lab.run_config(), None),
            f"Dropout {lab.dropout:g}": (lab.run_config(dropout=lab.dropout), None),
            f"weight decay {lab.weight_decay:g}": (lab.run_config(weight_decay=lab.weight_decay), None),
            f"augmentation (shift {lab.shift:g}, {lab.degrees:g}°)": (lab.run_config(), augment)}
    curves, bar = {}, progress(total=len(runs) + 1, unit="run")
    for i, (name, (cfg, aug)) in enumerate(runs.items()):
        curves[name] = curve(name, train_run(cfg, Path(work) / f"run{i}", aug))
        bar.update()
    stop_dir = Path(work) / "early-stop"
    stopped = train_run(lab.run_config(patience=lab.patience), stop_dir)
    bar.close()
    best = load_checkpoint(stop_dir / "best.pt")
    trainer = LabTrainer(lab.run_config(), Path(work) / "reload")  # a fresh model to load best.pt's weights into
    trainer.model.load_state_dict(best["model"])
    step_of_best = min(stopped, key=lambda r: r["val_loss"])["step"]
    early = EarlyStop(lab.patience, len(stopped), [r["val_loss"] for r in stopped], best["step"],
                      trainer.validate()["val_loss"], step_of_best)
    return Lab(lab, curves, early)


def main(argv=None) -> Lab:
    lab, out = parse(LabConfig, argv, __doc__, out=runs_dir(__file__, "overfit"))
    t0 = time.perf_counter()
    result = run_lab(lab, runs_dir(__file__, "overfit-runs", time.strftime("%Y%m%d-%H%M%S")))
    base = result.curves["no regularisation"]
    print(f"no regularisation: train accuracy {base.train_acc[-1]:.2%}, validation loss lowest at epoch "
          f"{base.best_epoch} ({min(base.val_loss):.3f}), {base.val_loss[-1]:.3f} at epoch {lab.epochs}")
    print(f"early stopping (patience {lab.patience}) stopped after epoch {result.early_stop.stopped_after_epoch}; "
          f"best.pt holds step {result.early_stop.best_pt_step}")
    for c in result.curves.values():
        print(f"  {c.name:32s} gap (val - train loss) at epoch {lab.epochs}: {c.gap:.3f}")
    write_results(out, "overfit", result, write_overfit_table, plot_overfit, t0)
    return result


if __name__ == "__main__":
    run(main)
