"""How Day 4's defaults were chosen: on a validation split, never on the test set.

Two steps. (1) Cost: one training step of the class-default MLP (LayerNorm + GELU + Dropout) against the plain
ReLU MLP, each with AdamW's default (foreach) and fused update, and of the benchmark's reference model, timed the
repo's way (median of 20 steps after 3 warm-up steps). (2) Quality: with the cheapest step, a grid over epochs,
peak learning rate and label smoothing, each trained on seeds 0 and 1 and scored on the 5,000 held-out training
images only. The rule: the fewest epochs for which some setting reaches the bar on every seed, then the setting
whose worst seed scores best (the G0 gate must hold for every seed), the mean breaking ties. The bar, 98.2%, is
the G0 gate (98%) plus one standard error of an accuracy near 98% measured on 5,000 images (0.2 points), so that
a recipe picked here is not a coin toss on the test set.

Run:  python day04_mlp_mnist/tune.py    (writes runs/day04_mlp_mnist/tuning.md and tuning.json)
"""
import dataclasses
import itertools
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn

from day04_mlp_mnist.main import MLP, Config, train
from day04_mlp_mnist.reference import reference_model
from sprint import machine, runs_dir, write_results
from sprint.cli import arg, parse, progress, run, validate
from sprint.measure import median_seconds

BAR = 0.982


@dataclass
class TuneConfig:
    seeds: tuple[int, ...] = arg((0, 1), "training seeds; a setting must reach the bar on every one", ge=0)
    epochs: tuple[int, ...] = arg((3, 4), "epoch budgets to try, fewest first", gt=0)
    lrs: tuple[float, ...] = arg((3e-3, 6e-3, 1.2e-2), "peak learning rates to try", gt=0)
    label_smoothing: tuple[float, ...] = arg((0.0, 0.1, 0.2), "label smoothing values to try", ge=0, lt=1)

    def __post_init__(self):
        validate(self)


def step_seconds(model: nn.Module, fused: bool, batch_size: int = 256) -> float:
    """Median seconds of one forward + backward + AdamW step on a random batch."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
    x, y = torch.randn(batch_size, 784), torch.randint(0, 10, (batch_size,))

    def step():
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return median_seconds(step, repeat=20, warmup=3)


def step_costs() -> list[dict]:
    models = {"LayerNorm + GELU + Dropout (MLP())": lambda: MLP(),
              "ReLU, no LayerNorm (Day 4's recipe)": lambda: MLP(dropout=0.0, norm=False, act="relu", init="he")}
    costs = [{"model": name, "optimizer": "fused" if fused else "foreach (default)",
              "step_ms": 1000 * step_seconds(build(), fused)}
             for name, build in models.items() for fused in (False, True)]
    return costs + [{"model": "784-512-256 ReLU (reference.py, bench.py's baseline)", "optimizer": "foreach (default)",
                     "step_ms": 1000 * step_seconds(reference_model(), False)}]


def grid(cfg: TuneConfig) -> list[dict]:
    rows = []
    settings = list(itertools.product(cfg.epochs, cfg.lrs, cfg.label_smoothing))
    with progress(total=len(settings) * len(cfg.seeds), desc="tuning", unit="run") as bar:
        for epochs, lr, smoothing in settings:
            accs, seconds = [], []
            for seed in cfg.seeds:
                result = train(Config(epochs=epochs, lr=lr, label_smoothing=smoothing, seed=seed, test=False),
                               log=lambda *_: None)
                accs.append(round(result["val_acc"], 6))  # 4910 / 5000 is 0.982, not float32's 0.98199999
                seconds.append(result["wall_s"])
                bar.update()
            rows.append({"epochs": epochs, "lr": lr, "label_smoothing": smoothing, "val_acc": accs,
                         "mean_val_acc": statistics.mean(accs), "train_s": statistics.median(seconds),
                         "clears_bar": min(accs) >= BAR})
    return rows


def pick(rows: list[dict]) -> dict | None:
    cleared = [r for r in rows if r["clears_bar"]]
    if not cleared:
        return None
    fewest = min(r["epochs"] for r in cleared)
    return max((r for r in cleared if r["epochs"] == fewest), key=lambda r: (min(r["val_acc"]), r["mean_val_acc"]))


def report(costs: list[dict], rows: list[dict], chosen: dict | None, seeds) -> str:
    lines = ["| model | AdamW update | one training step, batch 256 (ms) |", "|---|---|---|"]
    lines += [f"| {c['model']} | {c['optimizer']} | {c['step_ms']:.2f} |" for c in costs]
    lines += ["", f"| epochs | peak LR | label smoothing | validation accuracy, seeds {', '.join(map(str, seeds))} | "
                  f"mean | training time (s, median) | reaches {100 * BAR:.1f}% on every seed |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        accs = " / ".join(f"{100 * a:.2f}%" for a in r["val_acc"])
        mark = "**chosen**" if r is chosen else ("yes" if r["clears_bar"] else "no")
        lines.append(f"| {r['epochs']} | {r['lr']:g} | {r['label_smoothing']:g} | {accs} | "
                     f"{100 * r['mean_val_acc']:.2f}% | {r['train_s']:.1f} | {mark} |")
    verdict = (f"Chosen: {chosen['epochs']} epochs, peak LR {chosen['lr']:g}, label smoothing "
               f"{chosen['label_smoothing']:g}." if chosen else "No setting reached the bar.")
    return "\n".join(lines) + f"\n\n{verdict} Measured on {machine()}.\n"


def main(argv=None) -> dict:
    cfg, out = parse(TuneConfig, argv, __doc__, out=runs_dir(__file__))
    costs = step_costs()
    rows = grid(cfg)
    chosen = pick(rows)
    text = report(costs, rows, chosen, cfg.seeds)
    print(text)
    result = {"step_costs": costs, "grid": rows, "chosen": chosen, "bar": BAR, "machine": machine(),
              "config": dataclasses.asdict(cfg)}
    write_results(out, "tuning", text, result)
    return result


if __name__ == "__main__":
    run(main)
