"""Closing the loop: the memory calculator's formulas (memcalc.py) against what PyTorch measures — one block's saved
bytes against Megatron's s*b*h*(34 + 5*a*s/h), and (CUDA) the model states after an AdamW step against 16 bytes per
parameter."""
import copy

import torch

from day10_bigbatch_ckpt import memcalc
from day10_bigbatch_ckpt.main import GPTConfig, TinyGPT, make_batch
from sprint.measure import SavedBytes


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
        with SavedBytes(skip=blocks) as counter:
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
    """CUDA only: params + grads + AdamW states after the first step, predicted (memcalc) vs measured.

    cuBLAS takes its workspace (about 32 MiB on a Hopper card) from the caching allocator at the first matrix product on
    a stream and keeps it: a warm-up product first puts it in the baseline, so the figure is the model's states."""
    warm = torch.nn.Linear(8, 8, device="cuda")
    warm(torch.ones(2, 8, device="cuda")).sum().backward()
    del warm
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
