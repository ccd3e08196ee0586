"""What a run leaves behind besides checkpoints, written by rank 0 only: the effective config (`config.toml`), run
metadata (`run.json`: the run's id, one entry per launch), `metrics.jsonl`, the tracker's copy of the metrics
(`run.tracker`: TensorBoard scalars in `tb/` or an MLflow store in `mlruns/`), and the progress display. A file that
cannot be written (a full disk, a permission) ends the run with one line (LogError) naming it and the intact
checkpoint.
"""
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
import time
import tomllib
import types
import uuid
from pathlib import Path

import torch

from . import checkpoint
from . import config as config_mod
from .signals import Stopped


class LogError(RuntimeError):
    """A log file cannot be written; the message names it and says which checkpoint is intact."""


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
    """A kill leaves the old file or the new one, never half of it; a failure leaves no temporary file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


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


def run_id(run_dir: Path) -> str | None:
    """The id of the run whose folder this is, as run.json records it (None: no run.json, or no id in it)."""
    try:
        return json.loads((Path(run_dir) / "run.json").read_text())["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def identity(run_dir: Path, ckpt: dict | None, source: Path | None, auto: bool) -> tuple[str, str | None]:
    """(this launch's run id, the run it continues if that is another one). A fresh run draws a new id; a resume
    keeps its folder's (run.json: none in a new folder, then a new one); every checkpoint records it. Under
    checkpoint.resume=auto a last.pt of another run (copied over this folder's) is refused (ConfigError); a
    checkpoint named by its path may be another run's (continued on purpose)."""
    if ckpt is None:
        return uuid.uuid4().hex, None
    mine, theirs = run_id(run_dir), ckpt["run_id"]
    if mine == theirs or (mine is None and auto):  # auto without run.json: this folder's last.pt, its log lost
        return theirs, None
    if auto:
        raise config_mod.ConfigError(
            f"refusing to resume: {source} is a checkpoint of another run ({theirs}), not of this folder's run "
            f"({mine}, run.json). To continue from it on purpose, name it: --set checkpoint.resume={source}")
    return mine or uuid.uuid4().hex, theirs


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


TIMING = ("samples_per_s", "tokens_per_s", "mfu", "elapsed_s", "cpu_s")  # Speed's fields: the clock's, not the run's


def reproducible_records(run_dir: Path) -> list[dict]:
    """Every record of metrics.jsonl without its timing fields: what two runs of one seed and config write alike, and
    a resumed run like an uninterrupted one."""
    return [{k: v for k, v in record.items() if k not in TIMING} for record in read_metrics(run_dir)]


def scalars(kind: str, values: dict) -> dict:
    """A record's numbers under the trackers' names, `train/loss`; its epoch and step are the axis, not curves."""
    return {f"{kind}/{name}": value for name, value in values.items()
            if isinstance(value, (int, float)) and name not in ("epoch", "step")}


class MlflowRun:
    """The run's MLflow twin, in a file store inside the run folder (`mlruns/`: no server, and no database whose
    creation costs seconds): params (config.toml's fields, dotted), tags (git commit, torch version, world size),
    config.toml as an artifact, and every number metrics.jsonl gets. MLflow cannot delete a logged point, so it is
    sent only what a resume keeps: records go out when the logs are made durable (before each checkpoint, and at the
    end), and a metric never gets a step it already holds. A resume continues the MLflow run that run.json names,
    unless that run holds a step the resume redoes (resumed from an older checkpoint, after a crash, or after a kill
    while a checkpoint was written) or cannot be read: then a new MLflow run gets the records metrics.jsonl kept."""

    def __init__(self, run_dir: Path, meta: dict, launches: list[dict], kept: list[dict], start_step: int):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this switch
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # else `import mlflow` fetches a config from the
        # network, sends usage events and writes an id to ~/.config/mlflow/: a run talks to nothing outside its folder
        from mlflow.entities import Metric, Param, RunTag
        from mlflow.tracking import MlflowClient

        self.make_metric = Metric
        self.store = run_dir / "mlruns"
        self.client = MlflowClient(tracking_uri=self.store.resolve().as_uri())
        earlier = next((launch["mlflow_run_id"] for launch in reversed(launches) if "mlflow_run_id" in launch), None)
        reason = self.why_not_continued(earlier, start_step) if earlier else None
        tags = {"mlflow.source.git.commit": meta["git"], "torch": meta["torch"], "world_size": meta["world_size"]}
        self.note = None  # why the MLflow run of run.json was not continued, for the log
        if earlier and not reason:  # MLflow params cannot change: a field changed on resume shows in config.toml
            self.run_id = earlier
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run("0", run_name=run_dir.name).info.run_id  # "0": the Default experiment
            fields = config_mod.flatten(tomllib.loads((run_dir / "config.toml").read_text()))
            self.client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in fields.items()])
            tags["forked_from"] = earlier
            if reason:
                self.note = (f"MLflow run {earlier} not continued: {reason}. This launch logs to a new one, "
                             f"{self.run_id} (tag forked_from)")
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v is not None])
        self.client.log_artifact(self.run_id, str(run_dir / "config.toml"))
        self.last_step = self.last_steps(self.run_id)
        self.pending = []
        for record in kept:  # all of them when this MLflow run is new
            self.add(record["kind"], record["step"], record)

    def last_steps(self, run_id: str) -> dict:
        """{metric: the last step it holds} of an MLflow run."""
        return {key: max(m.step for m in self.client.get_metric_history(run_id, key))
                for key in self.client.get_run(run_id).data.metrics}

    def why_not_continued(self, run_id: str, start_step: int) -> str | None:
        """Why a resume from `start_step` cannot continue this MLflow run (None: it can)."""
        try:
            run, last = self.client.get_run(run_id), self.last_steps(run_id)
        except Exception as exc:  # what MLflow makes of a damaged store: a run gone, a meta.yaml torn by a kill
            return f"its files cannot be read ({type(exc).__name__}: {exc})"
        if run.info.lifecycle_stage != "active":
            return "it was deleted"
        if max(last.values(), default=0) > start_step:
            return (f"it holds steps up to {max(last.values())}, past step {start_step} this launch resumes from "
                    "(MLflow cannot delete a point)")
        return None

    def add(self, kind: str, step: int, values: dict) -> None:
        now = int(time.time() * 1000)
        for key, value in scalars(kind, values).items():
            if step > self.last_step.get(key, -1):
                self.pending.append(self.make_metric(key, float(value), now, step))
                self.last_step[key] = step

    def flush(self) -> None:
        """Send the pending records. The store is files: its failure (a full disk) is raised as an OSError, which a
        checkpoint's save reports on every rank; a resume sends what metrics.jsonl kept of them again."""
        from mlflow.exceptions import MlflowException

        pending, self.pending = self.pending, []
        try:
            self.client.log_batch(self.run_id, metrics=pending)
        except MlflowException as exc:
            raise OSError(f"MLflow store {self.store}: {exc.message}") from exc

    def close(self, status: str) -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status)


