"""The READMEs' generated blocks: results tables included verbatim, and the few tables that combine runs or days.

A block sits between two HTML comments (invisible on GitHub):

    <!-- include: PATH -->                 a Markdown file (PATH relative to the README), verbatim
    <!-- include: PATH table=N -->         ... only its N-th table (`paragraph=N`, `section=TITLE` likewise)
    <!-- generated: NAME -->               BLOCKS[NAME](): a table combining results files (the root README's,
                                           INTERVIEW.md's, and a day's that sets two runs side by side)
    <!-- end generated -->

An included results report has its relative links rewritten to work from the README. Each command writes its tables
(`results/*.md`) beside its figures; `python scripts/report.py --readme` re-makes every block from the committed
results files, and tests/test_report.py fails when a README block differs from what its results files make.
"""
import ast
import math
import os
import re
import statistics
import textwrap
from functools import partial
from pathlib import Path

from day07_amp_accum.report import by_precision
from day09_cnn.transfer_lab import accuracies
from day10_bigbatch_ckpt.main import MODES as DAY10_MODES
from day10_bigbatch_ckpt.report import cut, linear_ratio, matches, memtable
from sprint import markdown_table, read_json

ROOT = Path(__file__).resolve().parents[1]
DAYS = {int(p.name[3:5]): p.name for p in sorted(ROOT.glob("day[0-9][0-9]_*")) if p.is_dir()}
BEGIN = re.compile(r"^<!-- (generated|include): (.+?) -->$")
END = "<!-- end generated -->"


class FigureError(Exception):
    """A block that cannot be made: no end marker, a missing file, a selector that selects nothing."""


def wrap(text: str, width: int = 118) -> str:
    """Prose lines folded at `width` like the hand-written text around them (bullets keep a hanging indent); table
    rows, fenced blocks and `code` stay whole."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith(("|", "```")) or len(line) <= width:
            lines.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        glued = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", "\0"), line)
        lines += [part.replace("\0", " ") for part in textwrap.wrap(
            glued, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


def load(day: int, name: str = "summary.json"):
    """A committed results file of day `day`."""
    return read_json(ROOT / DAYS[day] / "results" / name)


# --- the cross-day figures ------------------------------------------------------------------------------------------

def shape(values: list) -> str:
    return "(" + ", ".join(map(str, values)) + ")"


def joined(values, spec: str = "", sep: str = " / ") -> str:
    return sep.join(format(v, spec) for v in values)


def day11_stages() -> tuple[dict, dict]:
    """Day 11's naive and optimised stages."""
    stages = load(11)["stages"]
    return stages[0], stages[-1]


def state_verdict(summary: dict) -> str:
    """Whether the resumed runs' final state equals the uninterrupted run's, entry by entry (`state_diffs`)."""
    diffs = sum(len(c["comparison"]["state_diffs"]) for c in summary["chains"].values())
    return "final state bit-identical" if diffs == 0 else f"{diffs} final-state entries differ"


def gap_ratios(overfit: dict) -> str:
    """Each regularised run's gap (val - train loss) over the unregularised one's (the first curve)."""
    gaps = [c["gap"] for c in overfit["curves"].values()]
    return " / ".join(f"{g / gaps[0]:.2f}" for g in gaps[1:])


def warmup_range(lab: dict) -> str:
    """The val loss without warmup over the one with it, per seed: the lowest and the highest ratio (one figure when
    they round alike)."""
    without, with_ = lab["warmup"].values()
    ratios = sorted(a["val_loss"] / b["val_loss"] for a, b in zip(without, with_))
    low, high = f"{ratios[0]:.2f}", f"{ratios[-1]:.2f}"
    return low if low == high else f"{low}–{high}"


def norm_acc(lab: dict, norm: str, batch: int) -> float:
    """The validation accuracy of `norm` trained at batch size `batch`."""
    return next(r["val_acc"] for r in lab["runs"] if r["norm"] == norm and r["batch_size"] == batch)


def forgotten_eval_cost(lab: dict) -> float:
    """The accuracy points a validation pass without `model.eval()` (over label-sorted batches) costs."""
    return 100 * (lab["forgotten_eval"]["clean"] - lab["forgotten_eval"]["after_sorted"])


def lora_share(levers: dict) -> float:
    """The share of full fine-tuning's optimizer state that LoRA keeps (`levers.json`)."""
    return levers["lora"]["state_bytes"] / levers["full"]["state_bytes"]


def compiled_ratio(lab: dict) -> float:
    """A compiled step's time over an eager one's, once compiled (`compile.json`)."""
    steady = lab["compile"]["steady_step_s"]
    return steady["compiled"] / steady["eager"]


def day12_config(name: str) -> dict:
    return next(row for row in load(12) if row["config"] == name)


def day12_nanogpt() -> tuple[float, float, float]:
    """(The template's tokens/s over nanoGPT's; the tuned run's and the speedrun's time to nanoGPT's final val loss
    over nanoGPT's own.)"""
    runs = load(12, "nanogpt.json")["runs"]
    nano = runs["nanogpt"]
    target = nano["val_loss_by_step"][str(nano["steps"])]

    def time_to(run: dict) -> float:
        return min(run["time_to_eval_s"][step] for step, loss in run["val_loss_by_step"].items() if loss <= target)

    return (runs["template"]["tokens_per_s"] / nano["tokens_per_s"], time_to(runs["template, tuned"]) / time_to(nano),
            time_to(runs["speedrun"]) / time_to(nano))


