"""Gates: named assertions on measured figures, recorded in `runs/gates/<day>.json`.

Each `check.py` creates `gates = Gates(__file__)` and calls `gates.check(name, measured, op, threshold)`.
The figure and verdict are stored before the assertion runs, so a failing gate still shows what it measured;
the root `conftest.py` prints every gate of the session as a table.
"""
import contextlib
import io
import json
import math
import operator
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sprint import REPO_ROOT, RUNS_ROOT

GATES_DIR = RUNS_ROOT / "gates"

OPS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass
class GateResult:
    day: str
    name: str
    measured: object
    op: str
    threshold: object
    passed: bool
    when: str


RECORDED: list[GateResult] = []  # this process's gates, for the summary table


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if hasattr(value, "item"):  # 0-d tensors and NumPy scalars
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


class Gates:
    """Records and asserts the gates of one day (named after the folder of `check_file`)."""

    def __init__(self, check_file: str, out_dir: Path = GATES_DIR):
        self.day = Path(check_file).resolve().parent.name
        self.path = Path(out_dir) / f"{self.day}.json"

    def check(self, name: str, measured, op: str, threshold) -> None:
        if op not in OPS:
            raise ValueError(f"unknown comparison {op!r}; use one of {sorted(OPS)}")
        measured, threshold = _jsonable(measured), _jsonable(threshold)
        try:
            passed = bool(OPS[op](measured, threshold))
        except TypeError:
            passed = False
        result = GateResult(self.day, name, measured, op, threshold, passed, time.strftime("%Y-%m-%dT%H:%M:%S"))
        RECORDED.append(result)
        self._save(result)
        assert passed, f"gate '{name}' failed: measured {measured!r}, required {op} {threshold!r}"

    def refuses(self, main, argv: list[str], out: Path, code: int = 2) -> None:
        """Gates on a command line that must fail: `main(argv + ["--out", out])` run as the script runs it exits with
        `code`, prints exactly one `error:` line, and creates nothing at `out`."""
        from sprint.cli import run

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                run(main, [*argv, "--out", str(out)])
                exit_code = 0
            except SystemExit as exc:
                exit_code = exc.code
        command = " ".join(argv)
        self.check(f"`{command}` exits with code {code}", exit_code, "==", code)
        self.check(f"`{command}` prints one error line", sum("error:" in line for line in err.getvalue().splitlines()),
                   "==", 1)
        self.check(f"`{command}` creates no output folder", Path(out).exists(), "==", False)

    def _save(self, result: GateResult) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(self.path.read_text())
        except (OSError, ValueError):
            table = {}
        table[result.name] = asdict(result)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


def format_table(results: list[GateResult]) -> str:
    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    rows = [("day", "gate", "measured", "threshold", "result")]
    rows += [(r.day, r.name, fmt(r.measured), f"{r.op} {fmt(r.threshold)}", "PASS" if r.passed else "FAIL")
             for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def run_this_file(check_file: str) -> None:
    """Script mode for a check.py: run its gates (slow ones included) through pytest and exit with its code."""
    import pytest

    sys.exit(pytest.main([str(Path(check_file).resolve()), "-q", "-p", "no:cacheprovider", "--rootdir",
                          str(REPO_ROOT)]))
