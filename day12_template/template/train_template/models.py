"""Models, chosen by `model.name`. Adding one is a config table (its hyperparameters, each with a reason) and one
function, registered together:

    @dataclass
    class MyNetTable:
        hidden: int = opt(256, "width of the hidden layer", gt=0)

    @register("my_net", MyNetTable, task="classify")
    def my_net(cfg: MyNetTable, info) -> nn.Module:      # info: what the data says of itself (data.ImageInfo)
        return MyNet(info.channels, info.num_classes, cfg.hidden)

and `[model.my_net]` in a config file (or `--set model.my_net.hidden=512`) sets its fields.

What every command asks of a model is the README's table ("A new model"; tests/test_models.py holds every registered
model to it): `forward(x)` returning logits, (batch, classes) for `classify` and (batch, time, vocabulary) for `lm`
(the task, tasks.py, turns them into a loss), and nothing else. Optional, each for what it enables: `blocks` (one
FSDP2 unit each), a `checkpointing` flag its forward honours (`model.activation_checkpointing`, refused without it;
`Blocks` gives both), `init_tensor` (below), `flops_per_token()` (MFU), `generate_stream` (sample.py's fast path).

A model initialises itself through `init_tensor(name, tensor, generator)`: the rule for one parameter or buffer (a
computed buffer, such as a mask: computed again), filled whole from `generator`. That is what lets FSDP build the
model without any rank ever holding all of it (see `init_weights`); a model without one gets its layers' default
init, and under FSDP each rank builds it whole before sharding it.
"""
import functools
import math
import zlib
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .config import ConfigError, opt
from .gpt import GPT


@dataclass(frozen=True)
class Registered:
    build: Callable  # (the model's table, the data's info) -> nn.Module
    table: type  # the dataclass of the model's hyperparameters: [model.<name>]
    task: str  # what it learns: a name in tasks.TASKS


MODELS: dict[str, Registered] = {}


def register(name: str, table: type, task: str):
    """Decorator: `build` becomes model `name`, configured by `[model.<name>]` (fields of `table`)."""
    def add(build: Callable) -> Callable:
        MODELS[name] = Registered(build, table, task)
        return build
    return add


def init_vector(name: str, tensor: torch.Tensor) -> None:
    """A norm's gain or a running variance 1; a bias, a running mean or a count 0."""
    if name.endswith(("running_var", ".weight")):
        nn.init.ones_(tensor)
    else:
        nn.init.zeros_(tensor)


class Blocks(nn.Module):
    """Runs `self.blocks` in order, each one recomputed in backward when checkpointing is on (training only)."""

    checkpointing = False

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)  # keeps only x; the block's insides are recomputed
            else:
                x = block(x)
        return x


