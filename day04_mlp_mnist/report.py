"""Day 4's report: the training curves of one run, with the single test evaluation marked at the end, and the
README's sentence on that run (`results/readme_results.md`)."""
from pathlib import Path

from sprint import read_json
from sprint.plots import save, subplots


def plot_curves(history: list[dict], test_acc: float | None, goal: float, path: Path) -> Path:
    epochs = [r["epoch"] for r in history]
    fig, (ax1, ax2) = subplots(1, 2, figsize=(10, 4))
    ax1.plot(epochs, [r["train_loss"] for r in history], "o-", label="train (running mean, label-smoothed)")
    ax1.plot(epochs, [r["val_loss"] for r in history], "s-", label="validation (eval mode)")
    ax1.set(title="cross-entropy loss", xlabel="epoch", ylabel="loss", yscale="log")
    ax1.legend()
    accs = [100 * r["val_acc"] for r in history]
    ax2.plot(epochs, accs, "o-", label="validation accuracy (5,000 held-out training images)")
    if test_acc is not None:
        ax2.plot([epochs[-1]], [100 * test_acc], "r*", markersize=12,
                 label=f"test accuracy, evaluated once: {100 * test_acc:.2f}%")
    ax2.axhline(100 * goal, color="gray", ls="--", label=f"gate: {100 * goal:.0f}% (test)")
    ax2.set(title="MNIST accuracy", xlabel="epoch", ylabel="accuracy (%)", ylim=(min(96, int(min(accs))), 100))
    ax2.legend(loc="lower right")
    return save(fig, path)


def readme_results(results: Path) -> str:
    """The README's run of seed 0 (`summary.json`, `metrics.jsonl`) and seed 1's accuracy (`bench.json`, from
    `bench.py`, which stays torch-free: after a new bench run, `python scripts/report.py --readme` re-makes this)."""
    summary, metrics = read_json(results / "summary.json"), read_json(results / "metrics.jsonl")
    seed1 = read_json(results / "bench.json")["rows"][1]["main"]["test_acc"]
    curve = " → ".join(f"{row['val_acc']:.2%}" for row in metrics)
    return (f"`python day04_mlp_mnist/main.py --out day04_mlp_mnist/results` (seed 0; "
            f"[`results/summary.json`](results/summary.json), [`results/metrics.jsonl`](results/metrics.jsonl)): "
            f"{summary['params']:,} parameters, {summary['n_train']:,} training / {summary['n_val']:,} validation "
            f"images, validation accuracy {curve} over the {summary['config']['epochs']} epochs, then **test accuracy "
            f"{summary['test_acc']:.2%}**, evaluated once. Seed 1 (a row of the benchmark below): {seed1:.2%}.")
