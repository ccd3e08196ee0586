"""speedrun_test.py — the speedrun config and nanoGPT's recipe on the template's own split, each test loss once.

    python speedrun_test.py --out results        # results/speedrun_test.json and speedrun_test.md

nanogpt_bench.py races the speedrun against nanoGPT on nanoGPT's split, whose validation text is also where the
speedrun's settings were chosen. This is the check on text that choice never saw: shakespeare_cpu.toml (nanoGPT's
CPU recipe in the template) and shakespeare_speedrun.toml, each trained as it is on the repo's Shakespeare
(`data.dataset = "shakespeare"`: whole works held out), then scored once on the test works (Romeo and Juliet,
Twelfth Night) with the checkpoint of its best validation loss. Both runs in this process, one after the other.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch

from train_template import config, runlog, train

CONFIGS = ("shakespeare_cpu.toml", "shakespeare_speedrun.toml")


def measure(name: str, out_dir: Path) -> dict:
    """One config trained as it is: its steps, batch, seconds, last validation and (once) test loss."""
    cfg = config.load(str(TEMPLATE / "configs" / name), [f"run.out_dir={out_dir}", "train.progress=off"])
    t0 = time.perf_counter()
    result = train.run(cfg)
    seconds = time.perf_counter() - t0
    return {"config": name, "steps": cfg.train.steps, "batch": cfg.train.batch_size, "seconds": seconds,
            "best_val_loss": result["best_val_loss"], "test_loss": result["test_loss"]}


def markdown(res: dict) -> str:
    rows = [f"| `{r['config']}` | {r['steps']:,} x {r['batch']} | {r['seconds']:.1f} | {r['best_val_loss']:.4f} | "
            f"{r['test_loss']:.4f} |" for r in res["runs"]]
    return "\n".join([f"Each config as it is on the repo's Shakespeare (whole works held out), {res['machine']}, torch "
                      f"{res['torch']}, {res['threads']} threads; the test works scored once, with best.pt:", "",
                      "| config | steps x windows | seconds of train.run (setup to the final test) | best val loss | "
                      "test loss |", "|---|---:|---:|---:|---:|", *rows]) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "runs" / "speedrun_test")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [measure(name, Path(tmp) / name) for name in CONFIGS]
    res = {"machine": runlog.cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(), "runs": runs}
    runlog.write_lab_results(args.out, "speedrun_test", res, markdown(res))
    return res


if __name__ == "__main__":
    main()
