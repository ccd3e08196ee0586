"""Figures: headless matplotlib and one way to save them (size, resolution, layout) for every plot in the repo."""
from pathlib import Path


def subplots(*args, **kwargs):
    """`plt.subplots` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save(fig, path: Path) -> Path:
    """Lay out, write (100 dpi PNG) and close `fig`; returns `path`."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