def day12_fsdp_share(ranks: int) -> float:
    """FSDP2's parameter + gradient + AdamW bytes per rank over DDP's, at `ranks` ranks."""
    state = {(row["strategy"], row["ranks"]): row["state"] for row in load(12, "zero.json")["rows"]}
    return state["fsdp", ranks] / state["ddp", ranks]


def measured_rows() -> list[tuple[int, str, str, str]]:
    """README.md's "Measured results" (and REPORT.md's): (day, the command that writes it, what it measures, the
    figure), one figure a row (or one per seed or setting, in the order the row names them)."""
    d1, d2, d3, d4 = load(1, "report.json"), load(2), load(3), load(4)
    d4b, d4i = load(4, "bench.json"), load(4, "init_lab.json")
    d5, d6, d6o, d7, d7a, d7o = (load(5, "timing.json"), load(6), load(6, "overfit.json"), load(7),
                                 load(7, "avx2/summary.json"), load(7, "optim.json"))
    d8, d8b, d9, d9n, d9t = load(8), load(8, "bench.json"), load(9), load(9, "norms.json"), load(9, "transfer.json")
    d10, d10l, d11c, (naive, optimised) = load(10), load(10, "levers.json"), load(11, "compile.json"), day11_stages()
    d12n, d12m, d12d, d12b, d12mo, d12t = (load(12, f"{name}.json") for name in ("nanogpt", "muon", "drills", "bench",
                                                                                "modern", "tokenizers"))
    facts, trap = d1["diagnosis"]["facts"], d1["lessons"]["broadcasting"]["trap_shape"]
    build = f"CUDA {facts['wheel_cuda']} wheel" if facts["wheel_cuda"] else "CPU-only build"
    hand = [op["max_abs_diff"] for op in d2["hand_vs_autograd"].values()]
    relu, chains = d4i["stds"]["relu"], d6["chains"].values()
    base, early, clip = d6o["curves"]["no regularisation"], d6o["early_stop"], d7o["clip_order"]
    speedup, resnet, first_step = d8b["scalar"]["speedup"]["numpy"], d9["resnet"], d11c["compile"]["first_step_s"]
    largest, nano_runs, muon = d10["largest_batch"]["true peak"], d12n["runs"], d12m["seeds"]
    labels = sorted({r["labels"] for r in d9t["runs"]})
    modern_val = {name: losses.values() for name, losses in d12mo["val_loss"].items()}
    speed, time_ratio, speedrun_ratio = day12_nanogpt()
    day1, day2, day3 = "day01_env_and_tensors/main.py", "day02_autograd/main.py", "day03_linreg/main.py"
    day4, init_lab, day5 = "day04_mlp_mnist/main.py", "day04_mlp_mnist/init_lab.py", "day05_dataloader/main.py"
    resume, overfit = "day06_ckpt_resume/prove_resume.py", "day06_ckpt_resume/overfit_lab.py"
    day7, optim_lab = "day07_amp_accum/main.py", "day07_amp_accum/optim_lab.py"
    day8, day9 = "day08_mini_autograd/bench.py", "day09_cnn/main.py"
    norms, day10, levers = "day09_cnn/norms_lab.py", "day10_bigbatch_ckpt/main.py", "day10_bigbatch_ckpt/levers_lab.py"
    day11, compile_lab, day12 = "day11_profile/main.py", "day11_profile/compile_lab.py", "day12_template/main.py"
    nanogpt, muon_lab, bench = ("day12_template/nanogpt_bench.py", "day12_template/muon_lab.py",
                                "day12_template/bench.py")
    modern = "day12_template/modern_lab.py"
    return [
        (1, day1, "this machine's CUDA diagnosis: the step it stops at",
         f"{d1['diagnosis']['step']} ({build})"),
        (1, day1, "an NVIDIA driver found (`nvidia-smi`)", yes_no(facts["nvidia_smi"])),
        (1, day1, f"the broadcasting trap, `(N,)` against `(N,1)` at N = {trap[0]}: the shape it gives",
         f"`{shape(trap)}`"),
        (2, day2, f"hand-derived gradients against autograd ({len(hand)} ops, float64): the largest difference",
         f"{max(hand):.1e}"),
        (2, day2, "... ops with no difference at all", f"{hand.count(0)} of {len(hand)}"),
        (2, day2, "`(w*x+b)**2` in float32: the hand gradient minus `w.grad`",
         f"{d2['linear_square_float32']['max_abs_diff']:.1e}"),
        (3, day3, "MSE after training", f"{d3['mse']:.2e}"),
        (3, day3, "w / b (the data's: 3 / 2)", f"{d3['w']:.4f} / {d3['b']:.4f}"),
        (3, day3, "the stability limit 2/λ_max", f"{d3['lr_limit']:.3f}"),
        (4, day4, f"MLP test accuracy after {d4['config']['epochs']} epochs, seed 0 (G0: > 98%)",
         f"{d4['test_acc']:.2%}"),
        (4, "day04_mlp_mnist/bench.py", "the same, seed 1", f"{d4b['rows'][1]['main']['test_acc']:.2%}"),
        (4, "day04_mlp_mnist/bench.py", f"the main job's time to a final accuracy over a plain reference MLP's time "
         f"to its first pass above 98%, seeds {joined(d4b['config']['seeds'])}",
         joined((r["ratios"]["1"] for r in d4b["rows"]), ".2f") + "×"),
        (4, init_lab, "He + ReLU: std at layer 30 / at layer 1", f"{relu['He'][-1]:.3g} / {relu['He'][0]:.3g}"),
        (4, init_lab, "too small an init: std at layer 30 over layer 1's",
         f"{relu['too small'][-1] / relu['too small'][0]:.1e}"),
        (4, init_lab, "dead units after Adam at LR 3e-2: ReLU / GELU / SiLU",
         joined((d4i["dead"][i]["dead"] for i in (1, 2, 3)), ".1%")),
        (5, day5, f"one augmented training epoch on {d5['cpu_count']} cores, "
         f"{joined(r['num_workers'] for r in d5['rows'])} workers (s)",
         joined((r["train_epoch_s"] for r in d5["rows"]), ".1f")),
        (5, day5, "the same epoch, data only (s)", joined((r["data_epoch_s"] for r in d5["rows"]), ".1f")),
        (6, resume, f"SIGKILLs ({joined((c['workers'] for c in chains), sep=' and ')} workers); resumed steps whose "
         "loss differs (`float.hex`)", f"{sum(len(c['kill_at']) for c in chains)}; "
         f"{sum(c['comparison']['loss_mismatches'] for c in chains)}"),
        (6, resume, "final-state entries that differ from the uninterrupted run's",
         f"{sum(len(c['comparison']['state_diffs']) for c in chains)}"),
        (6, overfit, f"{d6o['config']['subset']} images, no regularisation: training accuracy",
         f"{base['train_acc'][-1]:.0%}"),
        (6, overfit, f"... lowest val loss (its epoch) / at epoch {d6o['config']['epochs']}",
         f"{min(base['val_loss']):.3f} ({base['best_epoch']}) / {base['val_loss'][-1]:.3f}"),
        (6, overfit, "early stopping: stopped after epoch", f"{early['stopped_after_epoch']}"),
        (6, overfit, "gap with Dropout / weight decay / augmentation, of the unregularised gap", gap_ratios(d6o)),
        (7, day7, "one step, fp32 / fp16 / bf16 (ms)", joined((r["step_ms"] for r in d7["table"]), ".2f")),
        (7, day7, "... the same capped at AVX2 (ms)", joined((r["step_ms"] for r in d7a["table"]), ".2f")),
        (7, day7, "bytes saved for backward, fp32 / fp16 / bf16 (KiB)",
         joined((r["saved_bytes"] / 1024 for r in d7["table"]), ".0f")),
        (7, day7, "tiny gradients fp16 zeroes without loss scaling",
         f"{d7['ranges']['zero_fraction_fp16_unscaled']:.0%}"),
        (7, optim_lab, "no warmup at LR 0.03: val loss over the warmed-up run's, lowest–highest seed",
         warmup_range(d7o)),
        (7, optim_lab, "clipping before `unscale_`, then after: SGD's val loss",
         f"{clip['sgd']['clip, then unscale']['val_loss']:.2f} / {clip['sgd']['unscale, then clip']['val_loss']:.2f}"),
        (7, optim_lab, "... AdamW's", f"{clip['adamw']['clip, then unscale']['val_loss']:.3f} / "
         f"{clip['adamw']['unscale, then clip']['val_loss']:.3f}"),
        (7, optim_lab, "batch ×4: the LR closest to batch 32's curve, per seed", joined(d7o["scaling_closest"])),
        (8, "day08_mini_autograd/main.py", "XOR loss / MNIST test accuracy of the tensor engine",
         f"{d8['xor_final_loss']:.4f} / {d8['mnist']['test_acc']:.2%}"),
        (8, day8, "scalar engine against micrograd 0.1.0 on its demo (speed-up; with the collector paused)",
         f"{speedup['default']:.1f}×; {speedup['paused']:.1f}×"),
        (8, day8, "tensor engine step / torch's (ms)", f"{d8b['tensor']['engine_ms']:.2f} / "
         f"{d8b['tensor']['torch_ms']:.2f}"),
        (9, day9, f"ResNet test accuracy ({resnet['params']:,} params, {resnet['epochs']} epochs, "
         f"{resnet['config']['schedule']} LR {resnet['config']['lr']} chosen on validation)",
         f"{resnet['test_acc']:.2%}"),
        (9, day9, f"the Day 4 MLP's ({d9['mlp']['params']:,} params)", f"{d9['mlp']['test_acc']:.2%}"),
        *[(9, norms, f"val accuracy at batch {b}: BatchNorm / GroupNorm / LayerNorm (%)",
           joined((100 * norm_acc(d9n, n, b) for n in ("BatchNorm", "GroupNorm", "LayerNorm")), ".1f"))
          for b in (2, 128)],
        (9, norms, "a forgotten `eval()`: accuracy points lost", f"{forgotten_eval_cost(d9n):.1f}"),
        *[(9, "day09_cnn/transfer_lab.py", f"{n:,} labels: last stage + head minus scratch, test accuracy points "
           "per seed", joined((100 * (a - b) for a, b in zip(accuracies(d9t, n, "last stage + head"),
                                                             accuracies(d9t, n, "scratch"))), "+.1f"))
          for n in (labels[0], labels[-1])],
        (10, day10, "saved bytes at twice the batch: the ratio farthest from 2", f"{linear_ratio(d10):.3f}"),
        (10, day10, "checkpointing: saved bytes / true peak cut by", f"{cut(d10, 'saved_bytes'):.0%} / "
         f"{cut(d10, 'peak_bytes'):.1%}"),
        (10, day10, "... step time over fp32's",
         f"{d10['step_seconds']['fp32 + checkpoint'] / d10['step_seconds']['fp32']:.2f}×"),
        (10, day10, f"largest batch in {d10['budget_bytes'] / 2**20:.0f} MiB: fp32 / with checkpointing",
         f"{largest['fp32']} / {largest['fp32 + checkpoint']}"),
        (10, "day10_bigbatch_ckpt/memcalc.py examples", "the curriculum's worked examples the calculator reproduces",
         matches(ROOT / DAYS[10] / "results")),
        (10, levers, f"LoRA r={d10l['config']['rank']}: parameters trained, of all",
         f"{d10l['lora']['trainable']:,} of {d10l['full']['trainable']:,}"),
        (10, levers, "... share of the optimizer state kept", f"{lora_share(d10l):.1%}"),
        (10, levers, "torchao's AdamW8bit state / AdamW's (bytes)", f"{d10l['adamw8bit']['state_bytes']:,} / "
         f"{d10l['full']['state_bytes']:,}"),
        (11, day11, "data/step, naive → optimised", f"{naive['ratio']:.0%} → {optimised['ratio']:.1%}"),
        (11, day11, "epoch (s), naive → optimised", f"{naive['epoch_s']:.1f} → {optimised['epoch_s']:.1f}"),
        (11, day11, "test accuracy, naive → optimised", f"{naive['test_acc']:.2%} → {optimised['test_acc']:.2%}"),
        (11, compile_lab, "first compiled step, cold / from the cache (s)",
         f"{first_step['compiled, cold']:.1f} / {first_step['compiled, warm']:.2f}"),
        (11, compile_lab, "a compiled step's time over an eager one's", f"{compiled_ratio(d11c):.2f}"),
        (12, day12, f"MNIST + MLP config: test accuracy after {day12_config('mnist_mlp')['epochs_run']} epochs",
         f"{day12_config('mnist_mlp')['test_acc']:.2%}"),
        (12, day12, "the GPT (`shakespeare_cpu.toml`): val loss on held-out works (nats per character)",
         f"{day12_config('shakespeare_cpu')['val_loss']:.3f}"),
        (12, nanogpt, "against nanoGPT's `train.py`, same files and model: tokens/s over nanoGPT's", f"{speed:.2f}"),
        (12, nanogpt, "val loss at 2,000 steps, the template / nanoGPT",
         f"{nano_runs['template']['val_loss_by_step']['2000']:.3f} / "
         f"{nano_runs['nanogpt']['val_loss_by_step']['2000']:.3f}"),
        (12, nanogpt, "time to nanoGPT's final loss over nanoGPT's: tuned recipe / `shakespeare_speedrun.toml`",
         f"{time_ratio:.2f} / {speedrun_ratio:.2f}"),
        (12, muon_lab, "test loss after 240 steps, Muon, seeds 0 / 1",
         joined((s["muon_at_steps"] for s in muon), ".3f")),
        (12, muon_lab, "... AdamW", joined((s["adamw_at_steps"] for s in muon), ".3f")),
        (12, muon_lab, "... Muon at AdamW's time", joined((s["muon_at_time"] for s in muon), ".3f")),
        (12, modern, f"val loss after {d12mo['steps']:,} steps, {d12mo['chosen']}, seeds 0 / 1",
         joined(modern_val[d12mo["chosen"]], ".3f")),
        (12, modern, "... the GPT-2 block", joined(next(iter(modern_val.values())), ".3f")),
        (12, "day12_template/tokenizer_lab.py", f"val bits per byte after {d12t['steps']:,} steps, "
         f"{' / '.join(d12t['rows'])}, mean of seeds 0 and 1",
         joined((statistics.mean(row["val_bpb"].values()) for row in d12t["rows"].values()), ".3f")),
        (12, "day12_template/drills_lab.py", f"lr {d12d['high_lr']['lr']:g}: val loss after "
         f"{d12d['high_lr']['steps_done']} steps / at the config's lr", f"{d12d['high_lr']['val_loss']:.3f} / "
         f"{d12d['high_lr']['config_lr_val_loss']:.3f}"),
        (12, "day12_template/drills_lab.py", "`run.deterministic`: CPU time of a step over off's",
         f"{d12d['same_seed']['cost_cpu_ratio']:.2f}"),
        (12, "day12_template/drills_lab.py", "a resume without the optimizer state: the largest val loss gap over the "
         "next 50 steps (nats)", f"{d12d['resume']['resumed-model-only']['max_gap']:+.3f}"),
        (12, bench, "template loop overhead against a bare loop, wall clock / CPU time",
         f"{d12b['overhead']['wall']['overhead']:+.1%} / {d12b['overhead']['cpu']['overhead']:+.1%}"),
        (12, bench, "DDP on 2 ranks, samples/s over one process's",
         f"{d12b['scale_out']['DDP: 2 ranks x 1 thread']['vs_1_process_1_thread']:.2f}"),
        (12, "day12_template/zero_lab.py", "FSDP2's parameter + gradient + AdamW bytes per rank at 4 ranks, over DDP's",
         f"{day12_fsdp_share(4):.3f}"),
    ]


