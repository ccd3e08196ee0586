"""The checkpointer: every checkpoint of one run, built once from the run's stateful parts.

The loop calls it at a few moments: `load(ckpt, source)` at start-up when it resumes, `save()` after a step,
`mark_best()` after an evaluation that found the lowest validation loss so far, and `load_best_weights()` before the
final test. An asynchronous sharded save goes on in the background: `written()` says whether this rank's files are on
disk, and `finish()` completes it (renamed into place and linked as last.pt).

What a checkpoint holds, written in `save()` and read back in `load()` and nowhere else:
- `about`, given once: the run's id, its data's fingerprint and its data's info;
- the run's config, and the world size that wrote it;
- the loop's progress (`train.Progress`), its fields at the top level, since files are found by `step` and `best`;
- the model and the optimizer: full state dicts in one file, or each rank's shards in a folder (DCP);
- each entry of `states` under its own name: the scheduler, the scaler, the sampler, and whatever you add;
- every rank's RNG states and step.

A new piece of state (EMA weights, a data-mixture cursor) is one more entry of `states`: anything with
`state_dict()` and `load_state_dict()`.
"""
import functools
from pathlib import Path

import torch

from .. import config, runlog
from ..distributed import Dist
from . import files
from .files import FORMAT, CheckpointError
from .reading import load_best
from .sharded import ShardedSave, async_group, load_sharded, save_shards
from .state import load_model_state, load_optimizer_state, model_state, optimizer_state, rng_state, set_rng_state


class Checkpointer:
    def __init__(self, cfg: config.Config, dist: Dist, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 progress, states: dict, about: dict):
        self.run_dir = Path(cfg.run.out_dir)
        self.config = config.to_dict(cfg)
        self.keep_last = cfg.checkpoint.keep_last
        self.sharded = config.sharded_checkpoints(cfg, dist.world)
        self.asynchronous = cfg.checkpoint.async_save
        self.dist, self.model, self.optimizer = dist, model, optimizer
        self.progress, self.states, self.about = progress, states, about
        taken = {"format", "config", "world_size", "rng", "rank_steps", "model", "optimizer", "sharded",
                 "optimizer_groups", "checksums", "path", *about, *progress.state_dict()}
        if clashes := sorted(taken & states.keys()):
            raise ValueError(f"checkpointed states named {clashes}: those names hold other parts of a checkpoint")
        self.source = None  # the checkpoint this run resumed from
        self.before_write = None  # run on rank 0 before each checkpoint is written (the logs' flush)
        self.writing = None  # a sharded save under way
        if self.asynchronous:
            async_group(dist)  # made now, by every rank: later, torchrun's store may be gone

    # -- start-up ---------------------------------------------------------------------------------------------------
    def load(self, ckpt: dict, source: Path) -> None:
        """Every part's state from `ckpt` (read from `source`), in this run's layout. The RNGs come last, so nothing
        draws from them before the next step, and only at the same world size: at another, each rank keeps the seed it
        has (same samples, new dropout)."""
        progress_fields = list(self.progress.state_dict())
        if missing := [name for name in [*progress_fields, *self.states] if name not in ckpt]:
            raise CheckpointError(f"{source} holds no {', '.join(missing)}: it was written before this run's code "
                                  f"checkpointed them. Start a new run from its weights with checkpoint.init_from")
        self.source = source
        self.restore_weights(ckpt, self.optimizer)
        for name, part in self.states.items():
            part.load_state_dict(ckpt[name])
        self.progress.load_state_dict({name: ckpt[name] for name in progress_fields})
        if ckpt["world_size"] == self.dist.world:
            set_rng_state(ckpt["rng"][self.dist.rank], self.dist.device)

    def restore_weights(self, ckpt: dict, optimizer=None) -> None:
        """The model's (and, given an optimizer, its) state from a checkpoint of either format."""
        if ckpt.get("sharded"):
            load_sharded(self.model, optimizer, ckpt)
            return
        load_model_state(self.model, ckpt["model"])
        if optimizer is not None:
            load_optimizer_state(self.model, optimizer, ckpt["optimizer"], self.dist)

    # -- during the run ---------------------------------------------------------------------------------------------
    def save(self) -> None:
        """A checkpoint of this step; every rank takes part. Full: rank 0 gathers plain state dicts (names, no
        prefixes) and writes one file. Sharded: every rank writes its own shard of the model and optimizer, and rank 0
        writes the rest beside them; asynchronous, the writing goes on in the background until `finish()`."""
        dist, progress = self.dist, self.progress
        contents = {"format": FORMAT, **self.about, **progress.state_dict(), "config": self.config,
                    "world_size": dist.world,
                    **{name: part.state_dict() for name, part in self.states.items()},
                    "rng": dist.gather(rng_state(dist.device)), "rank_steps": dist.gather(progress.step)}
        if self.sharded:
            self.finish()  # a second save waits for the first
            shards = functools.partial(save_shards, self.model, self.optimizer, dist, self.asynchronous)
            self.writing = ShardedSave(contents, shards, self.run_dir, self.keep_last, dist, before=self.flush_logs)
            if not self.asynchronous:
                self.finish()
            return
        contents["model"] = model_state(self.model, dist)
        contents["optimizer"] = optimizer_state(self.model, self.optimizer, dist)
        self.on_rank0(functools.partial(self.write_file, contents))

    def write_file(self, contents: dict) -> None:
        self.flush_logs()
        files.save(contents, self.run_dir, self.keep_last)

    def flush_logs(self) -> None:
        """The logs reach the disk before the checkpoint that vouches for them."""
        if self.before_write is not None:
            self.before_write()

    def written(self) -> bool:
        """This rank's files of the save under way are on disk (or failed): `finish()` will not wait."""
        return self.writing is not None and self.writing.ready()

    def finish(self) -> None:
        """Complete the save under way, if any (every rank): its files written, renamed into place and linked."""
        writing, self.writing = self.writing, None
        if writing is not None:
            writing.complete()

    def saved_this_step(self) -> bool:
        """This folder holds a checkpoint of the current step (rank 0 looks, for every rank)."""
        return self.dist.gather(bool(files.step_files(self.run_dir, self.progress.step)))[0]

    def mark_best(self) -> None:
        """best.pt points at this step's checkpoint: the one saved before the evaluation that found it best."""
        self.finish()
        self.on_rank0(functools.partial(files.link_best, self.run_dir, self.progress.step))

    def on_rank0(self, write) -> None:
        """`write()` on rank 0; its failure stops every rank together with its message (none waits forever)."""
        error = None
        if self.dist.is_main:
            try:
                write()
            except (CheckpointError, runlog.LogError, OSError) as exc:  # the logs' flush, a link
                error = str(exc)
        if error := self.dist.gather(error)[0]:
            raise CheckpointError(error)

    # -- the end ----------------------------------------------------------------------------------------------------
    def load_best_weights(self) -> bool:
        """The model gets best.pt's weights, read back from disk; False when no file holds them any more."""
        self.finish()
        best = load_best(self.run_dir, self.progress.best["step"], self.source)
        if best is not None:
            self.restore_weights(best)
        return best is not None
