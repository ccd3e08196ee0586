"""Day 6 — validation, checkpoints and a resume that is bit-for-bit exact, even after `kill -9`.

Day 4's MLP gets the loop a production run needs: a validation split, `metrics.jsonl` and TensorBoard scalars,
`best.pt` (lowest validation loss) and `last.pt` (every epoch and every N steps) written atomically, early stopping,
warmup + cosine LR, and `--resume`. A checkpoint holds everything the next step depends on — model, optimizer,
scheduler, RNG states, the sampler's (epoch, seed, position) — so a run that is SIGKILLed and resumed computes the
very same losses, on the very same samples, as one that never stopped. Ctrl-C (SIGINT) or SIGTERM finishes the step,
saves and exits. The file-level safety lives in `checkpoint.py`, the data order in `sampler.py`.

Run:    python day06_ckpt_resume/main.py                          # a run in runs/day06_ckpt_resume/run-<date-time>/
        python day06_ckpt_resume/main.py --resume runs/day06_ckpt_resume/run-<date-time>/last.pt
Proof:  python day06_ckpt_resume/prove_resume.py                  # the same run SIGKILLed 5 times and resumed
Gates:  python day06_ckpt_resume/check.py
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; must be set before CUDA starts

import argparse
import json
import math
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from day04_mlp_mnist.main import MLP, evaluate
from day06_ckpt_resume.checkpoint import (CheckpointError, RunLog, clean_stale_tmp, load_checkpoint, load_for_resume,
                                          refuse_existing_run, repair_best, rng_state, save_checkpoint, seed_everything,
                                          set_rng_state, wrapper_hint)
from day06_ckpt_resume.sampler import IndexedTensors, ResumableSampler
from sprint import runs_dir
from sprint.cli import arg, from_args, parser_for, progress, run, unwritable, validate
from sprint.data import mnist_split, mnist_tensors
from sprint.device import pick_device

MNIST_TRAIN = 60_000


@dataclass
class Config:
    seed: int = arg(0, "seed of the initial weights, Dropout masks and data order", ge=0)
    epochs: int = arg(3, "passes over the training split", gt=0)
    batch_size: int = arg(128, "samples per optimizer step", gt=0)
    lr: float = arg(2e-3, "peak learning rate, reached after the warmup", gt=0)
    weight_decay: float = arg(0.05, "AdamW weight decay on the weight matrices (not on biases or LayerNorm)", ge=0)
    warmup_steps: int = arg(100, "steps of linear warmup before the cosine decay", ge=0)
    min_lr_ratio: float = arg(0.05, "the cosine decays to lr * this", ge=0, le=1)
    grad_clip: float = arg(1.0, "max global gradient norm (clip_grad_norm_)", gt=0)
    hidden: int = arg(256, "hidden units of the MLP", gt=0)
    dropout: float = arg(0.1, "Dropout probability; its masks draw from the global torch RNG", ge=0, lt=1)
    val_size: int = arg(5000, "training images held out for validation", gt=0, lt=MNIST_TRAIN)
    train_subset: int = arg(0, "train on the first N of the remaining images; 0: all of them", ge=0)
    num_workers: int = arg(0, "DataLoader worker processes", ge=0, le=256)
    ckpt_every: int = arg(200, "steps between mid-epoch checkpoints (every epoch end saves too)", gt=0)
    keep_last: int = arg(3, "step checkpoints kept on disk (>= 2: the newest may be half-written)", ge=2)
    patience: int = arg(3, "epochs without a better validation loss before early stopping", gt=0)
    max_steps: int = arg(0, "save and stop after this global step; 0: no limit", ge=0)
    threads: int = arg(0, "torch threads; 0: torch's default (bitwise results need a fixed one)", ge=0, le=256)
    device: str = arg("", "cpu, cuda, cuda:N or mps; empty: cuda, then mps, then cpu")
    log_every: int = arg(50, "steps between log lines", gt=0)

    def __post_init__(self):
        validate(self)
        if self.train_subset > MNIST_TRAIN - self.val_size:  # the images --val-size leaves for training
            raise ValueError(f"--train-subset must be <= {MNIST_TRAIN - self.val_size}, got {self.train_subset}")


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """Linear warmup to the peak LR, then a cosine down to peak * min_ratio (a LambdaLR, so it checkpoints)."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's two parameter groups: the weight matrices decayed, the biases and LayerNorm's gains and shifts (the
    1-D tensors) not. Pulling those toward 0 does not regularise; it only fights the scale and shift they learn."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]


