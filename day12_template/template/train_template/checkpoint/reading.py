"""Reading checkpoints back: CRC-checked weights-only loads, which file holds a step, and whether one fits a model."""
import zipfile
from pathlib import Path

import torch

from .. import data
from .files import FORMAT, CheckpointError, reason, step_files
from .sharded import crc32, load_sharded, shard_reader
from .state import load_model_state, strip_prefixes


def load(path, mmap: bool = False) -> dict:
    """torch.load(weights_only=True) (no code runs from the file) after checking the zip's CRC-32s, which torch.load
    skips: a flipped bit inside a tensor would otherwise load silently. A sharded checkpoint (a folder) gives its
    meta.pt: everything but the model and optimizer tensors (`sharded.load_shards` reads those)."""
    path = Path(path)
    if path.is_dir():
        if not (path / "meta.pt").is_file():
            raise CheckpointError(f"{path} is not a checkpoint of this template (a folder without meta.pt)")
        meta = load(path / "meta.pt", mmap)
        if not mmap:
            bad = [name for name, crc in meta["checksums"].items()
                   if not (path / name).is_file() or crc32(path / name) != crc]
            if bad:
                raise CheckpointError(f"checkpoint {path} is corrupted: CRC mismatch or missing file in {bad[:3]}")
            try:
                shard_reader(path).read_metadata()  # its index, read without running code from it
            except Exception as exc:
                raise CheckpointError(f"checkpoint {path} is unreadable: its .metadata index: {reason(exc)}") from None
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
                              f"checkpoint): {reason(exc)}") from None
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


def intact(run_dir: Path) -> str:
    """Which checkpoint a failed write left intact, for its message."""
    last = Path(run_dir) / "last.pt"
    step = step_of(last)
    if step is None:
        return "no checkpoint of this run was written yet"
    return f"the newest checkpoint, {last} (step {step}), is intact: resume from it with checkpoint.resume=auto"


def holding(step: int, run_dir: Path, source: Path | None = None) -> Path | None:
    """The first file holding `step`: this folder's best.pt or ckpt-<step>.pt, else (resumed from another folder)
    the checkpoint resumed from, or its folder's best.pt or ckpt-<step>.pt. None: no file holds it any more."""
    places = [Path(run_dir) / "best.pt", *step_files(run_dir, step)[::-1]]
    if source is not None and Path(source).parent.resolve() != Path(run_dir).resolve():
        folder = Path(source).parent
        places += [Path(source), folder / "best.pt", *step_files(folder, step)[::-1]]
    return next((p for p in places if step_of(p) == step), None)


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


def model_shapes(ckpt: dict) -> dict[str, tuple]:
    """Name -> shape of each model tensor a checkpoint holds (DDP/compile prefixes dropped), read without loading
    them: a sharded checkpoint's from its index."""
    if ckpt.get("sharded"):
        index = shard_reader(ckpt["path"]).read_metadata().state_dict_metadata
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


def load_weights(model: torch.nn.Module, path, info=None, data_cfg=None) -> None:
    """Fine-tuning: the model weights of any template checkpoint (DDP/compile prefixes dropped), shapes checked
    (`check_fits`), into a plain or an FSDP2-sharded model."""
    ckpt = load(path)
    check_fits(model, ckpt, path, info, data_cfg)
    if ckpt.get("sharded"):
        load_sharded(model, None, ckpt)
    else:
        load_model_state(model, strip_prefixes(ckpt["model"]))  # under FSDP2 each rank keeps its shard
