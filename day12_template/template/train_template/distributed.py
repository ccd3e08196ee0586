"""Scale-out on PyTorch's own engine: torchrun's environment, DDP or FSDP2, and state dicts any run can load.

One process per device. torchrun sets RANK / WORLD_SIZE / LOCAL_RANK (and MASTER_ADDR/PORT); without them the run
is a single process and the strategy is ignored. Backend: nccl on CUDA, gloo on CPU. Checkpoints hold *full, plain*
state dicts (parameter names as the bare model has them, on CPU), gathered on rank 0, so a checkpoint from any
strategy and world size loads into a plain model, or into any other strategy and world size.
"""
import contextlib
import copy
import ctypes
import os
import signal
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn


def pick_device(name: str, local_rank: int) -> torch.device:
    """`auto`: cuda (this rank's GPU under torchrun) -> mps -> cpu; otherwise the named device, if present."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    kind = name.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available() or kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"run.device={name}: this machine has no {kind} device (try auto or cpu)")
    if name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda":
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"run.device={name}: only {torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(device)
    return device


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # this run created the process group (and destroys it at the end)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=op)
        return t

    def gather(self, obj) -> list:
        """Every rank's `obj` (a list on every rank)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


# -- torchrun's launcher faults ----------------------------------------------------------------------------------
def check_launcher(resume: str) -> None:
    """ValueError before anything starts where torchrun's `--max-restarts` cannot work: restarted ranks would hang
    (or fail) connecting to the dead rank's old address, since the rendezvous store they share with the process
    group still serves the previous round's keys (PyTorch issue 135712); or a restart would be refused the folder."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) == 0:
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise ValueError("torchrun --max-restarts: restarted ranks would hang connecting to the dead rank's address "
                         "(PyTorch issue 135712); launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's "
                         "environment")
    if resume != "auto":
        raise ValueError("torchrun --max-restarts: a restarted run must continue from last.pt; add --set "
                         "checkpoint.resume=auto")


def die_with_launcher() -> None:
    """Under torchrun on Linux: SIGTERM this rank when the launcher dies (`kill -9` included), so no rank trains on
    as an orphan: torchrun starts each rank in a session of its own, where nothing else would stop it. SIGTERM is the
    graceful stop: the ranks agree on a step, write last.pt and exit. (The signal follows the *thread* that started
    this process; torchrun starts ranks from its main thread.)"""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    parent, pr_set_pdeathsig = os.getppid(), 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # the launcher died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def setup(device_name: str) -> Dist:
    """This process's place in the job, from torchrun's environment; joins the process group if there is one."""
    die_with_launcher()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name, local_rank)
    owns = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
        owns = True
    return Dist(rank, world, local_rank, device, owns)


# -- wrapping ----------------------------------------------------------------------------------------------------
def shard(model: nn.Module, d: Dist, bf16: bool = False) -> None:
    """FSDP2's `fully_shard`, in place: each of `model.blocks`, then the root, so that one block's full weights exist
    at a time. Call it before the model's memory is allocated, while it is on the meta device (models.build), so that
    only the shards are ever allocated.
    `bf16` (train.amp in bfloat16): parameters are all-gathered in bf16 (half the bytes; autocast still keeps its fp32
    ops in fp32) and gradients reduce-scattered in fp32; the shards and AdamW's moments stay fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(d.device.type, (d.world,))
    policy = MixedPrecisionPolicy()  # parameters and gradient reductions in their own dtype (fp32)
    if bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 sharded the model (its parameters are DTensors)."""
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def wrap(model: nn.Module, d: Dist) -> nn.Module:
    """The module to call for training: a DDP wrapper under torchrun, else the model itself (one process, or a model
    FSDP2 sharded in place). State dicts are always taken from `model`."""
    if not d.enabled or is_sharded(model):
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def sync_buffers(model: nn.Module, d: Dist) -> None:
    """Rank 0's buffers (BatchNorm running statistics) on every rank. Each rank's last forward updated its own copy;
    rank 0's is the one a checkpoint saves, so evaluating with it makes the logged figures those of best.pt."""
    if d.enabled:
        for buffer in model.buffers():
            dist.broadcast(buffer.data, src=0)


def grad_sync(module: nn.Module, enabled: bool):
    """Context for one micro-batch's backward: skip the gradient all-reduce unless `enabled` (the last micro-batch
    of an optimizer step). DDP: `no_sync()`; FSDP2: `set_requires_gradient_sync`."""
    if hasattr(module, "no_sync"):
        return contextlib.nullcontext() if enabled else module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