def results_table() -> str:
    """README.md's "Measured results" (and REPORT.md's)."""
    return markdown_table(["day", "command", "measures", "figure"],
                          [[day, f"`python {command}`", what, figure]
                           for day, command, what, figure in measured_rows()])


def cpu_bf16_table() -> str:
    """README.md and Day 7: what native bf16 is worth on a CPU, from Day 7's run on this CPU and its run capped at
    AVX2 (`results/avx2/`)."""
    rows = []
    for label, name in (("native (AMX-BF16 / AVX512-BF16)", "summary.json"), ("capped at AVX2", "avx2/summary.json")):
        run = by_precision(load(7, name))
        fp32, fp16, bf16 = run["off"], run["fp16"], run["bf16"]
        rows.append([label, f"{fp32['matmul_gflops']:.1f}", f"{bf16['matmul_gflops']:.1f}",
                     f"{bf16['matmul_gflops'] / fp32['matmul_gflops']:.3g}", f"{bf16['step_ms'] / fp32['step_ms']:.2f}",
                     f"{fp16['step_ms'] / fp32['step_ms']:.2f}"])
    return markdown_table(["Day 7's CPU kernels", "fp32 matmul 256³ (GFLOP/s)", "bf16 matmul (GFLOP/s)",
                           "bf16 ÷ fp32", "MLP step, bf16 ÷ fp32 time", "fp16 ÷ fp32 time"], rows, "lrrrrr")


