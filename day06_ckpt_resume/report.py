"""Day 6 report writers: the overlay plot of the killed-and-resumed processes, the optimizer-state table, and the
machine the figures were measured on."""
import json
import time
from dataclasses import asdict
from pathlib import Path

from day06_ckpt_resume.checkpoint import read_metrics
from sprint import markdown_table, plots
from sprint import machine


def write_results(out: Path, stem: str, result, table, plot, started: float) -> None:
    """A lab's results in `out`: `<stem>.md` by `table(result, path)`, `<stem>.png` by `plot(result, path)`, and
    `<stem>.json` (the result, the machine, the wall time since `started`, a time.perf_counter() value)."""
    out.mkdir(parents=True, exist_ok=True)
    table(result, out / f"{stem}.md")
    plot(result, out / f"{stem}.png")
    summary = {**asdict(result), "machine": machine(), "wall_s": time.perf_counter() - started}
    (out / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / stem}.md, {stem}.png and {stem}.json")


def plot_overlay(reference: Path, chains: dict, path: Path) -> None:
    """Each process of each killed chain over the uninterrupted run's loss curve, and their step-wise difference."""
    ref = {r["step"]: r["loss"] for r in read_metrics(reference) if r["kind"] == "train"}
    fig, axes = plots.subplots(len(chains) + 1, 1, figsize=(10, 3 * len(chains) + 2), sharex=True,
                               height_ratios=[3] * len(chains) + [1.2])
    for ax, (workers, chain) in zip(axes, chains.items()):
        ax.plot(list(ref), list(ref.values()), color="0.75", lw=4, label="uninterrupted run")
        for i, s in enumerate(chain.segments):
            mine = [r for r in s.records if r["kind"] == "train" and r["step"] > s.resumed_from]
            start = f"resumed at step {s.resumed_from}" if s.resumed_from else "fresh start"
            end = f"SIGKILLed after step {s.died_after_step}" if s.died_after_step else "ran to the end"
            steps = [r["step"] for r in mine]
            ax.plot(steps, [r["loss"] for r in mine], lw=0.9, label=f"process {i + 1}: {start}, {end}")
            axes[-1].plot(steps, [r["loss"] - ref[r["step"]] for r in mine], ".", ms=2)
            if s.died_after_step:
                ax.axvline(s.died_after_step, color="red", ls=":", lw=1)
        ax.set(title=f"num_workers={workers}: each process of the killed run over the uninterrupted run "
                     "(red: SIGKILL)", ylabel="training loss", yscale="log")
        ax.legend(fontsize=7)
    axes[-1].set(xlabel="global step", ylabel="resumed − uninterrupted", title="loss difference, all processes")
    plots.save(fig, path)


def write_optimizer_table(opt, path: Path) -> None:
    """The losses after a resume with and without the optimizer state (an OptimizerStateEffect) as Markdown."""
    rows = ["| step | uninterrupted | resumed with optimizer state | resumed with model weights only |",
            "| ---: | ---: | ---: | ---: |"]
    for i, (u, f, m) in enumerate(zip(opt.uninterrupted_losses, opt.full_losses, opt.model_only_losses)):
        rows.append(f"| {opt.at_step + i + 1} | {u:.6f} | {f:.6f} | {m:.6f} |")
    rows.append(f"| max abs diff | — | {opt.full_max_abs_diff:.3g} | {opt.model_only_max_abs_diff:.3g} |")
    path.write_text("\n".join(rows) + "\n")


