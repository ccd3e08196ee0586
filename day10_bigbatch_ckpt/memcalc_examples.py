"""Every worked example of the curriculum's memory section, each as ONE memcalc command line, with the figures the
curriculum prints for it. `python day10_bigbatch_ckpt/memcalc.py examples` prints them side by side; check.py makes
each figure a gate; the 12 GB table is the subset marked `table`.

A printed figure is matched to half a unit of its last digit ("232.8": ±0.05). Where the curriculum combined
intermediates it had already rounded to three figures (1.51B instead of 1.5152B, 2.79 GB x 1.3 x 2 = 7.25 instead of
7.26), it may be off by that rounding too: those figures get 0.5% more (`rounded=True`). "5-6" is a range, "> 12" a
bound. Sources: `000_*.txt` (the memory section) and, for 7B / ZeRO / KV cache, `002_*.txt` §6.
"""
import math
from dataclasses import dataclass
from typing import Callable

from day10_bigbatch_ckpt import memcalc as M

GB, MB = M.GB, M.MB


@dataclass(frozen=True)
class Figure:
    what: str  # with its unit
    value: Callable[[dict], float]  # from the command's figures, in that unit
    printed: str  # as the curriculum prints it: "232.8", a range "5-6", a bound "> 12" or "< 6"
    rounded: bool = False  # derived from intermediates the curriculum had already rounded


@dataclass(frozen=True)
class Example:
    name: str
    cli: str  # the arguments of `python day10_bigbatch_ckpt/memcalc.py`
    figures: tuple[Figure, ...]
    table: str | None = None  # the 12 GB table's scenario, when this call is one of its rows
    note: str = ""
    table_printed: str | None = None  # the table's "curriculum" cell, when it is not the total figure's


def est(key: str, unit: float = GB) -> Callable[[dict], float]:
    return lambda r: getattr(r["estimate"], key) / unit


def fig(key: str, unit: float = 1.0) -> Callable[[dict], float]:
    return lambda r: r[key] / unit


TOTAL = "total (GB)"
DECODER_012B = "train --hidden 768 --layers 12 --heads 12 --vocab 50000 --seq 512"
DECODER_035B = "train --hidden 1024 --layers 24 --heads 16 --vocab 50000 --seq 512"
DECODER_15B = "train --hidden 2048 --layers 24 --heads 16 --vocab 150000 --seq 512"
TOWERS = ("train --component vit:params=5.7e6,layers=12,hidden=192,heads=3,seq=197 "
          "text:params=22e6,layers=6,hidden=384,heads=6,seq=128 head:params=2.3e6")

