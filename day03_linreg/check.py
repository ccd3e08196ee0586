"""Day 3 gates: the hand-written loop fits y = 3x + 2, agrees with least squares, and stops with a message when
the learning rate is above the stability limit 2 / λ_max.

Run:  python day03_linreg/check.py   (or `pytest day03_linreg`)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest

from day03_linreg import main as day
from sprint.cli import UserError
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)


@pytest.fixture(scope="module")
def result():
    return day.fit()


def test_final_mse_is_below_1e_4(result):
    gates.check("final MSE is below 1e-4", result.mse, "<", 1e-4)


def test_w_is_within_0_01_of_3(result):
    gates.check("w is within 0.01 of 3 (|w - 3|)", abs(result.w - 3), "<", 1e-2)


def test_b_is_within_0_01_of_2(result):
    gates.check("b is within 0.01 of 2 (|b - 2|)", abs(result.b - 2), "<", 1e-2)


def test_sgd_agrees_with_closed_form_least_squares(result):
    gap = max(abs(result.w - result.w_lstsq), abs(result.b - result.b_lstsq))
    gates.check("SGD agrees with least squares within 1e-4 (max |SGD - lstsq|)", gap, "<", 1e-4)


def test_lr_just_below_the_stability_limit_converges(result):
    near = day.fit(lr=0.95 * result.lr_limit)
    gates.check("lr = 0.95 x the limit 2/λ_max converges: final MSE below 1e-4", near.mse, "<", 1e-4)


def test_lr_just_above_the_stability_limit_is_stopped_with_a_message(result):
    with pytest.raises(UserError, match="diverges") as caught:
        day.fit(lr=1.05 * result.lr_limit)
    gates.check("lr = 1.05 x the limit 2/λ_max is stopped, the message names the limit",
                f"{result.lr_limit:.3g}" in str(caught.value), "==", True)


def test_main_writes_plot_and_summary(tmp_path):
    day.main(["--steps", "50", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    gates.check("summary.json records --steps 50", summary["steps"], "==", 50)
    assert (tmp_path / "fit.png").stat().st_size > 0


@pytest.mark.parametrize("argv", [["--steps", "-5"], ["--steps", "0"], ["--lr", "0"], ["--lr", "nan"],
                                  ["--lr", "-0.1"], ["--steps", "1.5"]])
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


def test_a_diverging_lr_exits_1_with_one_line_and_creates_nothing(tmp_path):
    gates.refuses(day.main, ["--lr", "5"], tmp_path / "out", code=1)


if __name__ == "__main__":
    run_this_file(__file__)
