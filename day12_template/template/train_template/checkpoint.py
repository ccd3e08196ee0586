"""Checkpoint files: atomic writes, last/best links that cannot go stale, loads that fail loudly.

A run folder holds `ckpt-<step>.pt` files (the newest `keep_last`), `last.pt` (the newest) and `best.pt` (lowest
validation loss); the two names are hard links to step files, so naming costs no second write. Order at the end of
an evaluation period: write `ckpt-N.pt` atomically -> link `last.pt` -> prune old files -> evaluate -> link `best.pt`
to it (`link_best`, if N is the best). A kill anywhere leaves `last.pt` complete; `best.pt` then holds the best step
that `last.pt` records, or N, whose evaluation a resume from `last.pt` does again (and re-links it). Every checkpoint
records which step is the best, and `repair_best` re-links `best.pt` from that record on resume, so even a folder
left inconsistent by other code heals. A resume into another folder copies the best checkpoint from the folder it
resumes from; if no file holds it any more, the final test uses the last weights.

A *sharded* checkpoint (checkpoint.format, the default under FSDP) is a folder `ckpt-<step>/` instead: every rank
writes its own shard of the model and AdamW state through torch.distributed.checkpoint (DCP), rank 0 adds `meta.pt`
(everything else, and a CRC-32 of each file), and `last.pt` / `best.pt` are symbolic links to the folder. The same
order and the same promises hold: the folder is written as `ckpt-<step>.tmp/` and renamed into place (a step saved
again after a resume as `ckpt-<step>.<n>/`: a folder a link points to is never replaced, nor pruned).
"""
import os
import random
import re
import shutil
import sys
import zipfile
from copy import deepcopy
from pathlib import Path

import numpy as np
import torch

from . import config, data, distributed

