"""The figures the READMEs and INTERVIEW.md quote, generated from the committed results files: which field feeds which
cell and how it is formatted (the spec), for `python scripts/report.py --readme`.

Each cell is a template (`{d4/summary.json:test_acc|.2%}`: day 4's results/summary.json, field `test_acc`, as a
percentage with two decimals; the syntax is in mdblocks.py). Figures that combine fields are named functions (CALCS),
each with a docstring naming its fields. `python scripts/report.py --spec` prints every cell with its template and
its value now. After `scripts/refresh_results.py`, `python scripts/report.py --readme` rewrites every block;
tests/test_report.py fails when a README differs from what the results files say.
"""
import re
from pathlib import Path

from mdblocks import (BLOCKS, CALCS, DAYS, ROOT, TRACE, FigureError, fill, load_path, read, render,  # noqa: F401
                      results_file, table)


# --- figures that combine fields (each says which fields) ---------------------------------------------------------

def day1_machine() -> str:
    """d1/report.json: diagnosis.step, diagnosis.facts.wheel_cuda, diagnosis.facts.nvidia_smi."""
    facts = read("d1/report.json", "diagnosis.facts")
    build = f"CUDA {facts['wheel_cuda']} wheel" if facts["wheel_cuda"] else "CPU-only build"
    driver = "driver found" if facts["nvidia_smi"] else "no driver"
    return f"step {read('d1/report.json', 'diagnosis.step')} ({build}, {driver})"


def day6_state() -> str:
    """d6/summary.json: chains.*.comparison.state_diffs (entries of the final state that differ from the reference)."""
    diffs = sum(len(d) for d in read("d6/summary.json", "chains.*.comparison.state_diffs"))
    return "final state bit-identical" if diffs == 0 else f"{diffs} final-state entries differ"


def day6_gap_ratios() -> str:
    """d6/overfit.json: curves.*.gap, each regularised run's over the unregularised one (the first curve)."""
    gaps = read("d6/overfit.json", "curves.*.gap")
    return " / ".join(f"{g / gaps[0]:.2f}" for g in gaps[1:])


def day7_warmup_range() -> str:
    """d7/optim.json: warmup.no warmup.*.val_loss over warmup.warmup N steps.*.val_loss, per seed (low-high)."""
    runs = read("d7/optim.json", "warmup")
    without, with_ = (runs[k] for k in runs)
    ratios = sorted(a["val_loss"] / b["val_loss"] for a, b in zip(without, with_))
    return f"{ratios[0]:.2f}–{ratios[-1]:.2f}" if f"{ratios[0]:.2f}" != f"{ratios[-1]:.2f}" else f"{ratios[0]:.2f}"


def day7_linear_rule() -> str:
    """d7/optim.json: scaling_closest (the batch-128 run closest to the batch-32 one, per seed)."""
    closest = read("d7/optim.json", "scaling_closest")
    return "the linear rule matches" if all("linear" in c for c in closest) else "closest: " + " / ".join(closest)


def day9_norm(norm: str, batch: int) -> float:
    """d9/norms.json: runs[norm, batch_size].val_acc."""
    return next(r["val_acc"] for r in read("d9/norms.json", "runs") if r["norm"] == norm and r["batch_size"] == batch)


def day9_norms() -> str:
    names = ("BatchNorm", "GroupNorm", "LayerNorm")
    return "; ".join(f"batch {b}: BN/GN/LN " + "/".join(f"{100 * day9_norm(n, b):.1f}" for n in names) + "%"
                     for b in (2, 128))


def day9_transfer() -> str:
    """d9/transfer.json: last stage + head minus scratch, test accuracy per seed, at the fewest and the most labels."""
    runs = read("d9/transfer.json", "runs")
    parts = []
    for labels in (min(r["labels"] for r in runs), max(r["labels"] for r in runs)):
        def acc(regime):
            return [r["test_acc"] for r in runs if (r["labels"], r["regime"]) == (labels, regime)]

        gains = [100 * (a - b) for a, b in zip(acc("last stage + head"), acc("scratch"))]
        parts.append(f"{labels:,} labels " + " / ".join(f"{g:+.1f}" for g in gains))
    return "; ".join(parts)


def day10_cut(kind: str) -> float:
    """d10/summary.json: 1 - <kind>["fp32 + checkpoint"] / <kind>["fp32"] at the largest batch measured."""
    values = read("d10/summary.json", kind)
    return 1 - values["fp32 + checkpoint"][-1] / values["fp32"][-1]


def day10_linear() -> float:
    """d10/summary.json: saved_bytes.fp32, the ratio of consecutive batches (each twice the one before)."""
    saved = read("d10/summary.json", "saved_bytes.fp32")
    return max((b / a for a, b in zip(saved, saved[1:])), key=lambda r: abs(r - 2))


def day10_step_ratio(path: str, mode: str) -> float:
    """<path>: step_seconds[mode] / step_seconds.fp32 (one run)."""
    steps = read(path, "step_seconds")
    return steps[mode] / steps["fp32"]


def memcalc_matches() -> str:
    """d10/memcalc_examples.md: rows whose `matches` column says yes, of all figure rows."""
    rows = [line for line in results_file("d10/memcalc_examples.md").read_text().splitlines()
            if line.startswith("|") and not line.startswith(("| example", "|---"))]
    yes = sum(line.rstrip(" |").endswith("yes") for line in rows)
    return f"{yes}/{len(rows)}"


def memcalc_calls() -> int:
    """d10/memcalc_examples.md: the rows that start a CLI call (the others continue the one above)."""
    return sum(line.startswith("| ") and not line.startswith(("| example", "|  |"))
               for line in results_file("d10/memcalc_examples.md").read_text().splitlines())


MODES10 = ("fp32", "fp32 + checkpoint", "bf16 autocast")  # Day 10's three ways to run a step


def day11_stage(name: str, field: str):
    """d11/summary.json: stages[0] (naive) or stages[-1] (optimised), one field."""
    stages = read("d11/summary.json", "stages")
    return (stages[0] if name == "naive" else stages[-1])[field]


def day12_fsdp_share(ranks: int) -> float:
    """d12/zero.json: FSDP2's parameter + gradient + AdamW bytes per rank over DDP's, at `ranks` ranks."""
    state = {(r["strategy"], r["ranks"]): r["state"] for r in read("d12/zero.json")["rows"]}
    return state["fsdp", ranks] / state["ddp", ranks]


def day12_nanogpt() -> tuple[float, float]:
    """d12/nanogpt.json: (the template's tokens/s over nanoGPT's, the tuned run's time to nanoGPT's final val loss over
    nanoGPT's own)."""
    runs = read("d12/nanogpt.json")["runs"]
    nano, tuned = runs["nanogpt"], runs["template, tuned"]
    target = nano["val_loss_by_step"][str(nano["steps"])]

    def time_to(run):
        return min(run["time_to_eval_s"][s] for s, v in run["val_loss_by_step"].items() if v <= target)

    return runs["template"]["tokens_per_s"] / nano["tokens_per_s"], time_to(tuned) / time_to(nano)


def day12_config(name: str, field: str):
    """d12/summary.json: the row of config `name`, one field."""
    return next(r[field] for r in read("d12/summary.json") if r["config"] == name)


def machines() -> str:
    """Every results JSON's `machine` field, reduced to the CPU model and core count, the distinct ones."""
    found = set()
    for day in DAYS.values():
        for path in sorted((ROOT / day / "results").rglob("*.json")):
            data = load_path(path, path.stat().st_mtime)
            if isinstance(data, dict) and isinstance(data.get("machine"), str):
                found.add(re.split(r" \(|, (?=\d+ (?:logical )?cores)", data["machine"])[0])
    return "; ".join(sorted(found))


def day7_saved_ratio(precision: str = "bf16") -> float:
    """d7/summary.json: table[amp=precision].saved_bytes / table[amp=off].saved_bytes."""
    rows = {r["amp"]: r for r in read("d7/summary.json", "table")}
    return rows[precision]["saved_bytes"] / rows["off"]["saved_bytes"]


def day10_lora_share() -> float:
    """d10/levers.json: lora.state_bytes / full.state_bytes (the optimizer state LoRA keeps)."""
    return read("d10/levers.json", "lora.state_bytes") / read("d10/levers.json", "full.state_bytes")


def day9_forgotten_eval() -> float:
    """d9/norms.json: forgotten_eval.clean - forgotten_eval.after_sorted, in points."""
    return 100 * (read("d9/norms.json", "forgotten_eval.clean") - read("d9/norms.json", "forgotten_eval.after_sorted"))


def day11_compiled_ratio() -> float:
    """d11/compile.json: compile.steady_step_s.compiled / compile.steady_step_s.eager."""
    return read("d11/compile.json", "compile.steady_step_s.compiled") / read("d11/compile.json",
                                                                           "compile.steady_step_s.eager")


