"""Day 1 — the environment, and what a tensor really is.

Part 1 prints an environment report and walks the six-step "why is torch.cuda.is_available() False?" chain,
returning the step that explains this machine. Part 2 shows the tensor lessons with evidence rather than
prose: the three attributes (dtype / device / shape), broadcasting and its silent (N,) vs (N,1) trap, and
view / reshape / permute / contiguous seen through stride(), is_contiguous() and storage sharing.

Run:    python day01_env_and_tensors/main.py     (a few seconds; writes day01_env_and_tensors/results/)
Gates:  python day01_env_and_tensors/check.py
"""
import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch

from sprint.device import pick_device

OUT_DIR = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------------------------------------------
# Part 1a: the environment report
# ----------------------------------------------------------------------------------------------------------

def cpu_model() -> str:
    """The CPU's marketing name; platform.processor() is empty on most Linux systems, so read /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment_report() -> dict:
    """Versions, the chosen device, and the accelerator's key figures (or the CPU's when there is none)."""
    report = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": importlib.metadata.version("torchvision"),  # metadata only: importing it costs seconds
        "torch.version.cuda": torch.version.cuda,  # the CUDA runtime the wheel ships with; None on CPU builds
        "cuda_available": torch.cuda.is_available(),
        "device": str(pick_device()),
        "cpu_model": cpu_model(),
        "cpu_threads": torch.get_num_threads(),  # intra-op threads torch will use
        "cpu_count": os.cpu_count(),
        "mps_available": torch.backends.mps.is_available(),
    }
    if report["cuda_available"]:
        props = torch.cuda.get_device_properties(0)
        report.update({
            "gpu_count": torch.cuda.device_count(),
            "device_name": props.name,
            "total_memory_gib": round(props.total_memory / 2**30, 2),
            "compute_capability": f"{props.major}.{props.minor}",  # 8.0 = A100, 9.0 = H100/H200
            "sm_count": props.multi_processor_count,  # streaming multiprocessors: the GPU's "cores"
        })
    return report


# ----------------------------------------------------------------------------------------------------------
# Part 1b: why is torch.cuda.is_available() False? Walk the chain in order; the first failing step wins.
# ----------------------------------------------------------------------------------------------------------

def nvidia_smi_output() -> str | None:
    """nvidia-smi's banner (driver version and the highest CUDA it supports), or None if it is missing/fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def virtualization_hints() -> list[str]:
    """Signs that we run inside a container, WSL or a VM: where GPU passthrough has to be set up explicitly."""
    hints = []
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        hints.append("container")
    try:
        if "microsoft" in Path("/proc/version").read_text().lower():
            hints.append("wsl")
        if re.search(r"^flags\s*:.*\bhypervisor\b", Path("/proc/cpuinfo").read_text(), re.M):
            hints.append("vm")
    except OSError:
        pass
    return hints


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


def cuda_facts() -> dict:
    """Everything the chain inspects, read from torch, the environment and the system (tests monkeypatch these)."""
    smi = nvidia_smi_output()
    driver_cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi or "")
    return {
        "cuda_available": torch.cuda.is_available(),
        "nvidia_smi": smi is not None,
        "kernel_driver_loaded": Path("/proc/driver/nvidia/version").exists(),  # Linux only
        "torch_version": torch.__version__,
        "wheel_cuda": torch.version.cuda,
        "driver_max_cuda": driver_cuda.group(1) if driver_cuda else None,  # nvidia-smi's "CUDA Version"
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "virtualization": virtualization_hints(),
    }


# (step, what is wrong, the test on the facts, what to do) — the order matters: later steps assume earlier ones pass.
CHAIN = [
    (1, "no driver / GPU not visible: nvidia-smi gives no output",
     lambda f: not f["nvidia_smi"],
     "install the NVIDIA driver; in a container start it with --gpus all (nvidia-container-toolkit)"),
    (2, "CPU-only torch build ('+cpu' in torch.__version__)",
     lambda f: "+cpu" in f["torch_version"],
     "pip uninstall torch torchvision, then reinstall from the CUDA index-url (download.pytorch.org/whl/cu1xx)"),
    (3, "torch.version.cuda is None: not a CUDA wheel",
     lambda f: f["wheel_cuda"] is None,
     "same fix as step 2: install a CUDA wheel"),
    (4, "driver older than the wheel: its highest CUDA version < torch.version.cuda",
     lambda f: f["driver_max_cuda"] is not None
     and version_tuple(f["driver_max_cuda"]) < version_tuple(f["wheel_cuda"]),
     "upgrade the driver, or install a wheel built for an older CUDA"),
    (5, "CUDA_VISIBLE_DEVICES hides every GPU (set to '' or -1)",
     lambda f: f["CUDA_VISIBLE_DEVICES"] is not None and f["CUDA_VISIBLE_DEVICES"].strip() in ("", "-1"),
     "unset CUDA_VISIBLE_DEVICES or list a real device index"),
    (6, "everything above is fine: check WSL / container / VM GPU passthrough",
     lambda f: True,
     "enable GPU passthrough for the VM, WSL2 or container runtime"),
]


def diagnose_cuda(facts: dict | None = None) -> dict:
    """Return the first step of the chain that explains why CUDA is unavailable (step 0: it is available)."""
    facts = cuda_facts() if facts is None else facts
    if facts["cuda_available"]:
        return {"step": 0, "problem": "none: torch.cuda.is_available() is True", "fix": "", "facts": facts}
    step, problem, _, fix = next(link for link in CHAIN if link[2](facts))  # step 6 always matches
    return {"step": step, "problem": problem, "fix": fix, "facts": facts}


