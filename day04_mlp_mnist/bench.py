"""Day 4 benchmark: time-to-98% and final test accuracy of the default config, over 2 seeds.

Time-to-98% is the wall time from calling `train()` (MNIST loading included) until the first evaluation on the
10,000 test images above 98%; the test set is evaluated `--evals-per-epoch` times per epoch, and those evaluations
count in the time. Interpreter start-up and `import torch` come before and are printed separately.

Run:  python day04_mlp_mnist/bench.py            (writes day04_mlp_mnist/results/bench.md)
"""
import time

T_START = time.perf_counter()

import argparse  # noqa: E402  (imports after the clock starts: their cost is reported)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch  # noqa: E402

from day04_mlp_mnist.main import GOAL_ACC, OUT_DIR, Config, train  # noqa: E402

IMPORT_S = time.perf_counter() - T_START


def bench(seeds=(0, 1), evals_per_epoch: int = 2, **overrides) -> list[dict]:
    rows = []
    for seed in seeds:
        cfg = Config(seed=seed, evals_per_epoch=evals_per_epoch, **overrides)
        result = train(cfg, log=lambda *_: None)
        first = next((r for r in result["history"] if r["test_acc"] > GOAL_ACC), None)
        rows.append({"seed": seed, "time_to_98_s": result["time_to_98_s"], "epoch_at_98": first and first["epoch"],
                     "final_acc": result["test_acc"], "wall_s": result["wall_s"], "epochs": cfg.epochs})
        print(f"seed {seed}: final {100 * result['test_acc']:.2f}% in {result['wall_s']:.1f} s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    def fmt(v, pattern):
        return "never" if v is None else pattern.format(v)

    lines = ["| seed | time-to-98% (s) | reached at epoch | final test acc | training wall (s) |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['seed']} | {fmt(r['time_to_98_s'], '{:.1f}')} | {fmt(r['epoch_at_98'], '{:g}')} | "
              f"{100 * r['final_acc']:.2f}% | {r['wall_s']:.1f} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--evals-per-epoch", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT_DIR / "bench.md")
    args = parser.parse_args(argv)

    rows = bench(tuple(args.seeds), args.evals_per_epoch)
    text = (f"{table(rows)}\n\nDefault config {Config()}; test set evaluated {args.evals_per_epoch}x per epoch; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads; `import torch` + start-up before "
            f"the clock: {IMPORT_S:.1f} s.\n")
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
