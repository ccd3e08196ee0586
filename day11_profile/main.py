"""Day 11 — profile a training loop, find the real bottleneck, fix it one change at a time, at equal quality.

The curriculum's answer to "GPU utilisation is 30%, what do you do?" is a method, and this file runs it end to end:
  1. measure: time fetching a batch and running a training step separately; data/step says which side waits;
  2. profile: `torch.profiler` with `record_function` labels shows where each step's time goes, op by op;
  3. fix what the measurement points to, one change at a time, and measure again in the same run: the speed AND the
     test accuracy after the same number of epochs (a speed-up that costs accuracy is not a fix);
  4. conclude from the figures (the report's conclusion is generated from them).

The "before" is Day 5's pipeline as a learner first writes it: torchvision's per-sample MNIST (PIL decode + the
transforms.v2 below on every sample, every epoch), `DataLoader(num_workers=0)`, batch 64, AdamW at 1e-3 and
`loss.item()` every step. The changes: the same transforms applied once to the whole split (identical tensors, so
identical training), batch 256, its learning rate retuned on a validation split, no per-step `.item()`; the last
stage, torch.compile, is `compile_lab.py`.

Run:    python day11_profile/main.py                              (one full epoch per stage; writes runs/day11_profile/)
        python day11_profile/main.py --max-samples 6400           (quick: epoch times extrapolated from 6,400 images)
        python day11_profile/main.py --out day11_profile/results  (refreshes the committed figures)
Gates:  python day11_profile/check.py
Trace:  drag runs/day11_profile/prof/naive/*.pt.trace.json onto https://ui.perfetto.dev (or chrome://tracing)
"""
import functools
import math
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
from day11_profile.bands import classify
from day11_profile.gpu_util import gpu_utilisation
from sprint import runs_dir
from sprint.cli import arg, parse, progress, run, unwritable, validate
from sprint.data import MEAN, STD, mnist
from sprint.device import pick_device
from sprint.measure import one_thread, quiet_profiler

LABELS = ("data", "forward", "backward", "optimizer")  # the record_function ranges every step is split into
PROFILE_SCHEDULE = {"wait": 1, "warmup": 1, "active": 3}  # skip step 1 (start-up), warm up on 2, record 3-5
TRANSFORM = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize((MEAN,), (STD,))])
TRAIN_SPLIT = 60_000

# ---------------------------------------------------------------------------------------------------------------
# The pipelines and the recipe: one change per stage, from the learner's first version to the fixed one.

@dataclass(frozen=True)
class Stage:
    name: str
    in_memory: bool  # False: decode + transform every sample on every epoch; True: tensors prepared once
    batch_size: int
    lr: float  # AdamW's learning rate (the peak of the one-cycle schedule)
    one_cycle: bool  # warm the LR up then anneal it over the epoch, instead of keeping it constant
    item_each_step: bool  # `total += loss.item()` every step: a host sync that waits for the device


def make_stages(cfg, tuned: Stage) -> list[Stage]:
    return [Stage("naive", False, cfg.batch_size, cfg.lr, False, True),
            Stage("in-memory tensors", True, cfg.batch_size, cfg.lr, False, True),
            Stage(f"+ batch {cfg.big_batch}", True, cfg.big_batch, cfg.lr, False, True),
            Stage(f"+ LR retuned ({tuned.name})", True, cfg.big_batch, tuned.lr, tuned.one_cycle, True),
            Stage("+ no per-step .item()", True, cfg.big_batch, tuned.lr, tuned.one_cycle, False)]  # optimised


