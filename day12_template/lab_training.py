"""lab_training.py — how the Day 12 labs train a language model outside the template's loop, so that one change (the
optimizer, the architecture) is all that differs between two runs.

Windows of the training split drawn at random from a generator seeded by the run's seed, as the template draws them;
one warmup + cosine schedule per optimizer (the template's); the gradient norm clipped; the validation loss on the
same evenly spaced windows every few steps, recorded against steps and against training seconds (the evaluations
left out of the seconds). Also what the labs' command lines and tables share.
"""
import argparse
import shutil
import statistics
import time
from pathlib import Path

import torch

from train_template import config, data, runlog, tasks, train

HERE = Path(__file__).resolve().parent


def start(doc: str, name: str, config_file: Path, argv=None) -> tuple[argparse.Namespace, config.Config, data.Splits]:
    """A lab's command line (`--out`, by default runs/<name> in this folder), its config and data, and the global
    RNG seeded from the config, as the template seeds a run."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "runs" / name)
    args = parser.parse_args(argv)
    cfg = config.load(str(config_file), [])
    train.seed_everything(cfg.run.seed, deterministic=False)
    return args, cfg, data.build(cfg.data, cfg.run.seed)


def bf16_matmul_is_faster() -> bool:
    """Whether this CPU multiplies bf16 matrices faster than fp32 ones (runlog's measured peaks: ~1 s for both the
    first time a process asks)."""
    cpu = torch.device("cpu")
    bf16, fp32 = (runlog.peak_flops(cpu, dtype)[0] for dtype in (torch.bfloat16, torch.float32))
    return bf16 > fp32


def seeds_command(doc: str, runs: Path, argv=None) -> argparse.Namespace:
    """The command line of a lab that trains with the template's loop on several seeds: `--out` (by default `runs`)
    and `--seeds` (0 and 1). `runs`, where its runs go, is wiped first."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=runs)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args(argv)
    shutil.rmtree(runs, ignore_errors=True)
    return args


def seed_header(label: str, seeds: list[int]) -> tuple[str, str]:
    """The header cells of `seed_cells`' columns and their right alignment: `val, seed 0 | val, seed 1 | mean`."""
    return " | ".join([*(f"{label}, seed {s}" for s in seeds), "mean"]), "---:|" * (len(seeds) + 1)


def seed_cells(values: list[float]) -> str:
    """Per-seed figures and their mean, as a table's cells: `1.9098 | 1.9136 | 1.9117`."""
    return " | ".join(f"{v:.4f}" for v in [*values, statistics.mean(values)])


def spread(split, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` windows of a split, evenly spaced over all of it."""
    return split.batch(0, torch.linspace(0, len(split) - 1, count).long())


@torch.no_grad()
def mean_loss(model, task, windows: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The mean loss per token over `windows`, in evaluation mode (64 windows at a time)."""
    model.eval()
    x, y = windows
    nats = sum(task.eval_sums(model(xb), yb)[0].item() for xb, yb in zip(x.split(64), y.split(64)))
    model.train()
    return nats / y.numel()


def train_lm(model, optimizers: list, cfg: config.Config, splits, seed: int, steps: int, eval_every: int,
             val_windows: int) -> dict:
    """`steps` optimizer steps of `model` with `optimizers` (each on its own schedule) at the config's batch size and
    clipping: {"curve": [{"step", "seconds", "val_loss"}, ...], "val_loss", "seconds", "ms_per_step"}."""
    task = tasks.for_dataset(cfg.data.dataset, splits.info)
    schedules = [train.warmup_cosine(opt, steps, cfg.optim) for opt in optimizers]
    order = torch.Generator().manual_seed(seed)  # the data order: windows drawn at random, as the template does
    windows = spread(splits.val, val_windows)
    curve, seconds = [], 0.0
    for step in range(1, steps + 1):
        start = time.perf_counter()
        x, y = splits.train.batch(0, torch.randint(len(splits.train), (cfg.train.batch_size,), generator=order))
        task.loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        for opt, schedule in zip(optimizers, schedules):
            opt.step()
            opt.zero_grad(set_to_none=True)
            schedule.step()
        seconds += time.perf_counter() - start
        if step % eval_every == 0 or step == steps:
            curve.append({"step": step, "seconds": seconds, "val_loss": mean_loss(model, task, windows)})
    return {"curve": curve, "val_loss": curve[-1]["val_loss"], "seconds": seconds,
            "ms_per_step": 1000 * seconds / steps}
