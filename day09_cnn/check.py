"""Day 9 gates: the ResNet passes 99% and beats Day 4's MLP with fewer parameters; state_dict reconciliation
works; residual connections keep the first layer's gradient alive.

Run:  python day09_cnn/check.py   (or `pytest day09_cnn`)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day09_cnn import main as day
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
OUTPUTS = ("comparison.png", "comparison.md", "state_dict.md", "summary.json")


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """The learner's command, `python day09_cnn/main.py` (ResNet + Day 4's MLP), writing to a temporary folder."""
    return day.main(["--out", str(tmp_path_factory.mktemp("day09"))])


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("day09_smoke")
    return day.main(["--train-subset", "256", "--test-subset", "200", "--epochs", "1", "--out", str(out)]), out


@pytest.mark.slow
def test_resnet_reaches_99_percent_on_the_full_test_set(default_run):
    gates.check("test images evaluated", default_run["resnet"]["n_test"], "==", 10_000)
    gates.check("ResNet test accuracy, default run", default_run["resnet"]["test_acc"], ">=", 0.99)


@pytest.mark.slow
def test_resnet_beats_the_mlp_measured_the_same_way(default_run):
    gap = default_run["resnet"]["test_acc"] - default_run["mlp"]["test_acc"]
    gates.check("ResNet - MLP test accuracy", gap, ">", 0.0)


@pytest.mark.slow
def test_resnet_uses_fewer_or_comparable_parameters(default_run):
    ratio = default_run["resnet"]["params"] / default_run["mlp"]["params"]
    gates.check("ResNet / MLP parameters (comparable: <= 1.25)", ratio, "<=", 1.25)


@pytest.mark.slow
def test_conclusion_is_ten_lines_citing_the_measured_accuracies(default_run):
    text = "\n".join(default_run["conclusion"])
    cited = sum(f"{default_run[m]['test_acc']:.2%}" in text for m in ("resnet", "mlp"))
    gates.check("conclusion lines", len(default_run["conclusion"]), "==", 10)
    gates.check("measured accuracies cited in the conclusion", cited, "==", 2)


def test_main_writes_table_conclusion_and_plots(smoke_run):
    result, out = smoke_run
    for name in OUTPUTS:
        assert (out / name).stat().st_size > 0, name
    assert len(result["conclusion"]) == 10


@pytest.fixture(scope="module")
def demo():
    torch.manual_seed(0)
    return day.reconciliation_demo(day.ResNet())


def test_prefixed_state_dict_loads_after_stripping_the_prefix(demo):
    leftover = len(demo["stripped"]["missing"]) + len(demo["stripped"]["unexpected"])
    gates.check("missing + unexpected keys after stripping 'module.'", leftover, "==", 0)
    gates.check("max |logit diff| after loading", demo["stripped"]["max_logit_diff"], "==", 0.0)


def test_strict_false_reports_what_it_could_not_load(demo):
    gates.check("unexpected keys before stripping", demo["prefixed"]["unexpected"], "==",
                len(day.ResNet().state_dict()))
    assert demo["strict_error"].startswith("Error(s) in loading state_dict")
    assert demo["backbone_only"] == {"missing": ["fc.weight", "fc.bias"], "unexpected": []}


def test_shape_mismatch_fails_even_with_strict_false(demo):
    assert demo["shape_error"].startswith("size mismatch for fc.weight"), demo["shape_error"]


def test_residual_first_layer_gradient_exceeds_plain_by_orders_of_magnitude():
    grads = day.residual_experiment(depths=(40,), seeds=range(5))
    worst = min(r / p for r, p in zip(grads["residual"][0], grads["plain"][0]))
    # "Orders of magnitude": at least two (100x), in every seed.
    gates.check("depth 40: min over 5 seeds of residual/plain grad norm", worst, ">=", 100)


def test_bad_config_is_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="epochs must be > 0"):
        day.Config(epochs=0)
    with pytest.raises(ValueError, match="widths"):
        day.Config(widths=(16, 0))


if __name__ == "__main__":
    run_this_file(__file__)
