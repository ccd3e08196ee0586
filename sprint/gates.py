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
from fnmatch import fnmatch
from pathlib import Path

from sprint import REPO_ROOT, RUNS_ROOT, machine

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
        `code`, prints one line (`error: ...`) and nothing else, and creates nothing at `out`."""
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
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        self.check(f"`{command}` prints one line, an error line", ["error:" in line for line in lines], "==", [True])
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


# Test folders the suite does not collect (the root conftest's collect_ignore): Day 12's tests/ run where a learner
# runs them, inside the copy of the template that day12_template/check.py's copy gate makes.
NOT_COLLECTED = ["day12_template/template/tests"]


class OutcomeRecorder:
    """pytest plugin (the root conftest.py registers it): after a session, for each top-level folder whose tests all
    ran (a day, `errors`, `tests`), writes `runs/gates/<folder>.outcomes.json` with every test's outcome and the gates
    each test recorded. A test that fails before it records its gate shows up there as failed, so a report built from
    it (`scripts/report.py`) cannot lose a failure. A folder that ran only in part (some of its files, `file::test`,
    `-k`, `-m`, `-x`, an interrupt) is not written: the last complete record stays."""

    def __init__(self, out_dir: Path = GATES_DIR, root: Path = REPO_ROOT, session_record: Path | None = None):
        self.out_dir, self.root, self.session_record = Path(out_dir), Path(root), session_record
        self.tests: dict[str, dict] = {}  # nodeid -> {"outcome", "duration", "message", "gates"}
        self.collected: dict[str, set[str]] = {}  # folder -> nodeids
        self.files: dict[str, set[str]] = {}  # folder -> test files
        self.partial: set[str] = set()
        self.errors: dict[str, list[str]] = {}  # folder -> collection errors
        self._mark = 0

    def folder(self, nodeid: str) -> str | None:
        head = nodeid.replace("\\", "/").split("::")[0].split("/")[0]
        return head if head and (self.root / head).is_dir() else None

    def test_files(self, config, folder: str) -> set[str]:
        """The files pytest would collect in `folder` (its python_files, outside its norecursedirs and the paths a
        conftest's collect_ignore names)."""
        patterns, skip = config.getini("python_files"), config.getini("norecursedirs")
        found = set()
        for path in (self.root / folder).rglob("*.py"):
            parts = path.relative_to(self.root).parts
            if not any(fnmatch(d, pattern) for d in parts[1:-1] for pattern in skip) and \
                    any(fnmatch(path.name, pattern) for pattern in patterns) and not self.ignored(config, path):
                found.add("/".join(parts))
        return found

    def ignored(self, config, path: Path) -> bool:
        """Whether pytest's collection skips `path` or a folder above it inside the repo (collect_ignore)."""
        inside = [p for p in (path, *path.parents) if p.is_relative_to(self.root) and p != self.root]
        return any(config.hook.pytest_ignore_collect(collection_path=p, config=config) for p in inside)

    def pytest_sessionstart(self, session):
        self.started, self.first = time.time(), len(RECORDED)

    def pytest_deselected(self, items):
        self.partial |= {f for item in items if (f := self.folder(item.nodeid))}

    def pytest_collectreport(self, report):
        if report.failed and (f := self.folder(report.nodeid)):
            self.errors.setdefault(f, []).append(f"{report.nodeid}: {str(report.longrepr).strip().splitlines()[-1]}")

    def pytest_collection_finish(self, session):
        for arg in session.config.args:  # `file::test` runs part of a folder
            path, sep, _ = arg.partition("::")
            path = (session.config.invocation_params.dir / path).resolve()
            if sep and path.is_relative_to(self.root) and (f := self.folder(path.relative_to(self.root).as_posix())):
                self.partial.add(f)
        for item in session.items:
            if f := self.folder(item.nodeid):
                self.collected.setdefault(f, set()).add(item.nodeid)
                self.files.setdefault(f, set()).add(item.nodeid.split("::")[0])

    def pytest_runtest_logstart(self, nodeid, location):
        self._mark = len(RECORDED)

    def pytest_runtest_logreport(self, report):
        test = self.tests.setdefault(report.nodeid, {"outcome": "passed", "duration": 0.0, "message": "",
                                                     "gates": []})
        test["duration"] += report.duration
        if report.failed and test["outcome"] != "failed":
            test["outcome"] = "failed"
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
            lines = [line for line in str(report.longrepr).strip().splitlines() if line.strip()]
            test["message"] = f"{report.when}: {(crash or (lines[-1] if lines else 'failed')).splitlines()[0]}"
        elif report.skipped and test["outcome"] == "passed":
            test["outcome"] = "skipped"
            test["message"] = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)

    def pytest_runtest_logfinish(self, nodeid, location):
        if nodeid in self.tests:
            self.tests[nodeid]["gates"] += [r.name for r in RECORDED[self._mark:]]
        for r in RECORDED[self._mark:]:
            r.test = nodeid  # type: ignore[attr-defined]

    def pytest_sessionfinish(self, session, exitstatus):
        from importlib.metadata import version

        if self.session_record:  # `pytest --session-record FILE`: this session whole, however partial or interrupted
            write_json(Path(self.session_record), {
                "started": self.started, "finished": time.time(), "exit_status": int(exitstatus),
                "torch": version("torch"), "cuda": torch_cuda(), "args": list(session.config.args),
                "tests": self.tests, "gates": [{**asdict(r), "test": getattr(r, "test", None)}
                                               for r in RECORDED[self.first:]]})
        for folder in self.collected.keys() | self.errors.keys():
            nodeids = self.collected.get(folder, set())
            if folder in self.partial or not nodeids <= self.tests.keys() or (
                    folder not in self.errors and self.files.get(folder) != self.test_files(session.config, folder)):
                continue
            record = {"folder": folder, "started": self.started, "finished": time.time(), "torch": version("torch"),
                      "machine": machine(), "files": sorted(self.files.get(folder, ())),
                      "collect_errors": self.errors.get(folder, []),
                      "tests": {n: test for n, test in self.tests.items() if n in nodeids},  # in the order they ran
                      "gates": [{**asdict(r), "test": getattr(r, "test", None)}
                                for r in RECORDED[self.first:] if r.day == folder]}
            write_json(self.out_dir / f"{folder}.outcomes.json", record)


def write_json(path: Path, record: dict) -> None:
    """`record` as JSON at `path`, written whole or not at all (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=_jsonable) + "\n")
    os.replace(tmp, path)


def torch_cuda() -> dict:
    """The CUDA device this session saw, by name, with torch's CUDA runtime version; {} without one."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"device": torch.cuda.get_device_name(0), "runtime": torch.version.cuda, "count": torch.cuda.device_count()}