class Trainer:
    """One training run in `run_dir`: config.json, metrics.jsonl, tb/, ckpt-*.pt, last.pt, best.pt."""

    COUNTERS = ("step", "best_val", "best_step", "bad_epochs")  # checkpointed with the model, optimizer, RNG...

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
        (x, y), (self.x_val, self.y_val) = mnist_split(cfg.val_size, train_subset=cfg.train_subset or None)
        self.x_val, self.y_val = self.x_val.to(self.device), self.y_val.to(self.device)
        self.sampler = ResumableSampler(len(y), cfg.seed)
        # DataLoader draws its workers' base seed at every iter(): from the global RNG unless given a generator,
        # which would shift every later Dropout mask of a resumed run. A private generator keeps it out.
        self.loader = DataLoader(IndexedTensors(x, y), cfg.batch_size, sampler=self.sampler,
                                 num_workers=cfg.num_workers, persistent_workers=cfg.num_workers > 0,
                                 generator=torch.Generator().manual_seed(cfg.seed))
        self.model = self.build_model().to(self.device)
        self.optimizer = torch.optim.AdamW(decay_groups(self.model, cfg.weight_decay), lr=cfg.lr)
        self.steps_per_epoch = math.ceil(len(y) / cfg.batch_size)
        self.scheduler = warmup_cosine(self.optimizer, cfg.warmup_steps, cfg.epochs * self.steps_per_epoch,
                                       cfg.min_lr_ratio)
        self.step, self.best_val, self.best_step, self.bad_epochs = 0, math.inf, 0, 0
        self.stop_signal = None  # set by SIGINT/SIGTERM: finish the step, save, exit

    def build_model(self) -> torch.nn.Module:
        return MLP(784, self.cfg.hidden, 10, self.cfg.dropout)

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "sampler": self.sampler.state_dict(),
                **{k: getattr(self, k) for k in self.COUNTERS}, "config": asdict(self.cfg), "rng": rng_state()}

    def load_state_dict(self, ckpt: dict, load_optimizer: bool = True) -> None:
        self.model.load_state_dict(ckpt["model"])
        if load_optimizer:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        for group, lr in zip(self.optimizer.param_groups, self.scheduler.get_last_lr()):
            group["lr"] = lr  # a fresh optimizer would otherwise start at the warmup's first LR
        self.sampler.load_state_dict(ckpt["sampler"])
        self.step, self.best_val, self.best_step, self.bad_epochs = (ckpt[k] for k in self.COUNTERS)
        set_rng_state(ckpt["rng"])  # last: nothing may draw from the RNGs between here and the next step

    def resume(self, path: Path, ckpt: dict | None = None, load_optimizer: bool = True) -> None:
        ckpt = ckpt if ckpt is not None else load_for_resume(path, self.cfg)
        try:
            self.load_state_dict(ckpt, load_optimizer)
        except (RuntimeError, ValueError, KeyError) as exc:  # load_state_dict lists missing/unexpected keys
            raise CheckpointError(f"checkpoint {path} does not match this run{wrapper_hint(ckpt.get('model'))}: "
                                  f"{exc}") from None
        if note := repair_best(self.run_dir, ckpt, path):
            print(note)
        print(f"resumed from {path} at step {self.step} (epoch {self.sampler.epoch + 1}, sample {self.sampler.position}"
              f"/{self.sampler.n}){'' if load_optimizer else ' — model weights only, fresh optimizer'}")

    def save(self, best: bool = False) -> None:
        self.log.flush()  # logs up to this step become durable together with the checkpoint
        save_checkpoint(self.state_dict(), self.run_dir, self.cfg.keep_last, best)

    def check_finite(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {self.step + 1}; lower --lr (now {self.cfg.lr:g})")

    # -- one optimizer step, one validation ---------------------------------------------------------------------
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

    def validate(self) -> dict:
        ev = evaluate(self.model, self.x_val, self.y_val, 2000)
        return {"val_loss": ev["loss"], "val_acc": ev["acc"]}

    # -- the loop ---------------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train to the end, early stop or max_steps, then report; SIGINT/SIGTERM: save, raise KeyboardInterrupt."""
        if self.step == 0:
            refuse_existing_run(self.run_dir)
        (self.run_dir / "config.json").write_text(json.dumps(asdict(self.cfg), indent=2) + "\n")
        self.log = RunLog(self.run_dir, self.step)
        on_main = threading.current_thread() is threading.main_thread()  # only there can signals be handled
        handlers = {s: signal.signal(s, self._stop_soon) for s in (signal.SIGINT, signal.SIGTERM)} if on_main else {}
        try:
            if self._loop():
                return self._final_report()
            if self.stop_signal:
                raise KeyboardInterrupt
            return {"step": self.step, "best_val": self.best_val}
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)
            self.log.close()

    def _stop_soon(self, signum, frame) -> None:
        self.stop_signal = signal.Signals(signum).name
        signal.signal(signum, signal.default_int_handler)  # a second Ctrl-C stops at once, without saving

    def _loop(self) -> bool:
        """Train until the last epoch or early stopping (True), or max_steps or a stop signal (False)."""
        cfg, n = self.cfg, self.sampler.n
        bar = progress(total=cfg.epochs * self.steps_per_epoch, initial=self.step, unit="step")
        try:
            while self.sampler.epoch < cfg.epochs and self.bad_epochs < cfg.patience:
                epoch = self.sampler.epoch
                for x, y, idx in self.loader:
                    lr = self.optimizer.param_groups[0]["lr"]
                    out = self.train_step(x.to(self.device), y.to(self.device))
                    self.sampler.advance(len(idx))  # only now do these samples count as consumed
                    self.step += 1
                    self.log.record({"kind": "train", "step": self.step, "epoch": epoch, "loss": out["loss"],
                               "loss_hex": out["loss"].hex(), "acc": out["acc"], "lr": lr,
                               "grad_norm": out["grad_norm"], "samples": idx.tolist()})
                    self.log.scalars("train", {**out, "lr": lr}, self.step)
                    bar.update()
                    bar.set_postfix(epoch=epoch + 1, loss=f"{out['loss']:.4f}", refresh=False)
                    if self.step % cfg.log_every == 0:
                        bar.write(f"step {self.step} epoch {epoch + 1} loss {out['loss']:.4f} lr {lr:.2e} "
                                  f"grad_norm {out['grad_norm']:.3f}")
                    if self.step == cfg.max_steps or self.stop_signal:
                        self.save()
                        why = self.stop_signal or f"max_steps={cfg.max_steps}"
                        bar.write(f"stopped at step {self.step} ({why}), checkpoint saved; resume with "
                                  f"--resume {self.run_dir / 'last.pt'}")
                        return False
                    if self.step % cfg.ckpt_every == 0 and self.sampler.position < n:  # the epoch end saves anyway
                        self.save()
                bar.write(self._end_epoch(epoch))
        finally:
            bar.close()
        return True

    def _end_epoch(self, epoch: int) -> str:
        ev = self.validate()
        improved = ev["val_loss"] < self.best_val
        if improved:
            self.best_val, self.best_step = ev["val_loss"], self.step
        self.bad_epochs = 0 if improved else self.bad_epochs + 1
        self.sampler.next_epoch()
        self.log.record({"kind": "val", "step": self.step, "epoch": epoch, **ev, "best_val": self.best_val,
                         "bad_epochs": self.bad_epochs})
        self.log.scalars("val", {"loss": ev["val_loss"], "acc": ev["val_acc"]}, self.step)
        self.save(best=improved)
        return (f"epoch {epoch + 1}/{self.cfg.epochs} val_loss {ev['val_loss']:.4f} val_acc {100 * ev['val_acc']:.2f}% "
                + ("(best)" if improved else f"(no improvement {self.bad_epochs}/{self.cfg.patience})")
                + (": early stop" if self.bad_epochs >= self.cfg.patience else ""))

    def _final_report(self) -> dict:
        """The test set, touched once: best.pt's weights, loaded back from disk."""
        best = self.build_model().to(self.device)
        best.load_state_dict(load_checkpoint(self.run_dir / "best.pt")["model"])
        x_test, y_test = mnist_tensors(train=False, device=self.device)
        ev = evaluate(best, x_test, y_test, 2000)
        print(f"best.pt (val_loss {self.best_val:.4f}): test_loss {ev['loss']:.4f} test_acc {100 * ev['acc']:.2f}%")
        report = {"kind": "test", "step": self.step, "best_val": self.best_val, "best_step": self.best_step,
                  "test_loss": ev["loss"], "test_acc": ev["acc"]}
        self.log.record(report)
        return report


