"""Day 5's evidence and report: the augmentation runs compared, what the worker-timing table means, the table itself
(Markdown + CSV), its bar chart, the grid of augmented digits, and the collate and augmentation demos' table
(`results/demos.md`)."""
import csv
from pathlib import Path

import numpy as np
import torch

from sprint import markdown_table
from sprint.plots import save, subplots


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return (a.int() - b.int()).abs().max().item()  # in int: uint8 subtraction would wrap around


def augmentation_report(run1: list, run2: list, other_seed: list) -> dict:
    """Compare three runs of `augmentation_batches` (lists of (worker id, images)): seed s, seed s again, seed s+1."""
    (_, a), (_, b) = run1[:2]  # worker 0's batch and worker 1's batch
    return {
        "workers": [w for w, _ in run1],
        "max_diff_between_runs": max(max_abs_diff(x, y) for (_, x), (_, y) in zip(run1, run2)),
        "max_diff_between_workers": max_abs_diff(a, b),  # same source image, same positions in the batch
        "max_diff_between_seeds": max(max_abs_diff(x, y) for (_, x), (_, y) in zip(run1, other_seed)),
        "images": torch.cat([x for _, x in run1]),
        "image_workers": [w for w, x in run1 for _ in range(len(x))],
    }


def interpret(timing: dict) -> str:
    """What the table means on this machine, computed from the figures themselves."""
    rows = {r["num_workers"]: r for r in timing["rows"]}
    cores = timing["cpu_count"]
    lines = [f"Measured on {cores} CPU cores, {timing['samples']:,} samples per epoch, batch {timing['batch_size']}, "
             f"{timing['threads']} intra-op thread(s) in the training process, device {timing['device']}."]
    if 0 in rows:
        for n in sorted(rows)[1:]:
            speedup = rows[0]["train_epoch_s"] / rows[n]["train_epoch_s"]
            lines.append(f"- num_workers={n}: training epoch {speedup:.2f}x as fast as num_workers=0 (data only: "
                         f"{rows[n]['data_samples_per_s'] / rows[0]['data_samples_per_s']:.2f}x).")
    above = [n for n in rows if n > cores]
    if cores in rows and above:
        lines.append(beyond_the_cores(rows, cores, max(above)))
    producer = max(r["data_samples_per_s"] for r in timing["rows"])
    consumer = timing["model_only_samples_per_s"]
    bound = "the data pipeline (per-sample augmentation)" if producer < consumer else "the model step"
    lines.append(f"- The fastest loader produces {producer:,} samples/s; the training step alone consumes {consumer:,} "
                 f"samples/s, so an epoch here is bound by {bound}.")
    step_s = timing["samples"] / consumer
    slowest = max(timing["rows"], key=lambda r: r["train_epoch_s"] / (r["data_epoch_s"] + step_s))
    overhead = slowest["train_epoch_s"] / (slowest["data_epoch_s"] + step_s)
    if overhead > 1.5:
        lines.append(f"- num_workers={slowest['num_workers']}: the training epoch took {overhead:.1f}x the data-only "
                     f"epoch plus the step alone. The training process's {timing['threads']} intra-op threads "
                     f"wait on each other whenever a core is busy elsewhere (workers, other jobs); "
                     f"`--threads 1` avoids it.")
    lines.append("- Rule of thumb: start from num_workers = min(8, cores // 2), keep persistent_workers=True, and "
                 "measure; add workers only while the data-only rate stays below the training step's rate.")
    return "\n".join(lines)


SAME = 0.05  # a ratio within 5% of 1: "no faster, no slower" (one run on a shared machine)


def beyond_the_cores(rows: dict, cores: int, n: int) -> str:
    """What going from `cores` workers to `n` (> cores) did, column by column: the sentence says what the figures
    say, whichever way they point."""
    data = rows[n]["data_samples_per_s"] / rows[cores]["data_samples_per_s"]
    training = rows[cores]["train_epoch_s"] / rows[n]["train_epoch_s"]

    def moved(ratio: float) -> str:
        if abs(ratio - 1) <= SAME:
            return "no faster"
        return f"{ratio - 1:.0%} faster" if ratio > 1 else f"{1 - ratio:.0%} slower"

    line = (f"- num_workers={n} vs {cores} (the core count): the data-only rate {data:.2f}x ({moved(data)}), the "
            f"training epoch {training:.2f}x ({moved(training)}).")
    if data - 1 <= SAME:
        line += (f" Producing batches got no faster: past the core count the workers only time-share the {cores} "
                 "cores, so the loader's own rate is capped there.")
    else:
        line += (f" The loader itself got faster past the core count, which the {cores} cores cannot explain: more "
                 "processes also win a larger share of a CPU that other jobs use.")
    if training - 1 > SAME:
        first = rows[0]["train_epoch_s"] / rows[cores]["train_epoch_s"] if 0 in rows else None
        than = "" if first is None else (f", {'less' if training < first else 'more'} than the {first:.2f}x from 0 to "
                                         f"{cores} workers")
        line += (f" The training epoch still gained{than}. Extra workers add no compute; what they can add is more "
                 "batches queued ahead (prefetch_factor each) for the moments the training loop holds a core, and a "
                 "larger share of a CPU that other jobs use (one run cannot tell which).")
    elif training < 1 - SAME:
        line += " The training epoch got slower: more processes than cores, each taking turns with the training loop."
    return line


