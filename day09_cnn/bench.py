"""Day 9 bench: the ResNet's default run over several seeds — is 99% a property of the recipe or of seed 0?

Run:  python day09_cnn/bench.py --seeds 0 1     (~1 min per seed on a quiet 2-core CPU)
"""
import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

from day09_cnn.main import Config, train


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=Config.epochs)
    args = parser.parse_args(argv)

    rows = []
    for seed in args.seeds:
        run = train(Config(seed=seed, epochs=args.epochs), log=lambda *_: None)
        rows.append({"seed": seed, "test_acc": run["test_acc"], "wall_s": run["wall_s"]})
        print(f"seed {seed}: {run['test_acc']:.2%} test accuracy in {run['wall_s']:.1f} s", flush=True)
    accs = [r["test_acc"] for r in rows]
    print(f"min {min(accs):.2%}  mean {statistics.mean(accs):.2%}  over {len(accs)} seeds "
          f"(gate: >= 99.00% on the default seed)")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