def kept_records(run_dir: Path, start_step: int, evaluation_due: bool) -> list[dict]:
    """The records a resume from `start_step` keeps: none of the work it does again (the steps after it, the test,
    and, when `evaluation_due`, the evaluation at start_step: the checkpoint was written before it)."""
    def redone(record: dict) -> bool:
        if record["kind"] == "test" or record["step"] > start_step:
            return True
        return evaluation_due and record["step"] == start_step and record["kind"] == "val"

    return [record for record in read_metrics(run_dir) if not redone(record)]


class RunLog:
    """Rank 0's files and screen; on other ranks every method does nothing."""

    def __init__(self, run_dir: Path, cfg, active: bool, start_step: int, meta: dict, evaluation_due: bool = False,
                 run_id: str | None = None):
        self.run_dir, self.active, self.cfg, self.bar, self.closed = Path(run_dir), active, cfg, None, False
        self.tb = self.mlflow = None
        self.broken = False  # a write failed: close() then writes nothing more
        if not active:
            return
        with self.writing(self.run_dir / "config.toml"):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.run_dir / "config.toml", config_mod.dump_toml(cfg))
        launches = previous_launches(self.run_dir / "run.json") if start_step else []
        kept = kept_records(self.run_dir, start_step, evaluation_due)
        with self.writing(self.run_dir / "metrics.jsonl"):
            write_atomic(self.run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
            self.metrics = open(self.run_dir / "metrics.jsonl", "a")
        if cfg.run.tracker == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter

                # Readers drop the points from start_step on: those kept there are logged again
                with self.writing(self.run_dir / "tb"):
                    self.tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=start_step)
                for record in kept:
                    if record["step"] == start_step:
                        self.add_scalars(record["kind"], record["step"], record)
            except ImportError:  # tensorboard not installed: metrics.jsonl still has everything
                pass
        elif cfg.run.tracker == "mlflow":
            with self.writing(self.run_dir / "mlruns"):
                self.mlflow = MlflowRun(self.run_dir, meta, launches, kept, start_step)
            if self.mlflow.note:
                self.say(self.mlflow.note)
            meta = {**meta, "mlflow_run_id": self.mlflow.run_id}  # what the next resume continues
        with self.writing(self.run_dir / "run.json"):
            write_atomic(self.run_dir / "run.json",
                         json.dumps({"run_id": run_id, "launches": launches + [meta]}, indent=2) + "\n")

    @contextlib.contextmanager
    def writing(self, path: Path):
        """A file-system error inside becomes one LogError naming `path` and the checkpoint that is intact."""
        try:
            yield
        except OSError as exc:
            self.broken = True
            raise LogError(f"cannot write {path} ({exc.strerror or exc}); {checkpoint.intact(self.run_dir)}") from None

    def record(self, kind: str, step: int, **values) -> None:
        if not self.active:
            return
        if self.bar is not None and "loss" in values:
            self.bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{values['lr']:.2e}", refresh=False)
        with self.writing(self.run_dir / "metrics.jsonl"):
            self.metrics.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
            self.metrics.flush()  # one write per line: a kill leaves at most one torn line, which readers skip
        if self.tb:
            self.add_scalars(kind, step, values)
        if self.mlflow:
            self.mlflow.add(kind, step, values)

    def add_scalars(self, kind: str, step: int, values: dict) -> None:
        for name, value in scalars(kind, values).items():
            self.tb.add_scalar(name, value, step)

    def flush(self) -> None:
        """Make the logs durable up to now (before each checkpoint, so they never lag it after a kill)."""
        if self.active:
            with self.writing(self.run_dir / "metrics.jsonl"):
                self.metrics.flush()
                os.fsync(self.metrics.fileno())
            if self.tb:
                with self.writing(self.run_dir / "tb"):
                    self.tb.flush()
            if self.mlflow:
                with self.writing(self.mlflow.store):
                    self.mlflow.flush()

    def start_bar(self, label: str, total: int, done: int) -> None:
        """A tqdm bar of the run's steps until the next evaluation (`label`: "to step 500"): on a terminal
        (progress=auto) or always (bar); rank 0 only."""
        mode = self.cfg.train.progress
        if self.active and (mode == "bar" or mode == "auto" and sys.stderr.isatty()):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, desc=label, dynamic_ncols=True, leave=False)

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

    def end_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self, status: str = "FINISHED") -> None:
        """Once; `status` is what MLflow's run list shows: FINISHED, KILLED (stopped by a signal or Ctrl-C) or
        FAILED."""
        if not self.active or self.closed:
            return
        self.closed = True
        self.end_bar()
        closers = [(self.run_dir / "metrics.jsonl", self.metrics.close)]
        if self.tb:
            closers.append((self.run_dir / "tb", self.tb.close))
        if self.mlflow:
            closers.append((self.mlflow.store, functools.partial(self.mlflow.close, status)))
        for path, close in closers:
            if self.broken:  # the error that broke the log is being reported: close the rest without another
                with contextlib.suppress(Exception):
                    close()
            else:
                with self.writing(path):
                    close()

    def ended(self, exc_type, exc, traceback) -> None:
        """An ExitStack exit callback (train.py pushes it): close with the status the run ended with. Ending on an
        error, a failing close is not reported over it."""
        stopped = exc_type is not None and issubclass(exc_type, (Stopped, KeyboardInterrupt))
        try:
            self.close("FINISHED" if exc_type is None else "KILLED" if stopped else "FAILED")
        except LogError:
            if exc_type is None:
                raise


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


