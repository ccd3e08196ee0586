"""Day 11 gates: the profiler's trace and table show the labelled phases, the verdict follows the curriculum's
data/step bands, each change is measured on its own, and the fixed pipeline is at least 3x faster per epoch at the
naive pipeline's accuracy (within 0.2 points, same number of epochs, learning rate chosen on validation) — all in one
run; torch.compile's cost, recompiles and `_orig_mod.` prefix are measured too.

Run:  python day11_profile/check.py   (or `pytest day11_profile`)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day11_profile import bands, compile_lab, report
from day11_profile import main as day
from sprint import REPO_ROOT
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
SAMPLES = 6_400  # timed per stage: 100 naive batches of 64, 25 optimised batches of 256
LR_GRID = (0.016, 0.032)  # the big batch's candidates for the one-epoch accuracy gate (main.py tries five)
PIPELINES = ("naive", "optimised")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One run of main.py, every training run on its first 6,400 images (every stage measured, both pipelines
    profiled), feeds the gates below but the accuracy one."""
    out = tmp_path_factory.mktemp("day11")
    result = day.main(["--max-samples", str(SAMPLES), "--lr-grid", str(LR_GRID[-1]), "--out", str(out / "results"),
                       "--prof-dir", str(out / "prof")])
    result["out"] = out / "results"
    return result


@pytest.fixture(scope="module")
def quality():
    """Test accuracy after ONE FULL EPOCH, through main.py's own sweep: the naive recipe (batch 64, constant LR, on
    in-memory tensors, which train the same weights as the naive pipeline: see below) against batch 256 with its LR
    chosen on validation."""
    cfg = day.Config(lr_grid=LR_GRID)
    train_idx, val_idx = day.split(cfg.val_size)
    sweep = day.lr_sweep(cfg, train_idx, val_idx, torch.device("cpu"))
    chosen = max(sweep[1:], key=lambda r: r["val_acc"])
    x, y = day.prepared(train=False)
    return {"naive": day.evaluate(sweep[0]["model"], x, y), "chosen": chosen["stage"].name,
            "optimised": day.evaluate(chosen["model"], x, y)}