def memtable(scenario: str, column: str = "total") -> str:
    """d10/memory_table_12gb.md: the cell of `column` in the row whose scenario starts with `scenario`."""
    lines = [line.strip("|").split("|") for line in results_file("d10/memory_table_12gb.md").read_text().splitlines()
             if line.startswith("|")]
    header = [h.strip() for h in lines[0]]
    rows = [[c.strip().strip("*") for c in line] for line in lines[2:] if line[0].strip().startswith(scenario)]
    if len(rows) != 1:
        raise FigureError(f"d10/memory_table_12gb.md: {len(rows)} rows start with {scenario!r}")
    return rows[0][header.index(column)]


def mib(path: str, mode: str, i: int = -1) -> float:
    return read("d10/summary.json", path)[mode][i] / 2**20


def day7_step(precision: str, ref: str = "d7/summary.json") -> float:
    """<ref>: table[amp=precision].step_ms / table[amp=off].step_ms (one run)."""
    rows = {r["amp"]: r for r in read(ref, "table")}
    return rows[precision]["step_ms"] / rows["off"]["step_ms"]


# --- the root README --------------------------------------------------------------------------------------------------

def link(day: int) -> str:
    return f"[`{DAYS[day]}`]({DAYS[day]}/)"


def days_table() -> str:
    """README.md: the twelve-day table. Columns 2-5 are prose; the last one is measured."""
    rows = [
        [1, 'environment report, "why is CUDA unavailable" diagnosis (`diagnose_cuda.py`), tensor lessons',
         "`torch.cuda`, dtype/device/shape, broadcasting, `view`/`reshape`/`permute`/`contiguous`",
         "`(N,)` vs `(N,1)` trap reproduced and caught; view/reshape/permute storage facts; diagnosis names the right "
         "step, checked against an independent driver probe",
         "this machine: {calc:day1_machine}; the trap gives `{d1/report.json:lessons.broadcasting.trap_shape|shape}` "
         "at N = {d1/report.json:lessons.broadcasting.trap_shape|first}"],
        [2, "six hand-derived gradients vs autograd, graph lifetime, a custom `autograd.Function`",
         "`backward`, `.grad`, `retain_graph`, `detach`, `no_grad`, `gradcheck`",
         "hand gradient of `(w*x+b)**2` equals `w.grad` exactly; gradcheck passes the right backward and rejects the "
         "wrong one",
         "hand vs autograd ≤ {d2/summary.json:hand_vs_autograd.*.max_abs_diff|max|.1e} (float64; 0 for "
         "{d2/summary.json:hand_vs_autograd.*.max_abs_diff|zeros} of {d2/summary.json:hand_vs_autograd|len} ops); "
         "`(w*x+b)**2` {d2/summary.json:linear_square_float32.max_abs_diff|exact}"],
        [3, "linear regression with hand-written MSE, SGD and zero-grad",
         "`requires_grad`, `torch.no_grad`, `grad.zero_()`",
         "MSE < 1e-4, \\|w−3\\| and \\|b−2\\| < 0.01, agrees with least squares; a too-large lr stops with one line",
         "MSE {d3/summary.json:mse|.2e}, w = {d3/summary.json:w|.4f}, b = {d3/summary.json:b|.4f}; "
         "stability limit 2/λ_max = {d3/summary.json:lr_limit|.3f}"],
        [4, "an MLP on MNIST, recipe tuned on validation; init/activation lab",
         "`nn.Module`, `CrossEntropyLoss`, `AdamW`, `train()`/`eval()`",
         "test accuracy > 98.0% (G0) on seeds 0 and 1, test set evaluated once",
         "**{d4/summary.json:test_acc|.2%}** / {d4/bench.json:rows.1.main.test_acc|.2%}, "
         "{d4/summary.json:params|/1000|.0f}k params, {d4/summary.json:config.epochs} epochs; final accuracy at "
         "{d4/bench.json:median_ratio.1|.2f}× the plain reference's time to its first pass above 98% (median)"],
        [5, "a `Dataset`, augmentation in workers, worker-scaling table",
         "`Dataset`, `DataLoader`, `collate_fn`, transforms v2",
         "each sample once per epoch, seeded augmentations, padding collate, timing table",
         "training epoch {d5/timing.json:rows.*.train_epoch_s|each:.1f|join: / } s at "
         "{d5/timing.json:rows.*.num_workers|join: / } workers ({d5/timing.json:cpu_count} cores)"],
        [6, "validation, atomic checkpoints, exact resume, overfitting measured",
         "`state_dict`, `os.replace`, RNG state, `SummaryWriter`, early stopping",
         "SIGKILL + resume is bitwise equal to an uninterrupted run; a kill between `last.pt` and `best.pt`, a full "
         "disk and changed flags are handled",
         "{d6/summary.json:chains.*.kill_at|each:len|sum} SIGKILLs (workers "
         "{d6/summary.json:chains.*.workers|join: and }): {d6/summary.json:chains.*.comparison.loss_mismatches|sum} "
         "steps differ, {calc:day6_state}; overfit lab: early stop after epoch "
         "{d6/overfit.json:early_stop.stopped_after_epoch}, gap ×{calc:day6_gap_ratios} (Dropout / weight decay / "
         "augmentation)"],
        [7, "mixed precision, gradient accumulation, schedules and clipping",
         "`autocast`, `GradScaler`, `clip_grad_norm_`, warmup + cosine",
         "accumulation = big batch; scaler skips inf steps; fp16 overflow/underflow; warmup, clipping order and LR "
         "scaling measured",
         "bf16 stores {calc:day7_saved_ratio|.2f}× the bytes saved for backward; fp16 without loss scaling zeroes "
         "{d7/summary.json:ranges.zero_fraction_fp16_unscaled|.0%} of tiny gradients; no warmup at LR 0.03: val loss "
         "×{calc:day7_warmup_range}; clip before `unscale_`: SGD "
         "{d7/optim.json:clip_order.sgd.clip, then unscale.val_loss|.2f} vs "
         "{d7/optim.json:clip_order.sgd.unscale, then clip.val_loss|.2f}"],
        [8, "a scalar and a NumPy tensor autograd engine",
         "topological sort, chain rule, gradient accumulation",
         "gradients match `torch.autograd` element-wise (rtol 1e-9, atol 1e-12), also after `backward()` twice; XOR "
         "and MNIST (≥ 97%) train",
         "XOR loss {d8/summary.json:xor_final_loss|.4f}; MNIST {d8/summary.json:mnist.test_acc|.2%}; scalar demo "
         "{d8/bench.json:scalar.speedup.numpy.default|.1f}× as fast as micrograd 0.1.0; Tensor engine step "
         "{d8/bench.json:tensor.ratio|.2f}× torch's time"],
        [9, "a small ResNet vs the Day 4 MLP; normalisation lab",
         "`Conv2d`, `BatchNorm2d`, residuals, `load_state_dict(strict=False)`",
         "ResNet ≥ 99.0% with the schedule chosen on validation; beats the MLP with fewer or comparable parameters",
         "**{d9/summary.json:resnet.test_acc|.2%}** with {d9/summary.json:resnet.params|/1000|.0f}k params vs the "
         "MLP's {d9/summary.json:mlp.test_acc|.2%} with {d9/summary.json:mlp.params|/1000|.0f}k; at batch 2 BatchNorm "
         "gets {calc:day9_bn_b2|.0%} vs LayerNorm {calc:day9_ln_b2|.0%}"],
        [10, "activation memory and true peak vs batch, checkpointing, bf16; memory calculator; freezing/LoRA lab",
         "`torch.utils.checkpoint`, `saved_tensors_hooks`, `TorchDispatchMode` peak counter, `max_memory_allocated`",
         "linear in batch; checkpointing cuts the true peak 60–80%; every calculator worked example from the CLI",
         "true peak −{calc:day10_peak_cut|.1%} (saved bytes −{calc:day10_saved_cut|.0%}); largest batch in "
         "{d10/summary.json:budget_bytes|/1048576|.0f} MiB {d10/summary.json:largest_batch.true peak.fp32} → "
         "{d10/summary.json:largest_batch.true peak.fp32 + checkpoint}; {calc:memcalc_matches} calculator figures; "
         "LoRA keeps {calc:day10_lora_share|.1%} of the optimizer state"],
        [11, "find and fix the bottleneck one change at a time, at equal accuracy; `torch.compile`",
         "`torch.profiler`, `record_function`, data/step timing, `torch.compile`",
         "≥ 3× faster per epoch within 0.2 points of the naive accuracy",
         "data/step {calc:day11_ratio_naive|.0%} → {calc:day11_ratio_opt|.1%}; epoch "
         "{calc:day11_epoch_naive|.1f} s → {calc:day11_epoch_opt|.1f} s ({calc:day11_speedup|.1f}×); test accuracy "
         "{calc:day11_acc_naive|.2%} → {calc:day11_acc_opt|.2%}"],
        [12, "the reusable training template: `train.py` + task/config/data/models/checkpoint/distributed modules; "
         "image classifiers and a GPT (KV-cache sampling), 8 configs",
         "TOML dataclass config + `--set`, `torchrun` DDP / FSDP2 (`fully_shard`, `MixedPrecisionPolicy`), atomic and "
         "sharded (`torch.distributed.checkpoint`) checkpoints, `GradScaler`, `scaled_dot_product_attention`, "
         "`torch.profiler`",
         "MNIST config > 98%; SIGKILL/SIGTERM + resume bitwise for both tasks; DDP 2×B = 1×2B; FSDP2 = DDP; a killed "
         "worker restarted by torchrun (2 nodes on loopback) bitwise; no orphan after `kill -9` on torchrun; one "
         "writer per run folder; bad config → exit 2, nothing written",
         "MNIST config {calc:day12_mnist_acc|.2%}; the GPT {calc:day12_gpt_val|.3f} nats/char on held-out works; "
         "nanoGPT's final loss in {calc:day12_nanogpt_time|.2f}× its time; loop overhead "
         "{d12/bench.json:overhead.wall.overhead|+.1%}; FSDP2 state per rank at 4 ranks "
         "{calc:day12_fsdp4_share|.3f} of DDP's"],
    ]
    return table(["day", "folder", "deliverable", "key APIs", "gate", "measured"],
                 [[str(day), link(day), *cells] for day, *cells in rows])


