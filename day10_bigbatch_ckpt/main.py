"""Day 10 — big batches: activation memory and the true peak, shrunk by gradient checkpointing and bf16.

A tiny GPT (4 Transformer blocks) is the patient. For each batch size, in three modes (fp32, fp32 with
torch.utils.checkpoint around every block, bf16 autocast), two figures are measured, on any device:
  - saved for backward: the bytes autograd keeps between forward and backward (`sprint.measure.SavedBytes`);
  - true peak: the most tensor memory alive at once during forward + backward (`sprint.measure.PeakBytes`, a
    live-allocation counter, cross-checked against torch.profiler's allocator record; on CUDA also
    torch.cuda.max_memory_allocated).
The peak is what decides an out-of-memory error, so the largest batch that fits a budget comes from it. Then: what
checkpointing and bf16 cost in time, and a check of the Megatron formula the memory calculator (memcalc.py) uses.

Run:    python day10_bigbatch_ckpt/main.py                                    (writes runs/day10_bigbatch_ckpt/)
        python day10_bigbatch_ckpt/main.py --out day10_bigbatch_ckpt/results  (refreshes the committed figures)
        python day10_bigbatch_ckpt/memcalc.py examples                         (the curriculum's worked examples)
        python day10_bigbatch_ckpt/levers_lab.py                               (freezing, LoRA, offload, 8-bit)
Gates:  python day10_bigbatch_ckpt/check.py
"""
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from sprint import runs_dir
from sprint.cli import arg, parse, progress, run, validate
from sprint.device import pick_device
from sprint import machine
from sprint.measure import PeakBytes, SavedBytes, median_seconds, quiet_profiler

MiB = 2**20
MODES = ("fp32", "fp32 + checkpoint", "bf16 autocast")  # the three lines of each plot


@dataclass
class GPTConfig:
    vocab: int = 256  # byte-level tokens
    seq: int = 64
    hidden: int = 64
    heads: int = 4
    layers: int = 4
    dropout: float = 0.1  # dropout masks are activations too: keep them in the picture


