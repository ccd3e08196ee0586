"""Small shared helpers: offline MNIST (`data`), device choice (`device`), gate recording (`gates`),
command lines (`cli`), measurements (`measure`) and plots (`plots`)."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNS_ROOT = REPO_ROOT / "runs"  # git-ignored: where every script writes unless told `--out`


def runs_dir(day_file: str, *parts: str) -> Path:
    """`runs/<day folder>/<parts>`: the default output folder of a day's script (never the committed results/)."""
    return RUNS_ROOT.joinpath(Path(day_file).resolve().parent.name, *parts)