@functools.lru_cache(maxsize=2)
def prepared(train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The fix: the same transforms, applied once to the whole split, so every pipeline sees identical tensors."""
    ds = mnist(train=train)
    return TRANSFORM(ds.data.unsqueeze(1)).as_subclass(torch.Tensor), ds.targets  # (N,1,28,28) float32, (N,)


def split(val_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) indices of MNIST's training set, one fixed split; the test set stays for reporting."""
    order = torch.randperm(TRAIN_SPLIT, generator=torch.Generator().manual_seed(0))
    return order[val_size:], order[:val_size]


def batches(stage: Stage, train_idx: torch.Tensor, device: torch.device, seed: int):
    """One epoch of (x, y) on `device` in a seeded order; each fetch is a "data" range in the profiler's trace."""
    order = train_idx[torch.randperm(len(train_idx), generator=torch.Generator().manual_seed(seed))]
    if stage.in_memory:
        images, labels = (t.to(device) for t in prepared(train=True))
        source = ((images[i], labels[i]) for i in order.to(device).split(stage.batch_size))
    else:  # Day 5's first pipeline: PIL decode + transforms per sample, in the training process
        loader = DataLoader(mnist(train=True, transform=TRANSFORM), batch_size=stage.batch_size,
                            sampler=order.tolist(), num_workers=0, generator=torch.Generator().manual_seed(seed))
        source = iter(loader)
    while True:
        with record_function("data"):
            batch = next(source, None)
            if batch is None:
                return
            x, y = (t.to(device, non_blocking=True) for t in batch)  # a no-op when already there
        yield x, y


def make_model(stage: Stage, train_size: int, device: torch.device, seed: int):
    torch.manual_seed(seed)  # every stage trains the same initial model
    model = MLP().to(device)  # Day 4's model, unchanged: only the pipeline and the recipe around it change
    optimizer = torch.optim.AdamW(model.parameters(), lr=stage.lr)
    steps = math.ceil(train_size / stage.batch_size)  # one epoch: the one-cycle schedule spans it
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, stage.lr, total_steps=steps) if stage.one_cycle else None
    return model, optimizer, scheduler


def train_step(model, optimizer, scheduler, x, y) -> torch.Tensor:
    """One optimisation step, split into labelled ranges so the trace shows each part."""
    with record_function("forward"):
        loss = F.cross_entropy(model(x), y)
    with record_function("backward"):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return loss.detach()


def sync(device: torch.device) -> None:
    """Wait for queued device work, so a timer measures the work and not just its launch."""
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def evaluate(model, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        correct = sum((model(xb).argmax(1) == yb).sum().item() for xb, yb in zip(x.split(5000), y.split(5000)))
    model.train()
    return correct / len(y)


# ---------------------------------------------------------------------------------------------------------------
# 1. Measure: data time vs step time.  2. Profile.  3. Time whole epochs, with the accuracy they reach.

def time_phases(stages: list[Stage], train_idx, device: torch.device, n_batches: int, seed: int) -> list[dict]:
    """The curriculum's measurement: time a batch fetch and a training step separately, per stage the fastest of
    `n_batches`. The stages take turns, one batch each per round, so a busy spell on a shared machine hits all alike."""
    runs = [(*make_model(st, len(train_idx), device, seed), batches(st, train_idx, device, seed), Timings())
            for st in stages]  # per stage: a model, an optimizer, a scheduler, a batch stream, its timings
    for i in range(n_batches + 1):  # the first round is a warm-up (allocator, thread pool) and is not counted
        for model, optimizer, scheduler, it, timings in runs:
            start = timings.now()
            x, y = next(it)
            sync(device)
            fetched = timings.now()
            train_step(model, optimizer, scheduler, x, y)
            sync(device)
            if i:
                timings.add(start, fetched, timings.now())
    return [timings.figures() for *_, timings in runs]


def cpu_ms_in_one_thread(stages: list[Stage], train_idx, device: torch.device, n_batches: int, seed: int) -> list:
    """Per stage, the CPU milliseconds of its fastest fetch + step in one thread: the work a batch costs, which a
    second process on the same cores leaves alone. The gates comparing two stages read it, not the wall clock (a
    descheduled thread holds its partner at the barrier) nor a two-thread step's CPU time (which counts the second
    thread's share of big ops only, and its spinning)."""
    with one_thread():
        return [t["data_cpu_ms"] + t["step_cpu_ms"] for t in time_phases(stages, train_idx, device, n_batches, seed)]


class Timings:
    """One stage's fetch and step durations, in wall and CPU seconds; its figures are the fastest of each."""

    def __init__(self):
        self.wall = {"data": [], "step": []}
        self.cpu = {"data": [], "step": []}

    @staticmethod
    def now() -> tuple[float, float]:
        return time.perf_counter(), time.process_time()

    def add(self, start, fetched, done) -> None:
        for clock, kind in enumerate((self.wall, self.cpu)):
            kind["data"].append(fetched[clock] - start[clock])
            kind["step"].append(done[clock] - fetched[clock])

    def figures(self) -> dict:
        data, step = min(self.wall["data"]), min(self.wall["step"])  # a slower repeat was slowed by something
        return {"data_ms": 1e3 * data, "step_ms": 1e3 * step, "ratio": data / step, "verdict": classify(data / step),
                "compute_share": step / (data + step),  # the CPU stand-in for "GPU utilisation"
                "data_cpu_ms": 1e3 * min(self.cpu["data"]), "step_cpu_ms": 1e3 * min(self.cpu["step"])}


def profile_steps(stage: Stage, train_idx, device: torch.device, trace_dir: Path, seed: int):
    """Profile 5 steps (wait 1, warm up 1, record 3); write the trace to `trace_dir`; return the profiler."""
    quiet_profiler()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace_dir.mkdir(parents=True, exist_ok=True)
    for old in trace_dir.glob("*.pt.trace.json*"):  # one trace per pipeline: the report points at it
        old.unlink()
    model, optimizer, scheduler = make_model(stage, len(train_idx), device, seed)
    it = batches(stage, train_idx, device, seed)
    with profile(activities=activities, schedule=schedule(**PROFILE_SCHEDULE), record_shapes=True,
                 profile_memory=True, on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name="train")
                 ) as prof:
        for _ in range(sum(PROFILE_SCHEDULE.values())):
            train_step(model, optimizer, scheduler, *next(it))
            prof.step()  # advances the schedule; the trace is written after the last active step
    return prof, next(trace_dir.glob("*.pt.trace.json*"))


