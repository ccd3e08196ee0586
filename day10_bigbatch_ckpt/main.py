"""Day 10 — big batches: measure activation memory, then shrink it with gradient checkpointing and bf16.

A tiny GPT (4 Transformer blocks) is the patient. For each batch size we count the bytes autograd keeps
for backward (CPU: a saved-tensors hook; CUDA: also torch.cuda.max_memory_allocated), then repeat with
torch.utils.checkpoint around every block and with bf16 autocast. From the measurements: the largest batch
that fits an activation budget, the time checkpointing costs, and a check of the Megatron formula the
memory calculator (memcalc.py) uses.

Run:    python day10_bigbatch_ckpt/main.py          (~20 s on CPU; writes day10_bigbatch_ckpt/results/)
        python day10_bigbatch_ckpt/memcalc.py table (the curriculum's 12 GB table)
Gates:  python day10_bigbatch_ckpt/check.py
"""
import argparse
import copy
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.benchmark as benchmark
from torch.utils.checkpoint import checkpoint

from day10_bigbatch_ckpt import memcalc
from day10_bigbatch_ckpt.report import plot, report
from sprint.device import pick_device

OUT_DIR = Path(__file__).resolve().parent / "results"
MiB = 2**20
MODES = ("fp32", "fp32 + checkpoint", "bf16 autocast")  # the three lines of the plot


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


class SavedTensorBytes:
    """Counts the bytes autograd saves for backward while the context is open.

    A tensor saved twice (or two views of one buffer, e.g. the token ids and targets sliced from one tensor)
    counts once: storages are deduplicated by data_ptr. Parameters and buffers are skipped: they are model states, not
    activations. The pack hook returns the tensor itself, so counting changes nothing it measures.
    """

    def __init__(self, model: nn.Module):
        self.skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
        self.storages: dict[int, int] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.skip:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def loss_in_mode(model: TinyGPT, idx, targets, mode: str):
    """One forward pass in one of MODES (autocast only changes the compute dtype, weights stay fp32)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {MODES}")
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=mode == "bf16 autocast"):
        return model(idx, targets, checkpointing=mode == "fp32 + checkpoint")


def saved_bytes(model: TinyGPT, batch: int, mode: str) -> int:
    """Activation bytes for one forward pass at `batch` (forward only: the graph is dropped, no backward)."""
    idx, targets = make_batch(model.cfg, batch, next(model.parameters()).device)
    with SavedTensorBytes(model) as counter:
        loss_in_mode(model, idx, targets, mode)
    return counter.total


def cuda_peak_bytes(model: TinyGPT, batch: int, mode: str) -> int:
    """CUDA only: peak allocated during the forward pass, above what was allocated before it."""
    idx, targets = make_batch(model.cfg, batch, "cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = loss_in_mode(model, idx, targets, mode)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del loss
    return peak


def largest_batch(measure, budget: int) -> int:
    """Largest batch whose measured activations fit `budget`.

    Activations are linear in the batch (checked by the doubling gate), so two measurements give the line;
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


def step_seconds(model: TinyGPT, batch: int, mode: str, min_run_time: float = 1.0) -> float:
    """Median wall time of forward + backward (torch.utils.benchmark: warm-up, repeats, our thread count)."""
    idx, targets = make_batch(model.cfg, batch, next(model.parameters()).device)
    timer = benchmark.Timer("loss_in_mode(model, idx, targets, mode).backward()",
                            globals=dict(loss_in_mode=loss_in_mode, model=model, idx=idx, targets=targets, mode=mode),
                            num_threads=torch.get_num_threads())
    seconds = timer.blocked_autorange(min_run_time=min_run_time).median  # synchronises CUDA itself
    model.zero_grad(set_to_none=True)
    return seconds


def gradients(model: TinyGPT, batch: int, mode: str, seed: int = 0) -> list[torch.Tensor]:
    idx, targets = make_batch(model.cfg, batch, next(model.parameters()).device)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # same dropout masks in both runs; checkpoint replays the RNG when recomputing
    loss_in_mode(model, idx, targets, mode).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def allclose_ratio(got: list[torch.Tensor], want: list[torch.Tensor], rtol=1e-5, atol=1e-8) -> float:
    """max |got - want| / (atol + rtol*|want|) over all elements: <= 1 exactly when torch.allclose holds."""
    return max(((g - w).abs() / (atol + rtol * w.abs())).max().item() for g, w in zip(got, want))


