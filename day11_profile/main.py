"""Day 11 — profile a training loop, find the real bottleneck, fix it, and prove the speed-up.

The curriculum's answer to "GPU utilisation is 30%, what do you do?" is a method, and this file runs it end to end:
  1. measure: time fetching a batch and running a training step separately; data/step says which side waits;
  2. profile: `torch.profiler` with `record_function` labels shows where each step's time goes, op by op;
  3. fix what the measurement points to, one change at a time, and measure again in the same run;
  4. conclude from the figures (the report's conclusion is generated from them).

The "before" is Day 5's pipeline as a learner first writes it: torchvision's per-sample MNIST (PIL decode +
transforms.v2 on every sample, every epoch), `DataLoader(num_workers=0)`, batch 64, and `loss.item()` every step.

Run:    python day11_profile/main.py                      (~1 min on a quiet 2-core CPU: one full epoch per stage)
        python day11_profile/main.py --max-samples 12800  (a quick look: the first 12,800 samples of each epoch)
Gates:  python day11_profile/check.py
Trace:  drag day11_profile/prof/naive/*.pt.trace.json onto https://ui.perfetto.dev (or open it in chrome://tracing)
"""
import argparse
import gzip
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from day04_mlp_mnist.main import MLP
from day11_profile.bands import BANDS, band_of, classify  # noqa: F401 (re-exported for check.py)
from day11_profile.gpu_util import gpu_utilisation
from sprint.data import MEAN, STD, mnist, mnist_tensors
from sprint.device import pick_device

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE / "results"
PROF_DIR = HERE / "prof"  # traces are big: git-ignored
LABELS = ("data", "forward", "backward", "optimizer")  # the record_function ranges every step is split into
PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}  # skip step 1 (start-up), warm up on 2, record 3-5

# ---------------------------------------------------------------------------------------------------------------
# The pipelines: one change at a time, from the learner's first version to the fixed one.

@dataclass(frozen=True)
class Stage:
    name: str
    in_memory: bool  # False: decode + transform every sample on every epoch; True: tensors prepared once
    batch_size: int
    item_each_step: bool  # `total += loss.item()` every step: a host sync that waits for the device


def make_stages(batch_size: int, big_batch: int) -> list[Stage]:
    return [
        Stage("naive", False, batch_size, True),
        Stage("in-memory tensors", True, batch_size, True),
        Stage(f"+ batch {big_batch}", True, big_batch, True),
        Stage("+ no per-step .item()", True, big_batch, False),  # the optimised pipeline
    ]


def per_sample_loader(batch_size: int, seed: int) -> DataLoader:
    """Day 5's pipeline as first written: every image decoded from PIL and transformed, in the training process."""
    transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize((MEAN,), (STD,))])
    return DataLoader(mnist(train=True, transform=transform), batch_size=batch_size, shuffle=True, num_workers=0,
                      generator=torch.Generator().manual_seed(seed))


def in_memory_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int):
    """The fix: the split was decoded and normalised once (on the device); an epoch is a shuffled index."""
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed)).to(x.device)
    for idx in order.split(batch_size):
        yield x[idx], y[idx]


def batches(stage: Stage, device: torch.device, seed: int):
    """One epoch of (x, y) on `device`; each fetch is a "data" range in the profiler's trace."""
    if stage.in_memory:
        source = in_memory_batches(*mnist_tensors(train=True, device=device), stage.batch_size, seed)
    else:
        source = iter(per_sample_loader(stage.batch_size, seed))
    while True:
        with record_function("data"):
            batch = next(source, None)
            if batch is None:
                return
            x, y = (t.to(device, non_blocking=True) for t in batch)  # a no-op when already there
        yield x, y


def make_model(device: torch.device, seed: int):
    torch.manual_seed(seed)  # every stage trains the same initial model
    model = MLP().to(device)  # Day 4's model, unchanged: only the pipeline around it changes today
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train_step(model, optimizer, x, y) -> torch.Tensor:
    """One optimisation step, split into labelled ranges so the trace shows each part."""
    with record_function("forward"):
        loss = F.cross_entropy(model(x), y)
    with record_function("backward"):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
    return loss.detach()


