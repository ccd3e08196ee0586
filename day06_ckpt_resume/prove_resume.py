"""Day 6 proof: SIGKILL a real training process at random steps, resume it, and compare it bit for bit with a run
that never stopped; then resume once without the optimizer state to show why it is part of the checkpoint.

Run:    python day06_ckpt_resume/prove_resume.py   (one uninterrupted run, the same run SIGKILLed 5 times and resumed)
Gates:  python day06_ckpt_resume/check.py
"""
import argparse
import dataclasses
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch

from day06_ckpt_resume.checkpoint import load_checkpoint, read_metrics
from day06_ckpt_resume.main import OUT_DIR, RUNS_DIR, Config, config_from_args, config_parser, train
from day06_ckpt_resume.report import plot_overlay, write_optimizer_table
from sprint.data import REPO_ROOT

MAIN = Path(__file__).resolve().parent / "main.py"


def config_args(cfg: Config) -> list[str]:
    """`cfg` as command-line flags for `main.py train`."""
    return [arg for f in dataclasses.fields(cfg)
            for arg in (f"--{f.name.replace('_', '-')}", str(getattr(cfg, f.name)))]


def launch(cfg: Config, run_dir: Path, resume: Path | None = None, kill_at: int | None = None,
           timeout: float = 600) -> dict:
    """Run `main.py train` in a subprocess. With `kill_at`, SIGKILL it (and its DataLoader workers: the whole
    process group) as soon as it reports that step; the kill lands wherever the trainer is by then."""
    cmd = [sys.executable, str(MAIN), "train", "--out", str(run_dir),
           *config_args(dataclasses.replace(cfg, log_every=1))]  # every step reported: the kill can be precise
    if resume:
        cmd += ["--resume", str(resume)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
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
        raise RuntimeError(f"`main.py train` exited with {returncode} (kill_at={kill_at}, last step {last_step}):\n"
                           + "".join(lines[-20:]))
    return {"killed": killed, "last_step": last_step, "output": "".join(lines)}


def kill_and_resume(cfg: Config, run_dir: Path, kill_at: list[int]) -> list[dict]:
    """Start a run, SIGKILL it at each step in `kill_at` in turn, resuming from last.pt after every kill, and let
    the last process finish. Returns one segment per process: where it resumed, where it died, and the metrics
    records as they were on disk right after it ended (before the next process trims them)."""
    segments = []
    for k in [*kill_at, None]:
        last = Path(run_dir) / "last.pt"
        ckpt = load_checkpoint(last) if last.exists() else None  # killed before its first checkpoint: start over
        run = launch(cfg, run_dir, last if ckpt else None, k)
        segments.append({"kill_at": k, "died_after_step": run["last_step"] if run["killed"] else None,
                         "resumed_from": ckpt["step"] if ckpt else 0,
                         "resumed_mid_epoch": bool(ckpt and ckpt["sampler"]["position"] > 0),
                         "stale_tmp_files": sorted(p.name for p in Path(run_dir).glob("*.tmp")),
                         "records": read_metrics(run_dir)})
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


def compare_runs(reference: Path, resumed: Path, segments: list[dict]) -> dict:
    """Figures for "the killed-and-resumed run is the uninterrupted run", all compared bitwise."""
    ref = {r["step"]: r for r in read_metrics(reference) if r["kind"] == "train"}
    # Every step any process of the chain computed, including steps computed again after a kill.
    computed = [r for s in segments for r in s["records"] if r["kind"] == "train" and r["step"] > s["resumed_from"]]
    state_keys = ("model", "optimizer", "scheduler", "sampler", "rng", "step", "best_val", "bad_epochs")
    ref_ckpt, res_ckpt = load_checkpoint(reference / "last.pt"), load_checkpoint(resumed / "last.pt")
    return {
        "steps_reference": len(ref),
        "steps_computed": len(computed),
        "steps_never_computed": len(ref.keys() - {r["step"] for r in computed}),
        "loss_mismatches": sum(r["loss_hex"] != ref[r["step"]]["loss_hex"] for r in computed),
        "sample_mismatches": sum(r["samples"] != ref[r["step"]]["samples"] for r in computed),
        "max_abs_loss_diff": max(abs(r["loss"] - ref[r["step"]]["loss"]) for r in computed),
        "final_log_equal": read_metrics(resumed) == read_metrics(reference),  # train and val records, every field
        "state_diffs": diff_states({k: ref_ckpt[k] for k in state_keys}, {k: res_ckpt[k] for k in state_keys}),
    }


def steps_per_epoch(cfg: Config) -> int:
    n_train = cfg.train_subset or 60000 - cfg.val_size  # MNIST has 60,000 training images
    return math.ceil(n_train / cfg.batch_size)


def random_kill_points(total_steps: int, n: int, seed: int, first: int) -> list[int]:
    """n random steps in [first, total_steps), one in the middle of each of n equal slices (so they are spread)."""
    rng, width = random.Random(seed), (total_steps - first) / n
    return [first + int(width * (i + rng.uniform(0.2, 0.8))) for i in range(n)]


def model_only_resume(cfg: Config, work_dir: Path, at_step: int, n_steps: int) -> dict:
    """Resume at `at_step` twice — with the optimizer state, and with the model weights only — and return the next
    `n_steps` losses of both next to those of a run that never stopped."""
    work_dir = Path(work_dir)
    uninterrupted = dataclasses.replace(cfg, max_steps=at_step + n_steps)
    train(uninterrupted, work_dir / "uninterrupted")
    train(dataclasses.replace(cfg, max_steps=at_step), work_dir / "stopped")
    losses = {}
    for name, load_optimizer in (("full", True), ("model_only", False)):
        shutil.copytree(work_dir / "stopped", work_dir / name)
        train(uninterrupted, work_dir / name, resume=work_dir / name / "last.pt", load_optimizer=load_optimizer)
        losses[name] = [r["loss"] for r in read_metrics(work_dir / name) if r["kind"] == "train"][at_step:]
    losses["uninterrupted"] = [r["loss"] for r in read_metrics(work_dir / "uninterrupted")
                               if r["kind"] == "train"][at_step:]
    ref = losses["uninterrupted"]
    return {"at_step": at_step, **{f"{k}_losses": v for k, v in losses.items()},
            **{f"{k}_max_abs_diff": max(abs(a - b) for a, b in zip(losses[k], ref)) for k in ("full", "model_only")}}



def repo_relative(path: Path) -> str:
    """`path` relative to the repo when it lies inside it, so committed summaries hold no machine-specific paths."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def demo(cfg: Config, kill_at: dict[int, list[int]], out: Path, runs: Path) -> dict:
    """The lesson end to end: an uninterrupted run and, for each num_workers setting, the same run SIGKILLed at
    the steps in `kill_at[num_workers]` and resumed — all three at once, one per core; then the comparison, the
    overlay plot, and what resuming without the optimizer state does."""
    shutil.rmtree(runs, ignore_errors=True)
    cfg = dataclasses.replace(cfg, threads=cfg.threads or 1)  # three runs share the cores: one thread each
    print(f"an uninterrupted run, and the same run SIGKILLed at steps {kill_at} (per num_workers) and resumed ...")
    chain_cfgs = {w: dataclasses.replace(cfg, num_workers=w) for w in kill_at}
    with ThreadPoolExecutor(len(kill_at) + 1) as pool:
        ref_job = pool.submit(launch, cfg, runs / "uninterrupted")
        jobs = {w: pool.submit(kill_and_resume, c, runs / f"killed-w{w}", kill_at[w]) for w, c in chain_cfgs.items()}
        ref_job.result()
        chains = {w: {"run_dir": repo_relative(runs / f"killed-w{w}"), "kill_at": kill_at[w], "segments": job.result()}
                  for w, job in jobs.items()}
    for w, chain in chains.items():
        chain.update(compare_runs(runs / "uninterrupted", runs / f"killed-w{w}", chain["segments"]))
        path = " -> ".join(f"{s['resumed_from']}..{s['died_after_step'] or 'end'}" for s in chain["segments"])
        print(f"num_workers={w}: processes ran steps {path}; of {chain['steps_computed']} steps computed, "
              f"{chain['loss_mismatches']} losses and {chain['sample_mismatches']} batches differ from the "
              f"uninterrupted run; final state entries that differ: {len(chain['state_diffs'])}")
    out.mkdir(parents=True, exist_ok=True)
    plot_overlay(runs / "uninterrupted", chains, out / "resume_overlay.png")

    at = steps_per_epoch(cfg) * 3 // 2  # mid-way through the second epoch
    print(f"resuming at step {at} with and without the optimizer state ...")
    opt = model_only_resume(cfg, runs / "model_only", at, n_steps=20)
    print(f"max |loss - uninterrupted| over the next 20 steps: full state {opt['full_max_abs_diff']:.3g}, "
          f"model weights only {opt['model_only_max_abs_diff']:.3g}")
    write_optimizer_table(opt, out / "optimizer_state.md")
    for chain in chains.values():
        for s in chain["segments"]:
            del s["records"]
    test = next(r for r in read_metrics(runs / "uninterrupted") if r["kind"] == "test")
    summary = {"config": asdict(cfg), "reference": repo_relative(runs / "uninterrupted"), "reference_test": test,
               "chains": chains, "model_only": opt}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'resume_overlay.png'}, optimizer_state.md and summary.json")
    return summary



def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[config_parser(Config)])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers of each killed chain")
    parser.add_argument("--kills", type=int, nargs="+", default=[2, 3], help="SIGKILLs per chain, one per --workers")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the plot and tables go")
    parser.add_argument("--runs", type=Path, default=RUNS_DIR / "demo", help="where the runs go (wiped first)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = config_from_args(Config, args, parser)
    if len(args.kills) != len(args.workers):
        parser.error("give one --kills count per --workers value")
    total = cfg.epochs * steps_per_epoch(cfg)
    kill_at = {w: random_kill_points(total, k, cfg.seed + w, cfg.ckpt_every + 1)
               for w, k in zip(args.workers, args.kills)}
    return demo(cfg, kill_at, args.out, args.runs)


if __name__ == "__main__":
    main(sys.argv[1:])
