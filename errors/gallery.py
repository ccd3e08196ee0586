"""The error gallery: each row of the curriculum's error cheat sheet reproduced live, with its fix.

    python errors/gallery.py             # every row: the message caught, then what the fixed snippet computed
    python errors/gallery.py --row 11    # one row
    python errors/gallery.py --readme    # the same, then rewrite errors/README.md from this run

The rows live in `catalog.py`. Entries that need CUDA are skipped with the reason elsewhere (`pytest -m gpu` runs
them on a GPU). Exit code 1 when a snippet no longer gives the message its row expects.
"""
import inspect
import json
import multiprocessing
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and `errors`

import torch

from errors import catalog  # noqa: F401 (child processes look entries up as g.catalog.<name>)
from errors.catalog import ANALOGUE, CPU_FORM, CUDA, ENTRIES, ON_CPU, SAME, Entry
from sprint import REPO_ROOT
from sprint.cli import UserError, arg, parse, run, validate

README = REPO_ROOT / "errors" / "README.md"
ROWS = range(1, 22)  # the cheat sheet has 21 rows
CHILD_TIMEOUT_S = 180  # an entry run in a fresh interpreter (run_fresh): longer is a hang


@dataclass
class Outcome:
    errors: list[str] = field(default_factory=list)  # "Type: message" per exception, the first cause first
    warnings: list[str] = field(default_factory=list)
    result: str = ""  # what the snippet returned

    @property
    def text(self) -> str:
        return "\n".join(self.errors + self.warnings)


def run_here(fn) -> Outcome:
    """Call `fn()` and record its exception chain, its warnings and its result."""
    outcome = Outcome()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            outcome.result = str(fn())
        except Exception as exc:
            while exc is not None:
                outcome.errors.insert(0, f"{type(exc).__name__}: {exc}")
                exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    # DeprecationWarnings speak of the environment (Python 3.12+ warns when a threaded process forks), not the bug
    outcome.warnings = [f"{w.category.__name__}: {w.message}" for w in caught
                        if not issubclass(w.category, DeprecationWarning)]
    return outcome


def run_fresh(fn) -> Outcome:
    """`run_here(fn)` in a new interpreter: a CUDA error can leave the process's CUDA context unusable."""
    code = f"import json, errors.gallery as g; print(json.dumps(vars(g.run_here(g.catalog.{fn.__name__}))))"
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:  # a hung CUDA call: the entry's outcome, not an error of the gallery
        return Outcome(errors=[f"child process still running after {CHILD_TIMEOUT_S} s, killed (a hang): "
                               f"{(exc.stderr or b'')[-3000:].decode(errors='replace')}"])
    try:  # a poisoned CUDA context may also make the child's exit fail, after it printed its outcome
        return Outcome(**json.loads(proc.stdout.splitlines()[-1]))
    except (IndexError, json.JSONDecodeError):
        return Outcome(errors=[f"child process exited with {proc.returncode}: {proc.stderr[-3000:]}"])


def skip_reason(entry: Entry) -> str | None:
    if entry.needs == "cuda" and not torch.cuda.is_available():
        return "needs CUDA: torch.cuda.is_available() is False on this machine"
    if entry.needs == "no-cuda" and torch.cuda.is_available():
        return "reproduces a machine without CUDA; this one has it"
    if entry.needs == "fork" and "fork" not in multiprocessing.get_all_start_methods():
        return "needs the fork start method (Linux, macOS)"
    return None


@cache
def broken(entry: Entry) -> Outcome:
    return (run_fresh if entry.fresh_process else run_here)(entry.broken)


@cache
def fixed(entry: Entry) -> Outcome:
    return (run_fresh if entry.fresh_process else run_here)(entry.fixed)


def matches(entry: Entry) -> bool:
    return re.search(entry.pattern, broken(entry).text) is not None


def entry_id(entry: Entry) -> str:
    return f"{entry.row:02d}-{entry.key}" if entry.row else f"extra-{entry.key}"


def rows_on_cpu() -> set[int]:
    """Cheat-sheet rows with an entry that reproduces the row's cause on CPU."""
    return {e.row for e in ENTRIES if e.how in ON_CPU and e.row}


def scrub(text: str) -> str:
    """Drop what changes between runs and builds: pids, ports, shares, addresses, source locations in torch."""
    text = re.sub(r"\[[^\]\n]*\.(?:cc|cpp|h):\d+\] ", "", text)
    text = re.sub(r"(pid(?:\(s\))?) \d+", r"\1 <pid>", text)
    text = re.sub(r"\b\d+%", "<n>%", text)
    text = re.sub(r"0x[0-9a-f]{6,}", "0x…", text)
    return re.sub(r"port: \d+", "port: <port>", text)


def headline(outcome: Outcome) -> str:
    """Each exception and warning as a reader needs it: all of a short message, the first and last line of a long
    one (a worker's traceback sits in between)."""
    shown = []
    for message in outcome.errors + outcome.warnings:
        lines = [line.rstrip() for line in scrub(message).splitlines() if line.strip()]
        shown += lines if len(lines) <= 4 else [lines[0], "  [...]", lines[-1]]
    return "\n".join(shown)


# --- errors/README.md -------------------------------------------------------------------------------------------

