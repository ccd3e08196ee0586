"""The whole picture in one command: run the gates, or reuse what they recorded when no code changed since, then write
REPORT.md — this machine, the date and commit, every gate (threshold, measured figure, PASS/FAIL), the benchmark
figures of the committed results files, the interview evidence and the plots.

Run:  python scripts/report.py            REPORT.md; re-runs the gates of each folder whose code changed since they ran
      python scripts/report.py --fresh    re-run every gate first (the whole suite)
      python scripts/report.py --gates    also re-make each day's committed gates table (`results/gates.md`, which
                                          its README includes) from its recorded run, where every test passed
      python scripts/report.py --readme   re-make the blocks of README.md, INTERVIEW.md and the day READMEs from the
                                          committed results files (runs no gate)

Exit code 1 when a gate or a test failed. REPORT.md is git-ignored: it describes one machine at one moment.
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]  # `sprint` and the days, and `figures`

import figures  # noqa: E402
from sprint import markdown_table  # noqa: E402
from sprint.gates import GATES_DIR, NOT_COLLECTED  # noqa: E402

FOLDERS = [*figures.DAYS.values(), "errors", "tests"]  # what `pytest` collects (pyproject's testpaths)
# code and data every folder's tests depend on
SHARED = ["sprint", "conftest.py", "pyproject.toml", "data/mnist", "data/fashion-mnist"]
SKIP_DIRS = {".git", "runs", "results", "__pycache__", ".pytest_cache", ".hypothesis", "MNIST"}
REPORT = ROOT / "REPORT.md"
INTERVIEW = ROOT / "INTERVIEW.md"


# --- which recorded gates are still valid -------------------------------------------------------------------------

def files_under(path: Path, skip: set[str] = SKIP_DIRS) -> list[Path]:
    if path.is_file():
        return [path]
    return [p for p in path.rglob("*") if p.is_file() and not skip & set(p.relative_to(path).parts)]


def day_imports(folder: str) -> set[str]:
    """The day folders whose code `folder` imports (`from day04_mlp_mnist.main import ...`), transitively."""
    found, todo = set(), [folder]
    while todo:
        for py in files_under(ROOT / todo.pop()):
            if py.suffix == ".py":
                for day in set(re.findall(r"^\s*(?:from|import)\s+(day\d\d_\w+)", py.read_text(), re.M)):
                    if day not in found and (ROOT / day).is_dir():
                        found.add(day)
                        todo.append(day)
    return found - {folder}


def sources(folder: str) -> list[Path]:
    """Every file whose change can change `folder`'s test results: the folder, the days it imports, the shared code.
    The repo-wide tests (`tests/`) read everything (READMEs, lock file, CI script), so all of the repo counts."""
    if folder == "tests":
        return [p for p in files_under(ROOT, SKIP_DIRS - {"results"}) if p != REPORT]
    paths = [ROOT / folder, *(ROOT / d for d in day_imports(folder)), *(ROOT / s for s in SHARED)]
    return [f for p in paths for f in files_under(p)]


def test_files(folder: str) -> list[str]:
    """The files pytest collects in `folder` (pyproject: check.py, test_*.py; not under NOT_COLLECTED)."""
    names = (p.relative_to(ROOT).as_posix() for p in files_under(ROOT / folder)
             if p.name == "check.py" or re.fullmatch(r"test_.*\.py", p.name))
    return sorted(n for n in names if not any(n.startswith(f"{skip}/") for skip in NOT_COLLECTED))


def record_of(folder: str) -> dict | None:
    try:
        return json.loads((GATES_DIR / f"{folder}.outcomes.json").read_text())
    except (OSError, ValueError):
        return None


def stale_reason(folder: str) -> str | None:
    """Why `folder`'s recorded outcomes cannot stand for its code now (None when they can)."""
    record = record_of(folder)
    if record is None:
        return "no complete run recorded"
    if record["torch"] != version("torch"):
        return f"recorded with torch {record['torch']}"
    if record["files"] != test_files(folder):
        return "its test files changed"
    newest = max(sources(folder), key=lambda p: p.stat().st_mtime)
    if newest.stat().st_mtime > record["started"]:
        return f"{newest.relative_to(ROOT)} changed after the last run"
    return None