def results_table() -> str:
    """README.md: "Measured results", one row per benchmark command."""
    rows = [
        ["MLP test accuracy (G0 gate > 98%)", "`python day04_mlp_mnist/main.py`",
         "{d4/summary.json:test_acc|.2%} after {d4/summary.json:config.epochs} epochs (seed 0), test set evaluated "
         "once"],
        ["main job vs a plain reference MLP, both timed from launch", "`python day04_mlp_mnist/bench.py`",
         "{d4/bench.json:rows.*.ratios.1|each:.2f|join:× / }× the reference's time to its first pass above 98% "
         "(seeds {d4/bench.json:config.seeds|join: / })"],
        ["initialisation and activations", "`python day04_mlp_mnist/init_lab.py`",
         "He + ReLU: layer 30 at {d4/init_lab.json:stds.relu.He|last|.3g} vs layer 1's "
         "{d4/init_lab.json:stds.relu.He|first|.3g} std (too small an init: ×{calc:day4_small_init|.1e}); dead "
         "ReLU units after Adam at LR 3e-2: "
         "{d4/init_lab.json:dead.1.dead|.1%} (GELU {d4/init_lab.json:dead.2.dead|.1%}, SiLU "
         "{d4/init_lab.json:dead.3.dead|.1%}); SwiGLU with hidden 8d/3 has "
         "{d4/init_lab.json:ffn.0.swiglu_8d_3|,} parameters at d = {d4/init_lab.json:ffn.0.d}, like the 4d GELU MLP"],
        ["worker scaling, one augmented epoch", "`python day05_dataloader/main.py`",
         "{d5/timing.json:rows.*.num_workers|join: / } workers: "
         "{d5/timing.json:rows.*.train_epoch_s|each:.1f|join: / } s training, "
         "{d5/timing.json:rows.*.data_epoch_s|each:.1f|join: / } s data only"],
        ["exact resume after SIGKILL", "`python day06_ckpt_resume/prove_resume.py`",
         "{d6/summary.json:chains.*.kill_at|each:len|join: + } kills ({d6/summary.json:chains.*.workers|join: and } "
         "workers), {d6/summary.json:chains.*.comparison.loss_mismatches|sum} steps differ (`float.hex`), "
         "{calc:day6_state}"],
        ["overfitting, early stopping, `best.pt`", "`python day06_ckpt_resume/overfit_lab.py`",
         "{d6/overfit.json:config.subset} images: "
         "{d6/overfit.json:curves.no regularisation.train_acc|last|.0%} train accuracy, val loss "
         "{d6/overfit.json:curves.no regularisation.val_loss|min|.3f} (epoch "
         "{d6/overfit.json:curves.no regularisation.best_epoch}) → "
         "{d6/overfit.json:curves.no regularisation.val_loss|last|.3f} (epoch {d6/overfit.json:config.epochs}); "
         "early stop after epoch {d6/overfit.json:early_stop.stopped_after_epoch}; gap ×{calc:day6_gap_ratios} "
         "(Dropout / weight decay / augmentation)"],
        ["fp32 / fp16 / bf16: one step, bytes saved for backward", "`python day07_amp_accum/main.py`",
         "{d7/summary.json:table.*.step_ms|each:.2f|join: / } ms; "
         "{d7/summary.json:table.*.saved_bytes|each:/1024|each:.0f|join: / } KiB; capped at AVX2: "
         "{d7/avx2/summary.json:table.*.step_ms|each:.2f|join: / } ms"],
        ["warmup, clipping order, LR scaling", "`python day07_amp_accum/optim_lab.py`",
         "no warmup at LR 0.03: val loss ×{calc:day7_warmup_range}; clip before `unscale_`: SGD "
         "{d7/optim.json:clip_order.sgd.clip, then unscale.val_loss|.2f} vs "
         "{d7/optim.json:clip_order.sgd.unscale, then clip.val_loss|.2f}, AdamW "
         "{d7/optim.json:clip_order.adamw.clip, then unscale.val_loss|.3f} vs "
         "{d7/optim.json:clip_order.adamw.unscale, then clip.val_loss|.3f}; batch ×4: {calc:day7_linear_rule}"],
        ["mini-autograd: scalar engine vs micrograd 0.1.0, Tensor engine vs torch",
         "`python day08_mini_autograd/bench.py`",
         "{d8/bench.json:scalar.speedup.numpy.default|.1f}× as fast as micrograd on its own demo "
         "({d8/bench.json:scalar.speedup.numpy.paused|.1f}× with the collector paused in both); Tensor engine step "
         "{d8/bench.json:tensor.engine_ms|.2f} ms vs torch {d8/bench.json:tensor.torch_ms|.2f} ms"],
        ["ResNet vs MLP", "`python day09_cnn/main.py`",
         "{d9/summary.json:resnet.test_acc|.2%} ({d9/summary.json:resnet.params|,} params, "
         "{d9/summary.json:resnet.epochs} epochs, {d9/summary.json:resnet.config.schedule} LR "
         "{d9/summary.json:resnet.config.lr} chosen on {d9/summary.json:resnet.n_val|,} validation images) vs "
         "{d9/summary.json:mlp.test_acc|.2%} ({d9/summary.json:mlp.params|,} params)"],
        ["normalisation at batch 2 and 128, forgotten `eval()`", "`python day09_cnn/norms_lab.py`",
         "{calc:day9_norms}; forgotten `eval()` costs "
         "{calc:day9_forgotten_eval|.1f} points"],
        ["transfer learning: MNIST ResNet → Fashion-MNIST", "`python day09_cnn/transfer_lab.py`",
         "last stage + head vs scratch, test accuracy points per seed: {calc:day9_transfer}"],
        ["activation memory, checkpointing", "`python day10_bigbatch_ckpt/main.py`",
         "linear in batch (ratio {calc:day10_linear|.3f}); checkpointing −{calc:day10_saved_cut|.0%} saved bytes, "
         "−{calc:day10_peak_cut|.1%} true peak, ×{calc:day10_ckpt_time|.2f} step time"],
        ["freezing, LoRA from scratch", "`python day10_bigbatch_ckpt/levers_lab.py`",
         "LoRA r={d10/levers.json:config.rank} trains {d10/levers.json:lora.trainable|,} of "
         "{d10/levers.json:full.trainable|,} parameters ({calc:day10_lora_share|.1%} of the optimizer state); merged "
         "weights match the adapter to {d10/levers.json:merged_max_diff|.1e}; torchao's AdamW8bit holds "
         "{d10/levers.json:adamw8bit.state_bytes|,} bytes of state to AdamW's {d10/levers.json:full.state_bytes|,}"],
        ["profile → fix → re-measure", "`python day11_profile/main.py`",
         "data/step {calc:day11_ratio_naive|.0%} → {calc:day11_ratio_opt|.1%}; epoch {calc:day11_epoch_naive|.1f} s → "
         "{calc:day11_epoch_opt|.1f} s ({calc:day11_speedup|.1f}×) at {calc:day11_acc_opt|.2%} vs "
         "{calc:day11_acc_naive|.2%} test accuracy"],
        ["`torch.compile` on a CPU", "`python day11_profile/compile_lab.py`",
         "first compiled step {d11/compile.json:compile.first_step_s.compiled, cold|.1f} s (from the cache "
         "{d11/compile.json:compile.first_step_s.compiled, warm|.2f} s), then "
         "{calc:day11_compiled_ratio|.2f}× the eager step time"],
        ["the template on every shipped config", "`python day12_template/main.py`",
         "MNIST + MLP {calc:day12_mnist_acc|.2%} test accuracy after {calc:day12_mnist_epochs} epochs; the other "
         "configs capped at {calc:day12_cap} steps"],
        ["the template's GPT against nanoGPT's `train.py`", "`python day12_template/nanogpt_bench.py`",
         "same files and model: tokens/s {calc:day12_nanogpt_speed|.2f}× nanoGPT's; val loss "
         "{d12/nanogpt.json:runs.template.val_loss_by_step.2000|.3f} vs {d12/nanogpt.json:runs.nanogpt.val_loss_by_step.2000|.3f} "
         "at 2,000 steps; nanoGPT's final loss in {calc:day12_nanogpt_time|.2f}× its time (tuned recipe)"],
        ["Muon against AdamW on the GPT", "`python day12_template/muon_lab.py`",
         "test loss after 240 steps {d12/muon.json:seeds.*.muon_at_steps|each:.3f|join: / } vs AdamW's "
         "{d12/muon.json:seeds.*.adamw_at_steps|each:.3f|join: / } (seeds 0 / 1); at equal time "
         "{d12/muon.json:seeds.*.muon_at_time|each:.3f|join: / } vs "
         "{d12/muon.json:seeds.*.adamw_at_time|each:.3f|join: / }"],
        ["the engineering chapter's drills on the GPT", "`python day12_template/drills_lab.py`",
         "lr 1e-2: val loss {d12/drills.json:high_lr.val_loss|.3f} after {d12/drills.json:high_lr.steps_done} steps "
         "(the config's lr: {d12/drills.json:high_lr.config_lr_val_loss|.3f}); a resume without the optimizer state: "
         "up to {d12/drills.json:resume.resumed-model-only.max_gap|+.3f} nats over the next 50 steps"],
        ["template loop overhead, DDP scaling", "`python day12_template/bench.py`",
         "overhead against a bare loop {d12/bench.json:overhead.wall.overhead|+.1%} (wall), "
         "{d12/bench.json:overhead.cpu.overhead|+.1%} (CPU time); DDP 2 ranks "
         "{d12/bench.json:scale_out.DDP: 2 ranks x 1 thread.vs_1_process_1_thread|.2f}× one process"],
        ["every gate", "`pytest`, or `python scripts/report.py`",
         "each gate's measured figure against its threshold, PASS/FAIL (`REPORT.md`)"],
    ]
    return table(["result", "command", "measured"], rows)