def timing_table(timing: dict) -> str:
    """The worker-timing table (Markdown) and the model step's rate."""
    header = ["num_workers", "first batch (s)", "data-only epoch (s)", "data-only samples/s", "training epoch (s)",
              "training samples/s", "each sample once"]
    md = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    md += ["| " + " | ".join(str(v) for v in r.values()) + " |" for r in timing["rows"]]
    md.append(f"\nModel step alone (batches in memory): {timing['model_only_samples_per_s']:,} samples/s.\n")
    md.append(f"What the table says, computed from its figures (`report.interpret`):\n\n{interpret(timing)}\n")
    return "\n".join(md)


def write_timing(timing: dict, out_dir: Path) -> None:
    """worker_timing.csv and .md (the table and what it means) and the chart."""
    rows = timing["rows"]
    with open(out_dir / "worker_timing.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out_dir / "worker_timing.md").write_text(timing_table(timing))

    labels = [str(r["num_workers"]) for r in rows]
    pos = np.arange(len(rows))
    fig, (ax1, ax2) = subplots(1, 2, figsize=(10, 4))
    ax1.bar(pos - 0.2, [r["data_epoch_s"] for r in rows], 0.4, label="data only (incl. worker start)")
    ax1.bar(pos + 0.2, [r["train_epoch_s"] for r in rows], 0.4, label="data + training step")
    ax1.set(title=f"one epoch ({timing['samples']:,} samples)", xlabel="num_workers", ylabel="seconds",
            xticks=pos, xticklabels=labels)
    ax1.legend()
    ax2.bar(pos - 0.2, [r["data_samples_per_s"] for r in rows], 0.4, label="data only")
    ax2.bar(pos + 0.2, [r["train_samples_per_s"] for r in rows], 0.4, label="data + training step")
    ax2.axhline(timing["model_only_samples_per_s"], color="gray", ls="--", label="training step alone")
    ax2.set(title=f"throughput on {timing['cpu_count']} CPU cores", xlabel="num_workers", ylabel="samples/s",
            xticks=pos, xticklabels=labels)
    ax2.legend()
    save(fig, out_dir / "worker_timing.png")


def plot_augmentations(original: torch.Tensor, aug: dict, path: Path) -> None:
    images = [original] + list(aug["images"])
    titles = ["original"] + [f"worker {w}" for w in aug["image_workers"]]
    fig, axes = subplots(1, len(images), figsize=(1.5 * len(images), 1.9))
    for ax, img, title in zip(axes, images, titles):
        ax.imshow(img[0], cmap="gray")
        ax.set_title(title, fontsize=8)
        ax.axis("off")
    save(fig, path)


def demos_table(demos: dict) -> str:
    """The collate and augmentation demos (`results/demos.md`): the real `default_collate` error, the padded batch,
    and training image 0 augmented in 2 workers, seed 0 twice, then seed 1."""
    lengths = ", ".join(map(str, demos["lengths"]))
    rows = [[f"`default_collate` on three byte-encoded sentences of lengths {lengths}",
             f"`{demos['default_collate_error']}`"],
            ["`pad_collate` on the same three", f"`padded` of shape {tuple(demos['padded_shape'])}, `lengths` "
                                                f"{demos['lengths']}"],
            ["image 0 augmented, two runs with seed 0: max pixel difference", f"{demos['max_diff_between_runs']:.0f}"],
            ["worker 0 against worker 1: max pixel difference", f"{demos['max_diff_between_workers']:.0f}"],
            ["seed 0 against seed 1: max pixel difference", f"{demos['max_diff_between_seeds']:.0f}"]]
    return markdown_table(["demo", "measured"], rows) + "\n"
