"""Day 4 benchmark: the main job against a plain reference MLP, both timed from launch, in one run.

Each command runs as a fresh subprocess, one at a time, and its clock starts just before the launch, so Python's
start-up, `import torch` and loading MNIST all count. For `python day04_mlp_mnist/main.py` the bench records when
the line with the final test accuracy arrives and when the process exits; for `reference.py` (784-512-256 ReLU,
AdamW 2e-3, batch 256, linear decay) it records when the first test evaluation above 98% arrives, then stops it.
When the reference gets there depends on its decay length and on how often it looks, so it runs with several
lengths, evaluating the test set once per epoch (a plain script) and 4 times per epoch (stricter: it can stop
sooner), and the main job is compared with the soonest of each. Ratio = the main job's final-accuracy time /
the reference's first time above 98%.

Run:  python day04_mlp_mnist/bench.py    (writes runs/day04_mlp_mnist/bench.md and bench.json)
"""
import contextlib
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

from sprint import machine, runs_dir, write_results
from sprint.cli import UserError, arg, parse, progress, run, validate

HERE = Path(__file__).resolve().parent
GOAL = 0.98


@dataclass
class Config:
    seeds: tuple[int, ...] = arg((0, 1), "seeds: one main-job run and one run per reference setting for each", ge=0)
    ref_epochs: tuple[int, ...] = arg((3, 5), "lengths of the reference's linear decay, in epochs", gt=0)
    ref_evals: tuple[int, ...] = arg((1, 4), "test evaluations per epoch of the reference", gt=0, le=234)

    def __post_init__(self):
        validate(self)


def timed_lines(cmd: list[str]):
    """Launch `cmd` and yield (seconds since launch, line) for each line it prints; the caller may stop early."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-u", *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            yield time.perf_counter() - t0, line
        if proc.wait() != 0:
            raise UserError(f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n{''.join(lines[-20:])}")
        yield time.perf_counter() - t0, None  # the process has exited
    finally:
        proc.kill()  # a no-op after a normal exit; stops the reference once it has passed 98%
        proc.wait()


def main_job(seed: int) -> dict:
    cmd = [str(HERE / "main.py"), "--seed", str(seed)]
    with tempfile.TemporaryDirectory() as out, contextlib.closing(timed_lines([*cmd, "--out", out])) as lines:
        final_s = None
        for seconds, line in lines:
            if line is not None and line.startswith("test accuracy"):
                final_s = seconds
            elif line is None:
                summary = json.loads((Path(out) / "summary.json").read_text())
                return {"seed": seed, "final_acc_s": final_s, "exit_s": seconds, "test_acc": summary["test_acc"],
                        "epochs": summary["config"]["epochs"]}


def reference(seed: int, epochs: int, evals: int) -> dict:
    cmd = [str(HERE / "reference.py"), "--seed", str(seed), "--epochs", str(epochs), "--evals-per-epoch", str(evals)]
    with contextlib.closing(timed_lines(cmd)) as lines:
        for seconds, line in lines:
            match = re.fullmatch(r"([\d.]+) ([\d.]+)\n", line or "")
            if match and float(match[2]) > GOAL:  # stop it here: closing the generator kills the process
                return {"seed": seed, "epochs": epochs, "evals_per_epoch": evals, "first_98_s": seconds,
                        "at_epoch": float(match[1]), "acc": float(match[2])}
    return {"seed": seed, "epochs": epochs, "evals_per_epoch": evals, "first_98_s": None, "at_epoch": None, "acc": None}


def soonest(refs: list[dict], evals: int) -> float | None:
    times = [r["first_98_s"] for r in refs if r["evals_per_epoch"] == evals and r["first_98_s"] is not None]
    return min(times, default=None)


def report(rows: list[dict], evals: tuple[int, ...]) -> str:
    lines = ["| seed | main job: final test accuracy | final accuracy printed (s) | process exit (s) |",
             "|---|---|---|---|"]
    lines += [f"| {r['main']['seed']} | {100 * r['main']['test_acc']:.2f}% | {r['main']['final_acc_s']:.1f} | "
              f"{r['main']['exit_s']:.1f} |" for r in rows]
    lines += ["", "| seed | reference: decay (epochs) | test evaluations per epoch | first above 98% (s) | at epoch | "
                  "ratio main job / reference |", "|---|---|---|---|---|---|"]
    for r in rows:
        for ref in r["references"]:
            passed = ref["first_98_s"] is not None
            first = f"{ref['first_98_s']:.1f} | {ref['at_epoch']:g}" if passed else "never | -"
            ratio = f"{r['main']['final_acc_s'] / ref['first_98_s']:.2f}" if passed else "-"
            lines.append(f"| {r['main']['seed']} | {ref['epochs']} | {ref['evals_per_epoch']} | {first} | {ratio} |")
    lines.append("")
    for n in evals:
        ratios = [r["ratios"][n] for r in rows if r["ratios"][n]]
        per_seed = ", ".join(f"seed {r['main']['seed']}: {r['ratios'][n]:.2f}" for r in rows if r["ratios"][n])
        lines.append(f"Ratio against the soonest reference evaluating {n}x per epoch: {per_seed}"
                     + (f"; median {statistics.median(ratios):.2f}." if ratios else " (no reference passed 98%)."))
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    rows = []
    settings = [(e, n) for n in cfg.ref_evals for e in cfg.ref_epochs]
    with progress(total=len(cfg.seeds) * (1 + len(settings)), desc="bench", unit="run") as bar:
        for seed in cfg.seeds:  # alternate main job and reference runs, so that drifting load hits both
            row = {"main": main_job(seed), "references": []}
            bar.update()
            for epochs, evals in settings:
                row["references"].append(reference(seed, epochs, evals))
                bar.update()
            row["ratios"] = {n: (t := soonest(row["references"], n)) and row["main"]["final_acc_s"] / t
                             for n in cfg.ref_evals}
            rows.append(row)
    ratios = {n: [r["ratios"][n] for r in rows if r["ratios"][n]] for n in cfg.ref_evals}
    summary = {"rows": rows, "machine": machine(), "config": asdict(cfg),
               "median_ratio": {n: statistics.median(v) if v else None for n, v in ratios.items()}}
    text = (report(rows, cfg.ref_evals) + f"\nEach command timed from launch as its own subprocess, one at a time, "
            f"on {summary['machine']}.\n")
    print(text)
    write_results(out, "bench", text, summary)
    return summary


if __name__ == "__main__":
    run(main)