def machine_line() -> str:
    """README.md: the machines the results files name."""
    return fill("Measured on {calc:machines} (as each results file records it, with its thread count); timing "
                "claims are ratios measured within one run.")


def cpu_bf16() -> str:
    """README.md: what native bf16 is worth, from Day 7's matmul column on this CPU and capped at AVX2."""
    return fill(
        "- Reduced precision needs hardware support. On a CPU with AMX-BF16/AVX512-BF16 (the one the results were "
        "measured on) a bf16 256³ matmul runs at {d7/summary.json:table.2.matmul_gflops|.1f} GFLOP/s against "
        "{d7/summary.json:table.0.matmul_gflops|.1f} in fp32; capped at AVX2 "
        "(`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`, i.e. most laptops without native bf16) the same matmul "
        "runs at {d7/avx2/summary.json:table.2.matmul_gflops|.1f} against "
        "{d7/avx2/summary.json:table.0.matmul_gflops|.1f} GFLOP/s, {calc:day7_avx2_slowdown|.0f}× slower than fp32 "
        "(`python day07_amp_accum/main.py`, both settings). GPUs get it from tensor cores.")


def memcalc_intro() -> str:
    """README.md: the sentence before the 12 GB table."""
    return fill(
        "The memory-budget calculator (`python day10_bigbatch_ckpt/memcalc.py examples`) reproduces every worked "
        "example of the curriculum's memory section ({calc:memcalc_matches} figures match, from "
        "{calc:memcalc_calls} CLI calls). Its 12 GB table (`python day10_bigbatch_ckpt/memcalc.py table`; "
        "1 GB = 1e9 bytes, bf16 autocast + AdamW, s = 512, a fixed 0.8 GB plus activations × 1.3; "
        "`python day10_bigbatch_ckpt/main.py` writes both to `results/`):")


# --- the day READMEs' figures (their tables are included from results/ verbatim) ---------------------------------

def bullets(*templates: str) -> str:
    return "\n".join(fill(t) for t in templates)


def day01_environment() -> str:
    return fill(
        "Environment: Python {d1/report.json:environment.python}, torch {d1/report.json:environment.torch}, "
        "torchvision {d1/report.json:environment.torchvision}, `cuda_build` (`torch.version.cuda`) "
        "{d1/report.json:environment.cuda_build}, `cuda_available` {d1/report.json:environment.cuda_available}, device "
        "`{d1/report.json:environment.device}`, {d1/report.json:environment.cpu_model}, "
        "{d1/report.json:environment.cpu_count} cores, MPS {d1/report.json:environment.mps_available|yesno}.")


def day04_results() -> str:
    return fill(
        "`python day04_mlp_mnist/main.py --out day04_mlp_mnist/results` (seed 0; "
        "[`results/summary.json`](results/summary.json), [`results/metrics.jsonl`](results/metrics.jsonl)): "
        "{d4/summary.json:params|,} parameters, {d4/summary.json:n_train|,} training / {d4/summary.json:n_val|,} "
        "validation images, validation accuracy {d4/metrics.jsonl:*.val_acc|each:.2%|join: → } over the "
        "{d4/summary.json:config.epochs} epochs, then **test accuracy {d4/summary.json:test_acc|.2%}**, evaluated "
        "once. Seed 1 (a row of the benchmark below): {d4/bench.json:rows.1.main.test_acc|.2%}.")


def day06_resume() -> str:
    """Day 6 README: d6/summary.json chains.*.kill_at, .segments[1:].resumed_from, .comparison (steps_computed,
    loss/sample mismatches, final_log_equal, state_diffs), reference_test (best_val, test_acc)."""
    chains = read("d6/summary.json", "chains")
    kills = "; ".join(f"the num_workers={c['workers']} run after steps " + ", ".join(map(str, c["kill_at"]))
                      for c in chains.values())
    resumed = "; ".join(", ".join(str(s["resumed_from"]) for s in c["segments"][1:]) for c in chains.values())
    computed = [c["comparison"]["steps_computed"] for c in chains.values()]
    return fill(
        f"From `results/summary.json`: SIGKILLed {kills}. After each kill it resumed from `last.pt`, at steps "
        f"{resumed}. Across the two chains, {sum(computed):,} steps were computed "
        f"({' and '.join(f'{c:,}' for c in computed)}), including those redone after a kill. "
        "Steps whose loss differs from the uninterrupted run's (`float.hex`): "
        "**{d6/summary.json:chains.*.comparison.loss_mismatches|sum}**; whose sample indices differ: "
        "**{d6/summary.json:chains.*.comparison.sample_mismatches|sum}**; final `metrics.jsonl` identical: "
        "{d6/summary.json:chains.*.comparison.final_log_equal|each:yesno|join: / }; "
        "{calc:day6_state} (model, optimizer, scheduler, sampler, RNG states, counters). Uninterrupted run: best "
        "validation loss {d6/summary.json:reference_test.best_val|.4f}, test accuracy of `best.pt` "
        "**{d6/summary.json:reference_test.test_acc|.2%}**.")


def day06_optimizer() -> str:
    return fill(
        "Resumed at step {d6/summary.json:model_only.at_step} from the same checkpoint, once with everything and once "
        "with the model weights only (fresh AdamW, LR schedule kept). Over the next "
        "{d6/summary.json:model_only.full_losses|len} steps the loss moves by at most "
        "**{d6/summary.json:model_only.full_max_abs_diff|.3g}** with the full state and by up to "
        "**{d6/summary.json:model_only.model_only_max_abs_diff|.3g}** with the weights only. AdamW's moments and step "
        "count (bias correction) are part of the trajectory (`results/optimizer_state.md`):")


def day06_overfit() -> str:
    nr = "d6/overfit.json:curves.no regularisation"
    return bullets(
        "- **Memorised, and getting worse on new data.** Without regularisation the {d6/overfit.json:config.subset} "
        "images are learnt to {" + nr + ".train_acc|last|.0%} while the validation loss bottoms out at epoch "
        "{" + nr + ".best_epoch} ({" + nr + ".val_loss|min|.3f}) and ends at {" + nr + ".val_loss|last|.3f} by epoch "
        "{d6/overfit.json:config.epochs}: the model grows more confident on the validation images it gets wrong.",
        "- **Early stopping** (patience {d6/overfit.json:early_stop.patience}) on the same run stopped after epoch "
        "{d6/overfit.json:early_stop.stopped_after_epoch}, and its `best.pt`, loaded back from disk, holds step "
        "{d6/overfit.json:early_stop.best_pt_step} (the step of the lowest validation loss: "
        "{d6/overfit.json:early_stop.step_of_best_epoch}); its weights give the logged minimum validation loss again "
        "({d6/overfit.json:early_stop.best_pt_val_loss|.6f}).",
        "- **Each regulariser, one change at a time,** changes the gap: Dropout, AdamW weight decay, and random shifts "
        "and rotations (one `torchvision.transforms.v2.RandomAffine` per batch) leave ×{calc:day6_gap_ratios} of the "
        "unregularised gap.")