EXAMPLES = [
    Example("worked example 1, 12 GB row 1, time estimate 3: 0.12B, b=8",
            f"{DECODER_012B} --batch 8 --tflops 25 --steps 10000", (
                Figure("activations per layer (MB)", lambda r: r["per_layer"]["decoder"] / MB, "232.8"),
                Figure("activations, 12 layers, raw (GB)", est("activations_raw"), "2.79"),
                Figure("logits (GB)", est("logits"), "0.41"),
                Figure("parameters (M)", fig("params", 1e6), "123"),
                Figure("weights+grads+AdamW (GB)", est("states"), "1.97"),
                Figure("activations x1.3 (GB)", est("activations"), "3.63"),
                Figure(TOTAL, est("total"), "6.8"),
                Figure("FLOPs per step (TFLOP)", fig("flops_per_step", 1e12), "3.0"),
                Figure("time per step at 25 TFLOP/s (s)", fig("seconds_per_step"), "0.12"),
                Figure("10,000 steps (min)", fig("seconds_for_steps", 60), "20"),
            ), table="full fine-tune 0.12B, b=8"),
    Example("12 GB row 2: 0.12B, b=16", f"{DECODER_012B} --batch 16", (
        Figure("activations x1.3 (GB)", est("activations"), "7.25", rounded=True),
        Figure("logits (GB)", est("logits"), "0.82"),
        Figure(TOTAL, est("total"), "10.8", rounded=True),
    ), table="full fine-tune 0.12B, b=16"),
    Example("worked example 2, 12 GB row 3: 0.35B, b=2", f"{DECODER_035B} --batch 2", (
        Figure("parameters (M)", fig("params", 1e6), "353"),
        Figure("weights+grads+AdamW (GB)", est("states"), "5.65"),
        Figure("activations x1.3 (GB)", est("activations"), "2.42"),
        Figure("logits (GB)", est("logits"), "0.10"),
        Figure(TOTAL, est("total"), "9.0"),
    ), table="full fine-tune 0.35B, b=2"),
    Example("12 GB row 4: 0.5B full fine-tune, b=1", f"{DECODER_035B} --params 5e8 --batch 1", (
        Figure("weights+grads+AdamW (GB)", est("states"), "8.0"),
        Figure("activations x1.3 (GB)", est("activations"), "1.21"),
        Figure("logits (GB)", est("logits"), "0.05"),
        Figure(TOTAL, est("total"), "10.1"),
    ), table="full fine-tune 0.5B, b=1",
        note="the curriculum quotes 0.5B without a shape; its activations (1.21 GB) are exactly h1024/L24/a16's"),
    Example("12 GB row 5 and lever 4: full fine-tune 1.5B ('1B and up'), b=2", f"{DECODER_15B} --batch 2", (
        Figure("weights+grads+AdamW (GB)", est("states"), "24"),
        Figure("weights+grads+AdamW (GB), '1B and up'", est("states"), "> 16"),
        Figure(TOTAL, est("total"), "> 12"),
    ), table="full fine-tune 1.5B ('1B and up'), b=2"),
    Example("12 GB row 6: LoRA 0.5B, 3M trainable, b=2", f"{DECODER_035B} --params 5e8 --trainable 3e6 --batch 2", (
        Figure("frozen bf16 base (GB)", fig("frozen_bytes", GB), "1.0"),
        Figure("trainable weights+grads+AdamW (GB)", fig("trainable_bytes", GB), "0.05"),
        Figure("activations x1.3 (GB)", est("activations"), "2.42"),
        Figure("logits (GB)", est("logits"), "0.10"),
        Figure(TOTAL, est("total"), "4.4"),
    ), table="LoRA 0.5B (3M trainable), b=2"),
    Example("12 GB row 6: LoRA 0.5B, b=4", f"{DECODER_035B} --params 5e8 --trainable 3e6 --batch 4",
            (Figure(TOTAL, est("total"), "6.9"),), table="LoRA 0.5B (3M trainable), b=4"),
    Example("12 GB row 6: LoRA 0.5B, b=8 'close to the limit'",
            f"{DECODER_035B} --params 5e8 --trainable 3e6 --batch 8",
            (Figure(TOTAL, est("total"), "11-12"),), table="LoRA 0.5B (3M trainable), b=8"),
    Example("worked example 2 (1.5B), 12 GB row 7, time estimate 2: LoRA 1.5B, 9M trainable, b=2",
            f"{DECODER_15B} --trainable 9e6 --batch 2 --tflops 25 --steps 10000", (
                Figure("parameters (B)", fig("params", 1e9), "1.51", rounded=True),
                Figure("frozen bf16 base (GB)", fig("frozen_bytes", GB), "3.02", rounded=True),
                Figure("trainable weights+grads+AdamW (GB)", fig("trainable_bytes", GB), "0.14"),
                Figure("activations x1.3 (GB)", est("activations"), "3.54", rounded=True),
                Figure("logits (GB)", est("logits"), "0.31"),
                Figure(TOTAL, est("total"), "7.8"),
                Figure("FLOPs per step (TFLOP)", fig("flops_per_step", 1e12), "9.3"),
                Figure("time per step at 25 TFLOP/s (s)", fig("seconds_per_step"), "0.37"),
                Figure("10,000 steps (h)", fig("seconds_for_steps", 3600), "1"),
            ), table="LoRA 1.5B (9M trainable), b=2"),
    Example("12 GB row 7: LoRA 1.5B with checkpointing, 'b can reach 4-8'",
            f"{DECODER_15B} --trainable 9e6 --batch 8 --checkpoint-every 1",
            (Figure(f"{TOTAL} at b=8", est("total"), "< 12"),), table="LoRA 1.5B, b=8, checkpoint every layer"),
    Example("12 GB row 8: QLoRA 7B, 4-bit base + LoRA + checkpointing",
            "train --params 7e9 --trainable 8.4e6 --frozen-bits 4 --hidden 4096 --layers 32 --heads 32 --vocab 32000 "
            "--seq 512 --batch 2 --checkpoint-every 1", (
                Figure("frozen 4-bit base (GB)", fig("frozen_bytes", GB), "3.5"),
                Figure(TOTAL, est("total"), "5-6"),
            ), table="QLoRA 7B (4-bit base, 8.4M trainable), b=2, checkpointing",
            note="no shape or batch in the curriculum: Llama-2-7B's (h4096/L32/a32/V32k), LoRA r=8 on q/k/v/o "
                 "(8.4M trainable), s=512, b=2 as in the other LoRA rows"),
    Example("dual-tower example, 12 GB row 9, time estimate 1: 30M from scratch, b=64",
            f"{TOWERS} --batch 64 --dataset-size 100000 --tflops 20", (
                Figure("ViT-tiny activations per layer (MB)", lambda r: r["per_layer"]["vit"] / MB, "119.6"),
                Figure("text-tower activations per layer (MB)", lambda r: r["per_layer"]["text"] / MB, "138.4"),
                Figure("ViT-tiny tower, raw (GB)", lambda r: r["estimate"].per_component["vit"] / GB, "1.43"),
                Figure("text tower, raw (GB)", lambda r: r["estimate"].per_component["text"] / GB, "0.83"),
                Figure("activations, raw (GB)", est("activations_raw"), "2.26", rounded=True),
                Figure("activations x1.3 (GB)", est("activations"), "2.94"),
                Figure("parameters (M)", fig("params", 1e6), "30"),
                Figure("weights+grads+AdamW (GB)", est("states"), "0.48"),
                Figure(TOTAL, est("total"), "4.2"),
                Figure("FLOPs per sample (GFLOP)", fig("flops_per_sample", 1e9), "23.6"),
                Figure("FLOPs per step (TFLOP)", fig("flops_per_step", 1e12), "1.51"),
                Figure("steps per epoch (100,000 samples)", fig("steps_per_epoch"), "1563"),
                Figure("FLOPs per epoch (PFLOP)", fig("flops_per_epoch", 1e15), "2.36"),
                Figure("epoch at 20 TFLOP/s (min)", fig("seconds_per_epoch", 60), "2"),
            ), table="dual tower 30M (ViT-tiny + text + head), b=64",
            note="the curriculum gives 30M in all: the projection head is the remainder, 2.3M"),
    Example("12 GB row 9: dual tower, b=128", f"{TOWERS} --batch 128", (Figure(TOTAL, est("total"), "7.2"),),
            table="dual tower, b=128"),
    Example("12 GB row 10: dual tower, b=256, checkpoint every layer", f"{TOWERS} --batch 256 --checkpoint-every 1",
            (Figure(f"{TOTAL}, finest granularity: below the curriculum's 6-8", est("total"), "< 6"),),
            table="dual tower, b=256, checkpoint every layer", table_printed="6-8"),
    Example("12 GB row 10: dual tower, b=256, one checkpoint per tower", f"{TOWERS} --batch 256 --checkpoint-every 12",
            (Figure(f"{TOTAL}, coarsest granularity: above the curriculum's 6-8", est("total"), "> 8"),),
            table="dual tower, b=256, one checkpoint per tower", table_printed="6-8",
            note="the curriculum's '6-8 GB, varies with the checkpoint granularity' lies between these two calls"),
    Example("bytes per parameter of each setup; AdamW 16 bytes: 0.1B needs 1.6 GB; 8-bit saves 0.6 GB",
            "setups --params 1e8", (
                *(Figure(f"{name} (bytes/parameter)", lambda r, n=name: r[n]["bytes_per_param"], printed)
                  for name, printed in (("fp32-sgd", "8"), ("fp32-momentum", "12"), ("fp32-adamw", "16"),
                                        ("bf16-master-adamw", "16"), ("amp-adamw", "16"), ("amp-adamw8bit", "10"))),
                Figure("0.1B with AdamW (GB)", lambda r: r["fp32-adamw"]["bytes"] / GB, "1.6"),
                Figure("8-bit AdamW saves at 0.1B (GB)",
                       lambda r: (r["amp-adamw"]["bytes"] - r["amp-adamw8bit"]["bytes"]) / GB, "0.6"),
            )),
    Example("lever 6 at 1B: 8-bit AdamW saves 6 GB", "setups --params 1e9", (
        Figure("8-bit AdamW saves (GB)", lambda r: (r["amp-adamw"]["bytes"] - r["amp-adamw8bit"]["bytes"]) / GB, "6"),
    )),
    Example("levers 4-6 on 1.5B: LoRA 24 GB -> 7.8 GB; offload saves 8 bytes/parameter",
            "levers --hidden 2048 --layers 24 --heads 16 --vocab 150000 --seq 512 --batch 2", (
                Figure("LoRA r=8, every linear layer: total (GB)", lambda r: r["levers"][4]["total_GB"], "7.8"),
                Figure("offload saves (bytes/parameter)", lambda r: r["levers"][5]["saved_GB"] * GB / r["params"], "8"),
                Figure("8-bit AdamW saves (bytes/parameter)", lambda r: r["levers"][6]["saved_GB"] * GB / r["params"],
                       "6"),
            ), note="the curriculum's 'offload saves ~9 GB at 1.5B' is 1.5B x 6 bytes (the 8-bit figure); "
                    "8 bytes x 1.515B = 12.1 GB"),
    Example("stage plan 6.3: 7B full fine-tune 112 GB, ZeRO-3 over 8 GPUs", "zero --params 7e9 --gpus 8", (
        Figure("bf16 weights (GB)", fig("weights", GB), "14"),
        Figure("bf16 gradients (GB)", fig("grads", GB), "14"),
        Figure("fp32 master + m + v (GB)", fig("states", GB), "84"),
        Figure("model states (GB)", fig("total", GB), "112"),
        Figure("per GPU (GB)", fig("per_gpu", GB), "14.0"),
    )),
    *(Example(f"stage plan 6.3: KV cache, Llama-3-8B (GQA), {ctx // 1024}K context", f"kv --seq {ctx}",
              (Figure("KV cache (GiB)", fig("bytes", M.GiB), printed),))
      for ctx, printed in ((8192, "1.00"), (32768, "4.00"), (131072, "16.00"))),
]


