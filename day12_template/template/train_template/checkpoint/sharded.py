"""Sharded checkpoints through torch.distributed.checkpoint (DCP): every rank writes and reads its own shard."""
import contextlib
import copy
import os
import warnings
import zlib
from pathlib import Path

import torch
import torch.distributed
import torch.nn as nn

from ..distributed import Dist
from .files import CheckpointError, fsync_dir, fsync_tree, link_and_prune, reason, remove, step_files, step_name

# Each rank writes only what it holds (its FSDP2 shards; under DDP or in one process DCP spreads the replicated
# tensors over the ranks) and reads back whatever its own layout needs, so a checkpoint written by N ranks loads at
# any world size, under any strategy, or into one process. Only tensors go through DCP; everything else is meta.pt.
# DCP warns at every save and load in one process (also from an asynchronous save's thread) that it assumes one
# process: here that is the intent.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized",
                        category=UserWarning)


def _metadata_class(module: str, name: str) -> bool:
    """The globals a DCP .metadata pickle may name: DCP's own record classes, torch.Size, dtypes, a layout, a path."""
    from torch.distributed.checkpoint import metadata

    if module == "torch.distributed.checkpoint.metadata":
        return isinstance(getattr(metadata, name, None), type)
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
    return (module, name) in {("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                              ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                              ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}


def shard_reader(folder):
    """DCP's FileSystemReader, but its one pickle (the .metadata index) is read by an unpickler that builds DCP's
    metadata records only: no code from a checkpoint runs. (DCP reads the tensors with weights_only=True itself.)"""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta, TensorStorageMetadata

    class MetadataOnly(pickle.Unpickler):
        def find_class(self, module, name):
            if not _metadata_class(module, name):
                raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint index")
            return super().find_class(module, name)

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            with open(os.path.join(self.path, ".metadata"), "rb") as f:
                index = MetadataOnly(f).load()
            others = [key for key, entry in index.state_dict_metadata.items()
                      if not isinstance(entry, TensorStorageMetadata)]
            if others:  # DCP would unpickle such an entry without any restriction
                raise pickle.UnpicklingError(f"the index holds a non-tensor entry ({others[0]}): not written by "
                                             f"this template")
            index.storage_meta = index.storage_meta or StorageMeta()
            index.storage_meta.load_id = self.load_id
            return index

    return SafeReader(folder)


def crc32(path) -> int:
    value = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            value = zlib.crc32(chunk, value)
    return value


_ASYNC_GROUPS = {}  # world size -> the gloo group asynchronous saves finish on, apart from training's collectives


def async_group(dist: Dist):
    """The process group asynchronous saves finish on (None in one process). Made at start-up, by every rank:
    making it later needs torchrun's store, which is gone once torchrun is killed."""
    if dist.enabled and dist.world not in _ASYNC_GROUPS:
        _ASYNC_GROUPS[dist.world] = torch.distributed.new_group(backend="gloo")
    return _ASYNC_GROUPS.get(dist.world)


def save_shards(model: nn.Module, optimizer, dist: Dist, asynchronous: bool, folder):
    """Start this rank's part of a sharded checkpoint in `folder` (a collective); its Writing's result() is what
    meta.pt needs beside the tensors: the optimizer's param groups (not tensors) and each file's CRC-32, every rank
    summing only its own file (DCP does not check what it reads back; checkpoint.load does). `asynchronous`: DCP
    copies the state first, then writes it from a background thread while training goes on."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    groups = copy.deepcopy(optim_sd["param_groups"])  # as they are now: training changes the lr meanwhile
    state, writer, future = {"model": model_sd, "optimizer": optim_sd["state"]}, dcp.FileSystemWriter(folder), None
    with dcp_errors():
        if asynchronous:
            future = dcp.async_save(state, storage_writer=writer, process_group=async_group(dist),
                                    no_dist=not dist.enabled)
        else:
            dcp.save(state, storage_writer=writer, no_dist=not dist.enabled)
    return Writing(dist, folder, groups, future)


class Writing:
    """This rank's part of a sharded checkpoint being written: `done()` (polled each step for an asynchronous save)
    and `result()` (a collective): what meta.pt needs beside the tensors, once the files are complete."""

    def __init__(self, dist: Dist, folder, groups: list, future=None):
        self.dist, self.folder, self.groups, self.future = dist, Path(folder), groups, future

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> dict:
        """Every rank: its files' CRC-32s, or its error, gathered (one collective, which every rank reaches)."""
        dist, error, sums = self.dist, None, {}
        try:
            if self.future is not None:
                with dcp_errors():
                    self.future.result()
            sums = {p.name: crc32(p) for p in self.folder.iterdir()
                    if p.name.startswith(f"__{dist.rank}_") or dist.is_main and p.name == ".metadata"}
        except OSError as exc:
            error = str(exc)
        parts = dist.gather({"error": error, "sums": sums})
        if errors := [part["error"] for part in parts if part["error"]]:
            raise OSError(errors[0])
        checksums = {name: crc for part in parts for name, crc in part["sums"].items()}
        return {"optimizer_groups": self.groups, "checksums": checksums}


@contextlib.contextmanager
def dcp_errors():
    """DCP's CheckpointException (a BaseException: any rank's write error, raised on every rank) as an OSError."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        rank, failure = next(iter(exc.failures.items()))
        failure = getattr(failure, "exception", failure)
        raise OSError(f"rank {rank}: {type(failure).__name__}: {str(failure).strip().splitlines()[-1]}") from None


def load_shards(model: nn.Module, optimizer, ckpt: dict) -> None:
    """Load a sharded checkpoint (`ckpt`: its meta.pt, as checkpoint.load gives it) into `model` and, unless None,
    `optimizer`, each rank reading what its layout holds (a collective under torchrun)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import state_dict as sd

    if optimizer is None:
        state = {"model": sd.get_model_state_dict(model)}
    else:
        model_sd, optim_sd = sd.get_state_dict(model, optimizer)  # templates: the shapes and shards to fill
        state = {"model": model_sd, "optimizer": optim_sd["state"]}
    with dcp_errors():
        dcp.load(state, storage_reader=shard_reader(ckpt["path"]), no_dist=not torch.distributed.is_initialized())
    sd.set_model_state_dict(model, state["model"])
    if optimizer is not None:
        sd.set_optimizer_state_dict(model, optimizer, {"state": state["optimizer"],
                                                       "param_groups": ckpt["optimizer_groups"]})


class ShardedSave:
    """A sharded checkpoint being written, on every rank (each step is a collective). Started: rank 0 calls `before()`
    and makes ckpt-<step>.tmp/, then `write_shards(folder)` starts this rank's shard and returns a Writing
    (done yet? then its result: what meta.pt needs beside the tensors). `complete()`
    waits, then rank 0 adds meta.pt, renames the folder to ckpt-<step>/, links last.pt to it and prunes. Any rank's
    failure -> CheckpointError on every rank; the previous checkpoint stays."""

    def __init__(self, meta: dict, write_shards, run_dir: Path, keep_last: int, dist, before):
        self.meta = copy.deepcopy(meta)  # as it is now: an asynchronous save completes after more training
        self.run_dir, self.keep_last, self.dist = run_dir, keep_last, dist
        self.final = run_dir / step_name(meta["step"], sharded=True)
        if self.final.exists():  # the step saved again (a resume replayed it): a new name, the old one stays linked
            self.final = self.final.with_name(f"{self.final.name}.{len(step_files(run_dir, meta['step']))}")
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        error = None
        if dist.is_main:
            try:
                before()
                remove(self.tmp)
                self.tmp.mkdir()
            except OSError as exc:
                error = self.failed(exc)
        if error := dist.gather(error)[0]:  # also the barrier: the folder exists before any rank writes into it
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
        return f"could not write checkpoint {self.final} ({reason(exc)}); is the disk full? {self.intact()}"

    def complete(self) -> Path:
        error, dist = self.error, self.dist
        if error is None:
            try:
                meta = {**self.meta, "sharded": True, **self.writing.result()}
            except (OSError, RuntimeError) as exc:
                error = self.failed(exc)
        if dist.is_main and error is None:
            try:
                self.commit(meta)
            except CheckpointError as exc:  # a link (its message names it)
                error = f"{exc}. {self.intact()}"
            except (OSError, RuntimeError) as exc:  # torch's zip writer reports a full disk as a RuntimeError
                error = self.failed(exc)
        if dist.is_main and error:
            remove(self.tmp)
        if error := dist.gather(error)[0]:
            raise CheckpointError(error)
        return self.final

    def commit(self, meta: dict) -> None:
        """Rank 0: meta.pt, then the folder renamed into place (what makes it appear whole), then the links."""
        final, tmp = self.final, self.tmp
        torch.save(meta, tmp / "meta.pt")
        fsync_tree(tmp)
        os.replace(tmp, final)
        fsync_dir(self.run_dir)
        link_and_prune(final, self.run_dir, self.keep_last)


def load_sharded(model: torch.nn.Module, optimizer, ckpt: dict) -> None:
    """load_shards, its failures (a shard that does not fit, an unreadable file) as CheckpointError."""
    try:
        load_shards(model, optimizer, ckpt)
    except (OSError, RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint {ckpt['path']} cannot be loaded into this run: {reason(exc)}") from None
