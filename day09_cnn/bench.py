"""Day 9 bench: how the ResNet's recipe was chosen (on validation images), and how it holds over seeds.

--tune   trains the ResNet for every schedule x peak LR and scores each on the validation split carved from the
         training set (`main.Config.val_size` images): the default recipe in `main.py` is the best of this table.
         The test set is not looked at.
default  trains the chosen recipe with several seeds and scores each once on the test set: is 99% a property of
         the recipe or of seed 0?

Run:  python day09_cnn/bench.py --tune --out day09_cnn/results   (writes tuning.json + tuning.md)
      python day09_cnn/bench.py --out day09_cnn/results          (writes seeds.json + seeds.md)
"""
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

from day09_cnn.main import Config, score, train
from sprint import machine, markdown_table, runs_dir, write_results
from sprint.cli import arg, parse, run, validate
from sprint.data import mnist_tensors

SCHEDULES = ("onecycle", "linear", "constant")


@dataclass
class BenchConfig:
    tune: bool = arg(False, "compare schedules x peak LRs on the validation split instead of seeds")
    schedules: tuple[str, ...] = arg(SCHEDULES, "schedules tried with --tune", choices=SCHEDULES)
    lrs: tuple[float, ...] = arg((0.05, 0.1, 0.2), "peak learning rates tried with --tune", gt=0)
    seeds: tuple[int, ...] = arg((0, 1), "seeds of the chosen recipe, each scored once on the test set", ge=0)
    epochs: int = arg(Config.epochs, "ResNet epochs of every run", gt=0)

    def __post_init__(self):
        validate(self)


def tune(bc: BenchConfig) -> dict:
    rows = []
    for schedule in bc.schedules:
        for lr in bc.lrs:
            result = train(Config(schedule=schedule, lr=lr, epochs=bc.epochs), log=lambda *_: None)
            last = result["history"][-1]
            rows.append({"schedule": schedule, "lr": lr, "val_acc": last["val_acc"], "val_loss": last["val_loss"],
                         "wall_s": last["elapsed_s"]})
            print(f"{schedule:9s} lr {lr:<5g} validation accuracy {last['val_acc']:.2%}  loss {last['val_loss']:.4f}",
                  flush=True)
    best = max(rows, key=lambda r: (r["val_acc"], -r["val_loss"]))  # the rule, fixed before the runs
    return {"rows": rows, "best": best, "epochs": bc.epochs, "val_size": Config().val_size}


def tuning_table(result: dict) -> str:
    lines = [f"Validation accuracy and loss after {result['epochs']} epochs ({result['val_size']:,} images held out of "
             f"the training set), ResNet, SGD + Nesterov, batch {Config.batch_size}; chosen: the best accuracy, ties "
             f"broken by the lower loss.", "",
             "| schedule | peak LR | validation accuracy | validation loss |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        mark = " **(chosen)**" if (r["schedule"], r["lr"]) == (result["best"]["schedule"], result["best"]["lr"]) else ""
        lines.append(f"| {r['schedule']}{mark} | {r['lr']:g} | {r['val_acc']:.2%} | {r['val_loss']:.4f} |")
    return "\n".join(lines) + "\n"


def seeds(bc: BenchConfig) -> dict:
    x_test, y_test = mnist_tensors(train=False)
    rows = []
    for seed in bc.seeds:
        result = train(replace(Config(), seed=seed, epochs=bc.epochs), log=lambda *_: None)
        rows.append({"seed": seed, "val_acc": result["history"][-1]["val_acc"],
                     "wall_s": result["history"][-1]["elapsed_s"]} | score(result["model"], x_test, y_test))
        print(f"seed {seed}: validation {rows[-1]['val_acc']:.2%}, test {rows[-1]['test_acc']:.2%} "
              f"({rows[-1]['wall_s']:.1f} s)", flush=True)
    accs = [r["test_acc"] for r in rows]
    print(f"test accuracy: min {min(accs):.2%}, mean {statistics.mean(accs):.2%} over {len(accs)} seeds "
          f"(gate: >= 99.00% on the default seed)")
    return {"rows": rows, "recipe": asdict(Config())}


def main(argv=None) -> dict:
    bc, out = parse(BenchConfig, argv, __doc__, out=runs_dir(__file__))
    result = (tune(bc) if bc.tune else seeds(bc)) | {"machine": machine()}
    if bc.tune:
        print(tuning_table(result))
        write_results(out, "tuning", tuning_table(result), result)
    else:
        write_results(out, "seeds", seeds_table(result), result)
    return result


def seeds_table(result: dict) -> str:
    """The chosen recipe on each seed, each scored once on the test set (`seeds.md`)."""
    rows = [[r["seed"], f"{r['val_acc']:.2%}", f"{r['test_acc']:.2%}", r["test_errors"]] for r in result["rows"]]
    return markdown_table(["seed", "validation accuracy", "test accuracy", "test errors"], rows, "rrrr") + "\n"


if __name__ == "__main__":
    run(main)
