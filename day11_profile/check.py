"""Day 11 gates: the profiler's trace and table show the labelled phases, the verdict follows the curriculum's
data/step bands, and fixing the pipeline makes an epoch at least 3x faster, measured in the same run.

Run:  python day11_profile/check.py   (or `pytest day11_profile`)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day11_profile import main as day
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
SAMPLES = 12_800  # per stage: 200 naive batches of 64, 50 optimised batches of 256
PIPELINES = ("naive", "optimised")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """One small run of main.py (every stage measured, both pipelines profiled) feeds every gate below."""
    out = tmp_path_factory.mktemp("day11")
    result = day.main(["--max-samples", str(SAMPLES), "--out", str(out / "results"), "--prof-dir", str(out / "prof")])
    result["out"] = out / "results"
    return result


@pytest.fixture(scope="module")
def cpu_synced(study):
    """The stage that still calls .item() every step, timed on the CPU (reused when the study ran there)."""
    if study["device"] == "cpu":
        return study["stages"][-2]
    stage = day.make_stages(64, 256)[-2]
    return day.time_epoch(stage, torch.device("cpu"), SAMPLES // 4, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_trace_is_chrome_json_holding_every_labelled_range(study, pipeline):
    events = day.load_trace(study["profiles"][pipeline]["trace"])["traceEvents"]
    names = {e["name"] for e in events if e.get("ph") == "X"}
    gates.check(f"{pipeline}: labelled ranges in the trace", sum(label in names for label in day.LABELS), "==",
                len(day.LABELS))


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_trace_records_the_schedules_active_steps(study, pipeline):
    events = day.load_trace(study["profiles"][pipeline]["trace"])["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    gates.check(f"{pipeline}: profiled steps in the trace", len(steps), "==", day.PROFILE_SCHEDULE["active"])


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_key_averages_table_lists_every_labelled_range(study, pipeline):
    table = (study["out"] / f"key_averages_{pipeline}.txt").read_text()
    row_names = {line.split()[0] for line in table.splitlines() if line.strip()}
    gates.check(f"{pipeline}: labelled ranges in key_averages table", sum(label in row_names for label in day.LABELS),
                "==", len(day.LABELS))


# The curriculum's bands (< 5% compute-bound, 20-60% partly data-bound, > 100% data-bound) and the two filled gaps.
@pytest.mark.parametrize("ratio, verdict", [
    (0.0, "compute-bound"), (0.049, "compute-bound"), (0.05, "mostly compute-bound"), (0.199, "mostly compute-bound"),
    (0.20, "partly data-bound"), (0.59, "partly data-bound"), (0.60, "mostly data-bound"),
    (0.99, "mostly data-bound"), (1.0, "data-bound"), (3.5, "data-bound"),
])
def test_classify_follows_the_curriculum_bands(ratio, verdict):
    gates.check(f"classify({ratio:.1%})", day.classify(ratio), "==", verdict)


@pytest.mark.parametrize("bad", [-0.1, float("nan")])
def test_classify_rejects_a_ratio_that_is_not_a_measurement(bad):
    with pytest.raises(ValueError, match="must be a number >= 0"):
        day.classify(bad)


@pytest.mark.slow
def test_every_measured_ratio_lies_in_its_verdicts_band(study):
    inside = sum(lo <= s["ratio"] < hi for s in study["stages"] for lo, hi in [day.band_of(s["verdict"])])
    gates.check("stages whose data/step lies in their verdict's band", inside, "==", len(study["stages"]))


@pytest.mark.slow
def test_naive_pipeline_is_at_least_partly_data_bound(study):
    gates.check("naive data/step", study["stages"][0]["ratio"], ">=", 0.20)


@pytest.mark.slow
def test_optimised_pipeline_spends_under_20pct_of_a_step_on_data(study):
    gates.check("optimised data/step", study["stages"][-1]["ratio"], "<", 0.20)


@pytest.mark.slow
def test_optimised_pipeline_is_at_least_3x_faster_per_epoch(study):
    gates.check("epoch time naive / optimised (same run)", study["speedup"], ">=", 3.0)


@pytest.mark.slow
def test_host_sync_costs_under_5pct_of_the_loop_on_cpu(cpu_synced):
    gates.check("CPU: share of the loop inside per-step .item()", cpu_synced["item_share"], "<", 0.05)


@pytest.mark.slow
def test_report_contains_every_figure_it_claims(study):
    report = (study["out"] / "report.md").read_text()
    missing = [name for name, text in day.headline(study).items() if text not in report]
    gates.check("headline figures missing from report.md", len(missing), "==", 0)


@pytest.mark.slow
def test_main_writes_chart_tables_and_summary(study):
    for name in ("before_after.png", "summary.json", *(f"key_averages_{p}.txt" for p in PIPELINES)):
        assert (study["out"] / name).stat().st_size > 0, name


@pytest.mark.parametrize("argv", [["--max-samples", "0"], ["--phase-batches", "500"]])
def test_bad_flag_values_stop_with_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        day.main(argv)
    assert exit_info.value.code == 2 and "must be" in capsys.readouterr().err


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
