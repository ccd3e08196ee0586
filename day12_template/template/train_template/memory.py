"""How much GPU memory a config needs, estimated on the CPU before you rent the GPU.

    python memory.py --config configs/mnist_mlp.toml --set train.batch_size=1024
    python memory.py --config configs/gpt2_124m.toml      (model.gpt.vocab_size is set: no token files needed)

Counted, in bytes, for one process (no FSDP sharding), float32 weights and AdamW:
  resting   weights 4/param + AdamW moments 8/param (optim.name=muon: Muon's momentum, 4/param, for the blocks'
            matrices) + one micro-batch (images float32 + int64 labels, or int64 token ids + int64 next-token targets)
  step peak what one training step adds on top, the larger of
            backward:  the activations autograd saves in one micro-batch's forward and loss (counted exactly with
                       saved_tensors_hooks at batch 1 and 2, then scaled: they are linear in the batch, under the same
                       autocast) + the larger of one gradient as large as the largest of them and two as large as the
                       fp32 logits (the loss's backward runs first, with every activation still saved, and holds
                       the gradients of log_softmax's output and of its input: a large vocabulary's peak)
                       (+ gradients 4/param while accumulating)
            optimizer: gradients 4/param + AdamW's temporaries (CUDA foreach: 4/param; CPU: 2 x the largest tensor)
evaluation  what an evaluation forward and loss holds at its peak, in batches of the training micro-batch (train.py
            evaluates so): every tensor it creates counted from its creation until it is freed (`LiveBytes`), under
            no_grad, so nothing is kept for backward; `eval_peak` = resting + evaluation, below the training peak.
Reported beside them, not added: `logits`, one micro-batch's in fp32 (B x T x V x 4 for a GPT; log_softmax saves as
much, in the activations), and for a GPT `activations_formula`, the curriculum's Megatron-LM estimate
n_layer x s·b·h·(34 + 5·a·s/h) for 2-byte activations, doubled when training in fp32 (no autocast).
The model is built on the meta device and run on fake tensors (FakeTensorMode): the shapes, dtypes and kernel choices
of a CPU forward without data or arithmetic, so GPT-2 takes a fraction of a second. For a CUDA estimate (the default)
attention, dropout and autocast save what CUDA's kernels save (`CudaKernels`: the CPU's attention with dropout would
keep T x T matrices that CUDA's fused kernels do not, and CUDA's autocast runs norms and reductions in fp32 where the
CPU's keeps bf16). A model whose shapes depend on its data's values cannot run on fake tensors.
Not counted: the CUDA context, cuBLAS/cuDNN workspaces (fixed, tens of MB: `cuda_library_bytes()` measures them),
allocator rounding and fragmentation; `--cards` allows CONTEXT_GIB for them. With activation checkpointing only what is
kept is counted.
"""
import argparse
import contextlib
import json
import sys
import tempfile
import weakref

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from . import config, data, models, optimizers, tasks, train

CONTEXT_GIB = 0.5  # the CUDA context and library workspaces a card must hold besides the estimate


class SavedBytes:
    """Bytes autograd saves for backward while open: each storage once, the tensors of `skip` left out."""

    def __init__(self, *skip):
        owned = [t for s in skip for t in ([*s.parameters(), *s.buffers()] if isinstance(s, torch.nn.Module) else [s])]
        self.skip = {t.untyped_storage() for t in owned}
        self.storages: dict[torch.UntypedStorage, int] = {}  # a storage's Python object is the same for all its views
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        storage = t.untyped_storage()
        if storage not in self.skip:
            self.storages[storage] = storage.nbytes()
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


