"""Day 10's report: the Markdown tables and the plot README shows, built from `main.run_study()`'s figures, plus
the memory calculator's 12 GB table and worked examples (every committed results file of the day but levers.*)."""
import json
from pathlib import Path

from day10_bigbatch_ckpt import memcalc, memcalc_examples
from sprint.plots import save, subplots

MiB = 2**20
FIGURES = {"saved_bytes": "saved for backward", "peak_bytes": "true peak (forward + backward)"}


def mib(x: float) -> str:
    return f"{x / MiB:.2f}"


def plot(result: dict, path: Path) -> None:
    fig, axes = subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (key, title) in zip(axes, FIGURES.items()):
        for mode, values in result[key].items():
            ax.plot(result["batches"], [v / MiB for v in values], "o-", label=mode)
        budget = result["budget_bytes"] / MiB
        ax.axhline(budget, color="gray", ls="--", label=f"budget ({budget:g} MiB)")
        ax.set(xscale="log", yscale="log", xlabel="batch size", title=f"{title}, tiny GPT")
        ax.set_xticks(result["batches"], [str(b) for b in result["batches"]])
        ax.minorticks_off()
    axes[0].set_ylabel("MiB")
    axes[0].legend()
    save(fig, path)


def report(result: dict) -> str:
    """The Markdown README shows: both memory figures per batch, what each claim uses, times, Megatron."""
    batches, modes = result["batches"], list(result["saved_bytes"])
    head = " | ".join(f"{m}: {short} (MiB)" for short in ("saved", "peak") for m in modes)
    lines = [f"Measured on {result['machine']}, torch {result['torch']}, device `{result['device']}`; "
             f"the whole run took {result['wall_s']:.1f} s.", "",
             f"| batch | {head} |", "|---:|" + "---:|" * 2 * len(modes)]
    for i, b in enumerate(batches):
        cells = [mib(result[key][m][i]) for key in FIGURES for m in modes]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    if "cuda_peak_bytes" in result:
        lines += ["", "CUDA, torch.cuda.max_memory_allocated() over forward + backward (MiB):", "",
                  "| batch | " + " | ".join(modes) + " |", "|---:|" + "---:|" * len(modes)]
        lines += [f"| {b} | " + " | ".join(mib(result["cuda_peak_bytes"][m][i]) for m in modes) + " |"
                  for i, b in enumerate(batches)]
    big, ckpt = batches[-1], "fp32 + checkpoint"
    cut = {key: 1 - result[key][ckpt][-1] / result[key]["fp32"][-1] for key in FIGURES}
    bf16 = {key: 1 - result[key]["bf16 autocast"][-1] / result[key]["fp32"][-1] for key in FIGURES}
    fwd = result["forward_peak_bytes"][ckpt][-1]
    lines += ["", f"- at batch {big}, checkpointing keeps {cut['saved_bytes']:.1%} fewer bytes for backward but cuts "
              f"the true peak by {cut['peak_bytes']:.1%}: the checkpointed peak ({mib(result['peak_bytes'][ckpt][-1])} "
              f"MiB) is set by one block's forward temporaries ({mib(fwd)} MiB already during the forward pass) and "
              "its recomputation in backward, which saved bytes never see.",
              f"- bf16 autocast: {bf16['saved_bytes']:.1%} fewer saved bytes, {bf16['peak_bytes']:.1%} lower peak."]
    for key, figure in (("peak_bytes", "true peak"), ("saved_bytes", "saved for backward")):
        fits = result["largest_batch"][figure]
        lines.append(f"- largest batch within {result['budget_bytes'] / MiB:g} MiB by the **{figure}**: "
                     + ", ".join(f"{m} {fits[m]}" for m in modes) + ".")
    if "profiler_peak_bytes" in result:
        lines.append(f"- cross-check at batch {big}: torch.profiler's allocation record peaks at "
                     + ", ".join(f"{mib(result['profiler_peak_bytes'][m])} MiB ({m})" for m in modes)
                     + ", against the live-allocation counter's "
                     + ", ".join(mib(result["peak_bytes"][m][-1]) for m in modes) + " MiB.")
    t = result["step_seconds"]
    lines += [f"- forward + backward at batch {result['time_batch']} (median): fp32 {t['fp32'] * 1e3:.1f} ms, "
              f"checkpointed {t[ckpt] * 1e3:.1f} ms (x{t[ckpt] / t['fp32']:.2f}), bf16 autocast "
              f"{t['bf16 autocast'] * 1e3:.1f} ms (x{t['bf16 autocast'] / t['fp32']:.2f}).",
              "- checkpointed gradients vs plain: max |diff| / (atol + rtol*|ref|) = "
              f"{result['grad_allclose_ratio']:.3g} (<= 1 means torch.allclose).", "",
              "| batch | measured per block (bytes) | Megatron s*b*h*(34+5as/h) | measured / predicted | "
              "measured / (predicted + mask & LayerNorm extras) |", "|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['batch']} | {r['measured_per_layer']:,.0f} | {r['predicted_per_layer']:,.0f} | {r['ratio']:.3f} | "
              f"{r['explained_ratio']:.3f} |" for r in result["megatron"]]
    return "\n".join(lines)


def write(result: dict, out: Path) -> str:
    """Every results file of main.py into `out`; returns the report it printed."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = report(result)
    plot(result, out / "memory_vs_batch.png")
    (out / "memory_vs_batch.md").write_text(text + "\n")
    (out / "memory_table_12gb.md").write_text(memcalc.table_markdown(memcalc.table_12gb()) + "\n")
    (out / "memcalc_examples.md").write_text(memcalc_examples.markdown(memcalc_examples.run_all()) + "\n")
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    return text + f"\n\nwrote {out}/memory_vs_batch.png, memory_vs_batch.md, memory_table_12gb.md, " \
                  "memcalc_examples.md, summary.json"
