"""Day 6 — validation, checkpoints and a resume that is bit-for-bit exact, even after `kill -9`.

Day 4's MLP gets the loop a production run needs: a validation split carved from the training set, `metrics.jsonl`
and TensorBoard scalars, `best.pt` (on validation loss) and `last.pt` (every epoch and every N steps) written
atomically, early stopping, warmup + cosine LR, and `--resume`. A checkpoint holds everything the next step depends
on — model, optimizer, scheduler, the RNG states, the sampler's (epoch, seed, position) — so a run that is SIGKILLed
and resumed computes the very same losses, on the very same samples, as one that never stopped.

Run:    python day06_ckpt_resume/main.py train --out runs/day06_ckpt_resume/mine
        python day06_ckpt_resume/main.py train --out runs/day06_ckpt_resume/mine \
            --resume runs/day06_ckpt_resume/mine/last.pt
Proof:  python day06_ckpt_resume/prove_resume.py   (the same run SIGKILLed 5 times and resumed, compared bitwise)
Gates:  python day06_ckpt_resume/check.py
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; must be set before CUDA starts

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.tensorboard import SummaryWriter

from day04_mlp_mnist.main import MLP, evaluate
from day06_ckpt_resume.checkpoint import (CheckpointError, atomic_write_text, clean_stale_tmp, load_checkpoint,
                                          read_metrics, rng_state, save_checkpoint, seed_everything, set_rng_state)
from day06_ckpt_resume.sampler import IndexedTensors, ResumableSampler, split_mnist
from sprint.data import REPO_ROOT, mnist_tensors
from sprint.device import pick_device

OUT_DIR = Path(__file__).resolve().parent / "results"
RUNS_DIR = REPO_ROOT / "runs" / "day06_ckpt_resume"


@dataclass
class Config:
    seed: int = 0
    epochs: int = 3
    batch_size: int = 128
    lr: float = 2e-3  # peak LR, reached after the warmup
    weight_decay: float = 0.05
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05  # cosine decays to lr * min_lr_ratio
    grad_clip: float = 1.0
    hidden: int = 256
    dropout: float = 0.1  # Dropout draws from the global torch RNG: what makes restoring it necessary
    val_size: int = 5000
    train_subset: int = 0  # 0: all 55,000 remaining training images; N: the first N of them
    num_workers: int = 0
    ckpt_every: int = 200  # steps between mid-epoch checkpoints (one is also written at every epoch end)
    keep_last: int = 3  # step checkpoints kept on disk (>= 2: the newest may be the one being written)
    patience: int = 3  # epochs without a better validation loss before early stopping
    max_steps: int = 0  # 0: no limit; N: checkpoint and stop after global step N (smoke runs, demos)
    threads: int = 0  # 0: torch's default; results are bitwise reproducible only at a fixed thread count
    device: str = ""  # "": cuda -> mps -> cpu
    log_every: int = 50

    def __post_init__(self):
        for name in ("epochs", "batch_size", "lr", "hidden", "ckpt_every", "patience", "log_every"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.keep_last < 2:
            raise ValueError(f"keep_last must be >= 2 (the newest may be half-written), got {self.keep_last}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """Linear warmup to the peak LR, then a cosine down to peak * min_ratio (a LambdaLR, so it checkpoints)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)