class LiveBytes(TorchDispatchMode):
    """The most tensor memory alive at once while open: each storage an op creates counts from its creation until it
    is freed (a weakref finalizer), outputs that alias an input (views, in-place ops) do not. It works on fake tensors
    too. What it cannot see: scratch space a kernel allocates and frees inside itself."""

    def __init__(self):
        super().__init__()
        self.live, self.peak, self.alive = 0, 0, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(t.untyped_storage()) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.count(t.untyped_storage(), inputs)
        return out

    def count(self, storage: torch.UntypedStorage, inputs: set[int]) -> None:
        key = id(storage)
        if key in inputs or key in self.alive or storage.nbytes() == 0:
            return
        self.alive.add(key)
        self.live += storage.nbytes()
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self.free, key, storage.nbytes())

    def free(self, key: int, nbytes: int) -> None:
        if key in self.alive:
            self.alive.discard(key)
            self.live -= nbytes


# The functions that CUDA's autocast runs in fp32 and the CPU's leaves in the input's dtype (torch's autocast op
# reference, "CUDA Ops that can autocast to float32"): the norms a model calls and the reductions a hand-written one
# calls. Softmax and log_softmax inside cross_entropy already run in fp32 under both.
CUDA_AUTOCAST_FP32 = {F.layer_norm, F.rms_norm, F.group_norm, F.softmax, F.log_softmax, torch.softmax,
                      torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax, torch.pow, torch.Tensor.pow,
                      torch.Tensor.__pow__, torch.rsqrt, torch.Tensor.rsqrt, torch.exp, torch.Tensor.exp, torch.log,
                      torch.Tensor.log, torch.sum, torch.Tensor.sum, torch.cumsum, torch.Tensor.cumsum, torch.norm,
                      torch.Tensor.norm, torch.linalg.vector_norm, F.normalize}


def to_fp32(value):
    """A half-precision floating tensor as fp32 (as CUDA's autocast casts it); anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dtype in (torch.bfloat16, torch.float16):
        return value.float()
    return value


class CudaKernels(TorchFunctionMode):
    """Attention, dropout and autocast saved as CUDA's kernels save them, on the CPU. CUDA's fused attention (flash or
    memory-efficient) draws its dropout inside the kernel from a seed and an offset (two int64 it saves) and keeps no
    T x T matrix; the CPU's flash kernel at dropout 0 saves the same tensors (q, k, v, the output and its logsumexp),
    while the CPU's attention with dropout takes the math path, which keeps the attention weights and their mask.
    CUDA's dropout keeps a 1-byte mask (native_dropout), the CPU's one in the activation dtype. Under autocast, CUDA
    runs CUDA_AUTOCAST_FP32 in fp32 (a LayerNorm after a bf16 Linear saves fp32 input and output), the CPU does not."""

    def __init__(self):
        super().__init__()
        self.fused_dropouts = 0  # attention calls whose dropout the fused kernel draws

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in CUDA_AUTOCAST_FP32 and torch.is_autocast_enabled("cpu"):
            args, kwargs = [to_fp32(a) for a in args], {k: to_fp32(v) for k, v in kwargs.items()}
            with torch.autocast("cpu", enabled=False):
                return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention and kwargs.get("dropout_p", 0.0) > 0:
            self.fused_dropouts += 1
            return func(*args, **{**kwargs, "dropout_p": 0.0})
        if func is F.dropout and kwargs["p"] > 0 and kwargs["training"]:  # F.dropout passes them by name
            return torch.native_dropout(args[0], kwargs["p"], True)[0]
        return func(*args, **kwargs)


def saved_bytes(fn, *skip) -> int:
    with SavedBytes(*skip) as counter:
        fn()
    return sum(counter.storages.values())


def sample_batch(info, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (inputs, targets) shaped as the data's micro-batches: images (B, C, H, W) float32 and int64 labels, or
    windows of int64 token ids (B, block_size) and their next tokens."""
    if isinstance(info, data.TextInfo):
        windows = torch.randint(0, info.vocab_size, (batch, info.block_size + 1))
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
    return torch.randn(batch, info.channels, info.size, info.size), torch.randint(0, info.num_classes, (batch,))


def info_of(cfg: config.Config):
    """What the data says of itself, without reading it where the config says enough: a GPT with a fixed vocabulary
    (model.gpt.vocab_size > 0) needs only that and the text's block_size. Otherwise the data is built (DataError if
    absent)."""
    if cfg.model.name == "gpt" and cfg.model.gpt.vocab_size:
        return data.TextInfo(cfg.model.gpt.vocab_size, cfg.data.table.block_size)
    return data.build(cfg.data, cfg.run.seed).info