# ----------------------------------------------------------------------------------------------------------
# Part 2: tensor lessons, each returning its evidence
# ----------------------------------------------------------------------------------------------------------

def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when both tensors look into the same block of memory (a view), False for a copy."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def error_of(fn) -> dict | None:
    """Run fn and return the error it raised as {type, message}, or None if it ran fine."""
    try:
        fn()
    except Exception as exc:  # the lesson is the error itself, whichever it is
        return {"type": type(exc).__name__, "message": str(exc)}
    return None


def three_attributes() -> dict:
    """A tensor = data + dtype + device + shape. Mixed dtypes promote in elementwise ops but not in matmul."""
    x = torch.zeros(2, 3, dtype=torch.float32, device="cpu")  # state all three explicitly
    half = x.to("cpu", dtype=torch.float16)  # .to() changes device and dtype in one call
    a32, b64 = torch.ones(3, 2), torch.ones(2, 2, dtype=torch.float64)
    return {
        "shape": list(x.shape), "dtype": str(x.dtype), "device": str(x.device),
        "to_float16": str(half.dtype),
        "add_float32_float64": str((a32[:2] + b64).dtype),  # type promotion: the wider dtype wins
        "matmul_float32_float64": error_of(lambda: a32 @ b64),  # no promotion in matmul: an error
    }


def checked_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MSE with the one-line defence: equal shapes before anything can broadcast."""
    assert pred.shape == target.shape, (pred.shape, target.shape)
    return ((pred - target) ** 2).mean()


def broadcasting(n: int = 8, seed: int = 0) -> dict:
    """Align from the right; each dim equal, 1, or missing. A mismatch that fits the rules is silently wrong."""
    g = torch.Generator().manual_seed(seed)
    rule = (torch.randn(8, 1, 128, generator=g) + torch.randn(1, 16, 128, generator=g)).shape
    loud = error_of(lambda: torch.randn(32, 10) - torch.randn(32))  # 10 vs 32: breaks the rules, so it raises
    target = torch.randn(n, generator=g)  # labels as a flat vector: (N,)
    pred = target.unsqueeze(1).clone()  # a perfect model's output, shaped like a model's: (N, 1)
    trap = pred - target  # (N,1) - (N,) -> (N,N): every prediction minus every label
    return {
        "rule_shape": list(rule),
        "loud_mismatch": loud,
        "trap_shape": list(trap.shape),
        "trap_loss": (trap ** 2).mean().item(),  # no error: a perfect model scores a loss far from 0
        "right_loss": checked_mse(pred, target.unsqueeze(1)).item(),  # shapes aligned: exactly 0
        "assert_defence": error_of(lambda: checked_mse(pred, target)),
    }


def layout(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "stride": list(t.stride()), "contiguous": t.is_contiguous()}


def views_and_copies() -> dict:
    """A tensor is storage + shape + stride. view/permute only rewrite stride; reshape/contiguous may copy."""
    a = torch.arange(24.0).reshape(4, 6)  # contiguous: stride (6, 1)
    t = a.t()  # transpose swaps the strides -> (1, 6); nothing moves
    x = torch.arange(24.0).reshape(2, 3, 4)
    p = x.permute(2, 0, 1)  # permute is a transpose in N dims: strides reordered, memory untouched
    fixed = t.contiguous()  # a real copy, laid out row-major for its new shape
    return {
        "a": layout(a),
        "a.view(2,12) shares": shares_storage(a, a.view(2, 12)),
        "a.reshape(2,12) shares": shares_storage(a, a.reshape(2, 12)),  # reshape = view when it can
        "t = a.t()": layout(t),
        "t shares": shares_storage(a, t),
        "t.view(24)": error_of(lambda: t.view(24)),
        "t.reshape(24) shares": shares_storage(a, t.reshape(24)),  # it could not view, so it silently copied
        "x.permute(2,0,1)": layout(p),
        "permute shares": shares_storage(x, p),
        "t.contiguous()": layout(fixed),
        "t.contiguous() shares": shares_storage(a, fixed),
        "t.contiguous().view(24) works": error_of(lambda: fixed.view(24)) is None,
        "contiguous() of a contiguous tensor is itself": a.contiguous() is a,  # no copy when none is needed
    }


def tensor_lessons(n: int = 8, seed: int = 0) -> dict:
    return {"attributes": three_attributes(), "broadcasting": broadcasting(n, seed), "views": views_and_copies()}


# ----------------------------------------------------------------------------------------------------------

def show(title: str, items: dict) -> None:
    print(f"\n== {title}")
    for key, value in items.items():
        print(f"  {key:<46} {value}")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8, help="batch size N in the (N,) vs (N,1) broadcasting trap")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where report.json goes")
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("--n must be at least 2 (with N = 1 the trap's (N,N) equals (N,1) and hides nothing)")

    report = environment_report()
    show("environment", report)
    diagnosis = diagnose_cuda()
    show(f"is CUDA available? chain step {diagnosis['step']}",
         {"problem": diagnosis["problem"], "fix": diagnosis["fix"], **diagnosis["facts"]})
    lessons = tensor_lessons(args.n, args.seed)
    show("three attributes: dtype / device / shape", lessons["attributes"])
    show(f"broadcasting (N = {args.n})", lessons["broadcasting"])
    show("view / reshape / permute / contiguous", lessons["views"])

    result = {"environment": report, "diagnosis": diagnosis, "lessons": lessons}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out / 'report.json'}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
