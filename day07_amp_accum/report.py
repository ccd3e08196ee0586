"""Day 7 report writers: the precision table (Markdown) and its bar plot."""
from pathlib import Path

from sprint import plots


def write_table(rows: list[dict], ranges: dict, path: Path) -> None:
    fp32 = rows[0]
    on_cuda = fp32.cuda_peak_bytes is not None
    lines = [f"Device: {fp32.hardware}.", "",
             f"MLP 784-{fp32.hidden}-10, batch {fp32.batch}, one optimizer step (forward + loss + backward + "
             "AdamW), no accumulation.", "",
             "| precision | step time, median (ms) | × fp32 | bytes saved for backward (KiB) | × fp32 "
             "| params + grads + AdamW state (KiB) | CUDA peak allocated (KiB) | matmul 256³ (GFLOP/s) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        peak = f"{r.cuda_peak_bytes / 1024:.0f}" if on_cuda else "n/a (CPU)"
        lines.append(f"| {r.precision} | {r.step_ms:.2f} | {r.step_ms / fp32.step_ms:.2f} "
                     f"| {r.saved_bytes / 1024:.0f} | {r.saved_bytes / fp32.saved_bytes:.2f} "
                     f"| {r.state_bytes / 1024:.0f} | {peak} | {r.matmul_gflops:.1f} |")
    lines += ["", "What each column measures:",
              "- *step time*: wall time of one `AmpTrainer.train_step` (median of repeated steps on one batch).",
              "- *bytes saved for backward*: tensors autograd keeps for the backward pass, captured with "
              "`torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters excluded (autocast's "
              "low-precision weight copies included). This is the activation memory AMP can shrink.",
              "- *params + grads + AdamW state*: `nbytes` of every parameter, gradient and optimizer-state tensor "
              "after a step. Autocast leaves all of them fp32.",
              "- *CUDA peak allocated*: `torch.cuda.max_memory_allocated()` during one step (CUDA only).",
              "- *matmul*: a 256×256 matmul under the same autocast setting, median of 5 after a warm-up.", "",
              "| range check | value |", "| --- | ---: |",
              f"| 70000 through an fp16 autocast matmul | {ranges.fp16_70000} |",
              f"| 70000 through a bf16 autocast matmul | {ranges.bf16_70000} |",
              f"| weight gradients that are 0, fp32 (gradients of 2⁻²⁸) | {ranges.zero_fraction_fp32:.3f} |",
              f"| ... fp16 autocast, no loss scaling | {ranges.zero_fraction_fp16_unscaled:.3f} |",
              f"| ... fp16 autocast, GradScaler (scale 2¹⁶) | {ranges.zero_fraction_fp16_scaled:.3f} |",
              f"| relative error of the scaled fp16 gradients vs fp32 | {ranges.rel_error_fp16_scaled:.1e} |"]
    path.write_text("\n".join(lines) + "\n")


def plot_table(rows: list[dict], path: Path) -> None:
    names = [r.precision for r in rows]
    fig, axes = plots.subplots(1, 3, figsize=(12, 3.6))
    panels = [("step_ms", "step time (ms, median)"),
              ("saved_bytes", "bytes saved for backward (KiB)\nsaved_tensors_hooks, parameters excluded"),
              ("state_bytes", "params + grads + AdamW state (KiB)")]
    for ax, (key, title) in zip(axes, panels):
        values = [getattr(r, key) / (1024 if key != "step_ms" else 1) for r in rows]
        ax.bar(names, values, color=["tab:gray", "tab:orange", "tab:blue"])
        ax.set_title(title, fontsize=9)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle(f"one training step of the MLP (batch {rows[0].batch}) on {rows[0].hardware}", fontsize=8)
    plots.save(fig, path)

