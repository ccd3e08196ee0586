"""Day 10's report: the Markdown tables and the plot that README shows, built from `main.run()`'s figures."""
from pathlib import Path

MiB = 2**20


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for mode, values in result["saved_bytes"].items():
        ax.plot(result["batches"], [v / MiB for v in values], "o-", label=mode)
    ax.axhline(result["budget_bytes"] / MiB, color="gray", ls="--",
               label=f"activation budget ({result['budget_bytes'] / MiB:g} MiB)")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="bytes saved for backward (MiB)",
           title="Activation memory vs batch (tiny GPT, saved-tensor hook)")
    ax.set_xticks(result["batches"], [str(b) for b in result["batches"]])
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(result: dict) -> str:
    """The Markdown tables README shows."""
    batches, MODES = result["batches"], list(result["saved_bytes"])
    lines = ["| batch | " + " | ".join(f"{m} (MiB)" for m in MODES) + " |", "|---:|" + "---:|" * len(MODES)]
    for i, b in enumerate(batches):
        lines.append(f"| {b} | " + " | ".join(f"{result['saved_bytes'][m][i] / MiB:.2f}" for m in MODES) + " |")
    if "cuda_peak_bytes" in result:
        lines += ["", "CUDA, torch.cuda.max_memory_allocated() during the forward pass (MiB):", "",
                  "| batch | " + " | ".join(MODES) + " |", "|---:|" + "---:|" * len(MODES)]
        for i, b in enumerate(batches):
            lines.append(f"| {b} | " + " | ".join(f"{result['cuda_peak_bytes'][m][i] / MiB:.2f}" for m in MODES)
                         + " |")
    fp32, ckpt = result["saved_bytes"]["fp32"], result["saved_bytes"]["fp32 + checkpoint"]
    t = result["step_seconds"]
    lines += ["", f"- checkpointing keeps {1 - ckpt[-1] / fp32[-1]:.1%} less activation memory at batch "
              f"{batches[-1]}; bf16 autocast {1 - result['saved_bytes']['bf16 autocast'][-1] / fp32[-1]:.1%} less.",
              f"- largest batch within {result['budget_bytes'] / MiB:.0f} MiB of activations: "
              f"{result['largest_batch']['fp32']} without checkpointing, "
              f"{result['largest_batch']['fp32 + checkpoint']} with it.",
              f"- forward + backward at batch {result['time_batch']}: fp32 {t['fp32'] * 1e3:.1f} ms, with "
              f"checkpointing {t['fp32 + checkpoint'] * 1e3:.1f} ms (x{t['fp32 + checkpoint'] / t['fp32']:.2f}), "
              f"bf16 autocast {t['bf16 autocast'] * 1e3:.1f} ms (x{t['bf16 autocast'] / t['fp32']:.2f}).",
              f"- checkpointed gradients vs plain: max |diff| / (atol + rtol*|ref|) = "
              f"{result['grad_allclose_ratio']:.3g} (<= 1 means torch.allclose).", "",
              "| batch | measured per block (bytes) | Megatron s*b*h*(34+5as/h) | measured / predicted | "
              "measured / (predicted + mask & LayerNorm extras) |", "|---:|---:|---:|---:|---:|"]
    for r in result["megatron"]:
        lines.append(f"| {r['batch']} | {r['measured_per_layer']:,.0f} | {r['predicted_per_layer']:,.0f} | "
                     f"{r['ratio']:.3f} | {r['explained_ratio']:.3f} |")
    return "\n".join(lines)
