"""GPU utilisation while a loop runs (CUDA only): the figure `nvidia-smi` shows, sampled in a background thread."""
import statistics
import subprocess
import threading
import time

import torch


def gpu_utilisation(run, device: torch.device, min_seconds: float = 3.0) -> float | None:
    """Mean GPU utilisation (NVML, %) while `run()` is repeated for at least `min_seconds`; None without a reading."""
    samples, done = [], threading.Event()

    def sample():
        while not done.wait(0.2):  # NVML averages over its own 1/6-1 s window
            value = read_gpu_utilisation(device)
            if value is not None:
                samples.append(value)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min_seconds:
        run()
    done.set()
    sampler.join()
    return round(statistics.mean(samples), 1) if samples else None


def read_gpu_utilisation(device: torch.device) -> float | None:
    """torch.cuda.utilization() (needs the nvidia-ml-py package), else nvidia-smi, else None."""
    try:
        return float(torch.cuda.utilization(device))
    except (ModuleNotFoundError, RuntimeError):
        pass
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    uuid = uuid if uuid.startswith("GPU-") else "GPU-" + uuid  # nvidia-smi -i wants the GPU- prefix
    try:
        out = subprocess.run(["nvidia-smi", "-i", uuid, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=5, check=True).stdout
        return float(out.strip())
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
