"""Checkpoint files on disk: atomic writes, last/best links that cannot go stale, step names, pruning, cleaning up."""
import os
import re
import shutil
import sys
from pathlib import Path

import torch

# The checkpoint layout's version; another one is refused in one line. 2: a config table per model, the task's metrics;
# 3: the run's id, its data's fingerprint; 4: a config table per dataset.
FORMAT = "day12-template/4"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message names the file and says what is intact."""


# -- writing -----------------------------------------------------------------------------------------------------


def fsync_dir(directory: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename itself durable
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def atomic_save(obj, path: Path) -> None:
    """torch.save to `<path>.tmp` next to `path`, fsync, os.replace: a reader sees the old file or the new one.
    Any failure (disk full: torch's zip writer reports ENOSPC/EFBIG as a RuntimeError; a failing rename) removes
    the partial file and raises CheckpointError; the previous checkpoint is untouched."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except (OSError, RuntimeError) as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not write checkpoint {path} ({reason(exc)}); is the disk full? The previous "
                              f"checkpoint is intact: {path.parent / 'last.pt'}") from None


def link(src: Path, dst: Path) -> None:
    """Point `dst` at `src`, switching atomically: a hard link to a file, a relative symbolic link to a folder."""
    tmp = dst.with_name(dst.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        if dst.is_dir() and not dst.is_symlink():  # a copy of the folder (`cp -rL`): a link replaces it
            shutil.rmtree(dst)
        if src.is_dir():
            os.symlink(os.path.relpath(src, dst.parent), tmp)
        else:
            os.link(src, tmp)
        os.replace(tmp, dst)
        fsync_dir(dst.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not point {dst.name} at {src.name} ({reason(exc)})") from None


def remove(path: Path) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's folder (not what a link to it points at)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def fsync_tree(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    fsync_dir(folder)


def copy(src: Path, dst: Path) -> None:
    """Copy `src` (another folder's checkpoint, a file or a sharded folder) to `dst` like `atomic_save`: `<dst>.tmp`,
    fsync, os.replace."""
    src = Path(src).resolve()
    tmp = dst.with_name(dst.name + ".tmp")
    try:
        remove(tmp)
        if src.is_dir():
            shutil.copytree(src, tmp)
            fsync_tree(tmp)
        else:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dst)
        fsync_dir(dst.parent)
    except OSError as exc:
        remove(tmp)
        raise CheckpointError(f"could not copy {src} to {dst} ({reason(exc)}); is the disk full?") from None


def step_name(step: int, sharded: bool) -> str:
    return f"ckpt-{step:08d}" if sharded else f"ckpt-{step:08d}.pt"


STEP_FILE = re.compile(r"ckpt-(\d{8})(\.pt|\.(\d+))?")  # ckpt-<step>.pt, ckpt-<step>/ or ckpt-<step>.<n>/ (saved again)


def _order(path: Path) -> tuple[int, int]:
    match = STEP_FILE.fullmatch(path.name)
    return int(match.group(1)), int(match.group(3) or 0)


def step_files(run_dir: Path, step: int | None = None) -> list[Path]:
    """ckpt-<step>.pt files and ckpt-<step>[.<n>]/ folders (of `step`, if given), oldest first (a run may switch
    format on resume, and save a step again after a resume)."""
    found = sorted((p for p in Path(run_dir).glob("ckpt-*") if STEP_FILE.fullmatch(p.name)), key=_order)
    return [p for p in found if step is None or _order(p)[0] == step]


UNREMOVABLE: set[Path] = set()  # old checkpoints this process could not remove, each warned about once


def link_and_prune(path: Path, run_dir: Path, keep_last: int) -> Path:
    link(path, run_dir / "last.pt")
    linked = {(run_dir / name).resolve() for name in ("best.pt", "last.pt")}
    for old in step_files(run_dir)[:-keep_last]:
        if not (old.is_dir() and old.resolve() in linked):  # a folder a link points to stays (a file's bytes do)
            try:
                remove(old)
            except OSError as exc:  # housekeeping: the run goes on, and each later save tries again
                if old not in UNREMOVABLE:  # said once
                    UNREMOVABLE.add(old)
                    print(f"warning: could not remove the old checkpoint {old} ({reason(exc)}); the newest, "
                          f"{path.name}, is intact", file=sys.stderr)
    return path


def save(payload: dict, run_dir: Path, keep_last: int) -> Path:
    """Write ckpt-<step>.pt, link last.pt to it, delete all but the newest `keep_last`."""
    path = run_dir / step_name(payload["step"], sharded=False)
    atomic_save(payload, path)
    return link_and_prune(path, run_dir, keep_last)


def link_best(run_dir: Path, step: int) -> None:
    """Point best.pt at this folder's newest checkpoint of `step` (its file, or its sharded folder)."""
    link(step_files(run_dir, step)[-1], Path(run_dir) / "best.pt")


TEMPORARY = re.compile(r"(ckpt-\d{8}(\.pt|\.\d+)?|last\.pt|best\.pt|config\.toml|run\.json|metrics\.jsonl|meta\.json)"
                       r"\.tmp")


def clean_stale_tmp(run_dir: Path) -> list[Path]:
    """A SIGKILL skips `finally`: remove the temporary files (and half-written sharded folders) a dead run of this
    template left, by their names, and only in a run folder of this template (one with a run.json): a file of yours
    named *.tmp stays."""
    if not (Path(run_dir) / "run.json").is_file():
        return []
    stale = sorted(p for p in Path(run_dir).iterdir() if TEMPORARY.fullmatch(p.name))
    for p in stale:
        remove(p)
    return stale
