"""Day 7 report writers: the precision table (Markdown), its bar plot, the optimisation lab's tables and plot, and the
training run's table (`results/training.md`)."""
from pathlib import Path

from sprint import markdown_table, plots


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


def write_optim_table(lab, path: Path) -> None:
    """The optimisation lab (an optim_lab.Lab) as Markdown tables."""
    cfg, c = lab.config, lab.clip
    seeds = ", ".join(map(str, cfg.seeds))
    rows = [f"Day 4 MLP (hidden {cfg.hidden}, no Dropout), AdamW unless noted, one epoch of {cfg.subset} training "
            f"images; validation loss on 5,000 held-out images. Seeds {seeds}.", "",
            f"**Warmup** (peak LR {cfg.high_lr:g}, batch {cfg.batch}, cosine to 5%):", "",
            "| run | " + " | ".join(f"val loss, seed {s}" for s in cfg.seeds) + " |",
            "| --- |" + " ---: |" * len(cfg.seeds)]
    rows += [f"| {name} | " + " | ".join(f"{r.val_loss:.4f}" for r in runs) + " |" for name, runs in lab.warmup.items()]
    rows += ["", f"**clip_grad_norm_** (max_norm {c.max_norm:g}, one batch's gradients × 100):", "",
             "| figure | value |", "| --- | ---: |",
             f"| global norm before, computed by hand | {c.norm_before:.6f} |",
             f"| value returned by clip_grad_norm_ | {c.returned:.6f} |",
             f"| global norm after | {c.norm_after:.6f} |",
             f"| cosine(before, after) | {c.cosine_before_after:.8f} |",
             f"| gradients below max_norm (norm {c.small_returned:.3f}) left unchanged | {c.small_unchanged} |",
             "", f"**Clipping order with fp16 + GradScaler (scale 2¹⁶)**, batch {cfg.batch}, seed {cfg.seeds[0]}:",
             "",
             "| optimizer | order | mean gradient norm handed to the optimizer | val loss | val acc |",
             "| --- | --- | ---: | ---: | ---: |"]
    for opt, runs in lab.clip_order.items():
        rows += [f"| {opt} | {order} | {r.post_clip_norm:.3g} | {r.val_loss:.4f} | {r.val_acc:.2%} |"
                 for order, r in runs.items()]
    rows += ["", f"**LR scaling**, batch {cfg.base_batch} → {4 * cfg.base_batch} (same epoch, 4× fewer steps):", "",
             "| run | " + " | ".join(f"val loss, seed {s}" for s in cfg.seeds) + " |",
             "| --- |" + " ---: |" * len(cfg.seeds)]
    rows += [f"| {name} | " + " | ".join(f"{r.val_loss:.4f}" for r in runs) + " |"
             for name, runs in lab.scaling.items()]
    rows += ["", "Closest to the batch-32 run, per seed: " + "; ".join(lab.scaling_closest) + "."]
    d = lab.decay
    rows += ["", f"**Weight decay, decoupled or not** (λ {d.weight_decay:g} on the weight matrices, LR "
             f"{cfg.adamw_lr:g}, batch {cfg.batch}, warmup + cosine, seed {cfg.seeds[0]}):", "",
             "| run | val loss | ‖fc1.weight‖ | mean LayerNorm gain |", "| --- | ---: | ---: | ---: |"]
    rows += [f"| {name} | {r.val_loss:.4f} | {r.fc1_norm:.3f} | {r.gain_mean:.4f} |" for name, r in d.runs.items()]
    rows += ["", "| optimizer | ‖fc1‖ kept against no decay: weights with large gradients (v above the median) | "
             "with small gradients | large / small | loss ×{:g}: largest relative change of the final weights |"
             .format(d.loss_scale), "| --- | ---: | ---: | ---: | ---: |"]
    rows += [f"| {name} | {high:.4f} | {low:.4f} | {high / low:.2f} | {d.scale_change[name]:.2g} |"
             for name, (high, low) in d.shrink.items()]
    rows += ["", f"AdamW's decay alone, ∏(1 − LR·λ) over the {len(lab.schedule_lr)} steps: {d.decoupled_factor:.5f}.",
             "", f"**No-decay group** (Day 6's `decay_groups`): decayed {', '.join(d.groups['decay'])}; not decayed "
             f"{', '.join(d.groups['no decay'])}.", "",
             "| λ | seed | val loss, no-decay group | val loss, decay on every parameter | difference | mean LayerNorm "
             "gain, no-decay group / every parameter |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    rows += [f"| {a['weight_decay']:g} | {a['seed']} | {a['group_val_loss']:.4f} | {a['all_val_loss']:.4f} | "
             f"{a['all_val_loss'] - a['group_val_loss']:+.4f} | {a['group_gain_mean']:.4f} / {a['all_gain_mean']:.4f} |"
             for a in d.ablation]
    path.write_text("\n".join(rows) + "\n")


