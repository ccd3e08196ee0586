"""The gate harness: figures are recorded before the verdict, and a gate can fail."""
import json

import pytest

from sprint import gates as harness
from sprint.gates import Gates


@pytest.fixture
def gates(tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RECORDED", [])  # keep these examples out of the session's gate table
    check_file = tmp_path / "day99_example" / "check.py"
    check_file.parent.mkdir()
    check_file.touch()
    return Gates(str(check_file), out_dir=tmp_path / "gates")


def test_a_passing_gate_is_recorded_with_its_figure(gates):
    gates.check("accuracy", 0.985, ">", 0.98)
    record = json.loads(gates.path.read_text())["accuracy"]
    assert gates.path.name == "day99_example.json"
    assert record["measured"] == 0.985 and record["threshold"] == 0.98 and record["passed"] is True


def test_a_failing_gate_raises_and_still_records_the_figure(gates):
    with pytest.raises(AssertionError, match="measured 0.5, required > 0.98"):
        gates.check("accuracy", 0.5, ">", 0.98)
    assert json.loads(gates.path.read_text())["accuracy"]["passed"] is False


def test_nan_never_passes(gates):
    with pytest.raises(AssertionError):
        gates.check("loss", float("nan"), "<", 1.0)


def test_unknown_comparison_is_rejected(gates):
    with pytest.raises(ValueError, match="unknown comparison"):
        gates.check("x", 1, "≈", 1)


def test_summary_table_lists_every_gate():
    rows = [harness.GateResult("day99", "acc", 0.99, ">", 0.98, True, "now"),
            harness.GateResult("day99", "loss", 2.0, "<", 1.0, False, "now")]
    table = harness.format_table(rows)
    assert "PASS" in table and "FAIL" in table and "> 0.98" in table
