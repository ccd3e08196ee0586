"""Day 6 — validation, checkpoints and a resume that is bit-for-bit exact, even after `kill -9`.

Day 4's MLP gets the loop a production run needs: a validation split carved from the training set, `metrics.jsonl`
and TensorBoard scalars, `best.pt` (on validation loss) and `last.pt` (every epoch and every N steps) written
atomically, early stopping, warmup + cosine LR, and `--resume`. A checkpoint holds everything the next step depends
on — model, optimizer, scheduler, the RNG states, the sampler's (epoch, seed, position) — so a run that is SIGKILLed
and resumed computes the very same losses, on the very same samples, as one that never stopped.

Run:    python day06_ckpt_resume/main.py     (the lesson: one run, the same run SIGKILLed 5 times and resumed; ~2 min)
        python day06_ckpt_resume/main.py train --out runs/day06_ckpt_resume/mine
        python day06_ckpt_resume/main.py train --out runs/day06_ckpt_resume/mine \
            --resume runs/day06_ckpt_resume/mine/last.pt
Gates:  python day06_ckpt_resume/check.py
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; must be set before CUDA starts

import argparse
import dataclasses
import json
import math
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.tensorboard import SummaryWriter

from day04_mlp_mnist.main import MLP, evaluate
from sprint.data import REPO_ROOT, mnist_tensors
from sprint.device import pick_device

OUT_DIR = Path(__file__).resolve().parent / "results"
RUNS_DIR = REPO_ROOT / "runs" / "day06_ckpt_resume"
SPLIT_SEED = 1234  # the train/validation split never changes, whatever the training seed


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


# ---------------------------------------------------------------------------------------------------------------
# Data: a fixed validation split, and a sampler whose whole state is (epoch, seed, position)
# ---------------------------------------------------------------------------------------------------------------
def split_mnist(val_size: int, train_subset: int = 0):
    """MNIST's 60,000 training images split once into train / validation; the test set stays for the end."""
    x, y = mnist_tensors(train=True)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = perm[:val_size], perm[val_size:]
    if train_subset:
        train = train[:train_subset]
    return (x[train], y[train]), (x[val], y[val])


