"""gpu_results.py — a run of the GPU gates as a results table: every test's outcome and the gates it recorded (figure
against threshold), with the device, torch and CUDA versions. scripts/gpu_gates.sh runs it after pytest.

    python scripts/gpu_results.py runs/gpu_gates/record.json     # writes runs/gpu_gates/gpu_gates.md beside it

The record is what `pytest --session-record FILE` writes (sprint.gates.OutcomeRecorder), also when the run was
stopped at its time limit: the tests it did not reach are not in it, and the table says how pytest ended.
Exit codes: 0 written; 1 no record (pytest did not get as far as writing one).
"""
import argparse
import datetime
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def cell(value) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(record: dict) -> str:
    cuda = record["cuda"]
    device = f"{cuda['device']} (CUDA runtime {cuda['runtime']})" if cuda else "no CUDA device"
    started = datetime.datetime.fromtimestamp(record["started"], datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    counts = Counter(test["outcome"] for test in record["tests"].values())
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no test ran"
    lines = [f"GPU gates on {device}, torch {record['torch']}, started {started}: {summary} in "
             f"{record['finished'] - record['started']:.0f} s (pytest exit {record['exit_status']}).", "",
             "| test | outcome | seconds | gate | measured | threshold |", "| --- | --- | --- | --- | --- | --- |"]
    gates_of = defaultdict(list)
    for gate in record["gates"]:
        gates_of[gate["test"]].append(gate)
    for nodeid, test in sorted(record["tests"].items()):
        outcome = test["outcome"] + (f": {test['message']}" if test["message"] else "")
        for gate in gates_of[nodeid] or [None]:
            figures = ["", "", ""] if gate is None else [gate["name"], gate["measured"],
                                                         f"{gate['op']} {cell(gate['threshold'])}"]
            lines.append("| " + " | ".join(cell(v) for v in [nodeid, outcome, f"{test['duration']:.1f}", *figures])
                         + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("record", type=Path, help="the file `pytest --session-record` wrote")
    args = parser.parse_args(argv)
    if not args.record.is_file():
        print(f"error: {args.record} does not exist: pytest wrote no record (it did not start, or was killed)",
              file=sys.stderr)
        return 1
    out = args.record.with_name("gpu_gates.md")
    out.write_text(markdown(json.loads(args.record.read_text())))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
