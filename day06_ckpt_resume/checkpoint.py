"""Day 6's checkpoint files: RNG states that `torch.load(weights_only=True)` accepts, atomic writes that fail cleanly,
`last.pt`/`best.pt` kept right across kills, keep-last-N, and loads that fail with one message naming the file.

The order of a save is the whole design: write `ckpt-<step>.pt.tmp`, fsync it, rename it to `ckpt-<step>.pt`, point
`last.pt` at it, then `best.pt`, then delete old step files. A kill at any point leaves complete files only; the one
gap (a kill between `last.pt` and `best.pt`) is closed at the next resume by `repair_best`.
"""
import json
import os
import random
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from torch.utils.tensorboard import SummaryWriter

from sprint.cli import UserError, flag

# Flags that may differ between a checkpoint and the run that resumes it: they change when or where the run works,
# not what it computes (`epochs` stretches the cosine schedule over the new total from the next step on).
SAFE_TO_CHANGE = ("epochs", "patience", "max_steps", "num_workers", "threads", "device", "ckpt_every", "keep_last",
                  "log_every")
# Key prefixes that wrappers add to a state dict, and how to save without them.
WRAPPER_PREFIXES = {"module.": "DistributedDataParallel/DataParallel: save model.module.state_dict()",
                    "_orig_mod.": "torch.compile: save model._orig_mod.state_dict()"}


class CheckpointError(UserError, RuntimeError):
    """A checkpoint could not be written or read; the message names the file (an expected failure: exit 1)."""


# --- RNG states in forms weights_only loading accepts: tensors, ints, floats, tuples — no NumPy objects ---------
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


