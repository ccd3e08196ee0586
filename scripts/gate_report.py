"""Print every recorded gate (runs/gates/*.json, written by the last `pytest` or check.py run) as Markdown.

Run:  python scripts/gate_report.py            (after `pytest`)
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint`

from sprint.gates import GATES_DIR


def fmt(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def markdown(gates_dir: Path = GATES_DIR) -> str:
    lines = ["| day | gate | measured | threshold | result | when |", "| --- | --- | --- | --- | --- | --- |"]
    for path in sorted(gates_dir.glob("*.json")):
        for name, g in sorted(json.loads(path.read_text()).items()):
            verdict = "PASS" if g["passed"] else "**FAIL**"
            lines.append(f"| {g['day']} | {name} | {fmt(g['measured'])} | {g['op']} {fmt(g['threshold'])} "
                         f"| {verdict} | {g['when']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if not GATES_DIR.exists():
        sys.exit(f"no gate records in {GATES_DIR}: run `pytest` (or a day's check.py) first")
    print(markdown())