# ---------------------------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------------------------
class Trainer:
    """One training run in `run_dir`: config.json, metrics.jsonl, tb/, ckpt-*.pt, last.pt, best.pt."""

    def __init__(self, cfg: Config, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for p in clean_stale_tmp(self.run_dir):
            print(f"removed {p.name}: left by a run that died while saving")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.use_deterministic_algorithms(True)  # error out rather than silently use a nondeterministic kernel
        seed_everything(cfg.seed)
        self.device = pick_device(cfg.device or None)

        (x, y), (self.x_val, self.y_val) = split_mnist(cfg.val_size, cfg.train_subset)
        self.x_val, self.y_val = self.x_val.to(self.device), self.y_val.to(self.device)
        self.sampler = ResumableSampler(len(y), cfg.seed)
        # DataLoader draws its workers' base seed at every iter(): from the global RNG unless given a generator,
        # which would shift every later Dropout mask of a resumed run. A private generator keeps it out.
        self.loader = DataLoader(IndexedTensors(x, y), cfg.batch_size, sampler=self.sampler,
                                 num_workers=cfg.num_workers, persistent_workers=cfg.num_workers > 0,
                                 generator=torch.Generator().manual_seed(cfg.seed))

        self.model = MLP(784, cfg.hidden, 10, cfg.dropout).to(self.device)
        decay = [p for p in self.model.parameters() if p.ndim >= 2]  # no decay on biases and LayerNorm gains
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
        self.steps_per_epoch = math.ceil(len(y) / cfg.batch_size)
        self.scheduler = warmup_cosine(self.optimizer, cfg.warmup_steps, cfg.epochs * self.steps_per_epoch,
                                       cfg.min_lr_ratio)
        self.step, self.best_val, self.bad_epochs = 0, math.inf, 0

    # -- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                "step": self.step, "best_val": self.best_val, "bad_epochs": self.bad_epochs,
                "config": asdict(self.cfg), "rng": rng_state()}

    def load_state_dict(self, ckpt: dict, load_optimizer: bool = True) -> None:
        self.model.load_state_dict(ckpt["model"])
        if load_optimizer:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr  # a fresh optimizer would otherwise start at the warmup's first LR
        self.sampler.load_state_dict(ckpt["sampler"])
        self.step, self.best_val, self.bad_epochs = ckpt["step"], ckpt["best_val"], ckpt["bad_epochs"]
        set_rng_state(ckpt["rng"])  # last: nothing may draw from the RNGs between here and the next step

    def resume(self, path: Path, load_optimizer: bool = True) -> None:
        ckpt = load_checkpoint(path)
        try:
            self.load_state_dict(ckpt, load_optimizer)
        except (RuntimeError, ValueError, KeyError) as exc:  # load_state_dict lists missing/unexpected keys
            raise CheckpointError(f"checkpoint {path} does not match this run: {exc}") from None
        where = f"epoch {self.sampler.epoch + 1}, sample {self.sampler.position}/{self.sampler.n}"
        print(f"resumed from {path} at step {self.step} ({where})"
              + ("" if load_optimizer else " — model weights only, fresh optimizer"))

    def save(self, best: bool = False) -> None:
        self.metrics.flush()  # logs up to this step become durable together with the checkpoint
        self.writer.flush()
        save_checkpoint(self.state_dict(), self.run_dir, self.cfg.keep_last, best)

    def check_finite(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.step + 1}; lower --lr (now {self.cfg.lr:g})")

    # -- one optimizer step -----------------------------------------------------------------------------------
    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        self.model.train()
        logits = self.model(x)
        loss = F.cross_entropy(logits, y)
        self.check_finite(loss)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return {"loss": loss.item(), "acc": (logits.argmax(1) == y).float().mean().item(),
                "grad_norm": grad_norm.item()}

    # -- the loop ---------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg, start = self.cfg, self.step
        if start == 0 and (self.run_dir / "last.pt").exists():
            raise CheckpointError(f"{self.run_dir} already holds checkpoints: resume with "
                                  f"--resume {self.run_dir / 'last.pt'} or choose another --out")
        (self.run_dir / "config.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
        # Records past the checkpoint came from work that is now redone: drop them, from the logs too.
        kept = [r for r in read_metrics(self.run_dir) if r["step"] <= start and r["kind"] != "test"]
        atomic_write_text(self.run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        self.metrics = open(self.run_dir / "metrics.jsonl", "a")
        self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=start + 1)
        try:
            finished = self._loop()
            return self._final_report() if finished else {"step": self.step, "best_val": self.best_val}
        finally:
            self.metrics.close()
            self.writer.close()

    def _log(self, record: dict) -> None:
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()  # one write per line: a kill leaves at most one torn line, which readers skip

    def _loop(self) -> bool:
        """Train until the last epoch, early stopping or max_steps; False if stopped by max_steps."""
        cfg, n = self.cfg, self.sampler.n
        while self.sampler.epoch < cfg.epochs and self.bad_epochs < cfg.patience:
            epoch = self.sampler.epoch
            for x, y, idx in self.loader:
                lr = self.optimizer.param_groups[0]["lr"]
                out = self.train_step(x.to(self.device), y.to(self.device))
                self.sampler.advance(len(idx))  # only now do these samples count as consumed
                self.step += 1
                self._log({"kind": "train", "step": self.step, "epoch": epoch, "loss": out["loss"],
                           "loss_hex": out["loss"].hex(), "acc": out["acc"], "lr": lr,
                           "grad_norm": out["grad_norm"], "samples": idx.tolist()})
                for name in ("loss", "acc", "grad_norm"):
                    self.writer.add_scalar(f"train/{name}", out[name], self.step)
                self.writer.add_scalar("train/lr", lr, self.step)
                if self.step % cfg.log_every == 0:
                    print(f"step {self.step} epoch {epoch + 1} loss {out['loss']:.4f} lr {lr:.2e} "
                          f"grad_norm {out['grad_norm']:.3f}", flush=True)
                if self.step == cfg.max_steps:
                    self.save()
                    print(f"stopped at max_steps={cfg.max_steps}; resume with --resume {self.run_dir / 'last.pt'}")
                    return False
                if self.step % cfg.ckpt_every == 0 and self.sampler.position < n:  # the epoch end saves anyway
                    self.save()

            ev = evaluate(self.model, self.x_val, self.y_val, 2000)
            improved = ev["loss"] < self.best_val
            self.best_val = min(self.best_val, ev["loss"])
            self.bad_epochs = 0 if improved else self.bad_epochs + 1
            self.sampler.next_epoch()
            self._log({"kind": "val", "step": self.step, "epoch": epoch, "val_loss": ev["loss"],
                       "val_acc": ev["acc"], "best_val": self.best_val, "bad_epochs": self.bad_epochs})
            self.writer.add_scalar("val/loss", ev["loss"], self.step)
            self.writer.add_scalar("val/acc", ev["acc"], self.step)
            print(f"epoch {epoch + 1}/{cfg.epochs} val_loss {ev['loss']:.4f} val_acc {100 * ev['acc']:.2f}% "
                  f"{'(best)' if improved else f'(no improvement {self.bad_epochs}/{cfg.patience})'}", flush=True)
            self.save(best=improved)
        if self.bad_epochs >= cfg.patience:
            print(f"early stop: no better validation loss for {cfg.patience} epochs")
        return True

    def _final_report(self) -> dict:
        """The test set, touched once: best.pt's weights, loaded back from disk."""
        best = MLP(784, self.cfg.hidden, 10, self.cfg.dropout).to(self.device)
        best.load_state_dict(load_checkpoint(self.run_dir / "best.pt")["model"])
        x_test, y_test = mnist_tensors(train=False, device=self.device)
        ev = evaluate(best, x_test, y_test, 2000)
        print(f"best.pt (val_loss {self.best_val:.4f}): test_loss {ev['loss']:.4f} test_acc {100 * ev['acc']:.2f}%")
        report = {"kind": "test", "step": self.step, "best_val": self.best_val, "test_loss": ev["loss"],
                  "test_acc": ev["acc"]}
        self._log(report)
        return report


def train(cfg: Config, run_dir: Path, resume: Path | None = None, load_optimizer: bool = True) -> dict:
    trainer = Trainer(cfg, run_dir)
    if resume:
        trainer.resume(resume, load_optimizer)
    return trainer.fit()



def config_parser(cls) -> argparse.ArgumentParser:
    """A parent parser with one --flag per field of the config dataclass `cls`, defaulting to its default."""
    parser = argparse.ArgumentParser(add_help=False)
    for f in dataclasses.fields(cls):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return parser


def config_from_args(cls, args: argparse.Namespace, parser: argparse.ArgumentParser):
    try:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
    except ValueError as exc:  # the dataclass's own validation, reported as a usage error
        parser.error(str(exc))



def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common = config_parser(Config)
    sub = parser.add_subparsers(dest="command")
    tr = sub.add_parser("train", parents=[common], help="one training run (optionally resumed)")
    tr.add_argument("--out", type=Path, default=RUNS_DIR / "run", help="the run directory")
    tr.add_argument("--resume", type=Path, help="a checkpoint to continue from, e.g. <out>/last.pt")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "-h", "--help"):
        argv = ["train", *argv]
    args = parser.parse_args(argv)
    cfg = config_from_args(Config, args, parser)
    return train(cfg, args.out, args.resume)


if __name__ == "__main__":
    main(sys.argv[1:])