def megatron_check(cfg: GPTConfig, batches=(4, 8), device="cpu") -> list[dict]:
    """Close the loop: predict one block's 16-bit activations with the formula, measure them with the hook.

    The blocks run with bf16 weights and inputs, the formula's setting. What it counts: the inputs of the
    linear layers, LayerNorms and GELU, q/k/v, softmax output, and dropout masks at 1 byte per element.
    Two known differences: PyTorch's CPU dropout keeps its mask in the activation dtype (2 bytes; CUDA keeps a
    1-byte bool mask), and each LayerNorm also saves its mean and 1/std per token. `explained` adds both.
    """
    model = TinyGPT(cfg).to(device)
    blocks = copy.deepcopy(model.blocks).to(torch.bfloat16)
    s, h, a, layers = cfg.seq, cfg.hidden, cfg.heads, cfg.layers
    rows = []
    for b in batches:
        x = torch.randn(b, s, h, dtype=torch.bfloat16, device=device, requires_grad=True)
        with SavedTensorBytes(blocks) as counter:
            y = x
            for block in blocks:
                y = block(y)
        measured = counter.total / layers
        predicted = memcalc.activation_bytes_per_layer(s, b, h, a)
        mask_bytes, stat_bytes = (2, 2) if device == "cpu" else (1, 4)
        mask_extra = (mask_bytes - 1) * (2 * s * b * h + a * s * s * b)  # the formula prices masks at 1 byte
        ln_stats = 2 * 2 * b * s * stat_bytes  # 2 LayerNorms x (mean, 1/std) per token
        rows.append({"batch": b, "measured_per_layer": measured, "predicted_per_layer": predicted,
                     "ratio": measured / predicted, "explained_ratio": measured / (predicted + mask_extra + ln_stats)})
    return rows


def cuda_model_states(cfg: GPTConfig, batch: int = 1) -> dict:
    """CUDA only: params + grads + AdamW states after the first step, predicted (memcalc) vs measured."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model = TinyGPT(cfg).cuda()
    # fused AdamW updates in place; the default foreach path allocates temporaries as large as the states.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    idx, targets = make_batch(cfg, batch, "cuda")
    model(idx, targets).backward()
    opt.step()
    torch.cuda.synchronize()
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "predicted": memcalc.model_state_bytes(params, "fp32-adamw"),
            "measured": torch.cuda.max_memory_allocated() - base}


def run(cfg: GPTConfig = GPTConfig(), batches=(4, 8, 16, 32, 64), budget_mib: float = 32.0, time_batch: int = 32,
        time_s: float = 1.0, device=None, seed: int = 0) -> dict:
    device = pick_device(device)
    torch.manual_seed(seed)
    model = TinyGPT(cfg).to(device)
    memory = {mode: [saved_bytes(model, b, mode) for b in batches] for mode in MODES}
    result = {"config": asdict(cfg), "device": str(device), "batches": list(batches), "saved_bytes": memory}
    if device.type == "cuda":
        loss_in_mode(model, *make_batch(cfg, 2, device), "fp32").backward()  # warm-up: cuBLAS workspace etc.
        result["cuda_peak_bytes"] = {mode: [cuda_peak_bytes(model, b, mode) for b in batches] for mode in MODES}

    budget = int(budget_mib * MiB)
    result["budget_bytes"] = budget
    result["largest_batch"] = {mode: largest_batch(lambda b, m=mode: saved_bytes(model, b, m), budget)
                               for mode in MODES[:2]}
    result["step_seconds"] = {mode: step_seconds(model, time_batch, mode, time_s) for mode in MODES}
    result["time_batch"] = time_batch
    result["grad_allclose_ratio"] = allclose_ratio(gradients(model, 8, "fp32 + checkpoint"),
                                                   gradients(model, 8, "fp32"))
    result["megatron"] = megatron_check(cfg, device=device.type)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--budget-mib", type=float, default=32.0, help="activation budget for the largest batch")
    parser.add_argument("--time-batch", type=int, default=32, help="batch for the step-time comparison")
    parser.add_argument("--time-s", type=float, default=1.0, help="timing budget per mode (seconds)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--device", default=None, help="cpu / cuda / mps (default: best available)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the plot and tables go")
    args = parser.parse_args(argv)
    if min(args.batches) < 1 or args.budget_mib <= 0 or args.layers < 1:
        parser.error("batches and layers must be >= 1 and the budget positive")

    result = run(GPTConfig(layers=args.layers), tuple(sorted(args.batches)), args.budget_mib, args.time_batch,
                 args.time_s, args.device)
    text = report(result)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "memory_vs_batch.png")
    (args.out / "memory_vs_batch.md").write_text(text + "\n")
    (args.out / "memory_table_12gb.md").write_text(memcalc.table_markdown(memcalc.table_12gb()) + "\n")
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}/memory_vs_batch.png, memory_vs_batch.md, memory_table_12gb.md, summary.json")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
