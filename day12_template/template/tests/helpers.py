"""What the template's tests share (and the repo's check.py reuses): tiny configs that train in seconds, running
them, reading what they wrote, comparing checkpoints bitwise, and launching a script to kill it at a chosen moment."""
import contextlib
import hashlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import torch

from train_template import config, consolidate, runlog

TEMPLATE = Path(__file__).resolve().parent.parent
# train.py with the drills of TEMPLATE_FAULTS, run as a module (child_env lets a subprocess find the package)
FAULTS = ["-m", "train_template.troubleshoot.faults"]

# A tiny run: generated data, a small MLP with dropout, 16 steps per epoch, 2 epochs, a checkpoint every 3 steps.
TINY = {"data.dataset": "synthetic", "data.synthetic.size": 512, "data.synthetic.val_size": 128, "model.mlp.hidden": 32,
        "model.mlp.dropout": 0.1, "optim.lr": 3e-3, "train.epochs": 2, "train.batch_size": 32, "train.log_every": 1,
        "checkpoint.every_steps": 3, "checkpoint.keep_last": 2, "train.progress": "off"}
STEPS = 2 * 512 // 32


def tiny_lm(root: str) -> dict:
    """The same run for a language model: a tiny GPT on a corpus in the Shakespeare layout (`root`; empty: the repo's
    bundle), 32 steps evaluated every 16 (the "epochs" of text), windows of 32 bytes, the same checkpoints; none of
    TINY's image fields (train.epochs, the synthetic data's and the MLP's tables): a run warns about values it
    ignores."""
    shared = {k: v for k, v in TINY.items() if not k.startswith(("train.epochs", "data.synthetic.", "model.mlp."))}
    return {**shared, "data.dataset": "shakespeare", "data.root": root, "data.shakespeare.block_size": 32,
            "data.shakespeare.eval_windows": 32, "model.name": "gpt", "model.gpt.n_layer": 2, "model.gpt.n_head": 2,
            "model.gpt.n_embd": 32, "model.gpt.block_size": 32, "model.gpt.dropout": 0.1, "train.steps": STEPS,
            "train.eval_every": 16}


def tiny_tokens(root) -> dict:
    """tiny_lm's run on nanoGPT's token files in `root`: the same windows, set in the tokens dataset's table."""
    shared = {k: v for k, v in tiny_lm("").items() if not k.startswith("data.shakespeare.")}
    return {**shared, "data.dataset": "tokens", "data.root": str(root), "data.tokens.block_size": 32,
            "data.tokens.eval_windows": 32}


def sets(values: dict) -> list[str]:
    return [f"{k}={config.to_toml(v)}" for k, v in values.items()]


def cfg_of(values: dict, out: Path) -> config.Config:
    return config.load(None, sets({**values, "run.out_dir": str(out)}))


def train_records(run_dir: Path) -> dict:
    return {r["step"]: r for r in runlog.read_metrics(run_dir) if r["kind"] == "train"}


def every_record(run_dir: Path) -> list[dict]:
    """Every train, val and test record, timing fields left out, each float as float.hex."""
    return [{k: v.hex() if isinstance(v, float) else v for k, v in r.items()}
            for r in runlog.reproducible_records(run_dir)]


def diff_states(a, b, path="") -> list[str]:
    """Every place two checkpoint entries differ, compared bitwise (tensors by bytes, floats by float.hex)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys differ"]
        return [d for k in a for d in diff_states(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: lengths differ"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff_states(x, y, f"{path}[{i}]")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.reshape(-1).view(torch.uint8),
                                                                         b.reshape(-1).view(torch.uint8))
        return [] if same else [f"{path}: tensors differ"]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a.hex() == b.hex() else [f"{path}: {a!r} != {b!r}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def sha(path: Path) -> str:
    """A file's SHA-256, or a folder's (a sharded checkpoint): over its files' names and bytes."""
    path = Path(path)
    if path.is_dir():
        return hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in sorted(path.iterdir()))).hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


FORMATS = {"full": {}, "sharded": {"checkpoint.format": "sharded"}}  # the two checkpoint formats, in one process
SHARD = re.compile(r".*/ckpt-\d{8}\.tmp(/__1_\d+\.distcp)?")  # a sharded checkpoint's folder, rank 1's shard in it


def full(path: Path) -> dict:
    """A checkpoint with its model and optimizer state, whatever its format (a sharded one read into a plain model)."""
    return consolidate.full_checkpoint(path)


def child_env(**extra) -> dict:
    """Subprocesses compute with this process's thread count, so their floats round the same way, and import the
    package from this folder (`python -m train_template...`), installed or not. A child killed by a fatal signal
    (SIGABRT, SIGSEGV) prints every thread's Python stack (PYTHONFAULTHANDLER): where it was when it died."""
    path = os.pathsep.join(filter(None, [str(TEMPLATE), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads()), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path,
            "PYTHONFAULTHANDLER": "1", **extra}


@contextlib.contextmanager
def one_thread():
    """This process and the children it launches meanwhile (child_env) compute in one thread: runs sharing the cores
    at once then each get one instead of oversubscribing them (a thread pool whose threads wait for a core spins, and
    its step waits for its slowest thread). Bitwise comparisons hold among runs of one thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def launch(cmd, cwd=None, env=None, kill_when=None, sig=signal.SIGKILL, group=True, timeout=240):
    """Run `cmd`; with `kill_when` (a function returning True once the run got far enough), send `sig` as soon as it
    holds: to the whole process group (DataLoader workers included, like a terminal's Ctrl-C or the OOM killer's
    victims) or, with group=False, to the launched process alone. Returns (returncode, output)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env or child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        if kill_when is not None and kill_when():
            os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
            kill_when = None
        time.sleep(0.005)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    reader.join(5)
    return proc.returncode, "".join(out)


def reached(run_dir: Path, step: int):
    return lambda: any(s >= step for s in train_records(run_dir))