def day10_timings_table() -> str:
    """Day 10's step times from its run on this CPU and its run capped at AVX2 (`results/avx2/`): fp32 in ms, the
    other modes as multiples of it (one run each), with each run's machine."""
    rows = []
    for name in ("summary.json", "avx2/summary.json"):
        summary = load(10, name)
        steps = summary["step_seconds"]
        rows.append([summary["machine"], f"{steps['fp32'] * 1e3:.1f} ms",
                     *(f"×{steps[mode] / steps['fp32']:.2f}" for mode in DAY10_MODES[1:])])
    return markdown_table(["CPU", "fp32", "checkpointed", "bf16 autocast"], rows, "lrrr")


def machine_line() -> str:
    """README.md (and REPORT.md): the machines the results files name, each reduced to its CPU model and cores."""
    found = set()
    for day in DAYS.values():
        for path in sorted((ROOT / day / "results").rglob("*.json")):
            data = read_json(path)
            if isinstance(data, dict) and isinstance(data.get("machine"), str):
                found.add(re.split(r" \(|, (?=\d+ (?:logical )?cores)", data["machine"])[0])
    return (f"Measured on {'; '.join(sorted(found))} (as each results file records it, with its thread count); "
            "timing claims are ratios measured within one run.")


def interview_evidence() -> dict[int, list[tuple[str, str, str]]]:
    """INTERVIEW.md: under each answer, the figures that back it: (the command that writes it, what it measures, the
    figure)."""
    d2, d3, d4, d5, d6, d6o = load(2), load(3), load(4), load(5, "timing.json"), load(6), load(6, "overfit.json")
    d7, d9n, d10, d10l = load(7), load(9, "norms.json"), load(10), load(10, "levers.json")
    rnn, arch = load(12, "rnn_to_attention.json"), load(12, "architecture.json")
    views, saves = load(1, "report.json")["lessons"]["views"], d2["detach_vs_no_grad"]
    table12 = ROOT / DAYS[10] / "results"
    chains = d6["chains"].values()
    ranges, training = d7["ranges"], d7["training"]
    base, early = d6o["curves"]["no regularisation"], d6o["early_stop"]
    naive, optimised = day11_stages()
    day4, day6, day6o, day7 = ("python day04_mlp_mnist/main.py", "python day06_ckpt_resume/prove_resume.py",
                               "python day06_ckpt_resume/overfit_lab.py", "python day07_amp_accum/main.py")
    memcalc, norms, day1 = ("python day10_bigbatch_ckpt/memcalc.py table", "python day09_cnn/norms_lab.py",
                            "python day01_env_and_tensors/main.py")
    rnn_lab = "python day12_template/rnn_to_attention_lab.py --out day12_template/results"
    arch_lab = "python day12_template/architecture_lab.py --out day12_template/results --seeds 0 1 2 3"
    post, low = arch["val_loss"]["post-norm"], arch_row(arch, "post-norm, lr 3e-4")["delta_at_steps"]
    longest = max(rnn["reversal"]["rows"][0]["accuracy"], key=int)
    reversal = {(r["seed"], r["attention"]): r["accuracy"][longest] for r in rnn["reversal"]["rows"]}
    return {
        1: [(day4, "test accuracy, the test set evaluated once, after training (G0: > 98%)", f"{d4['test_acc']:.2%}"),
            (day6, "SIGKILLs; resumed steps whose loss differs; the final state",
             f"{sum(len(c['kill_at']) for c in chains)}; "
             f"{sum(c['comparison']['loss_mismatches'] for c in chains)}; {state_verdict(d6)}"),
            (day7, f"bf16 autocast, 4 micro-batches of 32 per step: test accuracy after {training['step']} steps",
             f"{training['test_acc']:.2%}")],
        2: [(day7, "parameters + gradients + AdamW state, fp32 / fp16 / bf16 autocast (KiB)",
             joined((r["state_bytes"] / 1024 for r in d7["table"]), ".0f")),
            (day7, "bytes saved for backward, the same (KiB)",
             joined((r["saved_bytes"] / 1024 for r in d7["table"]), ".0f")),
            (memcalc, "full fine-tune of 1.5B parameters: weights, gradients and AdamW state alone",
             memtable(table12, "full fine-tune 1.5B", "weights+grads+optim"))],
        3: [(norms, f"validation accuracy, BN / GN / LN, batch {b} (%)",
             joined((100 * norm_acc(d9n, n, b) for n in ("BatchNorm", "GroupNorm", "LayerNorm")), ".1f"))
            for b in (2, 128)] + [
            (norms, "batch of one in train mode", f"`{d9n['batch_of_one']['train_error']}`"),
            (norms, "RMSNorm in four lines vs `torch.nn.RMSNorm`: max difference", f"{d9n['rmsnorm_max_diff']}")],
        4: [("python day10_bigbatch_ckpt/main.py", "true peak of one fp32 step at batch 16 / 32 / 64 (MiB): the "
             "micro-batch sets the peak", joined((b / 2**20 for b in d10["peak_bytes"]["fp32"][2:]), ".1f")),
            (day7, "bf16, batch 128 as 4 × 32: test accuracy", f"{training['test_acc']:.2%}")],
        5: [(day7, "weight gradients of 2⁻²⁸ that become 0: fp32 / fp16 without scaling / fp16 with GradScaler",
             joined((ranges[k] for k in ("zero_fraction_fp32", "zero_fraction_fp16_unscaled",
                                         "zero_fraction_fp16_scaled")), ".0%")),
            (day7, "those scaled fp16 gradients against fp32, relative error", f"{ranges['rel_error_fp16_scaled']:.1e}"),
            (day7, "70,000 through a matmul: fp16 / bf16", f"{ranges['fp16_70000']} / {ranges['bf16_70000']:,.0f}")],
        6: [(day6o, f"{d6o['config']['subset']} images, no regularisation: training accuracy",
             f"{base['train_acc'][-1]:.0%}"),
            (day6o, f"lowest validation loss (its epoch); at epoch {d6o['config']['epochs']}",
             f"{min(base['val_loss']):.3f} ({base['best_epoch']}); {base['val_loss'][-1]:.3f}"),
            (day6o, "early stopping: stopped after epoch; step `best.pt` holds",
             f"{early['stopped_after_epoch']}; {early['best_pt_step']}"),
            (day6o, "gap with Dropout / weight decay / augmentation, of the unregularised gap", f"×{gap_ratios(d6o)}")],
        7: [(day1, "`a = arange(24).reshape(4,6)`: stride", f"`{shape(views['a']['stride'])}`"),
            (day1, "`a.t()`: stride; contiguous; shares storage", f"`{shape(views['transpose']['stride'])}`; "
             f"{yes_no(views['transpose']['contiguous'])}; {yes_no(views['transpose_shares'])}"),
            (day1, "`a.t().reshape(24)` shares storage (else a silent copy)",
             yes_no(views["transpose_reshape_shares"])),
            (day1, "`a.t().view(24)`", f"`{views['transpose_view']['type']}`")],
        8: [("python day02_autograd/main.py", "bytes autograd saves for `tanh(x @ W1) @ W2`: with grad; under `no_grad`",
             f"{saves['saved_bytes_with_grad']:,}; {saves['saved_bytes_under_no_grad']}"),
            ("python day02_autograd/main.py", "`w * w.detach()`: max difference of `w.grad` from w",
             f"{saves['grad_of_w_times_detached_w_minus_w']}")],
        9: [(memcalc, f"{label}: {column}", memtable(table12, row, column)) for row, label, column in (
            ("full fine-tune 1.5B", "full fine-tune 1.5B", "weights+grads+optim"),
            ("full fine-tune 1.5B", "full fine-tune 1.5B, b=2", "total"),
            *[("LoRA 1.5B (9M", "LoRA 1.5B (9M trainable), b=2", column) for column in (
                "weights+grads+optim", "activations raw", "x1.3", "logits", "total")],
            ("LoRA 1.5B, b=8", "the same with checkpointing, b=8", "x1.3"),
            ("LoRA 1.5B, b=8", "the same with checkpointing, b=8", "total"),
            ("QLoRA 7B", "QLoRA 7B", "weights+grads+optim"), ("QLoRA 7B", "QLoRA 7B", "total"))] + [
            ("python day10_bigbatch_ckpt/levers_lab.py", f"LoRA r={d10l['config']['rank']} on a tiny GPT: share of the "
             "optimizer state kept", f"{lora_share(d10l):.1%}")],
        10: [("python day03_linreg/main.py", "the stability limit 2/λ_max (above it the run stops with one line, not "
              "NaN)", f"{d3['lr_limit']:.3f}"),
             (day7, "70,000 in fp16 / bf16", f"{ranges['fp16_70000']} / {ranges['bf16_70000']:,.0f}")],
        11: [("python day05_dataloader/main.py", f"one augmented epoch on {d5['cpu_count']} cores, "
              f"{joined(r['num_workers'] for r in d5['rows'])} workers: training (s)",
              joined((r["train_epoch_s"] for r in d5["rows"]), ".1f")),
             ("python day05_dataloader/main.py", "the same, data only (samples/s)",
              joined((r["data_samples_per_s"] for r in d5["rows"]), ",")),
             ("python day05_dataloader/main.py", "the training step alone (samples/s)",
              f"{d5['model_only_samples_per_s']:,}")],
        12: [("python day11_profile/main.py", "data/step, naive → optimised",
              f"{naive['ratio']:.0%} ({naive['verdict']}) → {optimised['ratio']:.1%} ({optimised['verdict']})"),
             ("python day11_profile/main.py", "epoch (s), naive → optimised",
              f"{naive['epoch_s']:.1f} → {optimised['epoch_s']:.1f} ({naive['epoch_s'] / optimised['epoch_s']:.1f}×)"),
             ("python day11_profile/main.py", "test accuracy, naive → optimised",
              f"{naive['test_acc']:.2%} → {optimised['test_acc']:.2%}")],
        13: [(rnn_lab, f"reversing {longest} digits, seed {seed}: share right without / with attention",
              f"{reversal[seed, False]:.0%} / {reversal[seed, True]:.0%}")
             for seed in sorted({seed for seed, _ in reversal})] + [
             (rnn_lab, f"memory of a forward + backward grows as T^k: k, {name}", f"{c['memory_exponent']:.2f}")
             for name, c in rnn["contexts"].items()],
        14: [(arch_lab, "lr 3e-3: post-norm's val loss per seed", joined(post.values(), ".3f")),
             (arch_lab, "... predicting each character's frequency (the unigram loss)", f"{arch['unigram_loss']:.3f}"),
             (arch_lab, "... pre-norm's, per seed", joined(arch["val_loss"]["GPT-2 block"].values(), ".3f")),
             (arch_lab, "lr 3e-4: post-norm behind pre-norm, per seed", joined(low.values(), "+.3f")),
             (arch_lab, "QK-norm at lr 1e-2, val loss minus the plain block's there, per seed",
              joined(arch_row(arch, "QK-norm, lr 1e-2")["delta_at_steps"].values(), "+.3f"))],
    }