def tolerance(printed: str, rounded: bool = False) -> float:
    """Half a unit in the printed last digit, plus 0.5% for a figure derived from already-rounded numbers."""
    decimals = len(printed.partition(".")[2])
    return 0.5 * 10**-decimals + (0.005 * abs(float(printed)) if rounded else 0.0)


def miss(value: float, figure: Figure) -> tuple[float, float]:
    """(how far `value` is from what the curriculum prints, how far it may be): a point, a range or a bound."""
    p = figure.printed
    if p.startswith(("<", ">")):
        bound = float(p[1:])
        return (max(0.0, value - bound) if p[0] == "<" else max(0.0, bound - value)), 0.0
    if "-" in p:
        lo, hi = map(float, p.split("-"))
        return max(0.0, lo - value, value - hi), 0.0
    return abs(value - float(p)), tolerance(p, figure.rounded)


def run_all(examples=EXAMPLES) -> list[dict]:
    """Every example through the command line (`memcalc.calculate`): one row per figure."""
    rows = []
    for ex in examples:
        _, _, result = M.calculate(ex.cli)
        for f in ex.figures:
            value = f.value(result)
            off, tol = miss(value, f)
            rows.append({"example": ex.name, "cli": ex.cli, "figure": f.what, "printed": f.printed, "value": value,
                         "miss": off, "tolerance": tol, "ok": math.isfinite(value) and off <= tol, "note": ex.note})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| example (one CLI call) | figure | curriculum | calculator | matches |", "|---|---|---:|---:|:---:|"]
    last = None
    for r in rows:
        head = "" if r["cli"] == last else f"{r['example']}<br>`memcalc.py {r['cli']}`"
        lines.append(f"| {head} | {r['figure']} | {r['printed']} | {r['value']:.4g} | {'yes' if r['ok'] else 'NO'} |")
        last = r["cli"]
    notes = {r["example"]: r["note"] for r in rows if r["note"]}
    return "\n".join(lines + [""] + [f"- {name}: {note}." for name, note in notes.items()])


TABLE_ROWS = [(ex.table, ex.cli, ex.table_printed or next(f.printed for f in ex.figures if f.what.startswith(TOTAL)))
              for ex in EXAMPLES if ex.table]