def train_epoch(stage: Stage, train_idx, device: torch.device, max_samples: int | None, seed: int) -> dict:
    """Train on one epoch (or its first `max_samples` samples), timed; then the model and what it cost."""
    model, optimizer, scheduler = make_model(stage, len(train_idx), device, seed)
    it = batches(stage, train_idx, device, seed)
    train_step(model, optimizer, scheduler, *next(it))  # warm-up step: trained on, not timed
    sync(device)
    total_loss, n_samples, n_steps, item_s = 0.0, 0, 0, 0.0
    todo = math.ceil(min(len(train_idx), max_samples or len(train_idx)) / stage.batch_size) - 1
    t0, cpu0 = time.perf_counter(), time.process_time()
    for x, y in progress(it, desc=stage.name, total=todo, unit="step"):
        loss = train_step(model, optimizer, scheduler, x, y)
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
    return {"model": model, "samples": n_samples, "steps": n_steps, "wall_s": wall, "samples_per_s": n_samples / wall,
            "epoch_s": len(train_idx) / (n_samples / wall), "extrapolated": max_samples is not None,
            "item_us_per_step": 1e6 * item_s / n_steps, "item_share": item_s / wall,
            "cores_busy": cpu / wall,  # process CPU time / wall time: how many cores the loop kept busy
            "mean_loss": mean_loss}


def lr_sweep(cfg, train_idx, val_idx, device: torch.device) -> list[dict]:
    """Retune the learning rate for the big batch on the VALIDATION split (the test set plays no part in the choice):
    one epoch per candidate (--max-samples: its first N images), the naive recipe first (the accuracy to match), then
    one-cycle schedules."""
    x, y = (t.to(device) for t in prepared(train=True))
    candidates = [("naive recipe", cfg.batch_size, cfg.lr, False),
                  *((f"one-cycle, peak {peak:g}", cfg.big_batch, peak, True) for peak in cfg.lr_grid)]
    rows = []
    for name, batch_size, lr, one_cycle in candidates:
        stage = Stage(name, True, batch_size, lr, one_cycle, False)
        model = train_epoch(stage, train_idx, device, cfg.max_samples, cfg.seed)["model"]
        rows.append({"stage": stage, "model": model, "val_acc": evaluate(model, x[val_idx], y[val_idx])})
    return rows