def fake_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A fake CPU tensor for each of a meta model's parameters and buffers (call inside FakeTensorMode)."""
    return {name: torch.empty(t.shape, dtype=t.dtype, requires_grad=t.requires_grad)
            for name, t in [*model.named_parameters(), *model.named_buffers()]}


def activations(cfg: config.Config, info, batch: int, device: str = "cpu") -> tuple[int, list[int], int]:
    """(bytes saved for backward, each saved storage's bytes in the order they were saved, the logits in fp32) for
    one forward and loss at `batch`: the model is built on the meta device (no initialisation) and called on fake CPU
    tensors of its parameters and buffers; for `device` cuda, attention and dropout save what CUDA's kernels save
    (CudaKernels)."""
    model = models.build(cfg.model, info, device="meta")
    kernels = CudaKernels() if device == "cuda" else contextlib.nullcontext()
    with FakeTensorMode():
        tensors = fake_tensors(model)
        x, y = sample_batch(info, batch)
        with SavedBytes(*tensors.values(), x, y) as counter, models.autocast(cfg.train, "cpu")(), kernels:
            logits = torch.func.functional_call(model, tensors, (x,))
            tasks.for_dataset(cfg.data.dataset, info).loss(logits, y)
    saved = list(counter.storages.values())
    if device == "cuda":
        saved += [16] * kernels.fused_dropouts  # each fused attention with dropout saves a seed and an offset
    return sum(saved), saved, logits.numel() * 4


def evaluation(cfg: config.Config, info, batch: int, device: str = "cpu") -> int:
    """The peak bytes an evaluation forward and loss at `batch` holds at once (LiveBytes), on fake tensors as
    `activations` runs them, in eval mode under no_grad."""
    model = models.build(cfg.model, info, device="meta").eval()
    kernels = CudaKernels() if device == "cuda" else contextlib.nullcontext()
    with FakeTensorMode():
        tensors = fake_tensors(model)
        x, y = sample_batch(info, batch)
        with torch.no_grad(), models.autocast(cfg.train, "cpu")(), kernels, LiveBytes() as counter:
            tasks.for_dataset(cfg.data.dataset, info).loss(torch.func.functional_call(model, tensors, (x,)), y)
    return counter.peak


def activations_formula(cfg: config.Config, info, micro: int) -> int:
    """The curriculum's Megatron-LM count for a GPT: s·b·h·(34 + 5·a·s/h) bytes per layer with 2-byte activations
    (s = the data's block_size, b = micro-batch, h = n_embd, a = n_head), times n_layer; x 2 without autocast (fp32)."""
    gpt, s = cfg.model.gpt, info.block_size
    per_layer = s * micro * gpt.n_embd * (34 + 5 * gpt.n_head * s / gpt.n_embd)
    return round(per_layer * gpt.n_layer * (1 if cfg.train.amp else 2))


def optimizer_state(model: torch.nn.Module, cfg: config.Optim) -> int:
    """Bytes of the optimizer's state: AdamW's two fp32 moments per parameter; under optim.name=muon, Muon's one
    momentum buffer for each of the blocks' matrices."""
    if cfg.name == "adamw":
        return 8 * sum(p.numel() for p in model.parameters())
    matrices, rest = optimizers.muon_split(model)
    return 4 * sum(p.numel() for p in matrices) + 8 * sum(p.numel() for p in rest)


def at(v1: int, v2: int, micro: int) -> int:
    """A figure linear in the batch, from its values at batch 1 and 2, at batch `micro`."""
    return (2 * v1 - v2) + (v2 - v1) * micro


