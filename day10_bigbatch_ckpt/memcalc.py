"""Memory-budget calculator: predict a training run's memory on paper, the curriculum's way.

    total = fixed overhead + weights + gradients + optimizer states + activations x 1.3 + logits

Units: 1 GB = 1e9 bytes (decimal, as memory chips are labelled). torch.cuda.max_memory_allocated() and
nvidia-smi report binary units (1 GiB = 2**30 bytes = 1.074 GB), so a measured reading looks ~7% smaller.
The KV-cache figure is given in GiB, as the curriculum prints it.

Run:  python day10_bigbatch_ckpt/memcalc.py table                 (the 12 GB single-GPU table)
      python day10_bigbatch_ckpt/memcalc.py train --hidden 768 --layers 12 --heads 12 --seq 512 --batch 8
      python day10_bigbatch_ckpt/memcalc.py kv --layers 32 --kv-heads 8 --head-dim 128 --seq 8192
      python day10_bigbatch_ckpt/memcalc.py zero --params 7e9 --gpus 8
"""
import argparse
import sys
from dataclasses import dataclass

GB = 1e9  # decimal gigabyte
MB = 1e6
GiB = 2**30

# Bytes per parameter for (weights, gradients, optimizer states).
SETUPS = {
    "fp32-sgd": (4, 4, 0),  # plain SGD keeps no state
    "fp32-momentum": (4, 4, 4),  # one velocity buffer
    "fp32-adamw": (4, 4, 8),  # m and v, 4 bytes each
    "amp-adamw": (4, 4, 8),  # autocast computes in bf16 but stores weights, grads and m/v in fp32
    "bf16-master-adamw": (2, 2, 12),  # bf16 weights+grads, fp32 master copy + m + v (ZeRO paper's accounting)
    "amp-adamw8bit": (4, 4, 2),  # 8-bit Adam: m and v at 1 byte each
}
FIXED_OVERHEAD = 0.8 * GB  # CUDA context + cuBLAS/cuDNN workspaces, the curriculum's convention
ACTIVATION_FACTOR = 1.3  # formula is a lower bound: fragmentation, attention temporaries, unfused ops


def decoder_params(hidden: int, layers: int, vocab: int) -> float:
    """Decoder-only parameter count: 4h^2 attention + 8h^2 MLP per layer, embedding tied with the output layer."""
    return 12 * hidden**2 * layers + vocab * hidden


def bytes_per_param(setup: str) -> int:
    if setup not in SETUPS:
        raise ValueError(f"unknown training setup {setup!r}; choose one of {sorted(SETUPS)}")
    return sum(SETUPS[setup])


def model_state_bytes(params: float, setup: str = "amp-adamw", trainable: float | None = None,
                      frozen_bytes: int = 2) -> float:
    """Weights + gradients + optimizer states. With `trainable` (LoRA / frozen base) the base is stored frozen
    at `frozen_bytes` per parameter (bf16) with no gradients or optimizer state; only `trainable` pays `setup`."""
    per_param = bytes_per_param(setup)
    if trainable is None:
        return params * per_param
    return params * frozen_bytes + trainable * per_param


def activation_bytes_per_layer(seq: int, batch: int, hidden: int, heads: int) -> float:
    """Megatron-LM's 16-bit activation estimate for one Transformer layer: s*b*h*(34 + 5*a*s/h) bytes.

    34*s*b*h: the inputs of the linear layers, LayerNorms and GELU (2 bytes/element) and the dropout masks
    (1 byte/element); 5*a*s^2*b: the attention scores, softmax output and its dropout mask, growing with s^2.
    """
    return seq * batch * hidden * (34 + 5 * heads * seq / hidden)


def logits_bytes(batch: int, seq: int, vocab: int, bytes_per_element: int = 2) -> float:
    return batch * seq * vocab * bytes_per_element


def training_flops(params: float, tokens: float) -> float:
    """Forward (2 FLOPs per parameter per token) + backward (4) = 6*P*tokens; sum per tower for multi-tower models."""
    return 6 * params * tokens


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, seq: int, batch: int = 1,
                   bytes_per_element: int = 2) -> float:
    """K and V for every layer, KV head and position: 2*L*n_kv*d_head*s*b*bytes."""
    return 2 * layers * kv_heads * head_dim * seq * batch * bytes_per_element