class IndexedTensors(Dataset):
    """In-memory (x, y) pairs that also return their index, so every step can log which samples it saw."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


class ResumableSampler(Sampler[int]):
    """Epoch e visits randperm(n) drawn from its own `Generator().manual_seed(seed + e)` — never the global RNG,
    whose state depends on everything else the run did — starting at `position`, the number of samples already
    trained on. The training loop advances `position` only after a batch is used, so DataLoader prefetching
    cannot make a resumed run skip or replay a sample."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter(order[self.position:].tolist())

    def __len__(self) -> int:
        return self.n - self.position

    def advance(self, k: int) -> None:
        self.position += k

    def next_epoch(self) -> None:
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ValueError(f"the checkpoint's sampler ran over {state['n']} samples, this run has {self.n}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]


def warmup_cosine(optimizer, warmup_steps: int, total_steps: int, min_ratio: float):
    """Linear warmup to the peak LR, then a cosine down to peak * min_ratio (a LambdaLR, so it checkpoints)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# ---------------------------------------------------------------------------------------------------------------
# RNG states in forms `torch.load(weights_only=True)` accepts: tensors, ints, floats, tuples — no NumPy objects
# ---------------------------------------------------------------------------------------------------------------
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state() -> dict:
    _, keys, pos, has_gauss, gauss = np.random.get_state()  # ('MT19937', uint32[624], int, int, float)
    return {"python": random.getstate(),  # (version, tuple of 625 ints, None): plain Python values
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint files: atomic writes, keep-last-N, stale-temp cleanup, loads that fail loudly
# ---------------------------------------------------------------------------------------------------------------
class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message names the file."""


def _fsync_dir(directory: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename itself durable (Windows cannot open a directory)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temporary file next to `path`, fsync it, then os.replace: readers see old or new, never half."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
    except OSError as exc:  # disk full, quota, I/O error: drop the partial file, keep the old checkpoint
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not write checkpoint {path}: {exc}; the previous one is untouched") from exc
    os.replace(tmp, path)  # atomic on POSIX and Windows when both names are in the same directory
    _fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace a small text file (the metrics log) atomically; a kill leaves the old or the new version."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _atomic_link(src: Path, dst: Path) -> None:
    """Point `dst` at the same bytes as `src` (a hard link: no second write), switching atomically."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    os.link(src, tmp)
    os.replace(tmp, dst)
    _fsync_dir(dst.parent)


def save_checkpoint(payload: dict, run_dir: Path, keep_last: int, best: bool = False) -> Path:
    """Write ckpt-<step>.pt atomically, point last.pt (and best.pt) at it, and keep only the newest `keep_last`."""
    path = run_dir / f"ckpt-{payload['step']:08d}.pt"
    atomic_save(payload, path)
    _atomic_link(path, run_dir / "last.pt")
    if best:
        _atomic_link(path, run_dir / "best.pt")
    for old in sorted(run_dir.glob("ckpt-*.pt"))[:-keep_last]:  # zero-padded names sort by step
        old.unlink()  # last.pt/best.pt are separate links to their bytes, so they survive this
    return path


def clean_stale_tmp(run_dir: Path) -> list[Path]:
    """Remove temporary files left by a run that died mid-save (SIGKILL skips every `finally`)."""
    stale = sorted(Path(run_dir).glob("*.tmp"))
    for p in stale:
        p.unlink()
    return stale


def load_checkpoint(path: Path) -> dict:
    """torch.load with weights_only=True (no code runs from the file), after checking the zip's CRC-32s:
    torch.load itself does not, so a flipped bit in a tensor would otherwise load silently."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        with zipfile.ZipFile(path) as zf:
            bad_member = zf.testzip()
        if bad_member is not None:
            raise CheckpointError(f"checkpoint {path} is corrupted: CRC mismatch in {bad_member}")
        return torch.load(path, map_location="cpu", weights_only=True)
    except CheckpointError:
        raise
    except Exception as exc:  # truncated zip, bad pickle, forbidden global: one message that names the file
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated, corrupted or not a weights-only "
                              f"checkpoint): {type(exc).__name__}: {first_line}") from None


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of `metrics.jsonl`, skipping a torn last line (a run killed mid-write)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


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


# ---------------------------------------------------------------------------------------------------------------
# Proving it: SIGKILL a real training process, resume it, compare with a run that never stopped
# ---------------------------------------------------------------------------------------------------------------
def config_args(cfg: Config) -> list[str]:
    """`cfg` as command-line flags for `main.py train`."""
    return [arg for f in dataclasses.fields(cfg)
            for arg in (f"--{f.name.replace('_', '-')}", str(getattr(cfg, f.name)))]


def launch(cfg: Config, run_dir: Path, resume: Path | None = None, kill_at: int | None = None,
           timeout: float = 600) -> dict:
    """Run `main.py train` in a subprocess. With `kill_at`, SIGKILL it (and its DataLoader workers: the whole
    process group) as soon as it reports that step; the kill lands wherever the trainer is by then."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "train", "--out", str(run_dir),
           *config_args(dataclasses.replace(cfg, log_every=1))]  # every step reported: the kill can be precise
    if resume:
        cmd += ["--resume", str(resume)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    watchdog = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    lines, last_step = [], 0
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(r"step (\d+) ", line):
                last_step = int(m.group(1))
            if kill_at is not None and last_step >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)  # no handler, no finally: exactly like the OOM killer
                break
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        proc.stdout.close()
    killed = returncode == -signal.SIGKILL
    if killed != (kill_at is not None and last_step >= kill_at):
        raise RuntimeError(f"`main.py train` exited with {returncode} (kill_at={kill_at}, last step {last_step}):\n"
                           + "".join(lines[-20:]))
    return {"killed": killed, "last_step": last_step, "output": "".join(lines)}


def kill_and_resume(cfg: Config, run_dir: Path, kill_at: list[int]) -> list[dict]:
    """Start a run, SIGKILL it at each step in `kill_at` in turn, resuming from last.pt after every kill, and let
    the last process finish. Returns one segment per process: where it resumed, where it died, and the metrics
    records as they were on disk right after it ended (before the next process trims them)."""
    segments = []
    for k in [*kill_at, None]:
        last = Path(run_dir) / "last.pt"
        ckpt = load_checkpoint(last) if last.exists() else None  # killed before its first checkpoint: start over
        run = launch(cfg, run_dir, last if ckpt else None, k)
        segments.append({"kill_at": k, "died_after_step": run["last_step"] if run["killed"] else None,
                         "resumed_from": ckpt["step"] if ckpt else 0,
                         "resumed_mid_epoch": bool(ckpt and ckpt["sampler"]["position"] > 0),
                         "stale_tmp_files": sorted(p.name for p in Path(run_dir).glob("*.tmp")),
                         "records": read_metrics(run_dir)})
    return segments


def diff_states(a, b, path: str = "") -> list[str]:
    """Every place where two checkpoint payloads differ, compared bitwise (tensors: dtype, shape and bytes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))} differ"]
        return [d for k in a for d in diff_states(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff_states(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = (a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
        return [] if same else [f"{path}: tensors differ"]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a.hex() == b.hex() else [f"{path}: {a!r} != {b!r}"]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def compare_runs(reference: Path, resumed: Path, segments: list[dict]) -> dict:
    """Figures for "the killed-and-resumed run is the uninterrupted run", all compared bitwise."""
    ref = {r["step"]: r for r in read_metrics(reference) if r["kind"] == "train"}
    # Every step any process of the chain computed, including steps computed again after a kill.
    computed = [r for s in segments for r in s["records"] if r["kind"] == "train" and r["step"] > s["resumed_from"]]
    state_keys = ("model", "optimizer", "scheduler", "sampler", "rng", "step", "best_val", "bad_epochs")
    ref_ckpt, res_ckpt = load_checkpoint(reference / "last.pt"), load_checkpoint(resumed / "last.pt")
    return {
        "steps_reference": len(ref),
        "steps_computed": len(computed),
        "steps_never_computed": len(ref.keys() - {r["step"] for r in computed}),
        "loss_mismatches": sum(r["loss_hex"] != ref[r["step"]]["loss_hex"] for r in computed),
        "sample_mismatches": sum(r["samples"] != ref[r["step"]]["samples"] for r in computed),
        "max_abs_loss_diff": max(abs(r["loss"] - ref[r["step"]]["loss"]) for r in computed),
        "final_log_equal": read_metrics(resumed) == read_metrics(reference),  # train and val records, every field
        "state_diffs": diff_states({k: ref_ckpt[k] for k in state_keys}, {k: res_ckpt[k] for k in state_keys}),
    }


def steps_per_epoch(cfg: Config) -> int:
    n_train = cfg.train_subset or 60000 - cfg.val_size  # MNIST has 60,000 training images
    return math.ceil(n_train / cfg.batch_size)


def random_kill_points(total_steps: int, n: int, seed: int, first: int) -> list[int]:
    """n random steps in [first, total_steps), one in the middle of each of n equal slices (so they are spread)."""
    rng, width = random.Random(seed), (total_steps - first) / n
    return [first + int(width * (i + rng.uniform(0.2, 0.8))) for i in range(n)]


def model_only_resume(cfg: Config, work_dir: Path, at_step: int, n_steps: int) -> dict:
    """Resume at `at_step` twice — with the optimizer state, and with the model weights only — and return the next
    `n_steps` losses of both next to those of a run that never stopped."""
    work_dir = Path(work_dir)
    uninterrupted = dataclasses.replace(cfg, max_steps=at_step + n_steps)
    train(uninterrupted, work_dir / "uninterrupted")
    train(dataclasses.replace(cfg, max_steps=at_step), work_dir / "stopped")
    losses = {}
    for name, load_optimizer in (("full", True), ("model_only", False)):
        shutil.copytree(work_dir / "stopped", work_dir / name)
        train(uninterrupted, work_dir / name, resume=work_dir / name / "last.pt", load_optimizer=load_optimizer)
        losses[name] = [r["loss"] for r in read_metrics(work_dir / name) if r["kind"] == "train"][at_step:]
    losses["uninterrupted"] = [r["loss"] for r in read_metrics(work_dir / "uninterrupted")
                               if r["kind"] == "train"][at_step:]
    ref = losses["uninterrupted"]
    return {"at_step": at_step, **{f"{k}_losses": v for k, v in losses.items()},
            **{f"{k}_max_abs_diff": max(abs(a - b) for a, b in zip(losses[k], ref)) for k in ("full", "model_only")}}


def plot_overlay(reference: Path, chains: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ref = {r["step"]: r["loss"] for r in read_metrics(reference) if r["kind"] == "train"}
    fig, axes = plt.subplots(len(chains) + 1, 1, figsize=(10, 3 * len(chains) + 2), sharex=True,
                             height_ratios=[3] * len(chains) + [1.2])
    for ax, (workers, chain) in zip(axes, chains.items()):
        ax.plot(list(ref), list(ref.values()), color="0.75", lw=4, label="uninterrupted run")
        for i, s in enumerate(chain["segments"]):
            mine = [r for r in s["records"] if r["kind"] == "train" and r["step"] > s["resumed_from"]]
            start = f"resumed at step {s['resumed_from']}" if s["resumed_from"] else "fresh start"
            end = f"SIGKILLed after step {s['died_after_step']}" if s["died_after_step"] else "ran to the end"
            steps = [r["step"] for r in mine]
            ax.plot(steps, [r["loss"] for r in mine], lw=0.9, label=f"process {i + 1}: {start}, {end}")
            axes[-1].plot(steps, [r["loss"] - ref[r["step"]] for r in mine], ".", ms=2)
            if s["died_after_step"]:
                ax.axvline(s["died_after_step"], color="red", ls=":", lw=1)
        ax.set(title=f"num_workers={workers}: each process of the killed run over the uninterrupted run "
                     "(red: SIGKILL)", ylabel="training loss", yscale="log")
        ax.legend(fontsize=7)
    axes[-1].set(xlabel="global step", ylabel="resumed − uninterrupted", title="loss difference, all processes")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def repo_relative(path: Path) -> str:
    """`path` relative to the repo when it lies inside it, so committed summaries hold no machine-specific paths."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def demo(cfg: Config, kill_at: dict[int, list[int]], out: Path, runs: Path) -> dict:
    """The lesson end to end: an uninterrupted run and, for each num_workers setting, the same run SIGKILLed at
    the steps in `kill_at[num_workers]` and resumed — all three at once, one per core; then the comparison, the
    overlay plot, and what resuming without the optimizer state does."""
    shutil.rmtree(runs, ignore_errors=True)
    cfg = dataclasses.replace(cfg, threads=cfg.threads or 1)  # three runs share the cores: one thread each
    print(f"an uninterrupted run, and the same run SIGKILLed at steps {kill_at} (per num_workers) and resumed ...")
    chain_cfgs = {w: dataclasses.replace(cfg, num_workers=w) for w in kill_at}
    with ThreadPoolExecutor(len(kill_at) + 1) as pool:
        ref_job = pool.submit(launch, cfg, runs / "uninterrupted")
        jobs = {w: pool.submit(kill_and_resume, c, runs / f"killed-w{w}", kill_at[w]) for w, c in chain_cfgs.items()}
        ref_job.result()
        chains = {w: {"run_dir": repo_relative(runs / f"killed-w{w}"), "kill_at": kill_at[w], "segments": job.result()}
                  for w, job in jobs.items()}
    for w, chain in chains.items():
        chain.update(compare_runs(runs / "uninterrupted", runs / f"killed-w{w}", chain["segments"]))
        path = " -> ".join(f"{s['resumed_from']}..{s['died_after_step'] or 'end'}" for s in chain["segments"])
        print(f"num_workers={w}: processes ran steps {path}; of {chain['steps_computed']} steps computed, "
              f"{chain['loss_mismatches']} losses and {chain['sample_mismatches']} batches differ from the "
              f"uninterrupted run; final state entries that differ: {len(chain['state_diffs'])}")
    out.mkdir(parents=True, exist_ok=True)
    plot_overlay(runs / "uninterrupted", chains, out / "resume_overlay.png")

    at = steps_per_epoch(cfg) * 3 // 2  # mid-way through the second epoch
    print(f"resuming at step {at} with and without the optimizer state ...")
    opt = model_only_resume(cfg, runs / "model_only", at, n_steps=20)
    print(f"max |loss - uninterrupted| over the next 20 steps: full state {opt['full_max_abs_diff']:.3g}, "
          f"model weights only {opt['model_only_max_abs_diff']:.3g}")
    write_optimizer_table(opt, out / "optimizer_state.md")
    for chain in chains.values():
        for s in chain["segments"]:
            del s["records"]
    test = next(r for r in read_metrics(runs / "uninterrupted") if r["kind"] == "test")
    summary = {"config": asdict(cfg), "reference": repo_relative(runs / "uninterrupted"), "reference_test": test,
               "chains": chains, "model_only": opt}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'resume_overlay.png'}, optimizer_state.md and summary.json")
    return summary


def write_optimizer_table(opt: dict, path: Path) -> None:
    rows = ["| step | uninterrupted | resumed with optimizer state | resumed with model weights only |",
            "| ---: | ---: | ---: | ---: |"]
    for i, (u, f, m) in enumerate(zip(opt["uninterrupted_losses"], opt["full_losses"], opt["model_only_losses"])):
        rows.append(f"| {opt['at_step'] + i + 1} | {u:.6f} | {f:.6f} | {m:.6f} |")
    rows.append(f"| max abs diff | — | {opt['full_max_abs_diff']:.3g} | {opt['model_only_max_abs_diff']:.3g} |")
    path.write_text("\n".join(rows) + "\n")


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
    dm = sub.add_parser("demo", parents=[common], help="(default) uninterrupted vs killed-and-resumed runs")
    dm.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers of each killed chain")
    dm.add_argument("--kills", type=int, nargs="+", default=[2, 3], help="SIGKILLs per chain, one per --workers")
    dm.add_argument("--out", type=Path, default=OUT_DIR, help="where the plot and tables go")
    dm.add_argument("--runs", type=Path, default=RUNS_DIR / "demo", help="where the runs go (wiped first)")
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("train", "demo", "-h", "--help"):
        argv = ["demo", *argv]  # plain `python main.py [flags]` runs the demo
    args = parser.parse_args(argv)
    cfg = config_from_args(Config, args, parser)
    if args.command == "train":
        return train(cfg, args.out, args.resume)
    if len(args.kills) != len(args.workers):
        parser.error("give one --kills count per --workers value")
    total = cfg.epochs * steps_per_epoch(cfg)
    kill_at = {w: random_kill_points(total, k, cfg.seed + w, cfg.ckpt_every + 1)
               for w, k in zip(args.workers, args.kills)}
    return demo(cfg, kill_at, args.out, args.runs)


if __name__ == "__main__":
    main(sys.argv[1:])