def arch_row(arch: dict, change: str) -> dict:
    return next(r for r in arch["rows"] if r["change"] == change)


def yes_no(value: bool) -> str:
    return "yes" if value else "no"


def interview(n: int) -> str:
    """INTERVIEW.md's evidence for question `n`, as a table."""
    return markdown_table(["command", "measures", "figure"],
                          [[f"`{command}`", what, figure] for command, what, figure in interview_evidence()[n]])


BLOCKS = {"results": results_table, "machines": machine_line, "cpu-bf16": cpu_bf16_table,
          "day10-timings": day10_timings_table,
          **{f"interview-{n}": partial(interview, n) for n in range(1, 15)}}


# --- the blocks -----------------------------------------------------------------------------------------------------

def select(text: str, selector: str, where: str) -> str:
    """`table=N`: the N-th table of `text`; `paragraph=N`: its N-th block of lines between blank lines;
    `section=TITLE`: the text under the heading TITLE; empty: all of it."""
    key, _, value = selector.partition("=")
    lines = text.splitlines()
    if not key:
        return text.strip("\n")
    if key == "table":
        tables, current = [], []
        for line in lines + [""]:
            if line.startswith("|"):
                current.append(line)
            elif current:
                tables.append(current)
                current = []
        if not value.isdigit() or not 1 <= int(value) <= len(tables):
            raise FigureError(f"{where}: has {len(tables)} tables, asked for table={value}")
        return "\n".join(tables[int(value) - 1])
    if key == "paragraph":
        blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text) if b.strip()]
        if not value.isdigit() or not 1 <= int(value) <= len(blocks):
            raise FigureError(f"{where}: has {len(blocks)} paragraphs, asked for paragraph={value}")
        return blocks[int(value) - 1]
    if key == "section":
        heads = [i for i, line in enumerate(lines) if re.fullmatch(r"#+ " + re.escape(value), line)]
        if len(heads) != 1:
            raise FigureError(f"{where}: {len(heads)} headings named {value!r}")
        level = len(lines[heads[0]].split(" ")[0])
        body = []
        for line in lines[heads[0] + 1:]:
            if re.match(r"#{1,%d} " % level, line):
                break
            body.append(line)
        return "\n".join(body).strip("\n")
    raise FigureError(f"{where}: unknown selector {selector!r} (use table=N, paragraph=N or section=TITLE)")