FORMAT = "day12-template/3"  # 2: a config table per model, the task's metrics; 3: the run's id, its data's fingerprint


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message names the file and says what is intact."""


# -- RNG states, in forms torch.load(weights_only=True) accepts (no NumPy objects) ----------------------------------
def rng_state(device: torch.device) -> dict:
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                      "gauss": float(gauss)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


# -- writing -----------------------------------------------------------------------------------------------------
def _fsync_dir(directory: Path) -> None:
    if hasattr(os, "O_DIRECTORY"):  # POSIX: make the rename itself durable
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _reason(exc: BaseException) -> str:
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
        _fsync_dir(path.parent)
    except (OSError, RuntimeError) as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not write checkpoint {path} ({_reason(exc)}); is the disk full? The previous "
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
        _fsync_dir(dst.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"could not point {dst.name} at {src.name} ({_reason(exc)})") from None


def _remove(path: Path) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's folder (not what a link to it points at)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _fsync_tree(folder: Path) -> None:
    for f in folder.iterdir():
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    _fsync_dir(folder)


def copy(src: Path, dst: Path) -> None:
    """Copy `src` (another folder's checkpoint, a file or a sharded folder) to `dst` like `atomic_save`: `<dst>.tmp`,
    fsync, os.replace."""
    src = Path(src).resolve()
    tmp = dst.with_name(dst.name + ".tmp")
    try:
        _remove(tmp)
        if src.is_dir():
            shutil.copytree(src, tmp)
            _fsync_tree(tmp)
        else:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, dst)
        _fsync_dir(dst.parent)
    except OSError as exc:
        _remove(tmp)
        raise CheckpointError(f"could not copy {src} to {dst} ({_reason(exc)}); is the disk full?") from None


def intact(run_dir: Path) -> str:
    """Which checkpoint a failed write left intact, for its message."""
    last = Path(run_dir) / "last.pt"
    step = step_of(last)
    if step is None:
        return "no checkpoint of this run was written yet"
    return f"the newest checkpoint, {last} (step {step}), is intact: resume from it with checkpoint.resume=auto"


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


def _link_and_prune(path: Path, run_dir: Path, keep_last: int) -> Path:
    link(path, run_dir / "last.pt")
    linked = {(run_dir / name).resolve() for name in ("best.pt", "last.pt")}
    for old in step_files(run_dir)[:-keep_last]:
        if not (old.is_dir() and old.resolve() in linked):  # a folder a link points to stays (a file's bytes do)
            try:
                _remove(old)
            except OSError as exc:  # housekeeping: the run goes on, and each later save tries again
                if old not in UNREMOVABLE:  # said once
                    UNREMOVABLE.add(old)
                    print(f"warning: could not remove the old checkpoint {old} ({_reason(exc)}); the newest, "
                          f"{path.name}, is intact", file=sys.stderr)
    return path


def save(payload: dict, run_dir: Path, keep_last: int) -> Path:
    """Write ckpt-<step>.pt, link last.pt to it, delete all but the newest `keep_last`."""
    path = run_dir / step_name(payload["step"], sharded=False)
    atomic_save(payload, path)
    return _link_and_prune(path, run_dir, keep_last)


def link_best(run_dir: Path, step: int) -> None:
    """Point best.pt at this folder's newest checkpoint of `step` (its file, or its sharded folder)."""
    link(step_files(run_dir, step)[-1], Path(run_dir) / "best.pt")


class ShardedSave:
    """A sharded checkpoint being written, on every rank (each step is a collective). Started: rank 0 calls `before()`
    and makes ckpt-<step>.tmp/, then `write_shards(folder)` starts this rank's shard and returns a distributed.Writing
    (done yet? then its result: what meta.pt needs beside the tensors). `complete()`
    waits, then rank 0 adds meta.pt, renames the folder to ckpt-<step>/, links last.pt to it and prunes. Any rank's
    failure -> CheckpointError on every rank; the previous checkpoint stays."""

    def __init__(self, meta: dict, write_shards, run_dir: Path, keep_last: int, d, before):
        self.meta = deepcopy(meta)  # as it is now: an asynchronous save completes after more training
        self.run_dir, self.keep_last, self.d = run_dir, keep_last, d
        self.final = run_dir / step_name(meta["step"], sharded=True)
        if self.final.exists():  # the step saved again (a resume replayed it): a new name, the old one stays linked
            self.final = self.final.with_name(f"{self.final.name}.{len(step_files(run_dir, meta['step']))}")
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        error = None
        if d.is_main:
            try:
                before()
                _remove(self.tmp)
                self.tmp.mkdir()
            except OSError as exc:
                error = self.failed(exc)
        if error := d.gather(error)[0]:  # also the barrier: the folder exists before any rank writes into it
            raise CheckpointError(error)
        self.writing, self.error = None, None
        try:
            self.writing = write_shards(self.tmp)  # DCP: every rank writes, then rank 0 the .metadata
        except (OSError, RuntimeError) as exc:  # DCP re-raises any rank's write error (a full disk) on every rank
            self.error = self.failed(exc)

    def ready(self) -> bool:
        """This rank's files are written (or failed): complete() will not wait."""
        return self.writing is None or self.writing.done()

    def intact(self) -> str:
        last = self.run_dir / "last.pt"
        return f"The previous checkpoint is intact: {last}" if last.exists() else "No earlier checkpoint was written."

    def failed(self, exc: BaseException) -> str:
        return f"could not write checkpoint {self.final} ({_reason(exc)}); is the disk full? {self.intact()}"

    def complete(self) -> Path:
        error, d = self.error, self.d
        if error is None:
            try:
                meta = {**self.meta, "sharded": True, **self.writing.result()}
            except (OSError, RuntimeError) as exc:
                error = self.failed(exc)
        if d.is_main and error is None:
            try:
                self.commit(meta)
            except CheckpointError as exc:  # a link (its message names it)
                error = f"{exc}. {self.intact()}"
            except (OSError, RuntimeError) as exc:  # torch's zip writer reports a full disk as a RuntimeError
                error = self.failed(exc)
        if d.is_main and error:
            _remove(self.tmp)
        if error := d.gather(error)[0]:
            raise CheckpointError(error)
        return self.final

    def commit(self, meta: dict) -> None:
        """Rank 0: meta.pt, then the folder renamed into place (what makes it appear whole), then the links."""
        final, tmp = self.final, self.tmp
        torch.save(meta, tmp / "meta.pt")
        _fsync_tree(tmp)
        os.replace(tmp, final)
        _fsync_dir(self.run_dir)
        _link_and_prune(final, self.run_dir, self.keep_last)


# The temporary names this template writes in a run folder: a checkpoint file or sharded folder, a link, a log file.
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
        _remove(p)
    return stale


# -- reading -----------------------------------------------------------------------------------------------------
def load(path, mmap: bool = False) -> dict:
    """torch.load(weights_only=True) (no code runs from the file) after checking the zip's CRC-32s, which torch.load
    skips: a flipped bit inside a tensor would otherwise load silently. A sharded checkpoint (a folder) gives its
    meta.pt: everything but the model and optimizer tensors (`distributed.load_shards` reads those)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "meta.pt").is_file():
            raise CheckpointError(f"{path} is not a checkpoint of this template (a folder without meta.pt)")
        meta = load(path / "meta.pt", mmap)
        if not mmap:
            bad = [name for name, crc in meta["checksums"].items()
                   if not (path / name).is_file() or distributed.crc32(path / name) != crc]
            if bad:
                raise CheckpointError(f"checkpoint {path} is corrupted: CRC mismatch or missing file in {bad[:3]}")
            try:
                distributed.shard_reader(path).read_metadata()  # its index, read without running code from it
            except Exception as exc:
                raise CheckpointError(f"checkpoint {path} is unreadable: its .metadata index: {_reason(exc)}") from None
        return {**meta, "path": str(path.resolve())}
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        if not mmap:
            with zipfile.ZipFile(path) as zf:
                bad = zf.testzip()
            if bad is not None:
                raise CheckpointError(f"checkpoint {path} is corrupted: CRC mismatch in {bad}")
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except CheckpointError:
        raise
    except Exception as exc:  # truncated zip, bad pickle, forbidden global
        raise CheckpointError(f"checkpoint {path} is unreadable (truncated, corrupted or not a weights-only "
                              f"checkpoint): {_reason(exc)}") from None
    if isinstance(ckpt, dict) and str(ckpt.get("format")).startswith("day12-template/") and ckpt["format"] != FORMAT:
        raise CheckpointError(f"{path} was written by another version of this template (format {ckpt['format']!r}; "
                              f"this one reads {FORMAT!r}): finish its run with the template that wrote it")
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a checkpoint of this template (no format={FORMAT!r} entry)")
    return ckpt


def step_of(path: Path) -> int | None:
    """The step a checkpoint file holds (memory-mapped: reads almost nothing), or None if absent or unreadable."""
    try:
        return load(path, mmap=True)["step"]
    except CheckpointError:
        return None


def holding(step: int, run_dir: Path, source: Path | None = None) -> Path | None:
    """The first file holding `step`: this folder's best.pt or ckpt-<step>.pt, else (resumed from another folder)
    the checkpoint resumed from, or its folder's best.pt or ckpt-<step>.pt. None: no file holds it any more."""
    places = [Path(run_dir) / "best.pt", *step_files(run_dir, step)[::-1]]
    if source is not None and Path(source).parent.resolve() != Path(run_dir).resolve():
        folder = Path(source).parent
        places += [Path(source), folder / "best.pt", *step_files(folder, step)[::-1]]
    return next((p for p in places if step_of(p) == step), None)


def repair_best(run_dir: Path, last: dict, source: Path | None = None) -> str | None:
    """Make best.pt the checkpoint that `last` (read from `source`) records as best: link this folder's file, or copy
    the one in the folder resumed from; returns what was done (None: nothing to do)."""
    want, best = last["best"]["step"], run_dir / "best.pt"
    have = step_of(best)
    if want is None or have == want or (have is not None and have >= last["step"]):
        return None  # consistent, or not behind last.pt: the resumed run redoes that evaluation and re-links it
    found = holding(want, run_dir, source)
    if found is None:
        return f"best.pt holds step {have} but no file holds the best checkpoint (step {want}) any more; best.pt " \
               f"will be linked at the next better validation loss, else the final test uses the last weights"
    if found.parent.resolve() == Path(run_dir).resolve():
        link(found, best)
        return f"best.pt re-linked to step {want} (it held step {have})"
    if found.is_dir():  # a sharded checkpoint: copied in as its step folder, then linked like one saved here
        copy(found, run_dir / step_name(want, sharded=True))
        link(run_dir / step_name(want, sharded=True), best)
    else:
        copy(found, best)
    return f"best.pt copied from {found} (step {want})"


def load_best(run_dir: Path, step: int | None, source: Path | None = None) -> dict | None:
    """best.pt for the final test, refused unless it holds `step` (the recorded best); None when no file holds that
    step any more (repair_best said so at start-up): the caller then tests the weights it has."""
    path = run_dir / "best.pt"
    if step is not None and step_of(path) != step:
        path = holding(step, run_dir, source)
        if path is None:
            return None
    best = load(path)
    if best["step"] != step:
        raise CheckpointError(f"{path} holds step {best['step']}, but the best validation loss was at step {step}")
    return best


def load_sharded(model: torch.nn.Module, optimizer, ckpt: dict) -> None:
    """distributed.load_shards, its failures (a shard that does not fit, an unreadable file) as CheckpointError."""
    try:
        distributed.load_shards(model, optimizer, ckpt)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {ckpt['path']} cannot be loaded into this run: {_reason(exc)}") from None


def strip_prefixes(state: dict) -> dict:
    """Keys as a plain model names them: drops the `module.` (DDP) and `_orig_mod.` (torch.compile) prefixes."""
    out = {}
    for key, value in state.items():
        while key.startswith(("module.", "_orig_mod.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def model_shapes(ckpt: dict) -> dict[str, tuple]:
    """Name -> shape of each model tensor a checkpoint holds (DDP/compile prefixes dropped), read without loading
    them: a sharded checkpoint's from its index."""
    if ckpt.get("sharded"):
        index = distributed.shard_reader(ckpt["path"]).read_metadata().state_dict_metadata
        return {k[len("model."):]: tuple(v.size) for k, v in index.items() if k.startswith("model.")}
    return {k: tuple(v.shape) for k, v in strip_prefixes(ckpt["model"]).items()}


def check_fits(model: torch.nn.Module, ckpt: dict, path, info=None, data_cfg=None) -> None:
    """CheckpointError listing missing, unexpected and differently-shaped tensors, before anything is loaded; given
    this run's data (`info`, read per `data_cfg`), first how its vocabulary or classes differ from the checkpoint's."""
    mine, theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}, model_shapes(ckpt)
    missing, unexpected = sorted(mine.keys() - theirs.keys()), sorted(theirs.keys() - mine.keys())
    shapes = [f"{k} {theirs[k]} vs {mine[k]}" for k in sorted(mine.keys() & theirs.keys()) if mine[k] != theirs[k]]
    if missing or unexpected or shapes:
        parts = [data.size_changes(info, data_cfg, ckpt["info"], ckpt["config"]["data"]["root"]) if info else "",
                 f"missing {missing[:5]}" if missing else "", f"unexpected {unexpected[:5]}" if unexpected else "",
                 f"shapes differ: {shapes[:5]}" if shapes else ""]
        raise CheckpointError(f"checkpoint {path} does not fit this model: " + "; ".join(p for p in parts if p))


def resume_source(cfg: config.Config) -> tuple[Path | None, dict | None]:
    """(path, checkpoint) to resume from, or (None, None) for a fresh run. Refuses (ConfigError) a fresh run over an
    existing one, a missing file, and a checkpoint whose config differs in fields that are not safe to change."""
    want, last = cfg.checkpoint.resume, Path(cfg.run.out_dir) / "last.pt"
    if want == "auto":
        path = last if last.exists() or last.is_symlink() else None  # a dangling link: refused when loaded
    elif want:
        if not Path(want).exists():
            raise config.ConfigError(f"checkpoint.resume: {want} does not exist")
        path = Path(want)
    elif last.exists() or last.is_symlink():
        raise config.ConfigError(f"run.out_dir {cfg.run.out_dir} already holds a run (last.pt): continue it with "
                                 f"--set checkpoint.resume=auto, or choose another run.out_dir")
    else:
        path = None
    ckpt = load(path) if path else None
    if ckpt and (diffs := config.differences(ckpt["config"], cfg)):
        raise config.ConfigError(f"refusing to resume from {path}: the config differs in " + "; ".join(diffs)
                                 + ". Only fields marked [may change on resume] in --help-config may change; to "
                                 "start a new run from these weights, use checkpoint.init_from")
    return path, ckpt


def load_weights(model: torch.nn.Module, path, info=None, data_cfg=None) -> None:
    """Fine-tuning: the model weights of any template checkpoint (DDP/compile prefixes dropped), shapes checked
    (`check_fits`), into a plain or an FSDP2-sharded model."""
    ckpt = load(path)
    check_fits(model, ckpt, path, info, data_cfg)
    if ckpt.get("sharded"):
        load_sharded(model, None, ckpt)
    else:
        distributed.load_model_state(model, strip_prefixes(ckpt["model"]))  # under FSDP2 each rank keeps its shard
