"""Day 6 report writers: the overlay plot of the killed-and-resumed processes, the optimizer-state table, and the
machine the figures were measured on."""
import os
import platform
from pathlib import Path

from day06_ckpt_resume.checkpoint import read_metrics
from sprint import plots


def machine() -> str:
    """CPU model and core count (Linux names the model in /proc/cpuinfo), for the summary next to the timings."""
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.processor() or platform.machine()
    return f"{model}, {os.cpu_count()} cores"


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