def day07_training() -> str:
    return fill(
        "`results/summary.json` records the run's wall time ({d7/summary.json:wall_s|.0f} s, on the CPU that "
        "`results/precision.md` names) and, under `training`, what the bf16 run reached: a best validation loss "
        "of {d7/summary.json:training.best_val|.4f} and a test accuracy of **{d7/summary.json:training.test_acc|.2%}** "
        "in {d7/summary.json:training.step} steps.")


def day07_precision() -> str:
    t, a = "d7/summary.json:table", "d7/avx2/summary.json:table"
    return bullets(
        "- **Memory.** bf16 and fp16 store {calc:day7_saved_ratio|.2f}× the fp32 bytes saved for backward. The saved "
        "activations of the linear layers, LayerNorm input, GELU and Dropout become 2-byte tensors. What stays fp32 "
        "(LayerNorm statistics, the logits for the fp32 cross-entropy) plus the small bf16 copy of `fc2.weight` keeps "
        "it just above one half. Parameters, gradients and AdamW state are **identical** "
        "({" + t + ".*.state_bytes|each:/1024|each:.0f|join: / } KiB): autocast does not save parameter or optimizer "
        "memory.",
        "- **Speed depends on hardware, not on the dtype.** With native AMX-BF16 a bf16 matmul runs at "
        "{" + t + ".2.matmul_gflops|.1f} against {" + t + ".0.matmul_gflops|.1f} GFLOP/s in fp32, but the MLP step "
        "barely follows (×{calc:day7_step_bf16|.2f} in bf16, ×{calc:day7_step_fp16|.2f} in fp16): its layers are small "
        "and autocast adds a cast of every weight on every forward. Limit the same CPU to AVX2 and a bf16 matmul runs "
        "at {" + a + ".2.matmul_gflops|.1f} GFLOP/s (×{calc:day7_avx2_slowdown|.0f} slower than fp32 in the same run), "
        "and a step takes ×{calc:day7_step_bf16_avx2|.2f} (bf16) and ×{calc:day7_step_fp16_avx2|.2f} (fp16) the fp32 "
        "time. The speed-up needs tensor cores on a GPU, or AMX/AVX512-BF16 on a CPU. On a GPU, expect the CUDA peak "
        "column to drop too, by less than the saved-bytes column, because parameters, gradients and optimizer state "
        "do not shrink.",
        "- **Range** (second table in `results/precision.md`). 70,000 through an fp16 autocast matmul is "
        "`{d7/summary.json:ranges.fp16_70000}`; bf16 gives {d7/summary.json:ranges.bf16_70000|,.0f} (no overflow). "
        "Weight gradients of 2⁻²⁸ per output are **{d7/summary.json:ranges.zero_fraction_fp16_unscaled|.0%}** zeros "
        "in fp16 without loss scaling and **{d7/summary.json:ranges.zero_fraction_fp16_scaled|.0%}** with a "
        "GradScaler at 2¹⁶. After unscaling they are within {d7/summary.json:ranges.rel_error_fp16_scaled|.1e} "
        "(relative) of fp32.")


def day07_optim() -> str:
    o = "d7/optim.json:clip_order"
    return bullets(
        "- **Warmup + cosine** is Day 6's `warmup_cosine` (`LambdaLR`); `check.py` compares its LR at each of the "
        "{d7/optim.json:schedule_lr|len} steps with the formula (linear from 1/W to 1 over W steps, then 0.05 + 0.95 · "
        "½(1 + cos(π · progress))) to within 1e-12.",
        "- **Warmup at a high LR** ({d7/optim.json:config.high_lr}): without it the validation loss ends "
        "×{calc:day7_warmup_range} the warmed-up run's (seeds {d7/optim.json:config.seeds|join:, }). Adam's first "
        "updates move every weight by about the full LR whatever its gradient, before the second-moment estimates mean "
        "anything; warmup gives them steps to settle.",
        "- **`clip_grad_norm_`** returns the global norm *before* clipping ({d7/optim.json:clip.returned|.1f} here) "
        "and scales all gradients by one factor, so the global norm after it is max_norm and the direction is "
        "unchanged (cosine {d7/optim.json:clip.cosine_before_after|.6f}); gradients already below max_norm are "
        "left alone "
        "({d7/optim.json:clip.small_unchanged|yesno}).",
        "- **Clip after `unscale_`.** Clipping first meets the *scaled* gradients (×2¹⁶): every step is cut to "
        "max_norm, and unscaling then leaves 1/65,536 of it ({" + o + ".sgd.clip, then unscale.post_clip_norm|.3g}). "
        "SGD then ends at validation loss {" + o + ".sgd.clip, then unscale.val_loss|.2f} "
        "({" + o + ".sgd.clip, then unscale.val_acc|.0%} accuracy) against "
        "{" + o + ".sgd.unscale, then clip.val_loss|.2f}. AdamW hides the mistake "
        "({" + o + ".adamw.clip, then unscale.val_loss|.3f} against "
        "{" + o + ".adamw.unscale, then clip.val_loss|.3f}): "
        "dividing by √v cancels any uniform rescale of the gradients — which is exactly why it goes unnoticed until "
        "the optimizer changes.",
        "- **Batch 32 → 128** with the epoch fixed (4× fewer steps), the run closest to batch 32, per seed: "
        "{d7/optim.json:scaling_closest|join:; }. In this short, LR-limited run each AdamW step moves the weights by "
        "about the LR, so 4× fewer steps need about 4× the LR; the square-root rule is the one argued for long, "
        "noise-dominated Adam runs, a regime this one-epoch run does not reach. Formulas are starting points: sweep "
        "LR/3, LR, 3·LR around them.")


def day08_xor() -> str:
    d = "d8/summary.json"
    return table(["question", "experiment", "measured", "gate"], [
        ["—", "correct engine: XOR final MSE", "**{" + d + ":xor_final_loss|.5f}**", "< 0.01"],
        ["(1) `=` instead of `+=`", "d(x·x)/dx at x = {" + d + ":probe_x|.0f}",
         "**{" + d + ":square_grad_overwrite|.0f}** instead of {" + d + ":square_grad_exact|.0f}: the second path "
         "overwrites the first", "gap > 10%"],
        ["", "XOR final MSE", "**{" + d + ":xor_overwrite_final_loss|.3f}**: each weight keeps only its last "
         "contribution", "> 0.1"],
        ["(2) no gradient reset", "XOR final MSE", "**{" + d + ":xor_no_zero_grad_final_loss|.3f}**, never below "
         "{" + d + ":xor_no_zero_grad_min_loss|.3f}: every step replays all past gradients", "> 0.1"],
        ["(3) no topological order", "diamond `y = (u+1)·(2u)`, `u = x·x`, dy/dx at x = {" + d + ":probe_x|.0f}",
         "**{" + d + ":diamond_grad_no_topological|.0f}** instead of {" + d + ":diamond_grad_exact|.0f}: `u` passed "
         "its gradient on before its second consumer added to it", "gap > 10%"],
        ["(4) same net in PyTorch", "worst gradient error vs `torch.autograd`, float64, as a share of its tolerance",
         "**{" + d + ":torch_grad_tolerance_used_init|.1e}** at the start, "
         "**{" + d + ":torch_grad_tolerance_used_trained|.1e}** after training", "≤ 1"],
    ])


def day05_demos() -> str:
    """Day 5 README: d5/demos.json default_collate_error, padded_shape, lengths, max_diff_between_runs / _workers /
    _seeds (training image 0 augmented in 2 workers, seed 0 twice, then seed 1)."""
    d = lambda field: read("d5/demos.json", field)  # noqa: E731
    lengths = d("lengths")
    return "\n".join([
        f"`default_collate` on three byte-encoded sentences of lengths {', '.join(map(str, lengths[:-1]))} and "
        f"{lengths[-1]} (the real message, captured):", "```", d("default_collate_error"), "```",
        f"`pad_collate` returns `padded` of shape {tuple(d('padded_shape'))} and `lengths` {lengths}.", "",
        f"Augmentation of training image 0 in two workers: identical across two runs with seed 0 (max pixel "
        f"difference {d('max_diff_between_runs'):.0f}), different between worker 0 and worker 1 (max pixel difference "
        f"{d('max_diff_between_workers'):.0f}) and between seeds 0 and 1 ({d('max_diff_between_seeds'):.0f})."])


def day08_mnist() -> str:
    """Day 8 README: d8/summary.json mnist.history[*] (epoch, train_loss, test_acc), one row each."""
    rows = read("d8/summary.json", "mnist.history")
    return table(["epoch", "train loss", "test accuracy"],
                 [[str(r["epoch"]), f"{r['train_loss']:.3f}", f"{r['test_acc']:.2%}"] for r in rows])


