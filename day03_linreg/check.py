"""Day 3 gates: the hand-written loop fits y = 3x + 2 and agrees with least squares.

Run:  python day03_linreg/check.py   (or `pytest day03_linreg`)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest

from day03_linreg import main as day
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)


@pytest.fixture(scope="module")
def result():
    return day.fit()


def test_final_mse_is_below_1e_4(result):
    gates.check("final MSE", result["mse"], "<", 1e-4)


def test_w_is_within_0_01_of_3(result):
    gates.check("|w - 3|", abs(result["w"] - 3), "<", 1e-2)


def test_b_is_within_0_01_of_2(result):
    gates.check("|b - 2|", abs(result["b"] - 2), "<", 1e-2)


def test_sgd_agrees_with_closed_form_least_squares(result):
    gap = max(abs(result["w"] - result["w_lstsq"]), abs(result["b"] - result["b_lstsq"]))
    gates.check("max |SGD - lstsq|", gap, "<", 1e-4)


def test_main_writes_plot_and_summary(tmp_path):
    day.main(["--steps", "50", "--out", str(tmp_path)])
    assert (tmp_path / "fit.png").stat().st_size > 0
    assert (tmp_path / "summary.json").exists()


if __name__ == "__main__":
    run_this_file(__file__)
