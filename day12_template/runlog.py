"""What a run leaves behind besides checkpoints, written by rank 0 only: the effective config (`config.toml`), run
metadata (`run.json`: one entry per launch), `metrics.jsonl`, TensorBoard scalars (`tb/`), and the progress display.
"""
import datetime
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

import config as config_mod


def git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--", "."], capture_output=True,
                               text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "") if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def metadata(device: torch.device, world: int, resumed_from: str | None) -> dict:
    return {"start": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": [sys.executable, *sys.argv], "git": git_commit(Path(__file__).resolve().parent),
            "hostname": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name(),
            "world_size": world, "resumed_from": resumed_from}


def write_atomic(path: Path, text: str) -> None:
    """A kill leaves the old file or the new one, never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed), imported when a plot is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_lab_results(out: Path, name: str, res: dict, markdown: str, plot=None) -> None:
    """A lab's out/<name>.json, <name>.md (also printed) and, with `plot`, <name>.png (drawn by plot(res, path))."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{name}.md").write_text(markdown)
    print(markdown)
    if plot is None:
        print(f"wrote {out / name}.json and {name}.md")
        return
    plot(res, out / f"{name}.png")
    print(f"wrote {out / name}.json, {name}.md and {name}.png")


def previous_launches(path: Path) -> list[dict]:
    """The launch history of a run folder (none for a resume into a new folder, or if the file is unreadable)."""
    try:
        return json.loads(path.read_text())["launches"]
    except (OSError, ValueError, KeyError):
        return []


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of metrics.jsonl, skipping a torn last line (a run killed mid-write)."""
    path = Path(run_dir) / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class RunLog:
    """Rank 0's files and screen; on other ranks every method does nothing."""

    def __init__(self, run_dir: Path, cfg, active: bool, start_step: int, meta: dict):
        self.run_dir, self.active, self.cfg, self.bar = Path(run_dir), active, cfg, None
        if not active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.run_dir / "config.toml", config_mod.dump_toml(cfg))
        launches = previous_launches(self.run_dir / "run.json") if start_step else []
        write_atomic(self.run_dir / "run.json", json.dumps({"launches": launches + [meta]}, indent=2) + "\n")
        # Records past the checkpoint came from work that is now redone: drop them.
        kept = [r for r in read_metrics(self.run_dir) if r["step"] <= start_step and r["kind"] != "test"]
        write_atomic(self.run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
        self.metrics = open(self.run_dir / "metrics.jsonl", "a")
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=start_step + 1)
        except ImportError:  # tensorboard not installed: metrics.jsonl still has everything
            self.tb = None

    def record(self, kind: str, step: int, **values) -> None:
        if not self.active:
            return
        if self.bar is not None and "loss" in values:
            self.bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{values['lr']:.2e}", refresh=False)
        self.metrics.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        self.metrics.flush()  # one write per line: a kill leaves at most one torn line, which readers skip
        if self.tb:
            for name, value in values.items():
                if isinstance(value, (int, float)) and name not in ("epoch", "step"):
                    self.tb.add_scalar(f"{kind}/{name}", value, step)

    def flush(self) -> None:
        """Make the logs durable up to now (before each checkpoint, so they never lag it after a kill)."""
        if self.active:
            self.metrics.flush()
            os.fsync(self.metrics.fileno())
            if self.tb:
                self.tb.flush()

    def epoch_bar(self, epoch: int, total: int, done: int) -> None:
        """A tqdm bar for this epoch: on a terminal (progress=auto) or always (bar); rank 0 only."""
        mode = self.cfg.train.progress
        if self.active and (mode == "bar" or mode == "auto" and sys.stderr.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=f"epoch {epoch + 1}/{self.cfg.train.epochs}",
                            dynamic_ncols=True, leave=False)

    def advance(self) -> None:
        if self.bar is not None:
            self.bar.update()

    def say(self, text: str) -> None:
        """A line on stdout (rank 0), above the bar."""
        if not self.active:
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def end_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        if self.active:
            self.end_epoch()
            self.metrics.close()
            if self.tb:
                self.tb.close()


def profiler(cfg, run_dir: Path, enabled: bool, closing):
    """torch.profiler over `profile.steps` steps after `profile.start_step`, a Chrome trace in run_dir/profile/,
    stopped when `closing` (an ExitStack) closes; when not `enabled`, a stand-in whose step() does nothing."""
    if not enabled:
        return types.SimpleNamespace(step=lambda: None)
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=acts, schedule=schedule(wait=cfg.profile.start_step, warmup=1, active=cfg.profile.steps,
                                                      repeat=1),
                   on_trace_ready=tensorboard_trace_handler(str(run_dir / "profile")), record_shapes=True,
                   profile_memory=True)
    prof.start()
    closing.callback(prof.stop)
    return prof


# Dense bf16 tensor-core peaks (FLOP/s, no sparsity) of common cards, matched by name; other cards: no MFU figure.
CUDA_BF16_PEAK = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12,
                  "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12}


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(FLOP/s, where it comes from): on CUDA the card's bf16 peak from the table (None for a card not in it); on a
    CPU the best of a few square matmuls at `dtype` with this process's threads, measured now (~0.5 s)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in CUDA_BF16_PEAK.items() if k in name), None)
        return peak, f"{name} bf16 peak (table)" if peak else f"{name}: not in runlog.CUDA_BF16_PEAK"
    if device.type != "cpu":
        return None, f"{device.type}: no peak known"
    n, g = 1024, torch.Generator().manual_seed(0)  # its own generator: a resumed run's RNG state stays untouched
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    best = math.inf
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline or best == math.inf:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best, f"{n}x{n} {str(dtype).split('.')[-1]} matmul on {torch.get_num_threads()} thread(s)"


class Speed:
    """Throughput since this launch, for the train records: samples/s, and for models that count their FLOPs
    (`flops_per_token()`, the GPT) tokens/s and MFU: achieved model FLOP/s over the device's peak (`peak_flops`)."""

    def __init__(self, batch_size: int, tokens_per_sample: int | None, model, device: torch.device, train):
        self.batch_size, self.tokens_per_sample = batch_size, tokens_per_sample
        self.flops_per_token = model.flops_per_token() if hasattr(model, "flops_per_token") else None
        self.peak, self.peak_source = None, None
        if self.flops_per_token and tokens_per_sample:
            dtype = getattr(torch, train.amp_dtype) if train.amp else torch.float32
            self.peak, self.peak_source = peak_flops(device, dtype)

    def start(self, step: int) -> None:
        self.t0, self.c0, self.step0 = time.perf_counter(), time.process_time(), step

    def samples_per_s(self, step: int) -> float:
        return (step - self.step0) * self.batch_size / max(1e-9, time.perf_counter() - self.t0)

    def figures(self, step: int) -> dict:
        """samples_per_s (tokens_per_s, mfu), elapsed_s and cpu_s (well below elapsed_s: waiting for data, ranks)."""
        out = {"samples_per_s": self.samples_per_s(step)}
        if self.tokens_per_sample:
            out["tokens_per_s"] = out["samples_per_s"] * self.tokens_per_sample
            if self.peak:
                out["mfu"] = out["tokens_per_s"] * self.flops_per_token / self.peak
        out["elapsed_s"] = time.perf_counter() - self.t0
        out["cpu_s"] = time.process_time() - self.c0
        return out