def write_overfit_table(lab, path: Path) -> None:
    """The overfitting lab (an overfit_lab.Lab) as Markdown: one row per run, then early stopping and best.pt."""
    cfg, e = lab.config, lab.early_stop
    rows = [f"{cfg.subset} training images, {cfg.epochs} epochs, plain 784-{cfg.hidden}-10 ReLU MLP, AdamW lr "
            f"{cfg.lr:g}, seed {cfg.seed}. Losses and accuracies in eval mode (Dropout off) on the training subset and "
            "on 2,000 validation images.", "",
            f"| run | train acc | val acc | train loss | val loss (epoch {cfg.epochs}) | lowest val loss (epoch) "
            "| gap = val − train loss | gap ÷ unregularised gap |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    base = next(iter(lab.curves.values()))
    for c in lab.curves.values():
        rows.append(f"| {c.name} | {c.train_acc[-1]:.2%} | {c.val_acc[-1]:.2%} | {c.train_loss[-1]:.4f} "
                    f"| {c.val_loss[-1]:.4f} | {min(c.val_loss):.4f} ({c.best_epoch}) | {c.gap:.3f} "
                    f"| {c.gap / base.gap:.2f} |")
    rows += ["", "| early stopping (no regularisation) | value |", "| --- | ---: |",
             f"| patience | {e.patience} epochs |", f"| stopped after epoch | {e.stopped_after_epoch} |",
             f"| step of the lowest validation loss | {e.step_of_best_epoch} |",
             f"| step held by best.pt (loaded back) | {e.best_pt_step} |",
             f"| validation loss of best.pt's weights, evaluated again | {e.best_pt_val_loss:.6f} |",
             f"| lowest validation loss logged | {min(e.val_loss):.6f} |"]
    path.write_text("\n".join(rows) + "\n")


RESUME_ROWS = ["SIGKILLed after steps", "resumed from `last.pt` at steps",
               "steps computed, those redone after a kill included",
               "steps whose loss differs from the uninterrupted run's (`float.hex`)", "steps whose sample indices differ",
               "final `metrics.jsonl` identical",
               "final state entries that differ (model, optimizer, scheduler, sampler, RNG states, counters)"]


def chain_column(chain: dict) -> list[str]:
    """One killed chain of `summary.json`, a cell for each of RESUME_ROWS."""
    compared = chain["comparison"]
    return [", ".join(map(str, chain["kill_at"])), ", ".join(str(s["resumed_from"]) for s in chain["segments"][1:]),
            f"{compared['steps_computed']:,}", f"**{compared['loss_mismatches']}**",
            f"**{compared['sample_mismatches']}**", "yes" if compared["final_log_equal"] else "**no**",
            str(len(compared["state_diffs"]))]


def resume_table(summary: dict) -> str:
    """The killed chains of `prove_resume.py` (its `summary.json`) against the uninterrupted run, as Markdown."""
    chains = list(summary["chains"].values())
    columns = [chain_column(c) for c in chains]
    test = summary["reference_test"]
    return (f"Uninterrupted run: best validation loss {test['best_val']:.4f}, test accuracy of `best.pt` "
            f"{test['test_acc']:.2%}; {summary['machine']}.\n\n"
            + markdown_table(["killed chain", *(f"num_workers={c['workers']}" for c in chains)],
                             [[label, *cells] for label, *cells in zip(RESUME_ROWS, *columns)],
                             "l" + "r" * len(chains)) + "\n")


def plot_overfit(lab, path: Path) -> None:
    """Left: the unregularised run's training and validation loss, its best epoch and where early stopping stopped.
    Right: validation (solid) and training (dashed) loss of every run."""
    fig, (left, right) = plots.subplots(1, 2, figsize=(12, 4.2))
    base, e = next(iter(lab.curves.values())), lab.early_stop
    epochs = range(1, len(base.val_loss) + 1)
    left.plot(epochs, base.train_loss, color="C0", label="training subset (eval mode), log scale")
    left.set(title="no regularisation", xlabel="epoch", ylabel="training loss", yscale="log")
    val = left.twinx()  # a linear axis of its own, so the turn-up of the validation loss shows
    val.plot(epochs, base.val_loss, color="C1", label="validation, linear scale (first epochs off the top)")
    val.set(ylabel="validation loss", ylim=(0.95 * min(base.val_loss), 1.15 * base.val_loss[-1]))
    for ax, x, style, label in ((val, base.best_epoch, ":", f"lowest validation loss (epoch {base.best_epoch})"),
                                (val, e.stopped_after_epoch, "--", f"early stop, patience {e.patience} "
                                                                   f"(epoch {e.stopped_after_epoch})")):
        ax.axvline(x, color="green" if style == ":" else "red", ls=style, label=label)
    left.legend(*[sum(pair, []) for pair in zip(left.get_legend_handles_labels(), val.get_legend_handles_labels())],
                fontsize=7, loc="upper center", framealpha=0.9)
    for i, c in enumerate(lab.curves.values()):
        right.plot(epochs, c.val_loss, color=f"C{i}", label=f"{c.name}: gap {c.gap:.2f}")
        right.plot(epochs, c.train_loss, color=f"C{i}", ls="--", lw=0.8)
    right.set(title="validation (solid) and training (dashed) loss", xlabel="epoch", yscale="log")
    right.legend(fontsize=8)
    plots.save(fig, path)