class MLP(Blocks):
    """Day 4's network: flatten -> [Linear -> LayerNorm -> GELU -> Dropout] x depth -> Linear (logits)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 512, depth: int = 1, dropout: float = 0.1):
        super().__init__()
        widths = [in_features] + [hidden] * depth
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.LayerNorm(b), nn.GELU(), nn.Dropout(dropout))
            for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(hidden, num_classes)

    def init_tensor(self, name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        if tensor.dim() == 2:  # small random weights break the symmetry between units
            nn.init.trunc_normal_(tensor, std=0.02, a=-0.04, b=0.04, generator=generator)
        else:
            init_vector(name, tensor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.run_blocks(x.flatten(1)))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut (identity, or 1x1 conv + BN when the shape changes)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, padding=1, bias=False)  # BN's shift replaces a bias
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(Blocks):
    """Day 9's network: a stride-2 stem, one BasicBlock per stage (stride 2 after the first), global average pool."""

    def __init__(self, in_channels: int, num_classes: int, widths=(16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        chans = [widths[0], *widths]
        self.blocks = nn.ModuleList(BasicBlock(a, b, stride=1 if i == 0 else 2)
                                    for i, (a, b) in enumerate(zip(chans, chans[1:])))
        self.head = nn.Linear(widths[-1], num_classes)

    def init_tensor(self, name: str, tensor: torch.Tensor, generator: torch.Generator) -> None:
        if tensor.dim() >= 2:  # PyTorch's default for the weights of Conv2d and Linear: U(+-1/sqrt(fan_in))
            bound = 1 / math.sqrt(tensor[0].numel())
            nn.init.uniform_(tensor, -bound, bound, generator=generator)
        else:
            init_vector(name, tensor)

    def forward(self, x):
        return self.head(self.run_blocks(self.stem(x)).mean(dim=(2, 3)))


@dataclass
class MLPTable:
    hidden: int = opt(512, "width of each hidden layer", gt=0)
    depth: int = opt(1, "hidden blocks (Linear-LayerNorm-GELU-Dropout)", gt=0)
    dropout: float = opt(0.1, "dropout after each hidden block; it is what makes restoring the RNG necessary", ge=0,
                         lt=1)


@register("mlp", MLPTable, task="classify")
def mlp(cfg: MLPTable, info) -> nn.Module:
    return MLP(info.channels * info.size * info.size, info.num_classes, cfg.hidden, cfg.depth, cfg.dropout)


@dataclass
class ResNetTable:
    widths: tuple[int, ...] = opt((16, 32, 64), "channels per stage (one BasicBlock each, stride 2 after the "
                                  "first)", gt=0)


@register("resnet", ResNetTable, task="classify")
def resnet(cfg: ResNetTable, info) -> nn.Module:
    return ResNet(info.channels, info.num_classes, cfg.widths)


@dataclass
class GPTTable:
    n_layer: int = opt(4, "transformer blocks: depth", gt=0)
    n_head: int = opt(4, "attention heads per block (n_embd / n_head = each head's width)", gt=0)
    n_embd: int = opt(128, "width of the residual stream: the model's size grows with n_layer x n_embd^2", gt=0)
    block_size: int = opt(64, "the longest context the model sees (its position embeddings): at least "
                          "the data's block_size", gt=0)
    dropout: float = opt(0.0, "dropout in attention and MLP outputs: 0 for short runs on much data, 0.1-0.2 "
                         "when a small corpus is seen many times", ge=0, lt=1)
    bias: bool = opt(True, "biases in Linear and LayerNorm layers, as GPT-2; false is a little faster")
    vocab_size: int = opt(0, "0 = the data's vocabulary; N = embeddings for N tokens (padding GPT-2's 50,257 to "
                          "50,304, a multiple of 64, speeds up GPU matmuls; memory.py then needs no data)", ge=0)
    # The parts of a modern GPT (Llama, Gemma, modded-nanogpt), each an option; the defaults are GPT-2's.
    norm: str = opt("layernorm", "layernorm (GPT-2) | rmsnorm (Llama: no centring, no bias; a little cheaper)",
                    choices=("layernorm", "rmsnorm"))
    position: str = opt("learned", "learned (GPT-2: an embedding per position, block_size of them) | rope (rotary: "
                        "queries and keys turned by their position, so attention sees relative ones; no parameters) | "
                        "none (NoPE: only the causal mask tells a position how many came before it)",
                        choices=("learned", "rope", "none"))
    mlp: str = opt("gelu", "gelu (GPT-2, 4x wide) | swiglu (PaLM, Llama: gated, 8/3x wide for the same parameters) | "
                   "relu2 (ReLU squared: Primer, modded-nanogpt)", choices=("gelu", "swiglu", "relu2"))
    qk_norm: bool = opt(False, "RMS-normalise each head's queries and keys before attention: bounded attention "
                        "logits, steadier at high learning rates")
    logit_softcap: float = opt(0.0, "0 = off; C = the logits squashed to C x tanh(logits / C) (Gemma 2: 30): no "
                               "logit runs away", ge=0)
    tie_embeddings: bool = opt(True, "the output layer shares the token embedding's matrix (GPT-2); false: a "
                               "matrix of its own (more parameters, often a little better at scale)")
    norm_placement: str = opt("pre", "pre (GPT-2 on: the norm inside each residual branch, a clean residual path) | "
                              "post (the 2017 Transformer: the norm after each addition; needs warmup to train deep)",
                              choices=("pre", "post"))

    def check(self, cfg) -> None:
        if self.n_embd % self.n_head:
            raise ConfigError(f"model.gpt.n_embd={self.n_embd} must be divisible by model.gpt.n_head={self.n_head}")
        if self.position == "rope" and (self.n_embd // self.n_head) % 2:
            raise ConfigError(f"model.gpt.position=rope turns pairs of dimensions: the head width n_embd / n_head = "
                              f"{self.n_embd // self.n_head} must be even")
        if cfg.data.table.block_size > self.block_size:
            raise ConfigError(f"data.{cfg.data.dataset}.block_size={cfg.data.table.block_size} exceeds "
                              f"model.gpt.block_size={self.block_size}, the longest context the model has positions "
                              f"for")


@register("gpt", GPTTable, task="lm")
def gpt(cfg: GPTTable, info) -> nn.Module:
    if cfg.vocab_size and cfg.vocab_size < info.vocab_size:
        raise ConfigError(f"model.gpt.vocab_size={cfg.vocab_size} is below the data's vocabulary of "
                          f"{info.vocab_size:,} tokens (0 = the data's)")
    vocab = cfg.vocab_size or info.vocab_size
    return GPT(vocab, cfg.block_size, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.dropout, cfg.bias, cfg.norm,
               cfg.position, cfg.mlp, cfg.qk_norm, cfg.logit_softcap, cfg.tie_embeddings, cfg.norm_placement)


def build(cfg, info, seed: int = 0, device: str | torch.device = "cpu", shard: Callable | None = None) -> nn.Module:
    """The model named by `cfg.name` (the [model] section), configured by its table, sized for the data, on `device`
    and initialised from `seed`; on "meta", shapes only (no memory, no random draws: for counting and estimating).
    It is built on the meta device first; `shard` (FSDP2's fully_shard) is applied there, then memory is allocated and
    every tensor drawn by `init_weights`. A model without `init_tensor` is built whole instead, by its layers' own
    initialisers (on the CPU, then moved), then sharded."""
    make = functools.partial(MODELS[cfg.name].build, cfg.table, info)
    with torch.device("meta"):
        model = make()
    real, own_init = torch.device(device).type != "meta", hasattr(model, "init_tensor")
    if real and not own_init:
        with torch.random.fork_rng(devices=[]):  # PyTorch's default init, from `seed`; the global RNG untouched
            torch.default_generator.manual_seed(seed)
            model = make().to(device)
    if shard:
        shard(model)
    if real and own_init:
        materialize(model, device, seed)
    if cfg.activation_checkpointing and not hasattr(model, "checkpointing"):
        raise ConfigError(f"model.activation_checkpointing: model {cfg.name!r} has no `checkpointing` flag that its "
                          f"forward honours (subclass models.Blocks and run self.blocks with self.run_blocks)")
    model.checkpointing = cfg.activation_checkpointing
    return model


def materialize(model: nn.Module, device: str | torch.device, seed: int) -> None:
    """Memory on `device` for a model built on "meta" (only the local shards of an FSDP2-sharded one), then its
    initial values (init_weights). Ties between parameters (GPT's embedding and head) are kept."""
    ties = tied_parameters(model)
    model.to_empty(device=device)
    for module, name, owner, owner_name in ties:  # to_empty gives each use of a shared tensor its own copy
        setattr(module, name, getattr(owner, owner_name))
    init_weights(model, seed)


def tied_parameters(model: nn.Module) -> list[tuple]:
    """(module, name, owner, owner's name) for every parameter that is another module's, met earlier."""
    first, ties = {}, []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in first:
                ties.append((module, name, *first[id(p)]))
            else:
                first[id(p)] = (module, name)
    return ties


@torch.no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
    """Every parameter and buffer by `model.init_tensor`, each drawn whole from a generator of its own, seeded from
    `seed` and its name. An FSDP2-sharded parameter (a DTensor) is drawn into a temporary and keeps only its rows, so
    every rank's shard equals the same rows of what one process initialises, at any world size; the largest
    temporary is one tensor. The draws happen on the tensor's device: CPU and CUDA give different (equally valid)
    values."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        generator = torch.Generator(tensor.device).manual_seed(seed << 32 | zlib.crc32(name.encode()))
        if hasattr(tensor, "device_mesh"):
            init_shard(model, name, tensor, generator)
        else:
            model.init_tensor(name, tensor, generator)


def init_shard(model: nn.Module, name: str, shard, generator: torch.Generator) -> None:
    """A DTensor's local rows of the whole tensor `model.init_tensor` draws (the temporaries end with this call)."""
    from torch.distributed.tensor import distribute_tensor  # FSDP2 has imported it already (it is slow to load)

    whole = torch.empty(shard.shape, dtype=shard.dtype, device=shard.device)
    model.init_tensor(name, whole, generator)
    mine = distribute_tensor(whole, shard.device_mesh, shard.placements, src_data_rank=None)  # no communication
    shard.to_local().copy_(mine.to_local())


def autocast(train, device_type: str):
    """A factory of autocast contexts for `train.amp` / `train.amp_dtype` (a no-op context when amp is off)."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[train.amp_dtype]
    return lambda: torch.autocast(device_type, dtype=dtype, enabled=train.amp)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