def sync(device: torch.device) -> None:
    """Wait for queued device work, so a timer measures the work and not just its launch."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


# ---------------------------------------------------------------------------------------------------------------
# 1. Measure: data time vs step time.

def time_phases(stage: Stage, device: torch.device, n_batches: int, seed: int) -> dict:
    """The curriculum's measurement: time a batch fetch and a training step separately (fastest of `n_batches`)."""
    model, optimizer = make_model(device, seed)
    it = batches(stage, device, seed)
    data_s, step_s = [], []
    for i in range(n_batches + 1):  # the first batch is a warm-up (allocator, thread pool) and is not counted
        t0 = time.perf_counter()
        x, y = next(it)
        sync(device)
        t1 = time.perf_counter()
        train_step(model, optimizer, x, y)
        sync(device)
        if i:
            data_s.append(t1 - t0)
            step_s.append(time.perf_counter() - t1)
    data, step = min(data_s), min(step_s)  # timeit's rule: a slower repeat was slowed by something else
    return {"data_ms": 1e3 * data, "step_ms": 1e3 * step, "ratio": data / step, "verdict": classify(data / step),
            "compute_share": step / (data + step)}  # the CPU stand-in for "GPU utilisation"


# ---------------------------------------------------------------------------------------------------------------
# 2. Profile: a Chrome-trace JSON per pipeline plus the key-averages table.

def profile_steps(stage: Stage, device: torch.device, trace_dir: Path, seed: int) -> dict:
    """Profile 5 steps (wait 1, warm up 1, record 3); write the trace to `trace_dir` and return the tables."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("*.pt.trace.json*"):  # one trace per pipeline: the report points at it
        old.unlink()
    model, optimizer = make_model(device, seed)
    it = batches(stage, device, seed)
    with profile(activities=activities, schedule=schedule(**PROFILE_SCHEDULE), record_shapes=True,
                 profile_memory=True, on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name="train")
                 ) as prof:
        for _ in range(sum(PROFILE_SCHEDULE.values())):
            train_step(model, optimizer, *next(it))
            prof.step()  # advances the schedule; the trace is written after the last active step
    kind = "device" if device.type == "cuda" else "cpu"
    averages = prof.key_averages()
    table = (f"sorted by {kind}_time_total (where each step's time goes: the labelled ranges include their ops)\n"
             + averages.table(sort_by=f"{kind}_time_total", row_limit=-1)
             + f"\n\nsorted by self_{kind}_time_total (the hot ops themselves)\n"
             + averages.table(sort_by=f"self_{kind}_time_total", row_limit=15))
    hot = sorted((e for e in averages if e.key not in LABELS and not e.key.startswith("ProfilerStep")),
                 key=lambda e: getattr(e, f"self_{kind}_time_total"), reverse=True)[:3]
    trace = next(trace_dir.glob("*.pt.trace.json*"))
    return {"trace": trace, "table": table, "ranges_ms": labelled_ranges_ms(trace),
            "hot_ops": [(e.key, getattr(e, f"self_{kind}_time_total") / 1e3) for e in hot]}


def load_trace(path: Path) -> dict:
    """A Chrome-trace JSON as written by tensorboard_trace_handler (gzipped when its name ends in .gz)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as f:
        return json.load(f)


def labelled_ranges_ms(trace: Path) -> dict:
    """Mean duration (ms) of each labelled range and of a whole profiled step, read back from the trace."""
    durations = {}
    for event in load_trace(trace)["traceEvents"]:
        name = event.get("name", "")
        key = "step" if name.startswith("ProfilerStep#") else name
        # host-side ranges only: on CUDA the trace repeats each label on the GPU timeline ("gpu_user_annotation")
        if event.get("cat") == "user_annotation" and key in (*LABELS, "step"):
            durations.setdefault(key, []).append(event["dur"] / 1e3)  # Chrome traces count in microseconds
    return {key: statistics.mean(values) for key, values in durations.items()}


# ---------------------------------------------------------------------------------------------------------------
# 3. Fix and measure again: the same training loop, timed end to end.

def time_epoch(stage: Stage, device: torch.device, max_samples: int | None, seed: int) -> dict:
    """Train on the first `max_samples` samples of an epoch (all of it when None): throughput and host-sync cost."""
    model, optimizer = make_model(device, seed)
    it = batches(stage, device, seed)
    train_step(model, optimizer, *next(it))  # warm-up step, not timed
    sync(device)
    total_loss, n_samples, n_steps, item_s = 0.0, 0, 0, 0.0
    t0, cpu0 = time.perf_counter(), time.process_time()
    for x, y in it:
        loss = train_step(model, optimizer, x, y)
        if stage.item_each_step:  # the habit of logging every step: the host waits for the device each time
            t = time.perf_counter()
            total_loss += loss.item()
            item_s += time.perf_counter() - t
        else:  # accumulate on the device, read once at the end
            total_loss += loss
        n_samples, n_steps = n_samples + len(y), n_steps + 1
        if max_samples is not None and n_samples >= max_samples:
            break
    mean_loss = float(total_loss) / n_steps  # float() of a device tensor is the one sync of this loop
    sync(device)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if not math.isfinite(mean_loss):
        raise FloatingPointError(f"{stage.name}: training loss became {mean_loss}")
    return {"samples": n_samples, "steps": n_steps, "wall_s": wall, "samples_per_s": n_samples / wall,
            "epoch_s": 60_000 / (n_samples / wall),  # MNIST's training split, at the measured rate
            "item_us_per_step": 1e6 * item_s / n_steps, "item_share": item_s / wall,
            "cores_busy": cpu / wall,  # process CPU time / wall time: how many cores the loop kept busy
            "mean_loss": mean_loss}