def day08_bench() -> str:
    """Day 8 README: d8/bench.json scalar.runs[*].gc_share per engine and collector (lowest-highest over the two
    heaps), tracked_objects (this engine's, max), scalar.speedup.numpy.paused and .paused_outside_collector,
    scalar.phases (this engine's step, paused), micrograd's default ms_per_step (NumPy heap),
    scalar.tensor_engine_vs_micrograd_default."""
    runs = read("d8/bench.json", "scalar.runs")
    share = lambda engine, collector: sorted(r["gc_share"] for r in runs  # noqa: E731
                                             if r["engine"] == engine and r["collector"] == collector)
    span = lambda v: f"{v[0]:.0%}" if f"{v[0]:.0%}" == f"{v[-1]:.0%}" else f"{v[0]:.0%}–{v[-1]:.0%}"  # noqa: E731
    objects = max(r["tracked_objects"] for r in runs if r["engine"] == "ours")
    phases = read("d8/bench.json", "scalar.phases")
    ns = lambda phase: 1e6 * phases[f"{phase}_ms"] / phases["nodes"]  # noqa: E731
    total = phases["build_ms"] + phases["backward_ms"] + phases["update_and_free_ms"]
    shipped = next(r["ms_per_step"] for r in runs if (r["engine"], r["collector"], r["heap"]) ==
                   ("micrograd", "default", "numpy"))
    return bullets(
        f"- **micrograd spends {span(share('micrograd', 'default'))} of its time in the garbage collector.** Its "
        "graphs are cycles: every step leaves tens of thousands of nodes (each a dict, a set, a closure and its cells) "
        "that only the collector can free, so the collector runs hundreds of times per step and keeps rescanning "
        "everything that is still alive.",
        "- **This engine's graphs are never garbage for the collector, but the collector still runs.** CPython starts "
        "a pass every 700 net allocations, and a step allocates its whole graph before any of it is freed: the nodes "
        f"are scanned again and again, and a full pass rescans the whole process (with torch imported, {objects:,} "
        f"objects). That is {span(share('ours', 'default'))} of the step with the default settings. Paused during "
        "the step (`engine.collector_paused()`), the collector costs nothing and memory stays flat: reference "
        "counting still frees each graph when the step ends.",
        "- **The same pause helps micrograd too, but cannot make it free.** Paused, micrograd still has to collect "
        f"its cycles once per step ({span(share('micrograd', 'paused per step'))} of its time) and holds the step's "
        "garbage until then.",
        "- **What is left is CPython's cost per node.** Paused, this engine's step is "
        "{d8/bench.json:scalar.speedup.numpy.paused|.1f}× as fast as micrograd's, but half of micrograd's paused step "
        "is still its collector clearing the step's cycles: outside the collector's time the two differ by "
        "{d8/bench.json:scalar.speedup.numpy.paused_outside_collector|.1f}× (one slotted object per node instead of "
        f"an object with a dict, a set and a closure). Building a node costs this engine {ns('build'):.0f} ns and "
        f"sorting one {ns('sort'):.0f} ns, so its {phases['nodes']:,}-node step takes {total:.0f} ms with the "
        f"collector paused, while the goal set for it, 30× micrograd as shipped, would be {shipped / 30:.0f} ms. "
        "Reaching it needs fewer, bigger nodes — which is what the "
        "Tensor engine and PyTorch do: the Tensor engine runs the same demo (the same weights as matrices, the same "
        "losses) {d8/bench.json:scalar.tensor_engine_vs_micrograd_default|,.0f}× faster than micrograd, both at the "
        "default collector, because a step builds a few dozen nodes.")


def day09_seeds() -> str:
    """Day 9 README: d9/seeds.json rows[*] (seed, val_acc, test_acc, test_errors)."""
    rows = read("d9/seeds.json", "rows")
    return "Seeds (`python day09_cnn/bench.py --out day09_cnn/results`, `results/seeds.json`): the chosen recipe, " \
        "each seed scored once on the test set: " + "; ".join(
            f"seed {r['seed']}: validation {r['val_acc']:.2%}, test {r['test_acc']:.2%} ({r['test_errors']} errors)"
            for r in rows) + ". The gate (≥ 99.00%) is on the default seed 0."


def day09_residual() -> str:
    """Day 9 README: d9/summary.json residual.plain[-1] and .residual[-1] (the deepest stack, one value per seed):
    their ranges and the smallest residual/plain ratio."""
    res = read("d9/summary.json", "residual")
    plain, resid = res["plain"][-1], res["residual"][-1]
    ratio = min(r / p for r, p in zip(resid, plain))
    return (
        f"At depth {res['depths'][-1]} the plain stack's first-layer gradient is {min(plain):.1e} to "
        f"{max(plain):.1e} ({len(plain)} seeds): with PyTorch's default init each Linear + ReLU scales the backward "
        "signal by about √(1/6) ≈ 0.41, and 0.41^40 ≈ 3e-16. The identity path adds 1 to every layer's Jacobian, so "
        "the signal cannot vanish — without any normalisation it even grows "
        f"({min(resid):.1e} to {max(resid):.1e} here), which is why real networks pair residual connections with "
        "BatchNorm / LayerNorm and scaled initialisation. Gate: residual / plain ≥ 100 (two orders of magnitude) in "
        f"every one of {len(plain)} seeds; the smallest measured ratio is {ratio:.1e}.")


def day09_norms() -> str:
    n, f = "d9/norms.json", "d9/norms.json:forgotten_eval"
    return bullets(
        "- **Batch statistics need a batch.** BatchNorm gets {calc:day9_bn_b128|.1%} at batch 128 but "
        "{calc:day9_bn_b2|.1%} at batch 2, where GroupNorm gets {calc:day9_gn_b2|.1%} and LayerNorm "
        "{calc:day9_ln_b2|.1%}. "
        "In train mode each feature is normalised over two numbers (the outputs become ±1); the running averages that "
        "eval mode uses are estimated from those noisy pairs. GroupNorm and LayerNorm compute their statistics inside "
        "each sample, so the batch size does not enter them. In a CNN, BatchNorm2d also pools every channel over its "
        "H × W positions, which softens this without removing it (curriculum: \"batch 太小时 batch 统计量噪声大\").",
        "- **Train vs eval mode.** In train mode, swapping sample 0's 31 batch-mates changes its logits by up to "
        "{" + n + ":batch_dependence.sample_change_train|.2f}; in eval mode by "
        "{" + n + ":batch_dependence.sample_change_eval|.3g} (running statistics: deterministic per sample). On one "
        "batch the train-mode and eval-mode logits differ by up to {" + n + ":batch_dependence.train_vs_eval|.2f}.",
        "- **Batch of 1 in train mode** raises PyTorch's own error: `{" + n + ":batch_of_one.train_error}`. Eval mode "
        "and LayerNorm take the single sample. The usual source is the last partial batch of an epoch: "
        "`drop_last=True` on the training loader.",
        "- **A validation pass that forgot `model.eval()`** (under `no_grad`, which does not stop BatchNorm from "
        "updating its running statistics), over batches of 64 sorted by label, as a dataset stored class by class "
        "yields: the loop reports {" + f + ".reported_sorted|.2%} instead of {" + f + ".clean|.2%}, and afterwards the "
        "eval-mode accuracy is {" + f + ".after_sorted|.2%} (−{calc:day9_forgotten_eval|.1f} points) because the "
        "running statistics now describe the last classes seen. Over shuffled batches the damage is smaller "
        "({" + f + ".after_shuffled|.2%}): the bug hides until the data are ordered. An eval-mode pass changes the "
        "running statistics by {" + f + ".eval_pass_stats_change|.3g}.",
        "- **RMSNorm** is LayerNorm without the centring, `x / sqrt(mean(x²) + eps) · weight`; the four-line module in "
        "`norms_lab.py` equals `torch.nn.RMSNorm` (same eps): max difference of outputs and gradients "
        "{" + n + ":rmsnorm_max_diff|.3g}. Its speed is not universal: on {" + n + ":machine} "
        "({" + n + ":rmsnorm_speed.threads} thread, 4096×1024 float32) LayerNorm's fused kernel took "
        "{" + n + ":rmsnorm_speed.ms.LayerNorm|.2f} ms, `torch.nn.RMSNorm` "
        "{" + n + ":rmsnorm_speed.ms.torch.nn.RMSNorm|.2f} ms and the four lines "
        "{" + n + ":rmsnorm_speed.ms.RMSNorm (ours)|.2f} ms. The 10–30% saving the curriculum quotes is for fused GPU "
        "kernels, where both are memory-bound and RMSNorm skips the mean.")


def day10_intro() -> str:
    return fill(
        "`python day10_bigbatch_ckpt/main.py --out day10_bigbatch_ckpt/results` on {d10/summary.json:machine}, torch "
        "{d10/summary.json:torch}; the whole run took {d10/summary.json:wall_s|.1f} s — "
        "[results/memory_vs_batch.md](results/memory_vs_batch.md). Byte counts are exact: they do not depend on the "
        "machine's load or thread count; only the step times do.")


