"""Day 10 lab — memory levers 4 to 6: freezing, LoRA written from scratch, optimizer offload and 8-bit states.

On Day 10's tiny GPT, each trained for a few AdamW steps on one batch:
  1. freezing: `requires_grad_(False)` on the embeddings and every block but the last. Frozen parameters get no
     gradient, so AdamW creates no state for them: the optimizer-state bytes (read from `optimizer.state`) shrink
     with the trainable parameters;
  2. LoRA: every attention projection (qkv, proj) becomes `LoRALinear`, a frozen base plus B @ A of rank r. Trainable
     parameters, gradient bytes and optimizer-state bytes against full fine-tuning; the trained adapter merged into
     the weights gives the same output with no extra parameters;
  3. 8-bit AdamW: torchao's `AdamW8bit` (each moment of a tensor of >= 4,096 values, a multiple of 256, as 1-byte
     codes with an fp32 scale per block of 256; other tensors keep fp32 moments) against `torch.optim.AdamW` from the same weights:
     the state bytes per parameter read from the state tensors (a quantised state's codes, scales and code map
     counted), the losses, the step time. torchao compiles its step with torch.compile (the first step of a fresh
     machine then takes half a minute on a CPU); `--eager-8bit` runs it uncompiled (the gates do: the same bytes);
  4. offload: no maintained CPU-only path exists (FSDP2's CPUOffloadPolicy needs a GPU), so it is priced with the
     calculator (`memcalc.py levers`), with what it costs, as is 8-bit at the curriculum's sizes.

Run:   python day10_bigbatch_ckpt/levers_lab.py                                  (writes under runs/)
       python day10_bigbatch_ckpt/levers_lab.py --eager-8bit                     (AdamW8bit without torch.compile)
       python day10_bigbatch_ckpt/levers_lab.py --out day10_bigbatch_ckpt/results (refreshes the committed figures)
"""
import copy
import logging
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn

from day10_bigbatch_ckpt import memcalc
from day10_bigbatch_ckpt.main import GPTConfig, TinyGPT, allclose_ratio, make_batch
from sprint import runs_dir, write_results
from sprint.cli import arg, parse, run, validate
from sprint.measure import count_params


class LoRALinear(nn.Module):
    """y = base(x) + scale * x A^T B^T. The base stays frozen; only A (r x in) and B (out x r) train, r*(in+out)
    parameters instead of in*out. B starts at zero, so training starts exactly from the base model."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float = 16.0):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.scale = alpha / rank  # keeps the update's size steady when the rank changes
        self.A = nn.Parameter(torch.empty(rank, base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # as nn.Linear initialises its own weight

    def forward(self, x):
        return self.base(x) + (x @ self.A.T @ self.B.T) * self.scale

    def merged(self) -> nn.Linear:
        """One nn.Linear with W + scale * B @ A: the adapter folded in, nothing extra to compute at inference."""
        out = copy.deepcopy(self.base)
        with torch.no_grad():
            out.weight += self.scale * self.B @ self.A
        return out


def add_lora(model: TinyGPT, rank: int) -> TinyGPT:
    """Freeze the whole model, then give every attention projection a trainable low-rank adapter."""
    model.requires_grad_(False)
    for block in model.blocks:
        block.attn.qkv = LoRALinear(block.attn.qkv, rank)
        block.attn.proj = LoRALinear(block.attn.proj, rank)
    return model


def merge_lora(model: TinyGPT) -> TinyGPT:
    """The same model with every LoRALinear replaced by its merged nn.Linear."""
    model = copy.deepcopy(model)
    for block in model.blocks:
        block.attn.qkv, block.attn.proj = block.attn.qkv.merged(), block.attn.proj.merged()
    return model


def freeze_all_but_last_block(model: TinyGPT) -> TinyGPT:
    model.requires_grad_(False)  # the tied embedding / output layer and every block...
    model.blocks[-1].requires_grad_(True)  # ...but the last, and the final LayerNorm
    model.ln_f.requires_grad_(True)
    return model


def logits(model: TinyGPT, idx, targets) -> torch.Tensor:
    """The output layer's logits (read with a forward hook: TinyGPT's forward returns the loss)."""
    seen = []
    hook = model.head.register_forward_hook(lambda module, args, out: seen.append(out))
    with torch.no_grad():
        model(idx, targets)
    hook.remove()
    return seen[0]


def storages(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding `t`: itself, or the inner tensors of a tensor subclass (torchao's 8-bit state)."""
    if hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return [s for name in names for s in storages(getattr(t, name))]
    return [t]