# ---------------------------------------------------------------------------------------------------------------

def run_study(device: torch.device, max_samples: int | None = None, batch_size: int = 64, big_batch: int = 256,
              phase_batches: int = 20, prof_dir: Path = PROF_DIR, seed: int = 0, util_seconds: float = 3.0,
              log=print) -> dict:
    """Measure, profile and time every stage on `device`; return all the figures."""
    stages = make_stages(batch_size, big_batch)
    naive, best = stages[0], stages[-1]
    results = []
    for stage in stages:
        row = {**asdict(stage), **time_phases(stage, device, phase_batches, seed),
               **time_epoch(stage, device, max_samples, seed)}
        log(f"{stage.name:24s} data {row['data_ms']:6.2f} ms  step {row['step_ms']:6.2f} ms  data/step "
            f"{row['ratio']:6.1%} {'(' + row['verdict'] + ')':22s} {row['samples_per_s']:7,.0f} samples/s  "
            f"epoch {row['epoch_s']:5.1f} s")
        results.append(row)
    profiles = {}
    for name, stage in (("naive", naive), ("optimised", best)):
        profiles[name] = profile_steps(stage, device, Path(prof_dir) / name, seed)
        log(f"profiled {name}: {profiles[name]['trace']}")
    util = None
    if device.type == "cuda":
        util = {name: gpu_utilisation(lambda st=st: time_epoch(st, device, max_samples, seed), device, util_seconds)
                for name, st in (("naive", naive), ("optimised", best))}
        log(f"GPU utilisation: {util}")
    return {"device": str(device), "threads": torch.get_num_threads(), "max_samples": max_samples,
            "phase_batches": phase_batches, "stages": results, "profiles": profiles, "gpu_utilisation": util,
            "speedup": results[0]["epoch_s"] / results[-1]["epoch_s"]}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-samples", type=positive_int, default=None,
                        help="time only the first N samples of each epoch (default: the whole epoch)")
    parser.add_argument("--batch-size", type=positive_int, default=64, help="the naive pipeline's batch")
    parser.add_argument("--big-batch", type=positive_int, default=256, help="the optimised pipeline's batch")
    parser.add_argument("--phase-batches", type=positive_int, default=20, help="batches timed per phase for data/step")
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: best available)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="report, chart, tables, summary.json")
    parser.add_argument("--prof-dir", type=Path, default=PROF_DIR, help="profiler traces (big; git-ignored)")
    args = parser.parse_args(argv)
    steps_available = 60_000 // max(args.batch_size, args.big_batch) - 1  # phases are timed inside one epoch
    if args.phase_batches > steps_available:
        parser.error(f"--phase-batches must be <= {steps_available} with batches of "
                     f"{max(args.batch_size, args.big_batch)}")

    from day11_profile.report import conclusion, headline, plot, shown, write_report  # the report needs this module

    device = pick_device(args.device)
    study = run_study(device, args.max_samples, args.batch_size, args.big_batch, args.phase_batches, args.prof_dir,
                      args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, prof in study["profiles"].items():
        (args.out / f"key_averages_{name}.txt").write_text(prof["table"])
    plot(study, args.out / "before_after.png")
    write_report(study, args.out / "report.md", args.out / "before_after.png")
    summary = {**{k: v for k, v in study.items() if k != "profiles"}, "headline": headline(study),
               "profiles": {n: {"trace": shown(p["trace"]), "ranges_ms": p["ranges_ms"], "hot_ops": p["hot_ops"]}
                            for n, p in study["profiles"].items()}}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" + conclusion(study).replace("**", ""))
    print(f"\nwrote {args.out / 'report.md'}, before_after.png, key_averages_*.txt, summary.json; traces in "
          f"{args.prof_dir}")
    return study


if __name__ == "__main__":
    main(sys.argv[1:])