class Estimator:
    """Measures a config once (its parameters on the meta device, the saved activations at batch 1 and 2); called
    with a micro-batch, returns the breakdown described in the module docstring, in bytes."""

    def __init__(self, cfg: config.Config, info, device: str = "cuda"):
        self.cfg, self.info, self.device = cfg, info, device
        model = models.build(cfg.model, info, device="meta")  # shapes only: GPT-2's weights are never initialised
        self.params = sum(p.numel() for p in model.parameters())
        self.optimizer_state = optimizer_state(model, cfg.optim)
        self.largest_param = max(p.numel() for p in model.parameters()) * 4
        self.sample_bytes = sum(t.nbytes for t in sample_batch(info, 1))
        self.at_1, self.at_2 = activations(cfg, info, 1, device), activations(cfg, info, 2, device)
        self.eval_1, self.eval_2 = evaluation(cfg, info, 1, device), evaluation(cfg, info, 2, device)

    def __call__(self, micro: int) -> dict:
        # each measured figure is a line in the batch: through its values at 1 and 2
        (act_1, sizes_1, logits_1), (act_2, sizes_2, logits_2) = self.at_1, self.at_2
        act, logits = (at(v1, v2, micro) for v1, v2 in ((act_1, act_2), (logits_1, logits_2)))
        # the largest saved tensor, each through its own line: at batch 1 and 2 it may be a weight (autocast's bf16
        # copy), at the micro-batch an activation
        largest = max(at(v1, v2, micro) for v1, v2 in zip(sizes_1, sizes_2, strict=True))
        params = self.params
        e = {"params": params, "micro_batch": micro, "weights": 4 * params, "grads": 4 * params,
             "optimizer": self.optimizer_state, "batch": micro * self.sample_bytes, "activations": act,
             "logits": logits}
        if self.cfg.model.name == "gpt":
            e["activations_formula"] = activations_formula(self.cfg, self.info, micro)
        e["backward"] = act + max(largest, 2 * logits) + (e["grads"] if self.cfg.train.grad_accum > 1 else 0)
        e["optimizer_step"] = e["grads"] + (4 * params if self.device == "cuda" else 2 * self.largest_param)
        e["step_peak"] = max(e["backward"], e["optimizer_step"])
        e["resting"] = e["weights"] + e["optimizer"] + e["batch"]
        e["peak"] = e["resting"] + e["step_peak"]
        e["evaluation"] = at(self.eval_1, self.eval_2, micro)
        e["eval_peak"] = e["resting"] + e["evaluation"]
        return e

    def largest_micro_batch(self, budget: int) -> int:
        """The largest micro-batch whose estimated peak fits in `budget` bytes (0: not even one sample): the peak
        grows with the micro-batch, so double until it does not fit, then bisect."""
        if self(1)["peak"] > budget:
            return 0
        fits, too_big = 1, 2
        while self(too_big)["peak"] <= budget:
            fits, too_big = too_big, 2 * too_big
        while too_big - fits > 1:
            middle = (fits + too_big) // 2
            fits, too_big = (middle, too_big) if self(middle)["peak"] <= budget else (fits, middle)
        return fits


