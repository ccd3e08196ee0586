"""Memory-budget calculator: predict a training run's memory and time on paper, the curriculum's way.

    total = fixed overhead + weights + gradients + optimizer states + activations x 1.3 + logits
    time  = 6 x parameters x tokens FLOPs per sample (per component) / sustained FLOP/s

A model is one decoder (`--hidden --layers --heads --vocab`) or several components in one estimate
(`--component vit:params=5.7e6,layers=12,hidden=192,heads=3,seq=197 text:... head:params=2.3e6`): one fixed overhead,
the parameters summed, the activations summed (with checkpointing: every component's saved boundaries plus the one
segment being recomputed), the FLOPs summed per component with each component's own token count.

Units: 1 GB = 1e9 bytes (decimal, as memory chips are labelled). torch.cuda.max_memory_allocated() and
nvidia-smi report binary units (1 GiB = 2**30 bytes = 1.074 GB), so a measured reading looks ~7% smaller.
The KV-cache figure is given in GiB, as the curriculum prints it.

Run:  python day10_bigbatch_ckpt/memcalc.py table        (the curriculum's 12 GB single-GPU table)
      python day10_bigbatch_ckpt/memcalc.py examples     (every worked example of its memory section, one call each)
      python day10_bigbatch_ckpt/memcalc.py train --hidden 768 --layers 12 --heads 12 --seq 512 --batch 8
      python day10_bigbatch_ckpt/memcalc.py setups --params 1e8
      python day10_bigbatch_ckpt/memcalc.py levers --hidden 2048 --layers 24 --heads 16 --vocab 150000 --batch 2
      python day10_bigbatch_ckpt/memcalc.py kv --layers 32 --kv-heads 8 --head-dim 128 --seq 8192
      python day10_bigbatch_ckpt/memcalc.py zero --params 7e9 --gpus 8
"""
import argparse
import math
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint`

from sprint.cli import add_flags, arg, from_args, validate

GB = 1e9  # decimal gigabyte
MB = 1e6
GiB = 2**30

# Bytes per parameter for (weights, gradients, optimizer states).
SETUPS = {
    "fp32-sgd": (4, 4, 0),  # plain SGD keeps no state
    "fp32-momentum": (4, 4, 4),  # one velocity buffer
    "fp32-adamw": (4, 4, 8),  # m and v, 4 bytes each
    "bf16-master-adamw": (2, 2, 12),  # bf16 weights+grads, fp32 master copy + m + v (ZeRO paper's accounting)
    "amp-adamw": (4, 4, 8),  # autocast computes in bf16 but stores weights, grads and m/v in fp32
    "amp-adamw8bit": (4, 4, 2),  # 8-bit Adam: m and v at 1 byte each
}
FIXED_OVERHEAD = 0.8 * GB  # CUDA context + cuBLAS/cuDNN workspaces, the curriculum's convention
ACTIVATION_FACTOR = 1.3  # formula is a lower bound: fragmentation, attention temporaries, unfused ops
BUDGET_GB = 12.0  # the single GPU the curriculum plans for


def decoder_params(hidden: int, layers: int, vocab: int) -> float:
    """Decoder-only parameter count: 4h^2 attention + 8h^2 MLP per layer, embedding tied with the output layer."""
    return 12 * hidden**2 * layers + vocab * hidden


def bytes_per_param(setup: str) -> int:
    if setup not in SETUPS:
        raise ValueError(f"unknown training setup {setup!r}; choose one of {sorted(SETUPS)}")
    return sum(SETUPS[setup])


def model_state_bytes(params: float, setup: str = "amp-adamw", trainable: float | None = None,
                      frozen_bytes: float = 2) -> float:
    """Weights + gradients + optimizer states. With `trainable` (LoRA / frozen base) the base is stored frozen
    at `frozen_bytes` per parameter (bf16: 2, 4-bit: 0.5) with no gradients or optimizer state; only `trainable`
    pays `setup`."""
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


# ---------------------------------------------------------------------------------------------------------------
# A model as components: one decoder, or towers + a projection head.

@dataclass(frozen=True)
class Component:
    """One part of a model: a Transformer stack (layers > 0) or a part with parameters only (a projection head)."""
    name: str
    params: float
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    seq: int = 1  # tokens each sample sends through this part (its FLOPs are 6 x params x seq)
    vocab: int = 0  # output vocabulary: adds b*s*V 16-bit logits; 0 for an encoder tower or a head

    def __post_init__(self):
        where = f"--component {self.name}"
        if not (math.isfinite(self.params) and self.params > 0):
            raise ValueError(f"{where}: params must be a positive finite number, got {self.params!r}")
        for key in ("layers", "hidden", "heads", "vocab"):
            if getattr(self, key) < 0:
                raise ValueError(f"{where}: {key} must be >= 0, got {getattr(self, key)}")
        if self.seq < 1:
            raise ValueError(f"{where}: seq must be >= 1, got {self.seq}")
        if self.layers and not (self.hidden > 0 and self.heads > 0):
            raise ValueError(f"{where}: a part with layers needs hidden and heads > 0")
        if self.layers and self.hidden % self.heads:
            raise ValueError(f"{where}: heads ({self.heads}) must divide hidden ({self.hidden})")

    def layer_bytes(self, batch: int) -> float:
        """Raw 16-bit activations of one layer (Megatron); 0 for a part without layers."""
        return activation_bytes_per_layer(self.seq, batch, self.hidden, self.heads) if self.layers else 0.0

    def boundary_bytes(self, batch: int) -> float:
        """What a checkpoint keeps per segment: the segment's 16-bit input, s*b*h*2 bytes."""
        return 2 * self.seq * batch * self.hidden


def parse_component(spec: str) -> Component:
    """`name:key=value,...` with keys params, layers, hidden, heads, seq, vocab (e.g. head:params=2.3e6)."""
    name, _, body = spec.partition(":")
    fields = {"params": float, "layers": int, "hidden": int, "heads": int, "seq": int, "vocab": int}
    values = {}
    for item in filter(None, body.split(",")):
        key, _, text = item.partition("=")
        if key not in fields:
            raise ValueError(f"--component {spec!r}: unknown key {key!r}; use {', '.join(fields)}")
        try:
            values[key] = fields[key](float(text)) if fields[key] is int and "e" in text else fields[key](text)
        except (ValueError, OverflowError):
            raise ValueError(f"--component {spec!r}: {key} must be a number, got {text!r}") from None
    if not name or "params" not in values:
        raise ValueError(f"--component {spec!r}: write name:params=N[,layers=L,hidden=H,heads=A,seq=S,vocab=V]")
    return Component(name, **values)


@dataclass
class Estimate:
    """One training run's memory in bytes, split the way the curriculum's 12 GB table prints it."""
    fixed: float
    states: float  # weights + gradients + optimizer states (frozen base included)
    activations: float  # raw estimate x ACTIVATION_FACTOR
    logits: float
    params: float
    activations_raw: float = 0.0  # the formula's figure, before x 1.3
    per_component: dict = field(default_factory=dict)  # name -> raw activation bytes (checkpointed if asked)

    @property
    def total(self) -> float:
        return self.fixed + self.states + self.activations + self.logits


def estimate(components: list[Component], batch: int, setup: str = "amp-adamw", trainable: float | None = None,
             frozen_bytes: float = 2, checkpoint_every: int | None = None) -> Estimate:
    """Memory of one training step of a model made of `components` (see the module docstring).

    fp32 setups keep 4-byte activations and logits (x2 the 16-bit formula). `checkpoint_every=K` wraps every K
    layers in a checkpoint: each segment keeps only its input, and backward recomputes one segment at a time.
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    params = sum(c.params for c in components)
    if trainable is not None and trainable > params:
        raise ValueError(f"--trainable ({trainable:g}) cannot exceed the model's parameters ({params:g})")
    width = 2 if setup.startswith("fp32") else 1  # 16-bit formula; fp32 activations are twice as wide
    if checkpoint_every:
        per = {c.name: width * math.ceil(c.layers / checkpoint_every) * c.boundary_bytes(batch) for c in components}
        segment = max(width * min(checkpoint_every, c.layers) * c.layer_bytes(batch) for c in components)
        raw = sum(per.values()) + segment
    else:
        per = {c.name: width * c.layers * c.layer_bytes(batch) for c in components}
        raw = sum(per.values())
    logits = sum(logits_bytes(batch, c.seq, c.vocab, 2 * width) for c in components)
    return Estimate(fixed=FIXED_OVERHEAD, states=model_state_bytes(params, setup, trainable, frozen_bytes),
                    activations=raw * ACTIVATION_FACTOR, logits=logits, params=params, activations_raw=raw,
                    per_component=per)


def decoder(hidden: int, layers: int, heads: int, seq: int, vocab: int, params: float | None = None) -> Component:
    """A decoder-only model as one component; `params` defaults to 12*h^2*L + V*h."""
    return Component("decoder", decoder_params(hidden, layers, vocab) if params is None else params, layers,
                     hidden, heads, seq, vocab)


def estimate_training(hidden: int, layers: int, heads: int, seq: int, batch: int, vocab: int,
                      setup: str = "amp-adamw", params: float | None = None, trainable: float | None = None,
                      frozen_bytes: float = 2, checkpoint_every: int | None = None) -> Estimate:
    """The curriculum's convention for one decoder: 0.8 GB + model states + activations x 1.3 + 16-bit logits.

    `params` defaults to the decoder formula; pass it to price a model whose count is quoted directly (0.5B).
    """
    for name, value in dict(hidden=hidden, layers=layers, heads=heads, seq=seq, batch=batch, vocab=vocab).items():
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return estimate([decoder(hidden, layers, heads, seq, vocab, params)], batch, setup, trainable, frozen_bytes,
                    checkpoint_every)


def flops_per_sample(components: list[Component], checkpointing: bool = False) -> float:
    """6 x params x tokens summed per component; checkpointing adds one more forward (2 x params x tokens)."""
    return sum((8 if checkpointing else 6) / 6 * training_flops(c.params, c.seq) for c in components)


def lora_params(components: list[Component], rank: int = 8) -> float:
    """LoRA of rank r on every linear layer of a Transformer layer (q, k, v, o: 4 x 2hr; MLP h->4h->h: 10hr)."""
    return sum(18 * c.hidden * rank * c.layers for c in components)


# ---------------------------------------------------------------------------------------------------------------
# Units that fit the magnitude.

def fmt_bytes(n: float) -> str:
    return f"{n / GB:.2f} GB" if n >= 0.01 * GB else f"{n / MB:.1f} MB"


def fmt_flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g} FLOP"


def fmt_seconds(s: float) -> str:
    if s < 120:
        return f"{s:.3g} s"
    return f"{s:,.0f} s ({s / 60:.1f} min)" if s < 2 * 3600 else f"{s:,.0f} s ({s / 3600:.2f} h)"


def fmt_count(n: float) -> str:
    return f"{n / 1e9:.4g}B" if n >= 1e9 else f"{n / 1e6:.4g}M"


# ---------------------------------------------------------------------------------------------------------------
# The 12 GB table and the six levers.

def row(scenario: str, est: Estimate) -> dict:
    return {"scenario": scenario, "params_B": est.params / 1e9, "fixed_GB": est.fixed / GB,
            "states_GB": est.states / GB,
            "activations_raw_GB": est.activations_raw / GB, "activations_GB": est.activations / GB,
            "logits_GB": est.logits / GB, "total_GB": est.total / GB, "fits": est.total <= BUDGET_GB * GB}


def table_12gb() -> list[dict]:
    """Every row of the curriculum's 12 GB table, each computed by the CLI call `memcalc_examples` lists for it."""
    from day10_bigbatch_ckpt.memcalc_examples import TABLE_ROWS

    return [{**row(name, calculate(argv)[2]["estimate"]), "curriculum_GB": printed, "cli": argv}
            for name, argv, printed in TABLE_ROWS]


def table_markdown(rows: list[dict]) -> str:
    lines = ["| scenario | params | fixed | weights+grads+optim | activations raw | x1.3 | logits | total | "
             "curriculum | fits 12 GB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['params_B']:.3f}B | {r['fixed_GB']:.2f} | {r['states_GB']:.2f} | "
                     f"{r['activations_raw_GB']:.2f} | {r['activations_GB']:.2f} | {r['logits_GB']:.2f} | "
                     f"**{r['total_GB']:.2f} GB** | {r['curriculum_GB']} GB | {'yes' if r['fits'] else 'no'} |")
    return "\n".join(lines)


def levers(components: list[Component], batch: int, setup: str = "amp-adamw", trainable: float | None = None,
           rank: int = 8) -> list[dict]:
    """The curriculum's six memory levers, each applied alone to a full fine-tune: GPU memory, saving, cost."""
    if "adamw" not in setup or "8bit" in setup:
        raise ValueError(f"levers compares against a full fine-tune with fp32 AdamW states; got --setup {setup}")
    base = estimate(components, batch, setup)
    lora = lora_params(components, rank) if trainable is None else trainable
    state_bytes = SETUPS[setup][2]  # m and v (and the fp32 master copy where the setup keeps one)
    rows = [  # (lever, estimate with it, estimate it is compared with, what it saves, what it costs)
        ("baseline: full fine-tune", base, base, "", ""),
        (f"1. batch {max(1, batch // 2)} x 2 accumulation steps", estimate(components, max(1, batch // 2), setup),
         base, "activations and logits (linear in the batch)",
         "twice the steps per update; BatchNorm sees smaller batches"),
        ("2. gradient checkpointing, every layer", estimate(components, batch, setup, checkpoint_every=1), base,
         "activations: each layer keeps only its input", "one more forward: ~33% more compute (20-40% slower)"),
        ("3. bf16 autocast (in the baseline) vs fp32 activations", base, estimate(components, batch, "fp32-adamw"),
         "half the activation and logit bytes", "lower precision; fp16 also needs loss scaling"),
        (f"4. LoRA ({fmt_count(lora)} trainable), bf16 frozen base", estimate(components, batch, setup, trainable=lora),
         base, "gradients and optimizer states of the frozen base; the base stored in bf16",
         "limited capacity: rank and target modules must be chosen"),
        ("5. optimizer states offloaded to CPU", replace(base, states=base.states - base.params * state_bytes), base,
         f"{state_bytes} bytes/parameter ({fmt_bytes(base.params * state_bytes)}) moved to host RAM",
         "PCIe traffic every step: 2-5x slower; needs that much host memory"),
        ("6. 8-bit AdamW", replace(base, states=base.states - base.params * 6), base,
         "6 bytes/parameter: m and v at 1 byte each instead of 4",
         "a library's optimizer (torchao's AdamW8bit, measured in levers_lab.py); a very small accuracy loss"),
    ]
    return [{"lever": name, "total_GB": est.total / GB, "saved_GB": (ref.total - est.total) / GB, "saves": saves,
             "cost": cost, "fits": est.total <= BUDGET_GB * GB} for name, est, ref, saves, cost in rows]


def levers_markdown(rows: list[dict]) -> str:
    lines = ["| lever | GPU memory | saved | what it saves | what it costs | fits 12 GB |",
             "|---|---:|---:|---|---|:---:|"]
    lines += [f"| {r['lever']} | {r['total_GB']:.2f} GB | {r['saved_GB']:.2f} GB | {r['saves']} | {r['cost']} | "
              f"{'yes' if r['fits'] else 'no'} |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The command line: every value checked (positive, finite, heads | hidden, trainable <= total) before any sum.

@dataclass
class TrainArgs:
    hidden: int = arg(768, "hidden size h of the decoder", gt=0)
    layers: int = arg(12, "Transformer layers L", gt=0)
    heads: int = arg(12, "attention heads a (must divide --hidden)", gt=0)
    seq: int = arg(512, "sequence length s (tokens per sample)", gt=0)
    batch: int = arg(8, "batch size b (samples per step)", gt=0)
    vocab: int = arg(50_000, "vocabulary V; 0 = no logits term (an encoder)", ge=0)
    setup: str = arg("amp-adamw", "bytes per parameter for weights, gradients, optimizer states",
                     choices=tuple(SETUPS))
    params: float | None = arg(None, "parameter count (default: 12*h^2*L + V*h)", gt=0)
    trainable: float | None = arg(None, "LoRA / frozen base: trainable parameters (the base is stored frozen)", ge=0)
    frozen_bits: int = arg(16, "bits per frozen base parameter with --trainable (16 = bf16, 4 = QLoRA)",
                           choices=(4, 8, 16, 32))
    component: tuple[str, ...] | None = arg(None, "model parts instead of one decoder: "
                                            "name:params=N[,layers=L,hidden=H,heads=A,seq=S,vocab=V] ...")
    checkpoint_every: int | None = arg(None, "gradient checkpointing: one checkpoint every K layers (1 = every layer)",
                                       gt=0)
    dataset_size: int | None = arg(None, "samples per epoch: gives steps per epoch (and time with --tflops)", gt=0)
    tflops: float | None = arg(None, "sustained training throughput in TFLOP/s: gives time per step and epoch", gt=0)
    steps: int | None = arg(None, "number of steps to price (with --tflops)", gt=0)

    def __post_init__(self):
        validate(self)
        if self.component and self.params is not None:
            raise ValueError("--params sizes the decoder; with --component give params= in each component")
        # Parses every component and checks heads | hidden and trainable <= total: a bad value is one line.
        estimate(self.components(), self.batch, self.setup, self.trainable, self.frozen_bits / 8)

    def components(self) -> list[Component]:
        if self.component:
            return [parse_component(spec) for spec in self.component]
        if self.hidden % self.heads:
            raise ValueError(f"--heads ({self.heads}) must divide --hidden ({self.hidden})")
        return [decoder(self.hidden, self.layers, self.heads, self.seq, self.vocab, self.params)]


@dataclass
class LeverArgs(TrainArgs):
    rank: int = arg(8, "LoRA rank for the LoRA row when --trainable is not given", gt=0)


@dataclass
class SetupArgs:
    params: float = arg(1e8, "parameter count", gt=0)

    def __post_init__(self):
        validate(self)


@dataclass
class KvArgs:
    layers: int = arg(32, "layers", gt=0)
    kv_heads: int = arg(8, "key/value heads (GQA)", gt=0)
    head_dim: int = arg(128, "dimension per head", gt=0)
    seq: int = arg(8192, "context length", gt=0)
    batch: int = arg(1, "concurrent requests", gt=0)
    bytes: int = arg(2, "bytes per element (bf16: 2, fp8: 1)", gt=0)

    def __post_init__(self):
        validate(self)


@dataclass
class ZeroArgs:
    params: float = arg(7e9, "parameter count", gt=0)
    gpus: int = arg(8, "GPUs sharing the states", gt=0)
    stage: int = arg(3, "ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also weights",
                     choices=(0, 1, 2, 3))
    setup: str = arg("bf16-master-adamw", "bytes per parameter", choices=tuple(SETUPS))

    def __post_init__(self):
        validate(self)


def calculate(argv: list[str] | str):
    """(command, checked arguments, figures) for a command line (a list, or one string split on spaces). A bad
    value ends like on the command line: one line naming the flag, SystemExit(2)."""
    parser, sub = build_parser()
    args = parser.parse_args(argv.split() if isinstance(argv, str) else argv)
    if args.command in ("table", "examples"):
        return args.command, args, None
    a = from_args(COMMANDS[args.command][0], args, sub[args.command])
    try:
        return args.command, a, compute(args.command, a)
    except ValueError as exc:
        sub[args.command].error(str(exc))


def compute(command: str, a) -> dict:
    """The figures of one subcommand as a dict (bytes, FLOPs, seconds)."""
    if command in ("train", "levers"):
        parts = a.components()
        est = estimate(parts, a.batch, a.setup, a.trainable, a.frozen_bits / 8, a.checkpoint_every)
        result = {"estimate": est, "components": parts, "params": est.params, "total": est.total,
                  "per_layer": {c.name: c.layer_bytes(a.batch) for c in parts if c.layers},
                  "flops_per_sample": flops_per_sample(parts, bool(a.checkpoint_every))}
        result["flops_per_step"] = result["flops_per_sample"] * a.batch
        if a.trainable is not None:  # the frozen base and what the trainable part pays, separately
            result["frozen_bytes"] = est.params * a.frozen_bits / 8
            result["trainable_bytes"] = a.trainable * bytes_per_param(a.setup)
        if a.dataset_size:
            result["steps_per_epoch"] = math.ceil(a.dataset_size / a.batch)
            result["flops_per_epoch"] = result["flops_per_sample"] * a.dataset_size
        if a.tflops:
            result["seconds_per_step"] = result["flops_per_step"] / (a.tflops * 1e12)
            if a.dataset_size:
                result["seconds_per_epoch"] = result["flops_per_epoch"] / (a.tflops * 1e12)
            if a.steps:
                result["seconds_for_steps"] = a.steps * result["seconds_per_step"]
        if command == "levers":
            result["levers"] = levers(parts, a.batch, a.setup, a.trainable, a.rank)
        return result
    if command == "setups":
        return {name: {"bytes_per_param": bytes_per_param(name), "bytes": model_state_bytes(a.params, name)}
                for name in SETUPS}
    if command == "kv":
        return {"bytes": kv_cache_bytes(a.layers, a.kv_heads, a.head_dim, a.seq, a.batch, a.bytes)}
    if command == "zero":
        weights, grads, states = (a.params * b for b in SETUPS[a.setup])
        return {"weights": weights, "grads": grads, "states": states, "total": weights + grads + states,
                "per_gpu": zero_per_gpu(a.params, a.gpus, a.stage, a.setup)}
    raise ValueError(f"unknown command {command!r}")


def show_train(a: TrainArgs, r: dict) -> None:
    est, parts = r["estimate"], r["components"]
    names = ", ".join(f"{c.name} {fmt_count(c.params)}" for c in parts)
    print(f"{'parameters':<27}{fmt_count(r['params'])}" + (f"  ({names})" if len(parts) > 1 else ""))
    if r["per_layer"]:
        print(f"{'activations per layer':<27}" + ", ".join(f"{n} {v / MB:.1f} MB" for n, v in r["per_layer"].items())
              + "  (Megatron s*b*h*(34 + 5*a*s/h), 16-bit)")
    how = f"checkpoint every {a.checkpoint_every} layer(s): boundaries + one segment" if a.checkpoint_every else ""
    split = " + ".join(f"{n} {fmt_bytes(v)}" for n, v in est.per_component.items() if v) if len(parts) > 1 else ""
    detail = "; ".join(filter(None, (split, how)))
    print(f"{'activations, raw':<27}{fmt_bytes(est.activations_raw)}" + (f"  ({detail})" if detail else ""))
    print(f"{'activations x 1.3':<27}{fmt_bytes(est.activations)}")
    print(f"{'fixed overhead':<27}{fmt_bytes(est.fixed)}")
    base = (f"; frozen base at {a.frozen_bits} bits, {fmt_count(a.trainable)} trainable" if a.trainable is not None
            else "")
    print(f"{'weights+grads+optimizer':<27}{fmt_bytes(est.states)}  ({a.setup}: {bytes_per_param(a.setup)} "
          f"bytes/parameter{base})")
    print(f"{'logits':<27}{fmt_bytes(est.logits) if est.logits else '0 (no vocabulary)'}")
    fits = "yes" if est.total <= BUDGET_GB * GB else "no"
    print(f"{'total':<27}{fmt_bytes(est.total)}  (fits {BUDGET_GB:g} GB: {fits})")
    extra = ", +1 forward for recomputation" if a.checkpoint_every else ""
    print(f"{'compute':<27}{fmt_flops(r['flops_per_sample'])}/sample (6 x params x tokens per component{extra}), "
          f"{fmt_flops(r['flops_per_step'])}/step")
    if "steps_per_epoch" in r:
        print(f"{'epoch':<27}{r['steps_per_epoch']:,} steps ({a.dataset_size:,} samples / batch {a.batch}), "
              f"{fmt_flops(r['flops_per_epoch'])}")
    if "seconds_per_step" in r:
        line = f"{fmt_seconds(r['seconds_per_step'])}/step"
        if "seconds_per_epoch" in r:
            line += f", epoch {fmt_seconds(r['seconds_per_epoch'])}"
        if "seconds_for_steps" in r:
            line += f", {a.steps:,} steps {fmt_seconds(r['seconds_for_steps'])}"
        print(f"{'time at ' + format(a.tflops, 'g') + ' TFLOP/s':<27}{line}  (ideal: compute only)")


def show(command: str, a, r: dict) -> None:
    if command == "train":
        show_train(a, r)
    elif command == "levers":
        print(f"{fmt_count(r['params'])} parameters, batch {a.batch}, {a.setup}; each lever alone:\n")
        print(levers_markdown(r["levers"]))
    elif command == "setups":
        print(f"| setup | bytes/parameter | {fmt_count(a.params)} parameters |\n|---|---:|---:|")
        for name, v in r.items():
            split = " + ".join(map(str, SETUPS[name]))
            print(f"| {name} ({split}) | {v['bytes_per_param']} | {fmt_bytes(v['bytes'])} |")
    elif command == "kv":
        print(f"KV cache: {r['bytes'] / GiB:.2f} GiB ({r['bytes'] / GB:.2f} GB)")
    elif command == "zero":
        print(f"model states {fmt_bytes(r['total'])} (weights {fmt_bytes(r['weights'])}, gradients "
              f"{fmt_bytes(r['grads'])}, optimizer {fmt_bytes(r['states'])}); ZeRO-{a.stage} over {a.gpus} GPUs: "
              f"{fmt_bytes(r['per_gpu'])} per GPU")


COMMANDS = {"train": (TrainArgs, "memory and time of one training run (curriculum convention)"),
            "levers": (LeverArgs, "the six memory levers applied one at a time, with their cost"),
            "setups": (SetupArgs, "bytes per parameter of each training setup"),
            "kv": (KvArgs, "KV cache of one request, in GiB"),
            "zero": (ZeroArgs, "model states per GPU under ZeRO sharding")}


def build_parser():
    parser = argparse.ArgumentParser(description="Memory-budget calculator (1 GB = 1e9 bytes; KV cache in GiB).")
    commands = parser.add_subparsers(dest="command", required=True)
    sub = {"table": commands.add_parser("table", help="the curriculum's 12 GB single-GPU table, recomputed"),
           "examples": commands.add_parser("examples", help="every worked example of the curriculum's memory "
                                                             "section: CLI call, calculator, curriculum")}
    for name, (cls, text) in COMMANDS.items():
        sub[name] = commands.add_parser(name, help=text, description=text,
                                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        add_flags(sub[name], cls)
    return parser, sub


def main(argv=None) -> dict | list:
    """Run one subcommand and print its answer; returns the figures it printed, as numbers."""
    command, a, result = calculate(sys.argv[1:] if argv is None else argv)
    if command == "table":
        result = table_12gb()
        print(table_markdown(result))
    elif command == "examples":
        from day10_bigbatch_ckpt import memcalc_examples

        result = memcalc_examples.run_all()
        print(memcalc_examples.markdown(result))
    else:
        show(command, a, result)
    return result


if __name__ == "__main__":
    main()