def zero_per_gpu(params: float, gpus: int, stage: int = 3, setup: str = "bf16-master-adamw") -> float:
    """Model-state bytes per GPU under ZeRO: stage 1 shards optimizer states, 2 also gradients, 3 also weights."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")
    if gpus < 1:
        raise ValueError(f"need at least one GPU, got {gpus}")
    bytes_per_param(setup)  # validates the name
    weights, grads, states = (params * b for b in SETUPS[setup])
    return (states / gpus if stage >= 1 else states) + (grads / gpus if stage >= 2 else grads) + (
        weights / gpus if stage >= 3 else weights)


@dataclass
class Estimate:
    """One training run's memory in bytes, split the way the curriculum's 12 GB table prints it."""
    fixed: float
    states: float  # weights + gradients + optimizer states (frozen base included)
    activations: float  # Megatron estimate x ACTIVATION_FACTOR
    logits: float
    params: float

    @property
    def total(self) -> float:
        return self.fixed + self.states + self.activations + self.logits


def estimate_training(hidden: int, layers: int, heads: int, seq: int, batch: int, vocab: int,
                      setup: str = "amp-adamw", params: float | None = None, trainable: float | None = None,
                      frozen_bytes: int = 2) -> Estimate:
    """The curriculum's convention: 0.8 GB + model states + activations x 1.3 + 16-bit logits.

    `params` defaults to the decoder formula; pass it to price a model whose count is quoted directly (0.5B).
    """
    for name, value in dict(hidden=hidden, layers=layers, heads=heads, seq=seq, batch=batch, vocab=vocab).items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    params = decoder_params(hidden, layers, vocab) if params is None else params
    act = layers * activation_bytes_per_layer(seq, batch, hidden, heads) * ACTIVATION_FACTOR
    return Estimate(fixed=FIXED_OVERHEAD, states=model_state_bytes(params, setup, trainable, frozen_bytes),
                    activations=act, logits=logits_bytes(batch, seq, vocab), params=params)


# The curriculum's 12 GB single-GPU table (bf16 autocast + AdamW, s=512), with the totals it prints.
# It quotes 0.5B without a shape; its activation figures (1.21 GB at b=1, 2.42 GB at b=2) are those of h1024/L24/a16.
SHAPE_012B = dict(hidden=768, layers=12, heads=12, vocab=50_000)
SHAPE_035B = dict(hidden=1024, layers=24, heads=16, vocab=50_000)
SHAPE_15B = dict(hidden=2048, layers=24, heads=16, vocab=150_000)
TABLE_12GB = [  # (scenario, estimate_training kwargs, total the curriculum prints in GB)
    ("full fine-tune 0.12B, b=8", dict(SHAPE_012B, batch=8), 6.8),
    ("full fine-tune 0.12B, b=16", dict(SHAPE_012B, batch=16), 10.8),
    ("full fine-tune 0.35B, b=2", dict(SHAPE_035B, batch=2), 9.0),
    ("full fine-tune 0.5B, b=1", dict(SHAPE_035B, batch=1, params=0.5e9), 10.1),
    ("LoRA 0.5B (3M trainable), b=2", dict(SHAPE_035B, batch=2, params=0.5e9, trainable=3e6), 4.4),
    ("LoRA 0.5B (3M trainable), b=4", dict(SHAPE_035B, batch=4, params=0.5e9, trainable=3e6), 6.9),
    ("LoRA 1.5B (9M trainable), b=2", dict(SHAPE_15B, batch=2, trainable=9e6), 7.8),
    ("full fine-tune 1.5B, b=2", dict(SHAPE_15B, batch=2), "> 12"),  # the "1B and up" row: states alone > 16 GB
]


def table_12gb(seq: int = 512, budget_gb: float = 12.0) -> list[dict]:
    rows = []
    for scenario, kwargs, printed in TABLE_12GB:
        est = estimate_training(seq=seq, **kwargs)
        rows.append({"scenario": scenario, "params_B": est.params / 1e9, "fixed_GB": est.fixed / GB,
                     "states_GB": est.states / GB, "activations_GB": est.activations / GB,
                     "logits_GB": est.logits / GB, "total_GB": est.total / GB, "curriculum_GB": printed,
                     "fits": est.total <= budget_gb * GB})
    return rows


def table_markdown(rows: list[dict]) -> str:
    lines = ["| scenario | params | fixed | weights+grads+optim | activations x1.3 | logits | total | curriculum | "
             "fits 12 GB |", "|---|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['params_B']:.3f}B | {r['fixed_GB']:.2f} | {r['states_GB']:.2f} | "
                     f"{r['activations_GB']:.2f} | {r['logits_GB']:.2f} | **{r['total_GB']:.2f} GB** | "
                     f"{r['curriculum_GB']} GB | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(lines)


def run_command(args) -> None:
    if args.command == "table":
        print(table_markdown(table_12gb()))
    elif args.command == "train":
        est = estimate_training(args.hidden, args.layers, args.heads, args.seq, args.batch, args.vocab,
                                args.setup, args.params, args.trainable)
        per_layer = activation_bytes_per_layer(args.seq, args.batch, args.hidden, args.heads)
        print(f"parameters              {est.params / 1e6:10.1f} M")
        print(f"activations per layer   {per_layer / MB:10.1f} MB  (Megatron s*b*h*(34 + 5*a*s/h))")
        for name in ("fixed", "states", "activations", "logits", "total"):
            print(f"{name:<24}{getattr(est, name) / GB:10.2f} GB")
        print(f"training FLOPs per step {training_flops(est.params, args.batch * args.seq) / 1e12:10.2f} TFLOP")
    elif args.command == "kv":
        size = kv_cache_bytes(args.layers, args.kv_heads, args.head_dim, args.seq, args.batch, args.bytes)
        print(f"KV cache: {size / GiB:.2f} GiB ({size / GB:.2f} GB)")
    else:
        base = model_state_bytes(args.params, args.setup)
        share = zero_per_gpu(args.params, args.gpus, args.stage, args.setup)
        print(f"model states {base / GB:.1f} GB; ZeRO-{args.stage} over {args.gpus} GPUs: {share / GB:.1f} GB per GPU")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Memory-budget calculator (1 GB = 1e9 bytes; KV cache in GiB).")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("table", help="the curriculum's 12 GB single-GPU table, recomputed")
    train = sub.add_parser("train", help="memory of one training run (curriculum convention)")
    for flag, default in [("hidden", 768), ("layers", 12), ("heads", 12), ("seq", 512), ("batch", 8),
                          ("vocab", 50_000)]:
        train.add_argument(f"--{flag}", type=int, default=default)
    train.add_argument("--setup", choices=sorted(SETUPS), default="amp-adamw")
    train.add_argument("--params", type=float, help="parameter count (default: 12*h^2*L + V*h)")
    train.add_argument("--trainable", type=float, help="LoRA/frozen base: trainable parameters; base stored bf16")
    kv = sub.add_parser("kv", help="KV cache of one request, in GiB")
    for flag, default in [("layers", 32), ("kv-heads", 8), ("head-dim", 128), ("seq", 8192), ("batch", 1),
                          ("bytes", 2)]:
        kv.add_argument(f"--{flag}", type=int, default=default)
    zero = sub.add_parser("zero", help="model states per GPU under ZeRO sharding")
    zero.add_argument("--params", type=float, default=7e9)
    zero.add_argument("--gpus", type=int, default=8)
    zero.add_argument("--stage", type=int, default=3, choices=(0, 1, 2, 3))
    zero.add_argument("--setup", choices=sorted(SETUPS), default="bf16-master-adamw")
    args = parser.parse_args(argv)
    try:
        run_command(args)
    except ValueError as exc:  # e.g. a zero batch or GPU count: one line, not a traceback
        parser.error(str(exc))


if __name__ == "__main__":
    main(sys.argv[1:])
