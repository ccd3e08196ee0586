"""Scale-out on PyTorch's own engine: which rank this process is, and how the model is wrapped (DDP or FSDP2).

One process per device. torchrun sets RANK / WORLD_SIZE / LOCAL_RANK (and MASTER_ADDR/PORT); without them the run
is a single process and the strategy is ignored. Backend: nccl on CUDA, gloo on CPU. What a checkpoint holds of a
wrapped model, and how it loads into another strategy or world size, is the checkpoint package's part.
"""
import contextlib
import ctypes
import os
import signal
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed
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

    def all_reduce(self, t: torch.Tensor, op=torch.distributed.ReduceOp.SUM) -> torch.Tensor:
        if self.enabled:
            torch.distributed.all_reduce(t, op=op)
        return t

    def gather(self, obj) -> list:
        """Every rank's `obj` (a list on every rank)."""
        if not self.enabled:
            return [obj]
        out = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def close(self) -> None:
        if self.owns_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


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
    if world > 1 and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
        owns = True
    return Dist(rank, world, local_rank, device, owns)


# -- wrapping ----------------------------------------------------------------------------------------------------
def shard(model: nn.Module, dist: Dist, bf16: bool = False) -> None:
    """FSDP2's `fully_shard`, in place: each of `model.blocks`, then the root, so that one block's full weights exist
    at a time. Call it before the model's memory is allocated, while it is on the meta device (models.build), so that
    only the shards are ever allocated.
    `bf16` (train.amp in bfloat16): parameters are all-gathered in bf16 (half the bytes; autocast still keeps its fp32
    ops in fp32) and gradients reduce-scattered in fp32; the shards and AdamW's moments stay fp32."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(dist.device.type, (dist.world,))
    policy = MixedPrecisionPolicy()  # parameters and gradient reductions in their own dtype (fp32)
    if bf16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in getattr(model, "blocks", []):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 sharded the model (its parameters are DTensors)."""
    return any(hasattr(p, "device_mesh") for p in model.parameters())


def wrap(model: nn.Module, dist: Dist) -> nn.Module:
    """The module to call for training: a DDP wrapper under torchrun, else the model itself (one process, or a model
    FSDP2 sharded in place). State dicts are always taken from `model`."""
    if not dist.enabled or is_sharded(model):
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[dist.device.index] if dist.device.type == "cuda" else None)


def sync_buffers(model: nn.Module, dist: Dist) -> None:
    """Rank 0's buffers (BatchNorm running statistics) on every rank. Each rank's last forward updated its own copy;
    rank 0's is the one a checkpoint saves, so evaluating with it makes the logged figures those of best.pt."""
    if dist.enabled:
        for buffer in model.buffers():
            torch.distributed.broadcast(buffer.data, src=0)


def grad_sync(module: nn.Module, enabled: bool):
    """Context for one micro-batch's backward: skip the gradient all-reduce unless `enabled` (the last micro-batch
    of an optimizer step). DDP: `no_sync()`; FSDP2: `set_requires_gradient_sync`."""
    if hasattr(module, "no_sync"):
        return contextlib.nullcontext() if enabled else module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


def local_norm(norm: torch.Tensor) -> torch.Tensor:
    """clip_grad_norm_ returns a DTensor under FSDP2: the full value as a plain tensor."""
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

