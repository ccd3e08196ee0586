"""Day 11's report: the generated conclusion, the Markdown report and the chart, built from `main.run_study()`."""
import textwrap
from pathlib import Path

import torch

from day11_profile.main import BANDS, HERE, LABELS


def headline(study: dict) -> dict:
    """The figures the report states, formatted once (the gates look for exactly these strings in the report)."""
    naive, best = study["stages"][0], study["stages"][-1]
    synced, unsynced = study["stages"][-2], study["stages"][-1]
    trace = study["profiles"]["naive"]["ranges_ms"]
    return {
        "naive verdict": naive["verdict"],
        "optimised verdict": best["verdict"],
        "naive data/step": f"{naive['ratio']:.0%}",
        "optimised data/step": f"{best['ratio']:.1%}",
        "naive epoch": f"{naive['epoch_s']:.1f} s",
        "optimised epoch": f"{best['epoch_s']:.1f} s",
        "naive samples/s": f"{naive['samples_per_s']:,.0f}",
        "optimised samples/s": f"{best['samples_per_s']:,.0f}",
        "speed-up": f"{study['speedup']:.1f}×",
        "data share of a profiled naive step": f"{trace['data'] / trace['step']:.0%}",
        "host sync per step": f"{synced['item_us_per_step']:.1f} µs",
        "host sync share": f"{100 * synced['item_share']:.2g}%",
        "samples/s without per-step sync": f"{unsynced['samples_per_s'] / synced['samples_per_s']:.2f}×",
    }


def conclusion(study: dict) -> str:
    """The verdict, why, what changed and by how much — in words built from the figures."""
    s, h = study["stages"], headline(study)
    naive = s[0]
    gains = ", then ".join(f"{b['name'].lstrip('+ ')} ×{b['samples_per_s'] / a['samples_per_s']:.2f}"
                           for a, b in zip(s, s[1:]))
    where = "on the device" if study["device"] != "cpu" else "in memory"
    sync_note = ("costs next to nothing on a CPU, where there is no queue of device work to wait for; on a GPU it "
                 "stops the host from queueing the next kernels" if study["device"] == "cpu" else
                 "makes the host wait until the device has drained its queue, every step")
    synced, measured = s[-2], s[-1]["samples_per_s"] / s[-2]["samples_per_s"]
    explained = 1 / (1 - synced["item_share"])  # the gain that removing the time spent inside .item() would give
    if abs(measured / explained - 1) > 0.1:
        sync_note += (f". The time inside `.item()` accounts for ×{explained:.2f} of the ×{measured:.2f} measured "
                      "for that change: the rest is run-to-run variation")
    return (
        f"**Before: {h['naive verdict']}.** Fetching a batch of {naive['batch_size']} (decoding and transforming every "
        f"image in the training process) took {naive['data_ms']:.1f} ms against {naive['step_ms']:.1f} ms for the "
        f"training step: data/step = {h['naive data/step']}. In the profiler's trace the `data` range is "
        f"{h['data share of a profiled naive step']} of a profiled step, and its top self-time ops are "
        f"{', '.join(f'`{name}`' for name, _ in study['profiles']['naive']['hot_ops'])}.\n\n"
        f"**What changed, one thing at a time:** {gains} (samples/s). Preparing the tensors once and keeping them "
        f"{where} removes the per-sample work; a bigger batch amortises the per-step overhead; a per-step `.item()` "
        f"(a host sync, {h['host sync per step']} per step here, {h['host sync share']} of the loop) {sync_note}.\n\n"
        f"**After: {h['optimised verdict']}** (data/step = {h['optimised data/step']}). An epoch takes "
        f"{h['optimised epoch']} instead of {h['naive epoch']} ({h['naive samples/s']} → {h['optimised samples/s']} "
        f"samples/s): **{h['speed-up']} faster**, measured in the same run on the same samples."
    )


