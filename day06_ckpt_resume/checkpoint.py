"""Checkpoint files for Day 6: RNG states that `torch.load(weights_only=True)` accepts, atomic writes, keep-last-N,
stale-temp cleanup, and loads that fail loudly with the file's name."""
import json
import os
import random
import zipfile
from pathlib import Path

import numpy as np
import torch


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