@pytest.fixture(scope="module")
def cpu_synced(study):
    """The stage that still calls .item() every step, timed on the CPU (reused when the study ran there)."""
    if study["device"] == "cpu":
        return study["stages"][-2]
    cfg = day.Config(max_samples=SAMPLES // 4)
    stage = day.make_stages(cfg, day.Stage("x", True, 256, 1e-3, False, True))[-2]
    return day.train_epoch(stage, day.split(cfg.val_size)[0], torch.device("cpu"), cfg.max_samples, seed=0)


# --- the profiler ------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_trace_is_chrome_json_holding_every_labelled_range(study, pipeline):
    events = report.load_trace(REPO_ROOT / study["profiles"][pipeline]["trace"])["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    gates.check(f"{pipeline}: labelled ranges in the trace", sum(label in names for label in day.LABELS), "==",
                len(day.LABELS))


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_trace_records_the_schedules_active_steps(study, pipeline):
    events = report.load_trace(REPO_ROOT / study["profiles"][pipeline]["trace"])["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    gates.check(f"{pipeline}: profiled steps in the trace", len(steps), "==", day.PROFILE_SCHEDULE["active"])


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_key_averages_table_lists_every_labelled_range(study, pipeline):
    table = (study["out"] / f"key_averages_{pipeline}.txt").read_text()
    row_names = {line.split()[0] for line in table.splitlines() if line.strip()}
    gates.check(f"{pipeline}: labelled ranges in key_averages table", sum(label in row_names for label in day.LABELS),
                "==", len(day.LABELS))


def test_profiling_on_a_cpu_prints_no_gpu_probe_noise(capfd):
    cfg = day.Config()
    stage = day.make_stages(cfg, day.Stage("x", True, 256, 1e-3, False, True))[1]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("KINETO_LOG_LEVEL", raising=False)
        day.profile_steps(stage, day.split(cfg.val_size)[0], torch.device("cpu"), Path(cfg.prof_dir) / "check", 0)
    err = capfd.readouterr().err
    assert torch.cuda.is_available() or "gpuGetDeviceCount" not in err, err


# --- the verdict -------------------------------------------------------------------------------------------
# The curriculum's bands (< 5% compute-bound, 20-60% partly data-bound, > 100% data-bound) and the two filled gaps.
@pytest.mark.parametrize("ratio, verdict", [
    (0.0, "compute-bound"), (0.049, "compute-bound"), (0.05, "mostly compute-bound"), (0.199, "mostly compute-bound"),
    (0.20, "partly data-bound"), (0.59, "partly data-bound"), (0.60, "mostly data-bound"),
    (0.99, "mostly data-bound"), (1.0, "data-bound"), (3.5, "data-bound"),
])
def test_classify_follows_the_curriculum_bands(ratio, verdict):
    gates.check(f"classify({ratio:.1%})", bands.classify(ratio), "==", verdict)


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_classify_rejects_a_ratio_that_is_not_a_measurement(bad):
    with pytest.raises(ValueError, match="must be a number >= 0"):
        bands.classify(bad)


@pytest.mark.slow
def test_every_measured_ratio_lies_in_its_verdicts_band(study):
    inside = sum(lo <= s["ratio"] < hi for s in study["stages"] for lo, hi in [bands.band_of(s["verdict"])])
    gates.check("stages whose data/step lies in their verdict's band", inside, "==", len(study["stages"]))


@pytest.mark.slow
def test_naive_pipeline_is_at_least_partly_data_bound(study):
    gates.check("naive data/step", study["stages"][0]["ratio"], ">=", 0.20)


@pytest.mark.slow
def test_optimised_pipeline_spends_under_20pct_of_a_step_on_data(study):
    gates.check("optimised data/step", study["stages"][-1]["ratio"], "<", 0.20)


# --- the fix: speed, one change at a time, at equal quality ------------------------------------------------
@pytest.mark.slow
def test_optimised_pipeline_is_at_least_3x_faster_per_epoch(study):
    gates.check("epoch time naive / optimised (same run)", study["speedup"], ">=", 3.0)


@pytest.mark.slow
def test_preparing_the_data_once_alone_speeds_up_the_loop(study):
    naive, in_memory = study["stages"][:2]
    gates.check("naive / in-memory one-thread CPU time per image (batch 64 both, fastest batches)",
                report.per_image_cpu_us(naive) / report.per_image_cpu_us(in_memory), ">=", 2.0)


@pytest.mark.slow
def test_a_bigger_batch_alone_speeds_up_the_loop(study):
    small, big = study["stages"][1:3]
    gates.check("batch 64 / batch 256 one-thread CPU time per image (in memory, same LR, fastest batches)",
                report.per_image_cpu_us(small) / report.per_image_cpu_us(big), ">=", 1.5)


@pytest.mark.slow
def test_in_memory_pipeline_trains_exactly_what_the_naive_one_trains(study):
    # Same transforms, same order, same RNG: identical weights, so the naive recipe's accuracy can be measured fast.
    naive, in_memory = study["stages"][:2]
    gates.check("naive vs in-memory: |weight sums difference|", abs(naive["weights_sum"] - in_memory["weights_sum"]),
                "==", 0.0)
    gates.check("naive vs in-memory: test accuracy difference", abs(naive["test_acc"] - in_memory["test_acc"]), "==",
                0.0)


@pytest.mark.slow
def test_dropping_the_per_step_item_changes_no_weight(study):
    synced, unsynced = study["stages"][-2:]
    gates.check("with vs without per-step .item(): |weight sums difference|",
                abs(synced["weights_sum"] - unsynced["weights_sum"]), "==", 0.0)


@pytest.mark.slow
def test_optimised_recipe_reaches_the_naive_accuracy_after_one_epoch(quality):
    gates.check("test accuracy after 1 epoch: batch 256 with its LR chosen on validation - naive recipe (points)",
                100 * (quality["optimised"] - quality["naive"]), ">=", -0.2)


@pytest.mark.slow
def test_host_sync_costs_under_5pct_of_the_loop_on_cpu(cpu_synced):
    gates.check("CPU: share of the loop inside per-step .item()", cpu_synced["item_share"], "<", 0.05)


# --- the report ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_report_contains_every_figure_it_claims(study):
    text = (study["out"] / "report.md").read_text()
    missing = [name for name, figure in report.headline(study).items() if figure not in text]
    gates.check("headline figures missing from report.md", len(missing), "==", 0)


@pytest.mark.slow
def test_report_says_extrapolated_for_a_partial_epoch_and_measured_for_a_full_one(study):
    partial = report.conclusion(study)
    full = report.conclusion({**study, "max_samples": None})
    assert "extrapolated" in partial and "measured" not in partial.split("**After")[1], partial
    assert "extrapolated" not in full and "measured" in full.split("**After")[1], full


@pytest.mark.slow
def test_main_writes_chart_tables_and_summary(study):
    for name in ("before_after.png", "summary.json", "report.md", *(f"key_averages_{p}.txt" for p in PIPELINES)):
        assert (study["out"] / name).stat().st_size > 0, name


BAD_FLAGS = [["--max-samples", "0"], ["--phase-batches", "500"], ["--batch-size", "0"], ["--lr-grid", "0"],
             ["--lr-grid", "nan"], ["--val-size", "60000"], ["--device", "gpu"], ["--prof-dir", "/dev/null/x"]]
BAD_FLAGS += [] if torch.cuda.is_available() else [["--device", "cuda"]]  # a device this machine lacks


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=[" ".join(a) for a in BAD_FLAGS])
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


# --- the last stage: torch.compile (compile_lab.py) -----------------------------------------------------------
@pytest.fixture(scope="module")
def compiled():
    """compile_lab.py once, against the shared inductor cache; without a C++ compiler, parts 2 and 3 only."""
    why = compile_lab.inductor_unavailable()
    return {**compile_lab.run_lab(compile_lab.Config(cold=False, repeat=10), inductor=why is None), "why": why}


@pytest.mark.slow
def test_compiling_costs_many_steps_and_then_computes_the_same_losses(compiled):
    if compiled["why"]:
        pytest.skip(f"torch.compile's inductor backend cannot build here: {compiled['why']}")
    c = compiled["compile"]
    first = c["first_step_s"]["compiled, shared cache"]
    gates.check("first compiled step / steady compiled step", first / c["steady_step_s"]["compiled"], ">=", 10)
    gates.check("eager vs compiled: max |loss difference| over 3 steps", c["max_loss_diff"], "<=", 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("setting, graphs", [("dynamic=None (default)", 2), ("dynamic=False", 3),
                                             ("dynamic=True", 1), ("drop_last=True", 1)])
def test_a_changing_batch_shape_recompiles_unless_dynamic_or_drop_last(compiled, setting, graphs):
    gates.check(f"graphs compiled for batches {compiled['sizes']}, {setting}",
                compiled["recompiles"][setting]["graphs"], "==", graphs)


@pytest.mark.slow
def test_compiled_state_dict_keys_carry_orig_mod_and_the_inner_module_loads(compiled):
    o = compiled["orig_mod"]
    gates.check("compiled state_dict keys with _orig_mod.", o["prefixed"], "==", 1.0)
    gates.check("plain MLP refuses the compiled state_dict", "Missing key(s)" in o["plain_load_error"], "==", True)
    gates.check("_orig_mod.state_dict() loads: identical outputs", o["fixed_outputs_equal"], "==", True)


# --- CUDA --------------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_utilisation_rises_once_the_pipeline_is_fixed(study):
    util = study["gpu_utilisation"]
    rise = "no reading" if None in util.values() else util["optimised"] - util["naive"]  # a missing reading fails
    gates.check("GPU utilisation optimised - naive (%)", rise, ">", 0)


@pytest.mark.gpu
def test_a_host_sync_waits_longer_on_cuda_than_on_cpu(study, cpu_synced):
    gates.check("per-step .item() µs, CUDA / CPU", study["stages"][-2]["item_us_per_step"]
                / cpu_synced["item_us_per_step"], ">", 1.0)


if __name__ == "__main__":
    run_this_file(__file__)
