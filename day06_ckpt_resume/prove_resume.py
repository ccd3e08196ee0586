"""Day 6's proof: SIGKILL a real training process at random steps, resume it, and compare it bit for bit with a run
that never stopped; then resume once without the optimizer state to show why it is part of the checkpoint.

Run:    python day06_ckpt_resume/prove_resume.py                      # writes to runs/day06_ckpt_resume/prove/
        python day06_ckpt_resume/prove_resume.py --out day06_ckpt_resume/results   # refresh the committed figures
Gates:  python day06_ckpt_resume/check.py
"""
import contextlib
import dataclasses
import io
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch

from day06_ckpt_resume.checkpoint import load_checkpoint, read_metrics
from day06_ckpt_resume.main import MNIST_TRAIN, Config, train
from day06_ckpt_resume.report import plot_overlay, resume_table, write_optimizer_table
from sprint import REPO_ROOT, runs_dir, write_results
from sprint.cli import arg, flag, parse, progress, run
from sprint.data import prepare_mnist
from sprint import machine

MAIN = Path(__file__).resolve().parent / "main.py"
STATE_KEYS = ("model", "optimizer", "scheduler", "sampler", "rng", "step", "best_val", "best_step", "bad_epochs")


@dataclass
class ProofConfig(Config):
    workers: tuple[int, ...] = arg((0, 2), "num_workers of each killed chain", ge=0, le=256)
    kills: tuple[int, ...] = arg((2, 3), "SIGKILLs of each chain, one count per --workers value", gt=0)

    def __post_init__(self):
        super().__post_init__()
        if len(self.kills) != len(self.workers):
            raise ValueError(f"--kills needs one count per --workers value, got {self.kills} for {self.workers}")

    def run_config(self) -> Config:
        """The training settings alone; the runs share the cores, one thread each unless --threads says otherwise."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(Config)}
        return Config(**{**values, "threads": self.threads or 1})


@dataclass
class Segment:
    """One process of a killed-and-resumed chain."""
    kill_at: int | None
    died_after_step: int | None
    resumed_from: int
    resumed_mid_epoch: bool
    stale_tmp_files: list[str]
    records: list[dict] = field(repr=False)  # metrics.jsonl right after the process ended (before the next trims it)


@dataclass
class Comparison:
    """The killed-and-resumed run against the uninterrupted one, everything compared bitwise."""
    steps_reference: int
    steps_computed: int  # including the steps redone after each kill
    steps_never_computed: int
    loss_mismatches: int  # float.hex of the loss
    sample_mismatches: int  # the sample indices of the batch
    max_abs_loss_diff: float
    final_log_equal: bool  # metrics.jsonl, every record and field
    state_diffs: list[str]  # final model, optimizer, scheduler, sampler, RNG and counters


@dataclass
class Chain:
    workers: int
    run_dir: str
    kill_at: list[int]
    segments: list[Segment]
    comparison: Comparison | None = None


@dataclass
class OptimizerStateEffect:
    """The next losses after a resume at `at_step` with everything, and with the model weights only."""
    at_step: int
    uninterrupted_losses: list[float]
    full_losses: list[float]
    model_only_losses: list[float]
    full_max_abs_diff: float
    model_only_max_abs_diff: float


def config_args(cfg: Config) -> list[str]:
    """`cfg` as command-line flags for `main.py`."""
    return [a for f in dataclasses.fields(Config) for a in (flag(f.name), str(getattr(cfg, f.name)))]


def launch(cfg: Config, run_dir: Path, resume: Path | None = None, kill_at: int | None = None,
           timeout: float = 600) -> tuple[bool, int]:
    """Run `main.py` in a subprocess; returns (killed, last step reported). With `kill_at`, SIGKILL it (and its
    DataLoader workers: the whole process group) as soon as it reports that step; the kill lands wherever the
    trainer is by then."""
    cmd = [sys.executable, str(MAIN), "--out", str(run_dir),
           *config_args(dataclasses.replace(cfg, log_every=1))]  # every step reported: the kill can be precise
    if resume:
        cmd += ["--resume", str(resume)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
    watchdog = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    lines, last_step = [], 0
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(r"step (\d+) ", line):
                last_step = int(m.group(1))
            if kill_at is not None and last_step >= kill_at:
                os.killpg(proc.pid, signal.SIGKILL)  # no handler, no finally: exactly like the OOM killer
                break
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        proc.stdout.close()
    killed = returncode == -signal.SIGKILL
    if killed != (kill_at is not None and last_step >= kill_at):
        raise RuntimeError(f"`main.py` exited with {returncode} (kill_at={kill_at}, last step {last_step}):\n"
                           + "".join(lines[-20:]))
    return killed, last_step


def kill_and_resume(cfg: Config, run_dir: Path, kill_at: list[int], done=lambda: None) -> list[Segment]:
    """Start a run, SIGKILL it at each step in `kill_at` in turn, resuming from last.pt after every kill, and let
    the last process finish. `done()` is called after each process."""
    segments = []
    for k in [*kill_at, None]:
        last = Path(run_dir) / "last.pt"
        ckpt = load_checkpoint(last) if last.exists() else None  # killed before its first checkpoint: start over
        killed, last_step = launch(cfg, run_dir, last if ckpt else None, k)
        segments.append(Segment(k, last_step if killed else None, ckpt["step"] if ckpt else 0,
                                bool(ckpt and ckpt["sampler"]["position"] > 0),
                                sorted(p.name for p in Path(run_dir).glob("*.tmp")), read_metrics(run_dir)))
        done()
    return segments


def diff_states(a, b, path: str = "") -> list[str]:
    """Every place where two checkpoint payloads differ, compared bitwise (tensors: dtype, shape and bytes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(str, a.keys() ^ b.keys()))} differ"]
        return [d for k in a for d in diff_states(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff_states(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = (a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
        return [] if same else [f"{path}: tensors differ"]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a.hex() == b.hex() else [f"{path}: {a!r} != {b!r}"]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def compare_runs(reference: Path, resumed: Path, segments: list[Segment]) -> Comparison:
    ref = {r["step"]: r for r in read_metrics(reference) if r["kind"] == "train"}
    # Every step any process of the chain computed, including steps computed again after a kill.
    computed = [r for s in segments for r in s.records if r["kind"] == "train" and r["step"] > s.resumed_from]
    ref_ckpt, res_ckpt = load_checkpoint(reference / "last.pt"), load_checkpoint(resumed / "last.pt")
    return Comparison(
        steps_reference=len(ref), steps_computed=len(computed),
        steps_never_computed=len(ref.keys() - {r["step"] for r in computed}),
        loss_mismatches=sum(r["loss_hex"] != ref[r["step"]]["loss_hex"] for r in computed),
        sample_mismatches=sum(r["samples"] != ref[r["step"]]["samples"] for r in computed),
        max_abs_loss_diff=max(abs(r["loss"] - ref[r["step"]]["loss"]) for r in computed),
        final_log_equal=read_metrics(resumed) == read_metrics(reference),
        state_diffs=diff_states({k: ref_ckpt[k] for k in STATE_KEYS}, {k: res_ckpt[k] for k in STATE_KEYS}))


def steps_per_epoch(cfg: Config) -> int:
    return math.ceil((cfg.train_subset or MNIST_TRAIN - cfg.val_size) / cfg.batch_size)


def random_kill_points(total_steps: int, n: int, seed: int, first: int) -> list[int]:
    """n random steps in [first, total_steps), one in the middle of each of n equal slices (so they are spread)."""
    rng, width = random.Random(seed), (total_steps - first) / n
    return [first + int(width * (i + rng.uniform(0.2, 0.8))) for i in range(n)]


def quietly(fn, *args):
    """`fn(*args)` with its printing swallowed (the progress bar goes to stderr and stays)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def model_only_resume(cfg: Config, work_dir: Path, at_step: int, n_steps: int) -> OptimizerStateEffect:
    """Resume at `at_step` twice — with the optimizer state, and with the model weights only — and return the next
    `n_steps` losses of both next to those of a run that never stopped."""
    work_dir = Path(work_dir)
    uninterrupted = dataclasses.replace(cfg, max_steps=at_step + n_steps)
    quietly(train, uninterrupted, work_dir / "uninterrupted")
    quietly(train, dataclasses.replace(cfg, max_steps=at_step), work_dir / "stopped")
    losses = {}
    for name, load_optimizer in (("full", True), ("model_only", False)):
        shutil.copytree(work_dir / "stopped", work_dir / name)
        quietly(train, uninterrupted, work_dir / name, work_dir / name / "last.pt", load_optimizer)
        losses[name] = [r["loss"] for r in read_metrics(work_dir / name) if r["kind"] == "train"][at_step:]
    ref = [r["loss"] for r in read_metrics(work_dir / "uninterrupted") if r["kind"] == "train"][at_step:]
    return OptimizerStateEffect(at_step, ref, losses["full"], losses["model_only"],
                                *(max(abs(a - b) for a, b in zip(losses[k], ref)) for k in ("full", "model_only")))


@dataclass
class Proof:
    reference: Path  # the uninterrupted run's folder
    chains: dict[int, Chain]
    model_only: OptimizerStateEffect
    summary: dict  # what summary.json holds


def repo_relative(path: Path) -> str:
    """`path` relative to the repo when it lies inside it, so committed summaries hold no machine-specific paths."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def prove(cfg: Config, kill_at: dict[int, list[int]], out: Path, runs: Path) -> Proof:
    """An uninterrupted run (in this process) and, for each num_workers setting, the same run SIGKILLed at the steps
    in `kill_at[num_workers]` and resumed (in subprocesses) — all at once, one thread per run; then the comparison,
    the overlay plot, and what resuming without the optimizer state does. Writes summary.json, the plot and the
    table to `out`."""
    t0 = time.perf_counter()
    for name in ("uninterrupted", *(f"killed-w{w}" for w in kill_at), "model_only"):
        shutil.rmtree(Path(runs) / name, ignore_errors=True)
    prepare_mnist()  # once, before several processes would unpack it at the same time
    print(f"an uninterrupted run, and the same run SIGKILLed at steps {kill_at} (per num_workers) and resumed ...")
    bar = progress(total=1 + sum(len(k) + 1 for k in kill_at.values()), unit="process")
    with ThreadPoolExecutor(len(kill_at) + 1) as pool:
        ref_job = pool.submit(quietly, train, cfg, runs / "uninterrupted")  # in this process: one start-up less
        jobs = {w: pool.submit(kill_and_resume, dataclasses.replace(cfg, num_workers=w), runs / f"killed-w{w}",
                               kill_at[w], bar.update) for w in kill_at}
        ref_job.result()
        bar.update()
        chains = {w: Chain(w, repo_relative(runs / f"killed-w{w}"), kill_at[w], job.result())
                  for w, job in jobs.items()}
    bar.close()
    for w, chain in chains.items():
        chain.comparison = c = compare_runs(runs / "uninterrupted", runs / f"killed-w{w}", chain.segments)
        path = " -> ".join(f"{s.resumed_from}..{s.died_after_step or 'end'}" for s in chain.segments)
        print(f"num_workers={w}: processes ran steps {path}; of {c.steps_computed} steps computed, "
              f"{c.loss_mismatches} losses and {c.sample_mismatches} batches differ from the uninterrupted run; "
              f"final state entries that differ: {len(c.state_diffs)}")
    out.mkdir(parents=True, exist_ok=True)
    plot_overlay(runs / "uninterrupted", chains, out / "resume_overlay.png")

    at = steps_per_epoch(cfg) * 3 // 2  # mid-way through the second epoch
    print(f"resuming at step {at} with and without the optimizer state ...")
    opt = model_only_resume(cfg, runs / "model_only", at, n_steps=20)
    print(f"max |loss - uninterrupted| over the next 20 steps: full state {opt.full_max_abs_diff:.3g}, "
          f"model weights only {opt.model_only_max_abs_diff:.3g}")
    write_optimizer_table(opt, out / "optimizer_state.md")
    test = next(r for r in read_metrics(runs / "uninterrupted") if r["kind"] == "test")
    summary = {"config": asdict(cfg), "machine": machine(), "wall_s": time.perf_counter() - t0,
               "reference": repo_relative(runs / "uninterrupted"), "reference_test": test,
               "chains": {w: asdict(c) for w, c in chains.items()}, "model_only": asdict(opt)}
    for chain in summary["chains"].values():
        for s in chain["segments"]:
            del s["records"]
    print(f"wrote {out / 'resume_overlay.png'} and optimizer_state.md")
    write_results(out, "summary", resume_table(summary), summary)
    return Proof(runs / "uninterrupted", chains, opt, summary)


def main(argv=None) -> Proof:
    cfg, out = parse(ProofConfig, argv, __doc__, out=runs_dir(__file__, "prove"))
    total = cfg.epochs * steps_per_epoch(cfg)
    kill_at = {w: random_kill_points(total, k, cfg.seed + w, cfg.ckpt_every + 1)
               for w, k in zip(cfg.workers, cfg.kills)}
    return prove(cfg.run_config(), kill_at, out, runs_dir(__file__, "prove-runs"))


if __name__ == "__main__":
    run(main)