def relink(text: str, src: Path, dest: Path) -> str:
    """Relative links and images of a file in the folder `src`, rewritten for a Markdown file in `dest`."""
    def one(m: re.Match) -> str:
        if re.match(r"[a-z]+:|/|#", m[2]):
            return m[0]
        return f"{m[1]}({Path(os.path.relpath(src / m[2], dest)).as_posix()})"

    return re.sub(r"(!?\[[^\]]*\])\(([^)\s]+)\)", one, text)


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def block(kind: str, arg: str, md: Path) -> str:
    where = f"{shown(md)}: <!-- {kind}: {arg} -->"
    if kind == "generated":
        if arg not in BLOCKS:
            raise FigureError(f"{where}: no block named {arg!r} in scripts/figures.py")
        return wrap(BLOCKS[arg]())
    ref, _, selector = arg.partition(" ")
    path = (md.parent / ref).resolve()
    if not path.is_file():
        raise FigureError(f"{where}: {ref} does not exist")
    return relink(select(path.read_text(), selector.strip(), where), path.parent, md.parent)


def render(text: str, md: Path) -> str:
    """`text` (the Markdown file `md`) with every block re-made."""
    out, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        out.append(lines[i])
        i += 1
        if not m:
            continue
        end = next((j for j in range(i, len(lines)) if lines[j] == END or BEGIN.match(lines[j])), None)
        if end is None or lines[end] != END:
            raise FigureError(f"{shown(md)}: `{lines[i - 1]}` has no `{END}` before the next block")
        out += ["", block(m[1], m[2], md), "", END]
        i = end + 1
    return "\n".join(out)


