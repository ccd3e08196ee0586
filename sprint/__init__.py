"""Small shared helpers: offline MNIST (`data`), device choice (`device`), gate recording (`gates`),
command lines (`cli`), measurements (`measure`) and plots (`plots`)."""
import inspect
import json
import os
import platform
import re
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNS_ROOT = REPO_ROOT / "runs"  # git-ignored: where every script writes unless told `--out`


def runs_dir(day_file: str, *parts: str) -> Path:
    """`runs/<day folder>/<parts>`: the default output folder of a day's script (never the committed results/)."""
    return RUNS_ROOT.joinpath(Path(day_file).resolve().parent.name, *parts)


def write_results(out: Path, name: str, text: str, result) -> None:
    """`out/<name>.md` (the report) and `out/<name>.json` (its figures), and one line saying where."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text.rstrip("\n") + "\n")
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out / name}.md and {name}.json")


def read_json(path: Path):
    """A results file's figures: its JSON, or the list of its objects for JSON lines (`.jsonl`)."""
    text = Path(path).read_text()
    if Path(path).suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def markdown_table(header: list[str], rows: list[list], align: str = "") -> str:
    """A Markdown table; `align` has one of l/r/c per column (default: all left)."""
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join(marks[a] for a in (align or "l" * len(header))) + " |"]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def wrap(text: str, width: int = 118) -> str:
    """Prose lines folded at `width` like the hand-written text around them (bullets keep a hanging indent); table
    rows, fenced blocks and `code` stay whole."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if fenced or line.startswith(("|", "```")) or len(line) <= width:
            lines.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        glued = re.sub(r"`[^`]*`", lambda m: m[0].replace(" ", "\0"), line)
        lines += [part.replace("\0", " ") for part in textwrap.wrap(
            glued, width, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)]
    return "\n".join(lines)


def fragment_text(fragment, results: Path) -> str:
    """The Markdown `fragment(results)` makes from the results files in `results`, folded as a README shows it."""
    return wrap(fragment(Path(results)).strip("\n")) + "\n"


def write_fragment(out: Path, fragment) -> None:
    """`out/<fragment's name>.md`: Markdown made from the results files in `out`, which the day's README includes
    verbatim (`<!-- include: results/NAME.md -->`: its links are relative to the day folder). Written only into the
    day's own `results/` (a run into `runs/`, or the AVX2-capped run's `results/avx2/`, has no README to feed), and
    there not written, with a line saying why, while a results file it reads is missing or lacks a figure it quotes
    (a run with smaller settings than the committed one: fewer batches, seeds or modes). The committed fragments are
    checked without either excuse (tests/test_report.py)."""
    if Path(out).resolve() != Path(inspect.getfile(fragment)).resolve().parent / "results":
        return
    try:
        text = fragment_text(fragment, out)
    except FileNotFoundError as exc:
        print(f"not written: {fragment.__name__}.md needs {exc.filename}")
        return
    except (LookupError, StopIteration) as exc:
        print(f"not written: {fragment.__name__}.md quotes a figure this run does not have ({exc!r})")
        return
    (out / f"{fragment.__name__}.md").write_text(text)
    print(f"wrote {out / fragment.__name__}.md")


def cpu_info() -> tuple[str, set[str]]:
    """(CPU model, its feature flags) from /proc/cpuinfo on Linux; the platform's name and no flags elsewhere."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return model, flags


def machine() -> str:
    """The hardware a timing belongs to: CPU model, logical cores and the vector extensions that change speed
    (AVX2, AVX-512, AMX-BF16); once torch is loaded, also its CPU kernels and thread count, and the GPU if any.
    Importing torch is left to the caller, so torch-free benchmarks can name their machine too."""
    model, flags = cpu_info()
    isa = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("amx_bf16", "AMX-BF16")) if flag in flags]
    text = f"{model}, {os.cpu_count()} logical cores" + (f", {' + '.join(isa)}" if isa else "")
    torch = sys.modules.get("torch")
    if torch is not None:
        text += f" (torch: {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"
        if torch.cuda.is_available():
            text = f"{torch.cuda.get_device_name()}; host {text}"
    return text