class CausalSelfAttention(nn.Module):
    """Attention written out (no fused SDPA) so that every saved tensor is one the Megatron formula names."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.resid_drop = nn.Dropout(cfg.dropout)
        future = torch.ones(cfg.seq, cfg.seq, dtype=torch.bool).triu(diagonal=1)
        self.register_buffer("future", future, persistent=False)  # True where a token would see the future

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in self.qkv(x).split(h, dim=2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)  # (b, a, s, s): the s^2 term
        att = self.attn_drop(scores.masked_fill(self.future[:s, :s], float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, s, h)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    """Pre-LN Transformer block: x + attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.GELU(),
                                 nn.Linear(4 * cfg.hidden, cfg.hidden), nn.Dropout(cfg.dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as the 12*h^2*L + V*h count assumes

    def forward(self, idx, targets, checkpointing: bool = False):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            # Checkpointing keeps only each block's input; the block's insides are recomputed in backward.
            x = checkpoint(block, x, use_reentrant=False) if checkpointing else block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def make_batch(cfg: GPTConfig, batch: int, device="cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(cfg.vocab, (batch, cfg.seq + 1), generator=g).to(device)
    return idx[:, :-1], idx[:, 1:]  # next-token targets


def loss_in_mode(model: TinyGPT, idx, targets, mode: str):
    """One forward pass in one of MODES (autocast only changes the compute dtype, weights stay fp32)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=mode == "bf16 autocast"):
        return model(idx, targets, checkpointing=mode == "fp32 + checkpoint")


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def saved_bytes(model: TinyGPT, batch: int, mode: str) -> int:
    """Bytes autograd keeps for backward after one forward pass (the graph is then dropped, no backward)."""
    idx, targets = make_batch(model.cfg, batch, device_of(model))
    with SavedBytes(skip=model) as counter:
        loss_in_mode(model, idx, targets, mode)
    return counter.total


def peak_bytes(model: TinyGPT, batch: int, mode: str) -> tuple[int, int]:
    """(forward peak, true peak) of one forward + backward: the most tensor memory alive at once, gradients
    included, above the weights and the batch that were there before."""
    idx, targets = make_batch(model.cfg, batch, device_of(model))
    model.zero_grad(set_to_none=True)  # the gradients are allocated inside the step, as in training
    with PeakBytes() as counter:
        loss = loss_in_mode(model, idx, targets, mode)
        forward = counter.peak
        loss.backward()
        del loss
    model.zero_grad(set_to_none=True)
    return forward, counter.peak


def profiler_peak_bytes(model: TinyGPT, batch: int, mode: str) -> int:
    """The same peak from an independent witness: torch.profiler's record of every allocation and free."""
    from torch.profiler import ProfilerActivity, profile

    quiet_profiler()
    idx, targets = make_batch(model.cfg, batch, device_of(model))
    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_in_mode(model, idx, targets, mode).backward()
    model.zero_grad(set_to_none=True)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in events:  # +size at each allocation, -size at each free, in time order
        live += nbytes
        peak = max(peak, live)
    return peak


def cuda_peak_bytes(model: TinyGPT, batch: int, mode: str) -> int:
    """CUDA only: torch.cuda.max_memory_allocated() over forward + backward, above what was allocated before."""
    idx, targets = make_batch(model.cfg, batch, "cuda")
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss_in_mode(model, idx, targets, mode).backward()
    torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated() - base


def largest_batch(measure, budget: int) -> int:
    """Largest batch whose measured bytes fit `budget`.

    Both figures are linear in the batch (checked by the doubling gate), so two measurements give the line;
    its prediction is then confirmed (and corrected if needed) by measuring b and b+1 themselves.
    """
    one, two = measure(1), measure(2)
    per_sample, fixed = two - one, 2 * one - two
    b = max(0, math.floor((budget - fixed) / per_sample))
    while b > 0 and measure(b) > budget:
        b -= 1
    while measure(b + 1) <= budget:
        b += 1
    return b


def step_seconds(model: TinyGPT, batch: int, mode: str, repeat: int) -> float:
    """Median wall time of forward + backward (sprint.measure.median_seconds: warm-up, then the median)."""
    idx, targets = make_batch(model.cfg, batch, device_of(model))
    seconds = median_seconds(lambda: loss_in_mode(model, idx, targets, mode).backward(), repeat=repeat, warmup=2)
    model.zero_grad(set_to_none=True)
    return seconds


def gradients(model: TinyGPT, batch: int, mode: str, seed: int = 0) -> list[torch.Tensor]:
    idx, targets = make_batch(model.cfg, batch, device_of(model))
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # same dropout masks in both runs; checkpoint replays the RNG when recomputing
    loss_in_mode(model, idx, targets, mode).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def allclose_ratio(got: list[torch.Tensor], want: list[torch.Tensor], rtol=1e-5, atol=1e-8) -> float:
    """max |got - want| / (atol + rtol*|want|) over all elements: <= 1 exactly when torch.allclose holds."""
    return max(((g - w).abs() / (atol + rtol * w.abs())).max().item() for g, w in zip(got, want))


@dataclass
class Config:
    batches: tuple[int, ...] = arg((4, 8, 16, 32, 64), "batch sizes to measure", gt=0)
    budget_mib: float = arg(32.0, "memory budget (MiB) for the largest batch that fits", gt=0)
    time_batch: int = arg(32, "batch size of the step-time comparison", gt=0)
    repeat: int = arg(10, "timed steps per mode (their median is reported)", gt=0)
    layers: int = arg(4, "Transformer blocks in the tiny GPT", gt=0)
    device: str | None = arg(None, "cpu, cuda or mps (None: the best available)")
    seed: int = arg(0, "seed of the model's initial weights", ge=0)

    def __post_init__(self):
        validate(self)


def run_study(cfg: Config) -> dict:
    """Every figure of the day on one model: memory per batch and mode, largest batches, step times, Megatron."""
    device = pick_device(cfg.device)
    torch.manual_seed(cfg.seed)
    gpt = GPTConfig(layers=cfg.layers)
    model = TinyGPT(gpt).to(device)
    batches = sorted(cfg.batches)
    peaks = {mode: [peak_bytes(model, b, mode) for b in batches] for mode in progress(MODES, desc="true peak")}
    result = {"config": asdict(gpt), "device": str(device), "batches": batches,
              "saved_bytes": {mode: [saved_bytes(model, b, mode) for b in batches] for mode in MODES},
              "forward_peak_bytes": {mode: [f for f, _ in peaks[mode]] for mode in MODES},
              "peak_bytes": {mode: [p for _, p in peaks[mode]] for mode in MODES}}
    if device.type == "cuda":
        loss_in_mode(model, *make_batch(gpt, 2, device), "fp32").backward()  # warm-up: cuBLAS workspace etc.
        result["cuda_peak_bytes"] = {mode: [cuda_peak_bytes(model, b, mode) for b in batches] for mode in MODES}
    else:  # the counter against the profiler's allocation record, at the largest batch
        result["profiler_peak_bytes"] = {mode: profiler_peak_bytes(model, batches[-1], mode) for mode in MODES}

    budget = int(cfg.budget_mib * MiB)
    measures = {"saved for backward": lambda b, m: saved_bytes(model, b, m),
                "true peak": lambda b, m: peak_bytes(model, b, m)[1]}
    result["budget_bytes"] = budget
    result["largest_batch"] = {figure: {mode: largest_batch(lambda b, m=mode: measure(b, m), budget)
                                        for mode in progress(MODES, desc=f"largest batch by {figure}")}
                               for figure, measure in measures.items()}
    result["time_batch"] = cfg.time_batch
    result["step_seconds"] = {mode: step_seconds(model, cfg.time_batch, mode, cfg.repeat) for mode in MODES}
    result["grad_allclose_ratio"] = allclose_ratio(gradients(model, 8, "fp32 + checkpoint"),
                                                   gradients(model, 8, "fp32"))
    from day10_bigbatch_ckpt.formula_check import megatron_check  # it builds this module's model

    result["megatron"] = megatron_check(gpt, device=device.type)
    return result


def main(argv=None) -> dict:
    from day10_bigbatch_ckpt import report  # the report reads this module's figures

    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    t0 = time.perf_counter()
    result = run_study(cfg)
    result.update(machine=machine(), torch=torch.__version__, wall_s=time.perf_counter() - t0)
    print(report.write(result, out))
    return result


if __name__ == "__main__":
    run(main)