def files() -> list[Path]:
    """The Markdown files that may hold blocks."""
    return [ROOT / "README.md", ROOT / "INTERVIEW.md", *sorted(ROOT.glob("day*/README.md"))]


def stale() -> list[Path]:
    """The Markdown files whose blocks differ from what `write_all` would write."""
    return [md for md in files() if md.is_file() and render(md.read_text(), md) != md.read_text()]


def write_all() -> list[Path]:
    """Every block re-made from the committed results files; returns the files that changed."""
    changed = []
    for md in files():
        if md.is_file() and (new := render(old := md.read_text(), md)) != old:
            md.write_text(new)
            changed.append(md)
    return changed


# --- typed figures --------------------------------------------------------------------------------------------------

# a unit and the scales by which a gate may state its figure (98% as 98 or 0.98, 12 ms as 12 or 0.012)
UNITS = {"%": (1, 0.01), "points": (1, 0.01), "ms": (1, 1e-3), "s": (1,), "seconds": (1,),
         "min": (60,), "minutes": (60,), "×": (1,), "x": (1,),
         "tokens/s": (1,), "samples/s": (1,), "KiB": (1, 2**10), "MiB": (1, 2**20), "GiB": (1, 2**30),
         "KB": (1, 1e3), "MB": (1, 1e6), "GB": (1, 1e9), "M": (1, 1e6), "B": (1, 1e9)}