def write_report(study: dict, path: Path, chart: Path) -> None:
    h = headline(study)
    rows = ["| stage | batch | data/step | verdict | samples/s | epoch (s) | speed-up | `.item()` µs/step "
            "| cores busy | compute share |", "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for s in study["stages"]:
        rows.append(f"| {s['name']} | {s['batch_size']} | {s['ratio']:.1%} | {s['verdict']} | "
                    f"{s['samples_per_s']:,.0f} | {s['epoch_s']:.1f} | "
                    f"{s['samples_per_s'] / study['stages'][0]['samples_per_s']:.1f}× | "
                    f"{s['item_us_per_step']:.1f} | {s['cores_busy']:.2f} | {s['compute_share']:.0%} |")
    ranges = ["| pipeline | " + " | ".join(LABELS) + " | whole step |", "|---|" + "---:|" * (len(LABELS) + 1)]
    for name, prof in study["profiles"].items():
        ms = prof["ranges_ms"]
        ranges.append(f"| {name} | " + " | ".join(f"{ms[k]:.2f}" for k in (*LABELS, "step")) + " |")
    bands = ["| data/step | verdict | what to do |", "|---|---|---|"]
    bands += [f"| [{lo:.0%}, {hi:.0%}) | {v} | {advice} |".replace("inf%", "∞")
              for (hi, v, advice), lo in zip(BANDS, [0.0] + [b[0] for b in BANDS])]
    workload = ("one epoch" if study["max_samples"] is None else
                f"the first {study['max_samples']:,} samples of an epoch (--max-samples)")
    util = study["gpu_utilisation"]
    util_text = (f"GPU utilisation (NVML, mean while each pipeline ran): naive {util['naive']}%, optimised "
                 f"{util['optimised']}%." if util else
                 f"No CUDA GPU here ({study['device']}): instead of GPU utilisation the table shows *compute share* "
                 "(step time / (data + step) time from the phase measurement: the fraction of the loop spent "
                 "computing) and *cores busy* (process CPU time / wall time during the timed epoch).")
    text = "\n".join([
        "# Day 11 — profile, find the bottleneck, fix it", "",
        f"Measured on `{study['device']}` (torch.get_num_threads() = {study['threads']}) with torch {torch.__version__}: each "
        f"stage trains Day 4's MLP (AdamW) on {workload} after one untimed warm-up batch. Data/step compares the "
        f"fastest of {study['phase_batches']} batches for each phase, timed separately (waiting for the device after "
        "each). Epoch time = 60,000 / samples/s.", "",
        "## Conclusion", "", conclusion(study), "",
        "## Before → after, one change at a time", "", *rows, "", util_text, "",
        f"![samples/s and time per 1,000 samples by stage]({chart.name})", "",
        f"Host sync: `.item()` every step cost {h['host sync per step']} per step; removing it changed "
        f"samples/s by {h['samples/s without per-step sync']}.", "",
        "## Profiler: mean ms per labelled range (read back from the traces)", "", *ranges, "",
        "Traces (Chrome-trace JSON): " + ", ".join(f"`{shown(p['trace'])}`" for p in study["profiles"].values())
        + ". Open one in https://ui.perfetto.dev (drag the file in) or chrome://tracing.", "",
        "## Verdict bands (curriculum §9; 5–20% and 60–100% filled in here)", "", *bands, "",
    ])
    path.write_text(text)


def shown(path: Path) -> str:
    """`path` relative to the repo root when it lies inside it, as the report and README show it."""
    path, root = Path(path).resolve(), HERE.parent
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def plot(study: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = study["stages"]
    names = [textwrap.fill(s["name"], 14) for s in stages]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    bars = ax1.bar(names, [s["samples_per_s"] for s in stages], color=["tab:red"] + ["tab:blue"] * (len(stages) - 1))
    ax1.bar_label(bars, [f"×{s['samples_per_s'] / stages[0]['samples_per_s']:.1f}" for s in stages])
    ax1.set(title=f"training throughput ({study['device']})", ylabel="samples / s")
    data = [1e3 * s["data_ms"] / s["batch_size"] for s in stages]  # per 1,000 samples: batch sizes differ
    step = [1e3 * s["step_ms"] / s["batch_size"] for s in stages]
    ax2.bar(names, data, label="data (fetch a batch)", color="tab:orange")
    bars = ax2.bar(names, step, bottom=data, label="step (forward + backward + optimizer)", color="tab:green")
    ax2.bar_label(bars, [f"data/step {s['ratio']:.0%}" for s in stages])
    ax2.set(title="time per 1,000 samples, by phase", ylabel="ms")
    ax2.legend(loc="upper right")
    ax2.margins(y=0.35)  # room for the legend above the bar labels
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