# --- writing ----------------------------------------------------------------------------------------------------
def fsync_dir(directory: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename itself durable (Windows cannot open a directory)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class _WriteErrorKeeper:
    """A file for torch.save that remembers the first OSError of a write: torch's zip writer swallows it and raises
    `RuntimeError: [enforce fail at inline_container.cc] unexpected pos` instead, which does not say "disk full"."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data):
        try:
            return self.f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self):
        self.f.flush()


def atomic_save(obj, path: Path) -> None:
    """torch.save to a temporary file next to `path`, fsync it, then os.replace: readers see old or new, never half.
    Any failure (disk full, file-size limit, I/O error, a failed rename) removes the temporary file and raises
    CheckpointError naming the file and the cause; the files already there are untouched."""
    tmp, keeper = path.with_name(path.name + ".tmp"), None
    try:
        with open(tmp, "wb") as f:
            keeper = _WriteErrorKeeper(f)
            torch.save(obj, keeper)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)  # atomic on POSIX and Windows when both names are in the same directory
        fsync_dir(path.parent)
    except (OSError, RuntimeError) as exc:
        tmp.unlink(missing_ok=True)  # on a full disk this frees the space the partial file took
        cause = keeper.error if keeper and keeper.error else exc
        raise CheckpointError(f"could not write checkpoint {path}: {cause}; last.pt still holds the previous "
                              "checkpoint") from exc


def atomic_link(src: Path, dst: Path) -> None:
    """Point `dst` at the same bytes as `src` (a hard link: no second write), switching atomically."""
    tmp = dst.with_name(dst.name + ".tmp")
    try:
        tmp.unlink(missing_ok=True)
        os.link(src, tmp)
        os.replace(tmp, dst)
        fsync_dir(dst.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not point {dst} at {src.name}: {exc}") from exc


def atomic_write_text(path: Path, text: str) -> None:
    """Replace a small text file (the metrics log) atomically; a kill leaves the old or the new version."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(payload: dict, run_dir: Path, keep_last: int, best: bool = False) -> Path:
    """Write ckpt-<step>.pt atomically, point last.pt (and best.pt) at it, and keep only the newest `keep_last`."""
    path = run_dir / f"ckpt-{payload['step']:08d}.pt"
    atomic_save(payload, path)
    atomic_link(path, run_dir / "last.pt")
    if best:  # a kill right here leaves best.pt one improvement behind: repair_best fixes it at the next resume
        atomic_link(path, run_dir / "best.pt")
    for old in sorted(run_dir.glob("ckpt-*.pt"))[:-keep_last]:  # zero-padded names sort by step
        old.unlink()  # last.pt/best.pt are separate links to their bytes, so they survive this
    return path


def clean_stale_tmp(run_dir: Path) -> list[Path]:
    """Remove temporary files left by a run that died mid-save (SIGKILL skips every `finally`)."""
    stale = sorted(Path(run_dir).glob("*.tmp"))
    for p in stale:
        p.unlink()
    return stale


def refuse_existing_run(run_dir: Path) -> None:
    if (Path(run_dir) / "last.pt").exists():
        raise CheckpointError(f"{run_dir} already holds checkpoints: resume with --resume {Path(run_dir) / 'last.pt'}"
                              " or choose another --out")


# --- reading ----------------------------------------------------------------------------------------------------
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


def newest_loadable(run_dir: Path, skip: Path | None = None) -> tuple[Path, int] | None:
    """(path, step) of the newest ckpt-*.pt in `run_dir` that loads, other than `skip` (or a link to it)."""
    for path in sorted(Path(run_dir).glob("ckpt-*.pt"), reverse=True):
        if skip is not None and Path(skip).exists() and os.path.samefile(path, skip):
            continue
        try:
            return path, load_checkpoint(path)["step"]
        except CheckpointError:
            continue
    return None


def load_for_resume(path: Path, cfg=None) -> dict:
    """The checkpoint to resume `cfg` from. Refuses an unreadable file (naming the newest loadable ckpt-*.pt beside
    it) and a checkpoint written with other settings (listing them): a changed --lr, --seed or --batch-size would
    otherwise be recorded in config.json while the restored optimizer, RNG and sampler state silently ignore it."""
    try:
        ckpt = load_checkpoint(path)
    except CheckpointError as exc:
        found = newest_loadable(Path(path).parent, skip=path)
        hint = f"; the newest loadable one there is {found[0]} (step {found[1]}): resume with --resume {found[0]}" \
            if found else ""
        raise CheckpointError(f"{exc}{hint}") from None
    saved, now = ckpt.get("config", {}), asdict(cfg) if cfg is not None else ckpt.get("config", {})
    changed = [f"{flag(k)} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(saved.keys() | now.keys())
               if k not in SAFE_TO_CHANGE and saved.get(k) != now.get(k)]
    if changed:
        raise CheckpointError(f"checkpoint {path} was written with other settings ({'; '.join(changed)}): drop "
                              f"those flags to resume with the checkpoint's values, or start a new run with another "
                              f"--out (only {', '.join(map(flag, SAFE_TO_CHANGE))} may change on resume)")
    return ckpt


def wrapper_hint(state_dict: dict) -> str:
    """Why a state dict's keys may not match the model: the prefix a wrapper added, if any."""
    return "".join(f" (its keys start with '{p}', as saved from {how})" for p, how in WRAPPER_PREFIXES.items()
                   if state_dict and all(k.startswith(p) for k in state_dict))


def repair_best(run_dir: Path, ckpt: dict, source: Path) -> str | None:
    """Make best.pt hold step `ckpt["best_step"]` again; returns what was done, or None if nothing was needed.
    Needed after a kill between re-linking last.pt and best.pt: the resumed state already counts that epoch as the
    best, so no later save would re-link best.pt and the final report would read a stale (or missing) file."""
    step, best = ckpt["best_step"], Path(run_dir) / "best.pt"
    if step == 0 or (best.exists() and load_checkpoint(best)["step"] == step):
        return None
    for candidate in (Path(run_dir) / f"ckpt-{step:08d}.pt", Path(source)):
        if candidate.exists() and load_checkpoint(candidate)["step"] == step:
            atomic_link(candidate, best)
            return f"re-linked best.pt to step {step}: the previous run died between saving last.pt and best.pt"
    # Only when resuming from an older checkpoint whose best file was pruned: the next improvement re-links it.
    return f"warning: best.pt does not hold step {step}, the best of {source}, and no file of that step is left"


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


class RunLog:
    """A run's metrics.jsonl and TensorBoard events, cut back to step `start` first: the steps after a checkpoint are
    redone by the resumed run, so the records the killed process wrote for them are dropped."""

    def __init__(self, run_dir: Path, start: int):
        kept = [r for r in read_metrics(run_dir) if r["step"] <= start and r["kind"] != "test"]
        atomic_write_text(Path(run_dir) / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(Path(run_dir) / "metrics.jsonl", "a")
        self.tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=start + 1)

    def record(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()  # one write per line: a kill leaves at most one torn line, which readers skip

    def scalars(self, prefix: str, values: dict, step: int) -> None:
        for name, value in values.items():
            self.tb.add_scalar(f"{prefix}/{name}", value, step)

    def flush(self) -> None:
        self.file.flush()
        self.tb.flush()

    def close(self) -> None:
        self.file.close()
        self.tb.close()
