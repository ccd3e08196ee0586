"""Day 1, part 1b — why is torch.cuda.is_available() False? Walk the chain in order; the first failing step wins.

`cuda_facts()` reads everything the chain inspects (torch, the environment, nvidia-smi, /proc), so tests can
simulate any machine; `diagnose_cuda()` returns the step that explains this one. `main.py` prints it with the rest
of the environment report; run this file alone on a machine whose GPU does not show up.

Run:  python day01_env_and_tensors/diagnose_cuda.py
"""
import dataclasses
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch



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


@dataclass(frozen=True)
class CudaFacts:
    cuda_available: bool
    nvidia_smi: bool  # nvidia-smi ran and printed its banner
    kernel_driver_loaded: bool  # /proc/driver/nvidia exists (Linux only)
    torch_version: str
    wheel_cuda: str | None
    driver_max_cuda: str | None  # nvidia-smi's "CUDA Version": the newest runtime the driver supports
    cuda_visible_devices: str | None
    virtualization: list[str]


def cuda_facts() -> CudaFacts:
    """Everything the chain inspects, read from torch, the environment and the system (tests monkeypatch these)."""
    smi = nvidia_smi_output()
    driver_cuda = re.search(r"CUDA Version:\s*([\d.]+)", smi or "")
    return CudaFacts(torch.cuda.is_available(), smi is not None, Path("/proc/driver/nvidia/version").exists(),
                     torch.__version__, torch.version.cuda, driver_cuda.group(1) if driver_cuda else None,
                     os.environ.get("CUDA_VISIBLE_DEVICES"), virtualization_hints())


# (step, what is wrong, the test on the facts, what to do) — the order matters: later steps assume earlier ones pass.
CHAIN = [
    (1, "no driver / GPU not visible: nvidia-smi gives no output",
     lambda f: not f.nvidia_smi,
     "install the NVIDIA driver; in a container start it with --gpus all (nvidia-container-toolkit)"),
    (2, "CPU-only torch build ('+cpu' in torch.__version__)",
     lambda f: "+cpu" in f.torch_version,
     "pip uninstall torch torchvision, then reinstall from the CUDA index-url (download.pytorch.org/whl/cu1xx)"),
    (3, "torch.version.cuda is None: not a CUDA wheel",
     lambda f: f.wheel_cuda is None,
     "same fix as step 2: install a CUDA wheel"),
    (4, "driver older than the wheel: its highest CUDA version < torch.version.cuda",
     lambda f: f.driver_max_cuda is not None and version_tuple(f.driver_max_cuda) < version_tuple(f.wheel_cuda),
     "upgrade the driver, or install a wheel built for an older CUDA"),
    (5, "CUDA_VISIBLE_DEVICES hides every GPU (set to '' or -1)",
     lambda f: f.cuda_visible_devices is not None and f.cuda_visible_devices.strip() in ("", "-1"),
     "unset CUDA_VISIBLE_DEVICES or list a real device index"),
    (6, "everything above is fine: check WSL / container / VM GPU passthrough",
     lambda f: True,
     "enable GPU passthrough for the VM, WSL2 or container runtime"),
]


@dataclass(frozen=True)
class Diagnosis:
    step: int  # 0: CUDA is available
    problem: str
    fix: str
    facts: CudaFacts


def diagnose_cuda(facts: CudaFacts | None = None) -> Diagnosis:
    """Return the first step of the chain that explains why CUDA is unavailable (step 0: it is available)."""
    facts = cuda_facts() if facts is None else facts
    if facts.cuda_available:
        return Diagnosis(0, "none: torch.cuda.is_available() is True", "", facts)
    step, problem, _, fix = next(link for link in CHAIN if link[2](facts))  # step 6 always matches
    return Diagnosis(step, problem, fix, facts)


if __name__ == "__main__":
    result = diagnose_cuda()
    print(f"step {result.step}: {result.problem}" + (f"\nfix: {result.fix}" if result.fix else ""))
    for key, value in dataclasses.asdict(result.facts).items():
        print(f"  {key:<22} {value}")
