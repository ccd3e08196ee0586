"""consolidate.py — a sharded checkpoint (a folder: checkpoint.format = sharded, the default under FSDP) as one plain
file in the template's full format: the whole model and AdamW state, with everything else the folder's meta.pt holds.

    python consolidate.py runs/gpt_fsdp                        # its best.pt -> runs/gpt_fsdp/consolidated.pt
    python consolidate.py runs/gpt_fsdp/last.pt --out last-full.pt

You rarely need it: init_from, sample.py and resume read sharded folders directly, at any world size. It is for tools
that want a single file (torch.load(..., weights_only=True)), or for sending a run's weights elsewhere. One process
reads every shard, so it needs the memory of the whole model and its optimizer state, on CPU.
"""
import argparse
import sys
from pathlib import Path

from . import checkpoint, config, data, distributed, models, optimizers, train
from .checkpoint import state


def full_checkpoint(source: Path) -> dict:
    """The checkpoint `source` in the full format: a file as it is; a sharded folder read into a plain model and
    optimizer built from its own config, their state dicts put where a full checkpoint has them."""
    ckpt = checkpoint.load(source)
    if not ckpt.get("sharded"):
        return ckpt
    cfg = config.from_dict(ckpt["config"])
    model = models.build(cfg.model, data.info_from(ckpt["info"]))
    optimizer = optimizers.build(model, cfg.optim)
    checkpoint.load_sharded(model, optimizer, ckpt)
    one = distributed.Dist()  # this process alone: the plain state dicts of a single-process run
    full = {k: v for k, v in ckpt.items() if k not in ("sharded", "path", "optimizer_groups", "checksums")}
    full.update(model=state.model_state(model, one), optimizer=state.optimizer_state(model, optimizer, one))
    return full


def consolidate(source: Path, out: Path) -> dict:
    """The sharded checkpoint `source` (a folder, or a run folder: its best.pt) saved as the full-format file `out`,
    atomically; returns what was saved."""
    source = source / "best.pt" if (source / "best.pt").exists() else source
    if not checkpoint.load(source, mmap=True).get("sharded"):
        raise checkpoint.CheckpointError(f"{source} is a single file already: use it as it is")
    full = full_checkpoint(source)
    checkpoint.atomic_save(full, out)
    return full


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a sharded checkpoint folder, or a run folder (its best.pt)")
    parser.add_argument("--out", type=Path, help="the file to write (default: <run folder>/consolidated.pt)")
    args = parser.parse_args(argv)
    out = args.out
    if out is None:  # beside the checkpoint, in its run folder
        run_dir = args.source if (args.source / "best.pt").exists() else args.source.parent
        out = run_dir / "consolidated.pt"
    try:
        saved = consolidate(args.source, out)
    except (checkpoint.CheckpointError, config.ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: step {saved['step']}, {sum(t.numel() for t in saved['model'].values()):,} model values, "
          f"full format")
    return 0


def cli() -> None:
    """`python consolidate.py` at the template's root runs this."""
    train.exit_with(main)
