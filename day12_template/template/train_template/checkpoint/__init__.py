"""Checkpoints: a checkpointer that owns them, atomic writes, last/best links that cannot go stale, loud loads.

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

The package's parts: `checkpointer` (what a checkpoint holds, and when it is written and read), `files` (writing,
linking and pruning), `reading` (CRC-checked weights-only loads), `resume` (where a run resumes from), `sharded`
(DCP) and `state` (full state dicts and RNG states).
"""
from .checkpointer import Checkpointer
from .files import FORMAT, CheckpointError, atomic_save, clean_stale_tmp, link, step_files, step_name
from .reading import check_fits, intact, load, load_weights, step_of
from .resume import check_resume, repair_best, resume_source
from .sharded import load_sharded

__all__ = ["Checkpointer", "FORMAT", "CheckpointError", "atomic_save", "check_fits", "check_resume", "clean_stale_tmp",
           "intact", "link", "load", "load_sharded", "load_weights", "repair_best", "resume_source", "step_files",
           "step_name", "step_of"]