# -- state dicts ---------------------------------------------------------------------------------------------------
# One process: the plain state dicts, the optimizer's keyed by parameter name. Several: torch.distributed.checkpoint
# gathers the same format (FULL: gathered, on CPU, kept by rank 0); it is imported only then, as it is slow to load.
def _dcp():
    from torch.distributed.checkpoint import state_dict as dcp

    return dcp, dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)


def _names(model: nn.Module, optimizer) -> list[str]:
    """Parameter names in the order optimizer.state_dict() numbers the parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def model_state(model: nn.Module, d: Dist) -> dict:
    """The full model state dict on CPU, on rank 0 (a collective under FSDP: every rank calls it)."""
    if not d.enabled:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    dcp, full = _dcp()
    return dcp.get_model_state_dict(model, options=full)


def optimizer_state(model: nn.Module, optimizer, d: Dist) -> dict:
    """The full optimizer state keyed by parameter *names* (not positions), so it loads into any strategy."""
    if not d.enabled:
        sd, names = optimizer.state_dict(), _names(model, optimizer)
        return {"state": {names[i]: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in s.items()}
                          for i, s in sd["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]}
    dcp, full = _dcp()
    return dcp.get_optimizer_state_dict(model, optimizer, options=full)


def load_model_state(model: nn.Module, state: dict) -> None:
    """A full state dict into the model, or into its shards."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    dcp, _ = _dcp()
    dcp.set_model_state_dict(model, state, options=dcp.StateDictOptions(full_state_dict=True))


def load_optimizer_state(model: nn.Module, optimizer, state: dict, d: Dist) -> None:
    if not d.enabled:
        index = {n: i for i, n in enumerate(_names(model, optimizer))}
        optimizer.load_state_dict({"state": {index[n]: s for n, s in state["state"].items()},
                                   "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                                                    for g in state["param_groups"]]})
        return
    dcp, _ = _dcp()
    dcp.set_optimizer_state_dict(model, optimizer, state, options=dcp.StateDictOptions(full_state_dict=True))


def local_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_ returns a DTensor under FSDP2: the full value as a plain tensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


# -- sharded checkpoints: torch.distributed.checkpoint (DCP) -------------------------------------------------------
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


def async_group(d: Dist):
    """The process group asynchronous saves finish on (None in one process). Made at start-up, by every rank:
    making it later needs torchrun's store, which is gone once torchrun is killed."""
    if d.enabled and d.world not in _ASYNC_GROUPS:
        _ASYNC_GROUPS[d.world] = dist.new_group(backend="gloo")
    return _ASYNC_GROUPS.get(d.world)


def save_shards(model: nn.Module, optimizer, d: Dist, asynchronous: bool, folder):
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
            future = dcp.async_save(state, storage_writer=writer, process_group=async_group(d), no_dist=not d.enabled)
        else:
            dcp.save(state, storage_writer=writer, no_dist=not d.enabled)
    return Writing(d, folder, groups, future)


class Writing:
    """This rank's part of a sharded checkpoint being written: `done()` (polled each step for an asynchronous save)
    and `result()` (a collective): what meta.pt needs beside the tensors, once the files are complete."""

    def __init__(self, d: Dist, folder, groups: list, future=None):
        self.d, self.folder, self.groups, self.future = d, Path(folder), groups, future

    def done(self) -> bool:
        return self.future is None or self.future.done()

    def result(self) -> dict:
        """Every rank: its files' CRC-32s, or its error, gathered (one collective, which every rank reaches)."""
        d, error, sums = self.d, None, {}
        try:
            if self.future is not None:
                with dcp_errors():
                    self.future.result()
            sums = {p.name: crc32(p) for p in self.folder.iterdir()
                    if p.name.startswith(f"__{d.rank}_") or d.is_main and p.name == ".metadata"}
        except OSError as exc:
            error = str(exc)
        parts = d.gather({"error": error, "sums": sums})
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
        dcp.load(state, storage_reader=shard_reader(ckpt["path"]), no_dist=not dist.is_initialized())
    sd.set_model_state_dict(model, state["model"])
    if optimizer is not None:
        sd.set_optimizer_state_dict(model, optimizer, {"state": state["optimizer"],
                                                       "param_groups": ckpt["optimizer_groups"]})