def run_gates(folders: list[str]) -> int:
    """pytest on `folders`, in this process; the root conftest's recorder writes their outcomes."""
    import pytest

    os.chdir(ROOT)
    return pytest.main([*folders, "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT)])


# --- REPORT.md ----------------------------------------------------------------------------------------------------

def cell(value) -> str:
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def environment() -> list[tuple[str, str]]:
    import torch

    from sprint import cpu_info, machine
    from sprint.device import pick_device

    cuda = torch.cuda.is_available()
    flags = cpu_info()[1]
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16") if f in flags]
    return [("Python", platform.python_version()),
            ("torch", f"{torch.__version__} (CUDA build: {torch.version.cuda or 'none'})"),
            ("CUDA available", f"yes: {torch.cuda.get_device_name()}" if cuda else "no"),
            ("device", f"`{pick_device()}` (`sprint.device.pick_device()`)"),
            ("machine", f"{machine()} (`sprint.machine()`)"),
            ("CPU flags that change speed", ", ".join(isa) or "none of AVX2/AVX-512/AMX")]


def gate_rows(records: dict[str, dict]) -> tuple[list[str], dict]:
    """The gate table (one row per gate, then each failed or skipped test that recorded no failing gate), and counts."""
    rows, counts = [], {"PASS": 0, "FAIL": 0, "SKIP": 0}
    for folder, record in records.items():
        for error in record["collect_errors"]:
            rows.append(f"| {folder} | collection error: {cell(error)} | — | — | **FAIL** |")
            counts["FAIL"] += 1
        for g in record["gates"]:
            verdict = "PASS" if g["passed"] else "FAIL"
            counts[verdict] += 1
            rows.append(f"| {folder} | {cell(g['name'])} | {g['op']} {cell(g['threshold'])} | {cell(g['measured'])} "
                        f"| {'PASS' if g['passed'] else '**FAIL**'} |")
        failed_gates = {g["test"] for g in record["gates"] if not g["passed"]}
        for nodeid, test in record["tests"].items():
            if test["outcome"] == "failed" and nodeid not in failed_gates:
                counts["FAIL"] += 1
                rows.append(f"| {folder} | test `{cell(nodeid.split('::', 1)[-1])}` failed before or after its gates: "
                            f"{cell(test['message'])} | — | — | **FAIL** |")
            elif test["outcome"] == "skipped":
                counts["SKIP"] += 1
                rows.append(f"| {folder} | test `{cell(nodeid.split('::', 1)[-1])}` skipped: {cell(test['message'])} "
                            f"| — | — | SKIP |")
    return rows, counts


def short(value, width: int = 100) -> str:
    """A table cell of at most `width` characters (a long list of names cut, marked with an ellipsis)."""
    text = cell(value)
    return text if len(text) <= width else text[:width - 1].rstrip() + "…"


def gates_table(record: dict) -> str:
    """A day's recorded run as its README shows it: each test, named for the claim it proves, with every gate it
    recorded (the figure it measured and what it requires); a test that recorded none says how it ended."""
    by_test = {}
    for g in record["gates"]:
        by_test.setdefault(g["test"], []).append(g)
    outcomes = [t["outcome"] for t in record["tests"].values()]
    when = datetime.datetime.fromtimestamp(record["started"]).strftime("%Y-%m-%d")
    rows = []
    for nodeid, test in record["tests"].items():
        name = f"`{cell(nodeid.split('::', 1)[-1])}`"
        gates = by_test.get(nodeid, [])
        if test["outcome"] == "skipped":
            rows.append([name, f"skipped: {cell(test['message'].removeprefix('Skipped: '))}", "—", "—"])
        elif not gates:
            rows.append([name, "(plain assertions, no recorded figure)", "—", "—"])
        rows += [[name if i == 0 else "", cell(g["name"]), short(g["measured"]), f"{g['op']} {short(g['threshold'])}"]
                 for i, g in enumerate(gates)]
    return (f"Recorded on {when} by the day's tests (`python scripts/report.py --gates`): {len(outcomes)} tests, "
            f"{outcomes.count('passed')} passed, {outcomes.count('skipped')} skipped; {len(record['gates'])} gates. "
            f"{record['machine']}, torch {record['torch']}.\n\n"
            + markdown_table(["test", "gate", "measured", "required"], rows) + "\n")


def write_gates_tables(records: dict[str, dict]) -> None:
    """`results/gates.md` of each day whose recorded run passed whole (a failed run never replaces the table)."""
    for folder, record in records.items():
        if folder not in figures.DAYS.values():
            continue
        failed = [n for n, t in record["tests"].items() if t["outcome"] == "failed"] + record["collect_errors"]
        if failed:
            print(f"not written: {folder}/results/gates.md ({len(failed)} failed: {failed[0]} ...)")
            continue
        path = ROOT / folder / "results" / "gates.md"
        path.write_text(gates_table(record))
        print(f"wrote {path.relative_to(ROOT)}")


def interview_rows(records: dict[str, dict]) -> list[str]:
    """Each test INTERVIEW.md cites, with the gates it recorded in the run above."""
    if not INTERVIEW.is_file():
        return []
    tests = {n: t for r in records.values() for n, t in r["tests"].items()}
    gates = {}
    for r in records.values():
        for g in r["gates"]:
            gates.setdefault(g["test"], []).append(g)
    rows = ["| question | test | gate | measured | result |", "| --- | --- | --- | --- | --- |"]
    for question, nodeids in cited_tests().items():
        for nodeid in nodeids:
            test = tests.get(nodeid)
            if test is None:
                rows.append(f"| {question} | `{nodeid}` | not run | — | **FAIL** |")
                continue
            for g in gates.get(nodeid, []) or [None]:
                if g is None:
                    verdict = {"passed": "PASS", "skipped": "SKIP"}.get(test["outcome"], "**FAIL**")
                    rows.append(f"| {question} | `{nodeid}` | (no gate: the test's assertions) | — | {verdict} |")
                else:
                    rows.append(f"| {question} | `{nodeid}` | {cell(g['name'])} | {cell(g['measured'])} "
                                f"(need {g['op']} {cell(g['threshold'])}) | {'PASS' if g['passed'] else '**FAIL**'} |")
    return rows


def cited_tests(text: str | None = None) -> dict[str, list[str]]:
    """INTERVIEW.md's questions (`## Q1. ...`) -> the pytest node ids its evidence cites (in backticks)."""
    text = INTERVIEW.read_text() if text is None else text
    cited, question = {}, None
    for line in text.splitlines():
        if m := re.match(r"## (Q\d+)\.", line):
            question = m[1]
            cited[question] = []
        elif question:
            cited[question] += [n for n in re.findall(r"`((?:day\d\d_\w+|errors|tests)/[\w/]+\.py::[^`]+)`", line)
                                if n not in cited[question]]
    return cited


def plots() -> list[str]:
    return [f"![{p.relative_to(ROOT).as_posix()}]({p.relative_to(ROOT).as_posix()})"
            for day in figures.DAYS.values() for p in sorted((ROOT / day / "results").rglob("*.png"))]


def write_report(records: dict[str, dict], sources_: dict[str, str]) -> dict:
    rows, counts = gate_rows(records)
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = " with uncommitted changes" if git("status", "--porcelain") else ""
    summary = ["| folder | tests passed / failed / skipped | gates passed / failed | figures from |",
               "| --- | --- | --- | --- |"]
    for folder, record in records.items():
        outcomes = [t["outcome"] for t in record["tests"].values()]
        gate_ok = sum(g["passed"] for g in record["gates"])
        summary.append(f"| {folder} | {outcomes.count('passed')} / {outcomes.count('failed')} / "
                       f"{outcomes.count('skipped')} | {gate_ok} / {len(record['gates']) - gate_ok} | "
                       f"{sources_[folder]} |")
    text = [
        "# pytorch-sprint: report", "",
        f"Written by `python scripts/report.py` on {datetime.datetime.now():%Y-%m-%d %H:%M}, commit `{commit}`{dirty}.",
        "", "## This machine", "", "| | |", "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in environment()), "",
        f"## Gates: {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} skipped tests", "",
        *summary, "",
        "Each gate asserts a figure measured when its test ran; a test that failed without a failing gate (an error "
        "before the gate, or an assertion outside one) has its own FAIL row; skipped tests say why.", "",
        "| folder | gate | threshold | measured | result |", "| --- | --- | --- | --- | --- |", *rows, "",
        "## Benchmark figures (the committed results files)", "", figures.machine_line(), "",
        figures.results_table(), "",
        "## Interview evidence (INTERVIEW.md)", "", *interview_rows(records), "",
        "## Plots", "", *(f"{p}\n" for p in plots()),
    ]
    REPORT.write_text("\n".join(text).rstrip() + "\n")
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--fresh", action="store_true", help="re-run every gate, even where nothing changed")
    what.add_argument("--readme", action="store_true", help="re-make the READMEs' blocks; run no gate")
    parser.add_argument("--gates", action="store_true", help="also re-make each day's results/gates.md")
    args = parser.parse_args(argv)
    if args.readme and args.gates:
        parser.error("--gates runs the gates; --readme runs none: give one")
    if args.readme:
        try:
            changed = figures.write_all()
        except figures.FigureError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        for path in changed:
            print(f"{'rewrote' if path.exists() else 'removed'} {path.relative_to(ROOT)}")
        if not changed:
            print("every block is current")
        return 0
    reasons = {f: "--fresh" if args.fresh else stale_reason(f) for f in FOLDERS if test_files(f)}
    stale = [f for f, why in reasons.items() if why]
    for folder in stale:
        print(f"running {folder}: {reasons[folder]}")
    if stale:
        run_gates(stale)
    records, sources_ = {}, {}
    for folder in reasons:
        record = record_of(folder)
        if record is None or (folder not in stale and stale_reason(folder)):
            record = {"tests": {}, "gates": [], "collect_errors": [f"{folder}: no complete run recorded"]}
        records[folder] = record
        when = datetime.datetime.fromtimestamp(record.get("started", 0)).strftime("%Y-%m-%d %H:%M")
        sources_[folder] = "this run" if folder in stale else f"the run of {when} (no change since)"
    counts = write_report(records, sources_)
    if args.gates:
        write_gates_tables(records)
    print(f"wrote {REPORT.relative_to(ROOT)}: {counts['PASS']} gates PASS, {counts['FAIL']} FAIL, "
          f"{counts['SKIP']} tests skipped")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