def train(cfg: Config, run_dir: Path, resume: Path | None = None, load_optimizer: bool = True) -> dict:
    """One run in `run_dir`, fresh or resumed. What can be refused (an existing run, an unreadable or mismatched
    checkpoint) is refused before the data is loaded."""
    if resume is None:
        refuse_existing_run(run_dir)
    ckpt = load_for_resume(resume, cfg) if resume else None
    trainer = Trainer(cfg, run_dir)
    if resume:
        trainer.resume(resume, ckpt, load_optimizer)
    return trainer.fit()


def main(argv=None) -> dict:
    parser = parser_for(Config, __doc__)
    parser.add_argument("--out", type=Path, default=argparse.SUPPRESS,
                        help="run folder (default: runs/day06_ckpt_resume/run-<date-time>; with --resume: its folder)")
    parser.add_argument("--resume", type=Path, default=argparse.SUPPRESS,
                        help="checkpoint to continue from, e.g. <run folder>/last.pt")
    args = parser.parse_args(argv)
    cfg = from_args(Config, args, parser)
    resume, out = getattr(args, "resume", None), getattr(args, "out", None)
    if resume and not resume.is_file():
        parser.error(f"--resume {resume}: no such file")
    if resume and out and out.resolve() != resume.parent.resolve():
        parser.error(f"--out {out}: a resumed run continues in the folder of its checkpoint ({resume.parent})")
    out = resume.parent if resume else out or runs_dir(__file__, time.strftime("run-%Y%m%d-%H%M%S"))
    if why := unwritable(out):
        parser.error(f"--out {out}: {why}")
    if resume:  # flags not given take the checkpoint's values; load_for_resume refuses those given differently
        parser.set_defaults(**{k: v for k, v in load_for_resume(resume)["config"].items() if k in vars(args)})
        cfg = from_args(Config, parser.parse_args(argv), parser)
    return train(cfg, out, resume)


if __name__ == "__main__":
    run(main)