def plot_optim(lab, path: Path) -> None:
    """The schedule, the warmup comparison (training loss), the clipping order and the LR-scaling runs."""
    fig, axes = plots.subplots(1, 5, figsize=(21, 3.8))
    axes[0].plot(range(len(lab.schedule_lr)), lab.schedule_lr)
    axes[0].set(title=f"warmup_cosine: {lab.config.warmup_steps} warmup steps", xlabel="step", ylabel="LR / peak LR")
    for name, runs in lab.warmup.items():
        axes[1].plot(runs[0].losses, label=f"{name}: val {runs[0].val_loss:.3f}")
    axes[1].set(title=f"peak LR {lab.config.high_lr:g}, seed {lab.config.seeds[0]}", xlabel="step",
                ylabel="training loss", yscale="log")
    axes[1].legend(fontsize=8)
    names = [f"{opt}\n{order}" for opt, runs in lab.clip_order.items() for order in runs]
    values = [r.val_loss for runs in lab.clip_order.values() for r in runs.values()]
    axes[2].bar(range(len(values)), values, color=["tab:blue", "tab:red"] * 2)
    axes[2].set_xticks(range(len(values)), names, fontsize=6)
    axes[2].set(title="fp16: unscale_ then clip, or the reverse", ylabel="validation loss")
    for name, runs in lab.scaling.items():
        seen = [(i + 1) / len(runs[0].losses) for i in range(len(runs[0].losses))]  # batch 128 takes 4x fewer steps
        axes[3].plot(seen, runs[0].losses, label=f"{name}: val {runs[0].val_loss:.3f}", lw=0.9)
    axes[3].set(title="batch x4: which LR rule", xlabel="fraction of the epoch", ylabel="training loss",
                yscale="log")
    axes[3].legend(fontsize=7)
    d = lab.decay
    for i, (name, (high, low)) in enumerate(d.shrink.items()):
        axes[4].bar([3 * i, 3 * i + 1], [high, low], color=["tab:blue", "tab:orange"],
                    label=["large gradients", "small gradients"] if i == 0 else None)
    axes[4].set_xticks([0.5, 3.5], list(d.shrink))
    axes[4].set(title=f"weight decay λ {d.weight_decay:g}: ‖fc1‖ kept against no decay", ylabel="norm ratio")
    axes[4].legend(fontsize=7)
    plots.save(fig, path)


def by_precision(summary: dict) -> dict:
    """The precision table of a `summary.json`, by its `amp` column (off, fp16, bf16)."""
    return {row["amp"]: row for row in summary["table"]}


def training_table(summary: dict) -> str:
    """The bf16 training run of `main.py` (`summary.json`'s `training`) as Markdown (`results/training.md`)."""
    training, cfg = summary["training"], summary["config"]
    rows = [["precision, micro-batches × size", f"{cfg['amp']}, {cfg['accum']} × {cfg['batch_size'] // cfg['accum']}"],
            ["optimizer steps", training["step"]], ["best validation loss", f"{training['best_val']:.4f}"],
            ["test accuracy of `best.pt`", f"**{training['test_acc']:.2%}**"],
            ["wall time of the whole command (s)", f"{summary['wall_s']:.0f}"]]
    return markdown_table(["the training run", "value"], rows) + "\n"