@dataclass
class Config:
    max_samples: int | None = arg(None, "train on N images per run, not an epoch (epoch times extrapolated)", gt=0)
    batch_size: int = arg(64, "the naive pipeline's batch size", gt=0)
    lr: float = arg(1e-3, "the naive pipeline's AdamW learning rate (constant)", gt=0)
    big_batch: int = arg(256, "the optimised pipeline's batch size", gt=0)
    lr_grid: tuple[float, ...] = arg((4e-3, 8e-3, 1.6e-2, 3.2e-2, 6.4e-2), "big-batch one-cycle peak LRs", gt=0)
    val_size: int = arg(5000, "images held out for validation (the LR choice)", gt=0, lt=TRAIN_SPLIT)
    phase_batches: int = arg(20, "batches timed per phase for data/step", gt=0)
    device: str | None = arg(None, "cpu, cuda or mps (None: the best available)")
    seed: int = arg(0, "seed of the initial weights and the shuffle")
    prof_dir: Path = arg(runs_dir(__file__, "prof"), "profiler traces (big: keep them under the git-ignored runs/)")

    def __post_init__(self):
        validate(self)
        if why := unwritable(self.prof_dir):
            raise ValueError(f"--prof-dir {self.prof_dir}: {why}")
        steps = (TRAIN_SPLIT - self.val_size) // max(self.batch_size, self.big_batch) - 1  # phases fit in one epoch
        if self.phase_batches > steps:
            raise ValueError(f"--phase-batches must be <= {steps} with batches of "
                             f"{max(self.batch_size, self.big_batch)}")


def run_study(cfg: Config, log=print) -> dict:
    """Tune, then measure, train, evaluate and profile every stage on one device; return all the figures."""
    device = pick_device(cfg.device)
    train_idx, val_idx = split(cfg.val_size)
    x_test, y_test = (t.to(device) for t in prepared(train=False))
    sweep = lr_sweep(cfg, train_idx, val_idx, device)
    chosen = max(sweep[1:], key=lambda r: r["val_acc"])  # the best big-batch schedule on validation
    for r in (sweep[0], chosen):  # chosen: now, and only now, the test set
        r["test_acc"] = evaluate(r["model"], x_test, y_test)
    log("validation accuracy: " + ", ".join(f"{r['stage'].name} {r['val_acc']:.2%}" for r in sweep))
    stages = make_stages(cfg, chosen["stage"])
    results = []
    phases = time_phases(stages, train_idx, device, cfg.phase_batches, cfg.seed)
    one_thread = cpu_ms_in_one_thread(stages, train_idx, device, cfg.phase_batches, cfg.seed)
    for stage, timed, cpu_ms in zip(stages, phases, one_thread):
        row = {**asdict(stage), **timed, "one_thread_cpu_ms": cpu_ms,
               **train_epoch(stage, train_idx, device, cfg.max_samples, cfg.seed)}
        model = row.pop("model")
        row["test_acc"] = evaluate(model, x_test, y_test)  # once per stage, after its training
        row["weights_sum"] = sum(p.double().sum().item() for p in model.parameters())  # identical training?
        log(f"{stage.name:34s} data/step {row['ratio']:6.1%} {'(' + row['verdict'] + ')':22s} "
            f"{row['samples_per_s']:7,.0f} samples/s  epoch {row['epoch_s']:5.1f} s  test {row['test_acc']:.2%}")
        results.append(row)
    profiles = {name: profile_steps(stage, train_idx, device, Path(cfg.prof_dir) / name, cfg.seed)
                for name, stage in (("naive", stages[0]), ("optimised", stages[-1]))}
    util = None if device.type != "cuda" else {  # NVML's utilisation while each pipeline trains
        name: gpu_utilisation(lambda st=st: train_epoch(st, train_idx, device, cfg.max_samples, cfg.seed), device)
        for name, st in (("naive", stages[0]), ("optimised", stages[-1]))}
    return {"device": str(device), "threads": torch.get_num_threads(), "max_samples": cfg.max_samples,
            "train_samples": len(train_idx), "val_size": cfg.val_size, "phase_batches": cfg.phase_batches,
            "sweep": [{**asdict(r["stage"]), "val_acc": r["val_acc"], "test_acc": r.get("test_acc"),
                       "chosen": r is chosen} for r in sweep], "stages": results,
            "profiles": profiles, "gpu_utilisation": util, "speedup": results[0]["epoch_s"] / results[-1]["epoch_s"]}


def main(argv=None) -> dict:
    from day11_profile import report  # the report reads this module's figures

    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    t0 = time.perf_counter()
    study = run_study(cfg)
    study["wall_s"] = time.perf_counter() - t0
    study = report.write(study, out)
    print(f"\n{report.conclusion(study).replace('**', '')}\n\nwrote {out}/report.md, before_after.png, "
          f"key_averages_*.txt, summary.json; traces in {cfg.prof_dir}")
    return study


if __name__ == "__main__":
    run(main)