def day10_memory() -> str:
    s = "d10/summary.json"
    return bullets(
        "- **Linear in the batch**: both figures double with the batch (gates: saved and fp32 peak within 2.0 ± 0.1; "
        "measured ratio {calc:day10_linear|.3f}).",
        "- **Checkpointing keeps {calc:day10_saved_cut|.1%} fewer bytes for backward, but cuts the true peak by "
        "{calc:day10_peak_cut|.1%}** (batch {" + s + ":batches|last}). Saved bytes see only what is held between the "
        "passes (each block's input); the peak also holds one block's forward temporaries — "
        "{calc:day10_ckpt_forward_mib|.2f} MiB of the {calc:day10_ckpt_peak_mib|.2f} MiB are reached during the "
        "forward pass, mostly the b·a·s² attention scores — and that block's recomputation in backward. The cut lies "
        "inside the curriculum's \"activations −60–80%\" for lever 2 (gated at batch 16: "
        "{calc:day10_peak_cut_b16|.1%}). Gradients are identical: max |Δ| / (atol + rtol·|ref|) = "
        "{" + s + ":grad_allclose_ratio|.3g}, dropout included (checkpoint replays the RNG state).",
        "- **bf16 autocast**: {calc:day10_bf16_saved_cut|.1%} fewer saved bytes and a {calc:day10_bf16_peak_cut|.1%} "
        "lower peak, not 50%: LayerNorm runs in fp32 under autocast, so the residual stream stays fp32, and the bf16 "
        "copies of the weights count too.",
        "- **Largest batch within a {" + s + ":budget_bytes|/1048576|.0f} MiB budget, by the true peak: "
        "{" + s + ":largest_batch.true peak.fp32} plain, {" + s + ":largest_batch.true peak.fp32 + checkpoint} "
        "checkpointed, {" + s + ":largest_batch.true peak.bf16 autocast} with bf16.** By saved bytes it would be "
        "{" + s + ":largest_batch.saved for backward.fp32}, "
        "{" + s + ":largest_batch.saved for backward.fp32 + checkpoint} and "
        "{" + s + ":largest_batch.saved for backward.bf16 autocast}: for the checkpointed step saved bytes overstate "
        "the batch that fits {calc:day10_overstate|.1f}×. Found from the measured line, then confirmed by measuring b "
        "and b+1.",
        "- **Two witnesses agree**: at batch {" + s + ":batches|last} the profiler's allocation record peaks at "
        "{" + s + ":profiler_peak_bytes.*|each:/1048576|each:.2f|join: / } MiB, the live-allocation counter at "
        "{calc:day10_counter_peaks} MiB (gate: within 1% in every mode at batch 16).")


def day10_timings() -> str:
    """Day 10 README: step_seconds of d10/summary.json and d10/avx2/summary.json: fp32 in ms, the other modes as
    multiples of it (one run each), with each file's `machine`."""
    rows = []
    for path, cpu in (("d10/summary.json", "{d10/summary.json:machine}"),
                      ("d10/avx2/summary.json", "{d10/avx2/summary.json:machine}")):
        steps = read(path, "step_seconds")
        rows.append([fill(cpu), f"{steps['fp32'] * 1e3:.1f} ms", f"×{steps['fp32 + checkpoint'] / steps['fp32']:.2f}",
                     f"×{steps['bf16 autocast'] / steps['fp32']:.2f}"])
    return table(["CPU", "fp32", "checkpointed", "bf16 autocast"], rows, "lrrr")


def day11_intro() -> str:
    return fill(
        "`python day11_profile/main.py --out day11_profile/results` on {d11/summary.json:machine}; the whole run took "
        "{d11/summary.json:wall_s|.0f} s. Full report: [results/report.md](results/report.md).")


def day11_compile() -> str:
    c = "d11/compile.json:compile"
    return bullets(
        "- **Compiling is expensive, once**: the first compiled step took "
        "{" + c + ".first_step_s.compiled, cold|.2f} s with an empty cache (what a fresh machine or CI pays: tracing, "
        "AOTAutograd, C++ code generation and a gcc build), {" + c + ".first_step_s.compiled, warm|.2f} s when the "
        "same graph was read back from inductor's on-disk cache. A compiled step then costs "
        "×{calc:day11_compiled_ratio|.2f} an eager one here: this step is two matmuls that already run in oneDNN, so "
        "there is little for fusion to win on a CPU. Compile pays off where many small element-wise ops or Python "
        "overhead dominate, and on GPUs (fused kernels, CUDA graphs with `mode=\"reduce-overhead\"`).",
        "- **Same numbers**: the first {d11/compile.json:config.check_steps} losses agree to "
        "{" + c + ".max_loss_diff|.1e}.")


# INTERVIEW.md: under each answer, the figures that back it, each with the command that writes its results file.
INTERVIEW = {
    1: [("python day04_mlp_mnist/main.py", "the loop reaches {d4/summary.json:test_acc|.2%} test accuracy (G0: > 98%), "
         "the test set evaluated once, after training"),
        ("python day06_ckpt_resume/prove_resume.py", "{d6/summary.json:chains.*.kill_at|each:len|sum} SIGKILLs, "
         "{d6/summary.json:chains.*.comparison.loss_mismatches|sum} resumed steps whose loss differs, "
         "{calc:day6_state}"),
        ("python day07_amp_accum/main.py", "bf16 autocast, 4 micro-batches of 32 per step: "
         "{d7/summary.json:training.test_acc|.2%} test accuracy after {d7/summary.json:training.step} steps")],
    2: [("python day07_amp_accum/main.py", "parameters + gradients + AdamW state: "
         "{d7/summary.json:table.*.state_bytes|each:/1024|each:.0f|join: / } KiB in fp32 / fp16 / bf16 autocast; "
         "bytes saved for backward: {d7/summary.json:table.*.saved_bytes|each:/1024|each:.0f|join: / } KiB"),
        ("python day10_bigbatch_ckpt/memcalc.py table", "full fine-tune of 1.5B parameters: "
         "{calc:mem_full_1.5B_states} GB of weights, gradients and AdamW state alone")],
    3: [("python day09_cnn/norms_lab.py", "validation accuracy, {calc:day9_norms}"),
        ("python day09_cnn/norms_lab.py", "batch of one in train mode: `{d9/norms.json:batch_of_one.train_error}`"),
        ("python day09_cnn/norms_lab.py", "RMSNorm in four lines vs `torch.nn.RMSNorm`: max difference "
         "{d9/norms.json:rmsnorm_max_diff}")],
    4: [("python day10_bigbatch_ckpt/main.py", "true peak of one fp32 step at batch 16 / 32 / 64: "
         "{calc:day10_peak_b16_64} MiB (the micro-batch sets the peak)"),
        ("python day07_amp_accum/main.py", "bf16, batch 128 as 4 × 32: {d7/summary.json:training.test_acc|.2%} test "
         "accuracy")],
    5: [("python day07_amp_accum/main.py", "weight gradients of 2⁻²⁸ that become 0: fp32 "
         "{d7/summary.json:ranges.zero_fraction_fp32|.0%}, fp16 without scaling "
         "{d7/summary.json:ranges.zero_fraction_fp16_unscaled|.0%}, fp16 with GradScaler "
         "{d7/summary.json:ranges.zero_fraction_fp16_scaled|.0%} (then within "
         "{d7/summary.json:ranges.rel_error_fp16_scaled|.1e} of fp32)"),
        ("python day07_amp_accum/main.py", "70,000 through a matmul: fp16 {d7/summary.json:ranges.fp16_70000}, bf16 "
         "{d7/summary.json:ranges.bf16_70000|,.0f}")],
    6: [("python day06_ckpt_resume/overfit_lab.py", "{d6/overfit.json:config.subset} images, no regularisation: "
         "{d6/overfit.json:curves.no regularisation.train_acc|last|.0%} training accuracy; validation loss lowest at "
         "epoch {d6/overfit.json:curves.no regularisation.best_epoch} "
         "({d6/overfit.json:curves.no regularisation.val_loss|min|.3f}), "
         "{d6/overfit.json:curves.no regularisation.val_loss|last|.3f} at epoch {d6/overfit.json:config.epochs}"),
        ("python day06_ckpt_resume/overfit_lab.py", "early stopping after epoch "
         "{d6/overfit.json:early_stop.stopped_after_epoch}; `best.pt` holds step "
         "{d6/overfit.json:early_stop.best_pt_step}; "
         "gap with Dropout / weight decay / augmentation: ×{calc:day6_gap_ratios} of the unregularised gap")],
    7: [("python day01_env_and_tensors/main.py", "`a = arange(24).reshape(4,6)`: stride "
         "`{d1/report.json:lessons.views.a.stride|shape}`; `a.t()`: stride "
         "`{d1/report.json:lessons.views.transpose.stride|shape}`, contiguous "
         "{d1/report.json:lessons.views.transpose.contiguous|yesno}, shares storage "
         "{d1/report.json:lessons.views.transpose_shares|yesno}; `a.t().reshape(24)` shares storage "
         "{d1/report.json:lessons.views.transpose_reshape_shares|yesno} (a silent copy); `a.t().view(24)`: "
         "`{d1/report.json:lessons.views.transpose_view.type}`")],
    8: [("python day02_autograd/main.py", "bytes autograd saves for `tanh(x @ W1) @ W2`: "
         "{d2/summary.json:detach_vs_no_grad.saved_bytes_with_grad|,} with grad, "
         "{d2/summary.json:detach_vs_no_grad.saved_bytes_under_no_grad} under `no_grad`; `w * w.detach()` gives "
         "`w.grad` = w (max difference {d2/summary.json:detach_vs_no_grad.grad_of_w_times_detached_w_minus_w})")],
    9: [("python day10_bigbatch_ckpt/memcalc.py table", "full fine-tune 1.5B, b=2: {calc:mem_full_1.5B}; LoRA 1.5B "
         "(9M trainable), b=2: {calc:mem_lora_1.5B}; with checkpointing at b=8: {calc:mem_lora_1.5B_ckpt}; QLoRA 7B: "
         "{calc:mem_qlora_7B}"),
        ("python day10_bigbatch_ckpt/levers_lab.py", "LoRA r={d10/levers.json:config.rank} on a tiny GPT keeps "
         "{calc:day10_lora_share|.1%} of the optimizer state")],
    10: [("python day03_linreg/main.py", "the stability limit 2/λ_max = {d3/summary.json:lr_limit|.3f}: above it "
          "the run stops with one line instead of returning NaN"),
         ("python day07_amp_accum/main.py", "70,000 in fp16: {d7/summary.json:ranges.fp16_70000} (bf16: "
          "{d7/summary.json:ranges.bf16_70000|,.0f})")],
    11: [("python day05_dataloader/main.py", "one augmented epoch on {d5/timing.json:cpu_count} cores, "
          "{d5/timing.json:rows.*.num_workers|join: / } workers: "
          "{d5/timing.json:rows.*.train_epoch_s|each:.1f|join: / } s training, "
          "{d5/timing.json:rows.*.data_samples_per_s|each:,|join: / } samples/s data only; the training "
          "step alone consumes {d5/timing.json:model_only_samples_per_s|,} samples/s")],
    12: [("python day11_profile/main.py", "data/step {calc:day11_ratio_naive|.0%} "
          "({d11/summary.json:stages.0.verdict}) → {calc:day11_ratio_opt|.1%} "
          "({d11/summary.json:stages.-1.verdict}); epoch {calc:day11_epoch_naive|.1f} s → {calc:day11_epoch_opt|.1f} s "
          "({calc:day11_speedup|.1f}×) at {calc:day11_acc_naive|.2%} → {calc:day11_acc_opt|.2%} test accuracy")],
}


