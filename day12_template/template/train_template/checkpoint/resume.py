"""Where a run resumes from, and what it refuses to resume from."""
from pathlib import Path

from .. import config, data
from .files import CheckpointError, copy, link, step_name
from .reading import check_fits, holding, load, step_of


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


def check_resume(model, ckpt: dict, source: Path, splits, fingerprint: dict, cfg: config.Config) -> dict:
    """How this run's data differs from the data `ckpt` was trained on (split -> how). Refuses a checkpoint that does
    not fit the model (ConfigError: data.root may change on resume, but data of another vocabulary is a conflicting
    resume), and new data unless checkpoint.accept_new_data (DataError)."""
    try:
        check_fits(model, ckpt, source, splits.info, cfg.data)
    except CheckpointError as exc:
        raise config.ConfigError(f"refusing to resume: {exc}") from None
    changes = data.changes(ckpt["data"], fingerprint)
    if changes and not cfg.checkpoint.accept_new_data:
        raise data.DataError(f"refusing to resume from {source}: {'; '.join(changes.values())}. To train on the new "
                             f"data on purpose, add --set checkpoint.accept_new_data=true")
    return changes


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