INTRO = """\
# Error gallery: the cheat sheet, reproduced

Every row of the curriculum's error cheat sheet (and two errors it does not list: an exception inside a DataLoader
worker, a `module.` prefix in a state_dict), each as code that raises the real message, the message it gave, its
cause, the fix, and the fixed code (which runs). The entries live in [`catalog.py`](catalog.py); this page is
generated from them by `python errors/gallery.py --readme` (torch {torch}, CPU), and `pytest errors` checks that
every broken snippet still gives its message (so a torch upgrade that rewords one fails a test), that every fix
runs without an error or a warning, and that this page is what the gallery generates.

How an entry reproduces its row:
- **{same}**: the message the cheat sheet quotes, raised on a CPU.
- **{cpu_form}**: the row's cause on a CPU, where torch words it differently (a CPU allocator, the `meta` device).
- **{analogue}**: the nearest CPU bug for an error that only CUDA raises.
- **{cuda}**: needs an NVIDIA GPU (`pytest -m gpu` or `scripts/gpu_gates.sh`); this page shows the pattern the
  test expects, since it was generated on a CPU.

Reproduced on CPU: **{n_cpu} of 21 rows** ({cpu_rows}). CUDA only: rows {cuda_rows}.
`python errors/gallery.py` reproduces them live; `--row N` one row.
"""


def anchor(entry: Entry) -> str:
    return entry_id(entry).lower().replace("_", "-")


def source(*objects) -> str:
    return "\n\n\n".join(inspect.getsource(obj).rstrip() for obj in objects)


def render_entry(entry: Entry) -> str:
    label = f"{entry.row}" if entry.row else "not in the sheet"
    if entry.how == CUDA:
        caught = f"Expected on CUDA (pattern checked by `pytest -m gpu`):\n```text\n{entry.pattern}\n```"
    else:
        caught = f"Caught:\n```text\n{headline(broken(entry))}\n```"
    return "\n".join([
        f'<a name="{anchor(entry)}"></a>',
        f"### {label} · {entry.title}",
        f"*{entry.how}* · test id `{entry_id(entry)}`",
        "",
        f"```python\n{source(*entry.helpers, entry.broken)}\n```",
        caught,
        "",
        f"**Cause.** {entry.cause}",
        "",
        f"**Fix.** {entry.fix}",
        "",
        f"```python\n{source(entry.fixed)}\n```",
        "",
    ])


def render() -> str:
    """errors/README.md: the intro, one table row per cheat-sheet row, then every entry."""
    cpu, cuda_only = sorted(rows_on_cpu()), sorted(set(ROWS) - rows_on_cpu())
    parts = [INTRO.format(torch=torch.__version__.split("+")[0], same=SAME, cpu_form=CPU_FORM, analogue=ANALOGUE,
                          cuda=CUDA, n_cpu=len(cpu), cpu_rows=", ".join(map(str, cpu)),
                          cuda_rows=", ".join(map(str, cuda_only))),
             "| # | cheat-sheet message | entries |", "| ---: | --- | --- |"]
    for row in ROWS:
        entries = [e for e in ENTRIES if e.row == row]
        links = "<br>".join(f"[`{e.key}`](#{anchor(e)}): {e.how}" for e in entries)
        parts.append(f"| {row} | {entries[0].title} | {links} |")
    for e in [e for e in ENTRIES if e.row is None]:
        parts.append(f"| — | {e.title} | [`{e.key}`](#{anchor(e)}): {e.how} (not in the sheet) |")
    parts.append("")
    parts += [render_entry(e) for e in ENTRIES]
    return "\n".join(parts).rstrip() + "\n"


# --- command line -----------------------------------------------------------------------------------------------

@dataclass
class Config:
    row: int | None = arg(None, "only this cheat-sheet row", ge=1, le=21)
    readme: bool = arg(False, "rewrite errors/README.md from this run (needs every row: no --row)")

    def __post_init__(self):
        validate(self)
        if self.readme and self.row is not None:
            raise ValueError("--readme needs every row; drop --row")


def main(argv=None) -> None:
    cfg, _ = parse(Config, argv, __doc__)
    stale, skipped = [], []
    for entry in [e for e in ENTRIES if cfg.row in (None, e.row)]:
        print(f"row {entry.row or '-'}  {entry.title}  [{entry.how}]")
        if reason := skip_reason(entry):
            skipped.append(entry)
            print(f"  skipped: {reason}\n")
            continue
        print("  caught: " + headline(broken(entry)).replace("\n", "\n          "))
        if not matches(entry):
            stale.append(entry)
            print(f"  STALE: expected the pattern {entry.pattern!r}")
        result = fixed(entry)
        print(f"  fixed:  {result.result}" if not result.text else f"  FIX FAILED: {headline(result)}")
        if result.text:
            stale.append(entry)
        print()
    print(f"{len(ENTRIES)} entries; rows reproduced on CPU: {len(rows_on_cpu())} of 21; skipped here: {len(skipped)}")
    if stale:
        raise UserError(f"out of date: {', '.join(entry_id(e) for e in stale)}")
    if cfg.readme:
        if any(e.how != CUDA for e in skipped):
            raise UserError("README not written: run --readme where every CPU entry runs (Linux without CUDA)")
        README.write_text(render())
        print(f"wrote {README.relative_to(REPO_ROOT)}")


if __name__ == "__main__":
    run(main)