def interview(n: int):
    return lambda: "\n".join(f"- `{command}`: {fill(template)}" for command, template in INTERVIEW[n])


CALCS.update({
    "machines": machines,
    "day4_small_init": lambda: read("d4/init_lab.json", "stds.relu.too small")[-1]
    / read("d4/init_lab.json", "stds.relu.too small")[0],
    "day1_machine": day1_machine,
    "day6_state": day6_state,
    "day6_gap_ratios": day6_gap_ratios,
    "day7_saved_ratio": day7_saved_ratio,
    "day7_warmup_range": day7_warmup_range,
    "day7_linear_rule": day7_linear_rule,
    "day7_step_bf16": lambda: day7_step("bf16"),
    "day7_step_fp16": lambda: day7_step("fp16"),
    "day7_step_bf16_avx2": lambda: day7_step("bf16", "d7/avx2/summary.json"),
    "day7_step_fp16_avx2": lambda: day7_step("fp16", "d7/avx2/summary.json"),
    "day7_avx2_slowdown": lambda: read("d7/avx2/summary.json", "table.0.matmul_gflops")
    / read("d7/avx2/summary.json", "table.2.matmul_gflops"),
    "day9_norms": day9_norms,
    "day9_bn_b2": lambda: day9_norm("BatchNorm", 2),
    "day9_bn_b128": lambda: day9_norm("BatchNorm", 128),
    "day9_gn_b2": lambda: day9_norm("GroupNorm", 2),
    "day9_ln_b2": lambda: day9_norm("LayerNorm", 2),
    "day9_forgotten_eval": day9_forgotten_eval,
    "day9_transfer": day9_transfer,
    "day10_saved_cut": lambda: day10_cut("saved_bytes"),
    "day10_peak_cut": lambda: day10_cut("peak_bytes"),
    "day10_peak_cut_b16": lambda: 1 - mib("peak_bytes", "fp32 + checkpoint", 2) / mib("peak_bytes", "fp32", 2),
    "day10_bf16_saved_cut": lambda: 1 - mib("saved_bytes", "bf16 autocast") / mib("saved_bytes", "fp32"),
    "day10_bf16_peak_cut": lambda: 1 - mib("peak_bytes", "bf16 autocast") / mib("peak_bytes", "fp32"),
    "day10_ckpt_forward_mib": lambda: mib("forward_peak_bytes", "fp32 + checkpoint"),
    "day10_ckpt_peak_mib": lambda: mib("peak_bytes", "fp32 + checkpoint"),
    "day10_counter_peaks": lambda: " / ".join(f"{mib('peak_bytes', m):.2f}" for m in MODES10),
    "day10_peak_b16_64": lambda: " / ".join(f"{b / 2**20:.1f}" for b in read("d10/summary.json",
                                                                              "peak_bytes.fp32")[2:]),
    "day10_linear": day10_linear,
    "day10_ckpt_time": lambda: day10_step_ratio("d10/summary.json", "fp32 + checkpoint"),
    "day10_overstate": lambda: read("d10/summary.json", "largest_batch.saved for backward.fp32 + checkpoint")
    / read("d10/summary.json", "largest_batch.true peak.fp32 + checkpoint"),
    "day10_lora_share": day10_lora_share,
    "memcalc_matches": memcalc_matches,
    "memcalc_calls": memcalc_calls,
    "mem_full_1.5B": lambda: memtable("full fine-tune 1.5B"),
    "mem_full_1.5B_states": lambda: memtable("full fine-tune 1.5B", "weights+grads+optim"),
    "mem_lora_1.5B": lambda: memtable("LoRA 1.5B (9M"),
    "mem_lora_1.5B_ckpt": lambda: memtable("LoRA 1.5B, b=8"),
    "mem_qlora_7B": lambda: memtable("QLoRA 7B"),
    "day11_ratio_naive": lambda: day11_stage("naive", "ratio"),
    "day11_ratio_opt": lambda: day11_stage("optimised", "ratio"),
    "day11_epoch_naive": lambda: day11_stage("naive", "epoch_s"),
    "day11_epoch_opt": lambda: day11_stage("optimised", "epoch_s"),
    "day11_speedup": lambda: day11_stage("naive", "epoch_s") / day11_stage("optimised", "epoch_s"),
    "day11_acc_naive": lambda: day11_stage("naive", "test_acc"),
    "day11_acc_opt": lambda: day11_stage("optimised", "test_acc"),
    "day11_compiled_ratio": day11_compiled_ratio,
    "day12_mnist_acc": lambda: day12_config("mnist_mlp", "test_acc"),
    "day12_mnist_epochs": lambda: day12_config("mnist_mlp", "epochs_run"),
    "day12_cap": lambda: max(r["capped_at"] or 0 for r in read("d12/summary.json")),
    "day12_gpt_val": lambda: day12_config("shakespeare_cpu", "val_loss"),
    "day12_nanogpt_speed": lambda: day12_nanogpt()[0],
    "day12_nanogpt_time": lambda: day12_nanogpt()[1],
    "day12_fsdp4_share": lambda: day12_fsdp_share(4),
})

BLOCKS.update({
    **{f"interview-{n}": interview(n) for n in INTERVIEW},
    "day01-environment": day01_environment,
    "day04-results": day04_results,
    "day05-demos": day05_demos,
    "day06-resume": day06_resume,
    "day06-optimizer": day06_optimizer,
    "day06-overfit": day06_overfit,
    "day07-training": day07_training,
    "day07-precision": day07_precision,
    "day07-optim": day07_optim,
    "day08-xor": day08_xor,
    "day08-mnist": day08_mnist,
    "day08-bench": day08_bench,
    "day09-seeds": day09_seeds,
    "day09-residual": day09_residual,
    "day09-norms": day09_norms,
    "day10-intro": day10_intro,
    "day10-memory": day10_memory,
    "day10-timings": day10_timings,
    "day11-intro": day11_intro,
    "day11-compile": day11_compile,
    "days": days_table,
    "results": results_table,
    "machines": machine_line,
    "cpu-bf16": cpu_bf16,
    "memcalc": memcalc_intro,
})


def files() -> list[Path]:
    """The Markdown files that may hold generated blocks."""
    return [ROOT / "README.md", ROOT / "INTERVIEW.md", *sorted(ROOT.glob("day*/README.md"))]


def stale() -> list[Path]:
    """The files whose generated blocks differ from what `write_all` would write."""
    return [md for md in files() if md.is_file() and render(md.read_text(), md) != md.read_text()]


def write_all() -> list[Path]:
    """Re-make every generated block; returns the files that changed."""
    changed = []
    for md in files():
        if md.is_file() and (new := render(old := md.read_text(), md)) != old:
            md.write_text(new)
            changed.append(md)
    return changed