NUMBER = r"\d(?:[\d,]*\d)?(?:\.\d+)?(?:e[-+]?\d+)?"
THRESHOLD = r"(?P<threshold>(?:[<>≥≤±]|at least|at most|within|under|below|above|over|past|than|up to|exit|code) ?)?"
UNIT = rf"(?P<unit>{'|'.join(sorted(map(re.escape, UNITS), key=len, reverse=True))})"
ALONE_BEFORE, ALONE_AFTER = r"(?<![\w.×/^–-])", r"(?![\w×–-])"  # not a part of a word, a name or a range
IN_PROSE = re.compile(  # a number with its unit, or a factor (×2)
    rf"{ALONE_BEFORE}{THRESHOLD}(?:(?P<value>{NUMBER}) ?{UNIT}|× ?(?P<factor>{NUMBER})){ALONE_AFTER}")
IN_TABLE = re.compile(  # any number, with or without its unit
    rf"{ALONE_BEFORE}{THRESHOLD}(?:× ?(?P<factor>{NUMBER})|(?P<value>{NUMBER})(?: ?{UNIT})?){ALONE_AFTER}")
UNTYPED = re.compile(r'`[^`]*`|\]\([^)]*\)|"[^"]*"')  # code spans, link targets, "quotations"


def prose_lines(text: str):
    """(line number, text) of each hand-written line, and of each comment in a code block; generated blocks, code and
    headings are left out, code spans, link targets and quotations blanked."""
    in_block = fenced = False
    for number, line in enumerate(text.split("\n"), 1):
        if BEGIN.match(line) or line == END:
            in_block = line != END
        elif line.startswith("```"):
            fenced = not fenced
        elif fenced:
            if comment := re.search(r"\s# (.*)", line):
                yield number, UNTYPED.sub("", comment[1])
        elif not in_block and not line.startswith("#"):
            yield number, UNTYPED.sub("", line)


def stated_figures(checks: list[Path]) -> tuple[set[tuple[float, str]], set[float]]:
    """The thresholds the `check.py` files state: the figures in their strings (gate names, messages: value and
    unit), and the numbers they compare with or hand to `gates.check`."""
    worded, numbers = set(), set()
    for path in checks:
        for node in ast.walk(ast.parse(path.read_text())):
            operands = []
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                worded |= {(value, unit) for value, unit, *_ in typed(node.value, IN_TABLE)}
            elif isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "check":
                operands = node.args[3:]  # gates.check(name, measured, op, threshold)
            numbers |= {c.value for operand in operands for c in ast.walk(operand)
                        if isinstance(c, ast.Constant) and type(c.value) in (int, float)}
    return worded, numbers


def typed(line: str, pattern: re.Pattern):
    """(value, unit, text, whether a threshold word precedes it) of each figure in `line`."""
    for m in pattern.finditer(line):
        unit = "×" if m["factor"] or m["unit"] == "x" else m["unit"] or ""
        yield float((m["value"] or m["factor"]).replace(",", "")), unit, m[0].strip(), bool(m["threshold"])


def typed_figures(md: Path, text: str | None = None) -> list[str]:
    """`FILE:LINE: figure` for each number with a unit typed in `md`'s prose, and each number in a table typed by
    hand, that is neither a threshold (after `>`, `within`, ..., or a range's end) nor one its day's `check.py` states
    (any day's, for the root files): a measured figure belongs in a generated table."""
    checks = [md.parent / "check.py"] if md.parent != ROOT else sorted(ROOT.glob("day*/check.py"))
    worded, numbers = stated_figures([path for path in checks if path.is_file()])
    found = []
    for number, line in prose_lines(md.read_text() if text is None else text):
        for value, unit, figure, threshold in typed(line, IN_TABLE if line.startswith("|") else IN_PROSE):
            stated = (value, unit) in worded or any(math.isclose(value * scale, n)
                                                    for scale in UNITS.get(unit, (1,)) for n in numbers)
            if not threshold and not stated:
                found.append(f"{shown(md)}:{number}: {figure}")
    return found
