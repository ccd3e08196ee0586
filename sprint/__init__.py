"""Small shared helpers: offline MNIST (`data`), device choice (`device`), gate recording (`gates`),
command lines (`cli`), measurements (`measure`) and plots (`plots`)."""
import os
import platform
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNS_ROOT = REPO_ROOT / "runs"  # git-ignored: where every script writes unless told `--out`


def runs_dir(day_file: str, *parts: str) -> Path:
    """`runs/<day folder>/<parts>`: the default output folder of a day's script (never the committed results/)."""
    return RUNS_ROOT.joinpath(Path(day_file).resolve().parent.name, *parts)


def machine() -> str:
    """This CPU as a timing should name it: model, logical cores and the vector extensions that change speed."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:  # not Linux: the platform's own name
        pass
    isa = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX-512"), ("amx_bf16", "AMX-BF16")) if flag in flags]
    return f"{model}, {os.cpu_count()} logical cores" + (f", {' + '.join(isa)}" if isa else "")
