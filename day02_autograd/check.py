"""Day 2 gates: hand-derived gradients match autograd, and each autograd rule behaves as the lesson claims.

Run:  python day02_autograd/check.py   (or `pytest day02_autograd`)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest

from day02_autograd import main as day
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
SEED = 1  # main's default is 0: the gates must hold for any seed, not one tuned run


@pytest.fixture(scope="module")
def grads():
    return day.hand_vs_autograd(seed=SEED)


@pytest.mark.parametrize("op", list(day.OPS))
def test_hand_derived_gradient_matches_autograd(grads, op):
    gates.check(f"{op}: hand-derived gradient within 1e-12 of autograd's (float64)", grads[op].max_abs_diff, "<", 1e-12)


def test_linear_square_hand_gradient_equals_w_grad_exactly():
    result = day.exact_linear_square(trials=500, seed=SEED)
    gates.check("(w*x+b)**2: hand gradient equals w.grad bit for bit (max diff over 500 float32 triples)",
                result.max_abs_diff, "==", 0.0)


@pytest.fixture(scope="module")
def leaf():
    return day.leaf_and_retain_grad(SEED)


def test_only_user_created_tensors_are_leaves(leaf):
    gates.check("w created by the user is a leaf", leaf.w_is_leaf, "==", True)
    gates.check("y = w * 2, made by an op, is not a leaf (y.is_leaf)", leaf.y_is_leaf, "==", False)


def test_non_leaf_has_no_grad_and_torch_warns(leaf):
    gates.check("a non-leaf's .grad is None without retain_grad", leaf.y_grad_is_none, "==", True)
    gates.check("reading a non-leaf's .grad raises a UserWarning", leaf.warning, "==", "UserWarning")


def test_retain_grad_keeps_the_intermediate_gradient(leaf):
    gates.check("retain_grad keeps y.grad = 2y exactly (max diff)", leaf.retained_grad_minus_2y, "==", 0.0)


@pytest.fixture(scope="module")
def detach():
    return day.detach_vs_no_grad(SEED)


def test_detach_shares_memory_and_stops_gradient(detach):
    gates.check("detach shares storage", detach.detached_shares_storage, "==", True)
    gates.check("w * w.detach(): w.grad equals w exactly (max diff)", detach.grad_of_w_times_detached_w_minus_w,
                "==", 0.0)
    gates.check("w * w: w.grad equals 2w exactly (max diff)", detach.grad_of_w_times_w_minus_2w, "==", 0.0)


def test_no_grad_builds_no_graph_and_saves_nothing(detach):
    gates.check("an output under no_grad does not require grad", detach.no_grad_output_requires_grad, "==", False)
    gates.check("bytes saved for backward with grad are above 0", detach.saved_bytes_with_grad, ">", 0)
    gates.check("bytes saved for backward under no_grad are 0", detach.saved_bytes_under_no_grad, "==", 0)


def test_gradients_accumulate_until_zeroed():
    acc = day.accumulation(SEED)
    gates.check("two backward calls give exactly twice the gradient (max diff)", acc.two_backward_minus_twice_one,
                "==", 0.0)
    gates.check("zero_() leaves a zero gradient (max |grad|)", acc.after_zero, "==", 0.0)
    gates.check("after zero_(), one backward gives exactly one gradient (max diff)",
                acc.zero_then_one_backward_minus_one, "==", 0.0)


@pytest.fixture(scope="module")
def twice():
    return day.second_backward(SEED)


def test_second_backward_raises(twice):
    error = twice.error
    gates.check("a second backward raises a RuntimeError", error and error.type, "==", "RuntimeError")
    gates.check("the second backward's message names the cause",
                "Trying to backward through the graph a second time" in error.message, "==", True)


def test_retain_graph_allows_a_second_backward(twice):
    gates.check("with retain_graph the second backward raises nothing", twice.error_with_retain_graph, "==", None)
    gates.check("with retain_graph the gradient accumulates to 4w exactly (max diff)", twice.grad_minus_4w, "==", 0.0)


@pytest.fixture(scope="module")
def custom():
    return day.check_custom_function(SEED)


def test_custom_function_passes_gradcheck_in_float64(custom):
    gates.check("custom SiLU passes gradcheck (float64)", custom.correct_passes_float64, "==", True)
    gates.check("custom SiLU's gradient within 1e-12 of F.silu's", custom.grad_minus_f_silu, "<", 1e-12)


def test_gradcheck_rejects_a_wrong_backward(custom):
    gates.check("gradcheck rejects the wrong backward (passes: False)", custom.wrong_passes_float64, "==", False)
    gates.check("the wrong backward raises a GradcheckError", custom.wrong_error.type, "==", "GradcheckError")


def test_gradcheck_needs_float64(custom):
    gates.check("in float32 gradcheck rejects even the correct backward (passes: False)",
                custom.correct_passes_float32, "==", False)


def test_main_writes_summary(tmp_path):
    day.main(["--trials", "10", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "summary.json").read_text())
    gates.check("summary.json holds the 7 lessons", len(written), "==", 7)
    gates.check("summary.json: --trials 10 is recorded", written["linear_square_float32"]["trials"], "==", 10)


@pytest.mark.parametrize("argv", [["--trials", "0"], ["--trials", "-3"], ["--seed", "x"], ["--bogus"]])
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


if __name__ == "__main__":
    run_this_file(__file__)
