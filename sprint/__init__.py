"""Small shared helpers: offline MNIST (`data`), device choice (`device`), gate recording (`gates`),
command lines (`cli`), measurements (`measure`) and plots (`plots`)."""
import json
import os
import platform
import re
import sys
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