def state_bytes(optimizer: torch.optim.Optimizer, params=None) -> int:
    """Bytes of the optimizer's state tensors (of `params` only, if given), each storage counted once."""
    keep = None if params is None else {id(p) for p in params}
    found = {s.untyped_storage().data_ptr(): s.untyped_storage().nbytes()
             for p, state in optimizer.state.items() if keep is None or id(p) in keep
             for t in state.values() if torch.is_tensor(t) for s in storages(t)}
    return sum(found.values())


def adamw8bit() -> type:
    """torchao's AdamW8bit, imported when used (it takes 1.5 s). Muted: torch's log lines about an Enum torchao
    registers with torch.compile and about compiling without a CUDA runtime, and a warning on torchao's state class
    (torchao's to fix, not the learner's)."""
    for logger in ("torch.utils._pytree", "torch.utils.cpp_extension"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", "OptimState8bit does not implement _stable_hash_for_caching")  # torchao's too
    from torchao.optim import AdamW8bit

    return AdamW8bit


def train_and_count(model: TinyGPT, steps: int, batch: int, lr: float, optimizer_class=torch.optim.AdamW,
                    eager: bool = False) -> dict:
    """A few steps on one batch (every parameter handed to the optimizer); then what each part holds, and the median
    step time after the first (which pays for any compilation). `eager`: torch.compile directives ignored."""
    optimizer = optimizer_class(model.parameters(), lr=lr)
    idx, targets = make_batch(model.cfg, batch)
    losses, seconds = [], []
    with torch.compiler.set_stance("force_eager" if eager else "default"):
        for _ in range(steps):
            start = time.perf_counter()
            loss = model(idx, targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            seconds.append(time.perf_counter() - start)
    frozen = [p for p in model.parameters() if not p.requires_grad]
    quantised = [p for p, state in optimizer.state.items() if hasattr(state.get("exp_avg"), "__tensor_flatten__")]
    return {"params": count_params(model, trainable_only=False), "trainable": count_params(model),
            "tensors": len(list(model.parameters())),
            "grad_bytes": sum(p.grad.nbytes for p in model.parameters() if p.grad is not None),
            "state_bytes": state_bytes(optimizer), "quantised_params": sum(p.numel() for p in quantised),
            "quantised_tensors": len(quantised), "quantised_state_bytes": state_bytes(optimizer, quantised),
            "frozen_with_grad": sum(p.grad is not None for p in frozen),
            "frozen_with_state": sum(p in optimizer.state for p in frozen),
            "first_loss": losses[0], "last_loss": losses[-1], "losses": losses,
            "first_step_s": seconds[0], "step_ms": 1000 * statistics.median(seconds[1:])}


@dataclass
class Config:
    rank: int = arg(4, "LoRA rank r", gt=0)
    steps: int = arg(20, "AdamW steps per variant (the first is not timed)", ge=2)
    batch: int = arg(8, "batch size", gt=0)
    lr: float = arg(3e-3, "AdamW learning rate", gt=0)
    seed: int = arg(0, "seed of the initial weights", ge=0)
    eager_8bit: bool = arg(False, "run AdamW8bit's step without torch.compile (no compile time; a slower step)")

    def __post_init__(self):
        validate(self)


def run_lab(cfg: Config, eight_bit: bool = True) -> dict:
    """Every variant; `eight_bit=False` leaves AdamW8bit out (the gates measure it apart, eager)."""
    def fresh() -> TinyGPT:
        torch.manual_seed(cfg.seed)  # every variant starts from the same weights
        return TinyGPT(GPTConfig())

    result = {"config": vars(cfg).copy(), "full": train_and_count(fresh(), cfg.steps, cfg.batch, cfg.lr),
              "frozen": train_and_count(freeze_all_but_last_block(fresh()), cfg.steps, cfg.batch, cfg.lr)}
    if eight_bit:
        result["adamw8bit"] = train_and_count(fresh(), cfg.steps, cfg.batch, cfg.lr, adamw8bit(), cfg.eager_8bit)
    base = fresh().eval()
    lora = add_lora(copy.deepcopy(base), cfg.rank).eval()
    idx, targets = make_batch(base.cfg, cfg.batch, seed=1)
    result["lora_start_diff"] = (logits(lora, idx, targets) - logits(base, idx, targets)).abs().max().item()
    result["lora"] = train_and_count(lora.train(), cfg.steps, cfg.batch, cfg.lr)
    result["lora_formula"] = sum(cfg.rank * (m.in_features + m.out_features)
                                 for b in base.blocks for m in (b.attn.qkv, b.attn.proj))
    merged = merge_lora(lora).eval()
    lora.eval()
    got, want = logits(merged, idx, targets), logits(lora, idx, targets)
    result["merged_max_diff"] = (got - want).abs().max().item()
    result["merged_allclose_ratio"] = allclose_ratio([got], [want], rtol=1e-5, atol=1e-5)  # <= 1: allclose
    result["merged_params"] = count_params(merged, trainable_only=False)
    result["base_params"] = count_params(base, trainable_only=False)
    # Levers 5 and 6 where they matter: the curriculum's 1.5B full fine-tune and its 0.12B at the 12 GB limit.
    result["calculator"] = {name: memcalc.calculate(["levers", *cli.split()])[2]["levers"]
                            for name, cli in CALCULATOR.items()}
    return result


CALCULATOR = {"full fine-tune 1.5B (h2048/L24/V150k), b=2":
              "--hidden 2048 --layers 24 --heads 16 --vocab 150000 --seq 512 --batch 2",
              "full fine-tune 0.12B (h768/L12/V50k), b=16":
              "--hidden 768 --layers 12 --heads 12 --vocab 50000 --seq 512 --batch 16"}


def report(r: dict) -> str:
    full = r["full"]
    lines = ["| variant | parameters | trainable | gradient bytes | optimizer-state bytes | frozen with a gradient | "
             "frozen with optimizer state | loss: first -> last step |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name in ("full", "frozen", "lora", "adamw8bit"):
        v = r[name]
        lines.append(f"| {LABELS[name].format(**r['config'])} | {v['params']:,} | {v['trainable']:,} "
                     f"({v['trainable'] / full['trainable']:.1%}) | {v['grad_bytes']:,} | {v['state_bytes']:,} "
                     f"({v['state_bytes'] / full['state_bytes']:.1%}) | {v['frozen_with_grad']} | "
                     f"{v['frozen_with_state']} | {v['first_loss']:.3f} -> {v['last_loss']:.3f} |")
    lines += ["", f"- LoRA trainable parameters = r*(in+out) summed over the adapted layers: {r['lora_formula']:,} "
              f"(counted: {r['lora']['trainable']:,}).",
              f"- before training, the LoRA model's logits differ from the base model's by at most "
              f"{r['lora_start_diff']:.3g} (B starts at zero).",
              f"- merged weights vs the trained adapter: max |logit difference| {r['merged_max_diff']:.3g} "
              f"(allclose at rtol = atol = 1e-5: ratio {r['merged_allclose_ratio']:.3g} <= 1); the merged "
              f"model has {r['merged_params']:,} parameters, the base model {r['base_params']:,}.",
              *eight_bit_lines(r)]
    for name, rows in r["calculator"].items():
        lines += ["", f"Calculator, {name} (`memcalc.py levers {CALCULATOR[name]}`):", "",
                  memcalc.levers_markdown(rows)]
    return "\n".join(lines)


def eight_bit_lines(r: dict) -> list[str]:
    full, q = r["full"], r["adamw8bit"]
    compiled = f"compiled: its first step (compiling, or reading the compile cache) took {q['first_step_s']:.1f} s"
    if r["config"]["eager_8bit"]:
        compiled = "eager (--eager-8bit)"
    return [f"- 8-bit AdamW (torchao `AdamW8bit`, {compiled}): optimizer state {q['state_bytes'] / q['params']:.2f} "
            f"bytes per parameter against AdamW's {full['state_bytes'] / full['params']:.2f}; on the "
            f"{q['quantised_params']:,} parameters of the tensors it quantises, "
            f"{q['quantised_state_bytes'] / q['quantised_params']:.3f} (the calculator's `amp-adamw8bit` row: 2, the code "
            f"of each moment; the rest is fp32 block scales and each state's 256-entry code map). Loss after "
            f"{r['config']['steps']} steps {q['last_loss']:.3f} against AdamW's {full['last_loss']:.3f}; median step "
            f"{q['step_ms']:.1f} ms against {full['step_ms']:.1f} ms."]


LABELS = {"full": "full fine-tuning", "frozen": "frozen embeddings + blocks 1-3 (last block and ln_f train)",
          "lora": "LoRA r={rank} on attention qkv + proj, base frozen",
          "adamw8bit": "full fine-tuning, torchao AdamW8bit"}


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__, "levers"))
    result = run_lab(cfg)
    text = report(result)
    print(text + "\n")
    write_results(out, "levers", text, result)
    return result


if __name__ == "__main__":
    run(main)