def estimate(cfg: config.Config, info, device: str = "cuda", world: int = 1) -> dict:
    """The breakdown described in the module docstring, in bytes, at the config's micro-batch."""
    return Estimator(cfg, info, device)(cfg.train.batch_size // (cfg.train.grad_accum * world))


def cpu_eval_peak(cfg: config.Config, info) -> int:
    """Measured on the CPU: the most an evaluation forward and loss at the micro-batch allocates (allocation_peak)."""
    torch.manual_seed(0)
    model = models.build(cfg.model, info).eval()
    x, y = sample_batch(info, cfg.train.batch_size // cfg.train.grad_accum)

    @torch.no_grad()
    def forward():
        with models.autocast(cfg.train, "cpu")():
            tasks.for_dataset(cfg.data.dataset, info).loss(model(x), y)

    forward()
    return allocation_peak(forward)


def cpu_step_peak(cfg: config.Config, info) -> int:
    """Measured on the CPU: the most a training step (forward, backward, clip, AdamW) allocates above the memory
    live before it (see allocation_peak)."""
    torch.manual_seed(0)
    model = models.build(cfg.model, info)
    optimizer = optimizers.build(model, cfg.optim)
    task = tasks.for_dataset(cfg.data.dataset, info)
    x, y = sample_batch(info, cfg.train.batch_size // cfg.train.grad_accum)

    def step():
        with models.autocast(cfg.train, "cpu")():
            loss = task.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW creates its moments on the first step: measure a steady one
    return allocation_peak(step)


def allocation_peak(fn) -> int:
    """The most `fn()` allocates on the CPU above the memory live before it, from torch.profiler's allocation
    tracking (the CPU stand-in for torch.cuda.max_memory_allocated)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    totals = [(e["args"]["Total Allocated"], e["args"]["Bytes"]) for e in events if e.get("name") == "[memory]"]
    # The running total also holds what earlier profiling sessions of this process allocated and never freed:
    # measure from the total before the step's first allocation.
    before = totals[0][0] - totals[0][1]
    return max(total for total, _ in totals) - before


def cuda_library_bytes() -> int:
    """What cuBLAS/cuBLASLt workspaces hold after a Linear-LayerNorm-GELU forward and backward (fp32 and autocast),
    once every tensor of that warm-up is freed: the fixed part the estimate leaves out."""
    for amp in (False, True):
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                  torch.nn.Linear(64, 10)).cuda()
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            loss = net(torch.randn(32, 64, device="cuda")).float().sum()
        loss.backward()
        del net, loss
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def card_sizes(text: str) -> list[float]:
    try:
        sizes = [float(size) for size in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected GiB separated by commas (12,24,80), got {text!r}") from None
    if not sizes or min(sizes) <= CONTEXT_GIB:
        raise argparse.ArgumentTypeError(f"every card must hold more than the {CONTEXT_GIB} GiB CUDA context")
    return sizes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a TOML config (see configs/)")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the run will train")
    parser.add_argument("--cards", type=card_sizes, default=[12, 24, 80], metavar="GIB,GIB,...",
                        help="GPU memory sizes in GiB to check the peak against (default 12,24,80)")
    args = parser.parse_args(argv)
    try:
        cfg = config.load(args.config, args.set)
        info = info_of(cfg)
    except (config.ConfigError, data.DataError) as exc:  # one line, the exit codes of train.py
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2 if isinstance(exc, config.ConfigError) else 1)
    estimator = Estimator(cfg, info, args.device)
    e = estimator(cfg.train.batch_size // cfg.train.grad_accum)
    print(f"{cfg.model.name}: {e['params']:,} parameters, micro-batch {e['micro_batch']}")
    scale = "2-byte activations (autocast)" if cfg.train.amp else "2-byte activations x 2 (fp32)"
    notes = {"logits": "fp32, in activations as log_softmax's output; its backward adds two as large",
             "activations_formula": f"the curriculum's Megatron formula, {scale}",
             "eval_peak": "an evaluation (micro-batches, no_grad): resting + evaluation"}
    for key in ("weights", "optimizer", "batch", "resting", "activations", "logits", "activations_formula",
                "backward", "optimizer_step", "step_peak", "peak", "evaluation", "eval_peak"):
        if key in e:
            print(f"  {key:<20}{e[key] / 2**20:10.2f} MiB  {notes.get(key, '')}".rstrip())
    print(f"  + CUDA context and cuBLAS/cuDNN workspaces: not counted; each card keeps {CONTEXT_GIB} GiB for them")
    need = e["peak"] / 2**30 + CONTEXT_GIB
    for card in args.cards:
        budget = int((card - CONTEXT_GIB) * 2**30)
        if e["peak"] <= budget:
            verdict = f"fits ({need:.2f} GiB)"
        elif micro := estimator.largest_micro_batch(budget):
            verdict = f"does not fit ({need:.2f} GiB); micro-batch {micro} would (raise train.grad_accum to match)"
        else:
            verdict = "does not fit even at micro-batch 1: shard it (train.strategy=fsdp) or checkpoint activations"
        print(f"  {card:g} GiB card: {verdict}")


def cli() -> None:
    """`python memory.py` at the template's root runs this."""
    train.exit_with(main)