# Dense peaks (FLOP/s, no sparsity) from NVIDIA's datasheets: (bf16 and fp16 on tensor cores with fp32 accumulation,
# as torch's matmuls run; fp32 on CUDA cores, since torch's default float32 matmul precision does not use TF32).
# A card not here gets no MFU and says so: V100 has no bf16 tensor cores, and a variant (RTX 3090 Ti) is not its base.
CUDA_PEAK = {"H100": (989.4e12, 66.9e12), "H100 PCIe": (756.5e12, 51.2e12), "H100 NVL": (835.5e12, 60e12),
             "H200": (989.4e12, 66.9e12), "H200 NVL": (835.5e12, 60e12), "A100": (312e12, 19.5e12),
             "L40S": (362.05e12, 91.6e12), "L4": (121e12, 30.3e12), "RTX 4090": (165.2e12, 82.6e12),
             "RTX 3090": (71e12, 35.6e12)}


def cuda_card(name: str) -> str | None:
    """The CUDA_PEAK key of a device name: the key followed by nothing, a memory size or a form factor ("NVIDIA H100
    80GB HBM3", "NVIDIA A100-SXM4-40GB"), so that "H100 PCIe" is not read as "H100", nor "L40S" as "L4"."""
    for key in sorted(CUDA_PEAK, key=len, reverse=True):
        if re.search(rf"\b{re.escape(key)}(?=$|[ -]\d+GB|-SXM|-PCIE)", name):
            return key
    return None


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(FLOP/s, where it comes from): on CUDA the card's peak at `dtype` from CUDA_PEAK (None for a card not in it);
    on a CPU the best of a few square matmuls at `dtype` (cpu_peak_flops)."""
    if device.type == "cuda":
        name, card = torch.cuda.get_device_name(device), cuda_card(torch.cuda.get_device_name(device))
        if card is None:
            return None, f"{name}: not in runlog.CUDA_PEAK"
        low_precision, fp32 = CUDA_PEAK[card]
        peak = fp32 if dtype == torch.float32 else low_precision
        return peak, f"{name}: {card}'s dense {str(dtype).split('.')[-1]} peak (runlog.CUDA_PEAK)"
    if device.type != "cpu":
        return None, f"{device.type}: no peak known"
    return cpu_peak_flops(dtype, torch.get_num_threads())


@functools.cache
def cpu_peak_flops(dtype: torch.dtype, threads: int) -> tuple[float, str]:
    """The best of a few 1024x1024 matmuls at `dtype` on `threads` threads, measured over ~0.5 s the first time a
    process asks (a second run in the same process, as in a test suite or a sweep, reuses it)."""
    n, g = 1024, torch.Generator().manual_seed(0)  # its own generator: a resumed run's RNG state stays untouched
    a, b = torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)
    best = math.inf
    deadline = time.perf_counter() + 0.5
    while time.perf_counter() < deadline or best == math.inf:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best, f"{n}x{n} {str(dtype).split('.')[-1]} matmul on {threads} thread(s)"


class Speed:
    """Throughput over the window since the previous train record (or the launch), for the train records: samples/s,
    and for models that count their FLOPs (`flops_per_token()`, the GPT) tokens/s and MFU: achieved model FLOP/s over
    the device's peak (`peak_flops`). A window, not an average since the launch, so that a slow start (torch.compile,
    the first CUDA kernels) weighs on the records it happened in only; a window that holds an evaluation or a
    checkpoint counts their time too."""

    def __init__(self, batch_size: int, tokens_per_sample: int | None, model, device: torch.device, train):
        self.batch_size, self.tokens_per_sample = batch_size, tokens_per_sample
        self.flops_per_token = model.flops_per_token() if hasattr(model, "flops_per_token") else None
        self.peak, self.peak_source = None, None
        if self.flops_per_token and tokens_per_sample:
            dtype = getattr(torch, train.amp_dtype) if train.amp else torch.float32
            self.peak, self.peak_source = peak_flops(device, dtype)

    def start(self, step: int) -> None:
        self.t0, self.c0, self.step0 = time.perf_counter(), time.process_time(), step
        self.window_t0, self.window_step0 = self.t0, step

    def samples_per_s(self, step: int) -> float:
        """Since the launch (the evaluation lines' figure)."""
        return (step - self.step0) * self.batch_size / max(1e-9, time.perf_counter() - self.t0)

    def figures(self, step: int) -> dict:
        """samples_per_s (tokens_per_s, mfu) over the window this record closes; elapsed_s and cpu_s since the launch
        (cpu_s well below elapsed_s: waiting for data, ranks)."""
        now = time.perf_counter()
        out = {"samples_per_s": (step - self.window_step0) * self.batch_size / max(1e-9, now - self.window_t0)}
        self.window_t0, self.window_step0 = now, step
        if self.tokens_per_sample:
            out["tokens_per_s"] = out["samples_per_s"] * self.tokens_per_sample
            if self.peak:
                out["mfu"] = out["tokens_per_s"] * self.flops_per_token / self.peak
        out["elapsed_s"] = now - self.t0
        out["cpu_s"] = time.process_time() - self.c0
        return out
