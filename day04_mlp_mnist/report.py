"""Day 4's report: the training curves of one run, with the single test evaluation marked at the end, and its table
(`results/summary.md`, which the README includes)."""
from pathlib import Path

from sprint import markdown_table
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


def run_table(summary: dict, history: list[dict]) -> str:
    """One run as the README shows it (`results/summary.md`): its size, then each evaluation and the test."""
    rows = [[f"{row['epoch']:g}", f"{row['train_loss']:.4f}", f"{row['val_loss']:.4f}", f"{row['val_acc']:.2%}"]
            for row in history]
    if summary["test_acc"] is not None:  # a run with the test left out (`--no-test`) has none
        rows.append([f"test, evaluated once ({summary['n_test']:,} images)", "", f"{summary['test_loss']:.4f}",
                     f"**{summary['test_acc']:.2%}**"])
    return (f"Seed {summary['config']['seed']}: {summary['params']:,} parameters, {summary['n_train']:,} training / "
            f"{summary['n_val']:,} validation images; {summary['machine']}.\n\n"
            + markdown_table(["epoch", "train loss (running mean, label-smoothed)", "val loss", "val accuracy"], rows,
                             "rrrr") + "\n")
