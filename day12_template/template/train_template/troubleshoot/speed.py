"""Why the device waits: data time against step time, and the host syncs a training loop makes.

`data_vs_step` times, in turns, fetching the next batch (its copy to the device included) and one training step on it
(the device synchronised after each), and
classifies the ratio of their medians with Day 11's bands: below 5% the loop is compute-bound (a faster device,
mixed precision, a larger batch help; the data pipeline does not), above 20% it is data-bound (workers, pinned
memory, lighter augmentation, a faster storage format).

`HostSyncs` counts, while a loop runs, the calls that make the host wait for the device: `.item()`, `.tolist()`,
`.cpu()`, `.numpy()`, `bool()/float()/int()` of a tensor (an `if` on a tensor), `print(tensor)`. Only calls made
by your code count (torch's own, such as AdamW reading its CPU step counter, are left out), each with its file and
line. On CUDA only tensors on the GPU count (exact); on a CPU every tensor does, so the count is an upper bound:
on a GPU a call on a CPU tensor costs nothing.
"""
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

TORCH_DIR = str(Path(torch.__file__).resolve().parent)
BANDS = [(0.05, "compute-bound"), (0.20, "mostly compute-bound"), (float("inf"), "data-bound")]  # Day 11's bands
SYNCS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__repr__", "__format__"}


def band(ratio: float) -> str:
    return next(name for upper, name in BANDS if ratio < upper)


def data_vs_step(next_batch, step, device: torch.device, n: int = 20, warmup: int = 3) -> dict:
    """Median seconds of `next_batch()` and of `step(batch)` over `n` turns after `warmup`, their ratio and band."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    data_s, step_s = [], []
    for i in range(warmup + n):
        sync()
        t0 = time.perf_counter()
        batch = next_batch()
        sync()  # a non-blocking copy to the device belongs to the data's time, not the step's
        t1 = time.perf_counter()
        step(batch)
        sync()
        t2 = time.perf_counter()
        if i >= warmup:
            data_s.append(t1 - t0)
            step_s.append(t2 - t1)
    data, compute = statistics.median(data_s), statistics.median(step_s)
    return {"data_s": data, "step_s": compute, "ratio": data / compute, "band": band(data / compute)}


def _site(frame) -> str | None:
    """`file:line` of the code that made the call, or None when torch itself made it."""
    while frame and frame.f_code.co_filename.startswith(TORCH_DIR) and \
            Path(frame.f_code.co_filename).name in ("overrides.py", "_tensor.py"):  # dispatch layers
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith(TORCH_DIR):
        return None
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"


class HostSyncs(TorchFunctionMode):
    """`with HostSyncs(device) as syncs: <a training loop>`; then `syncs.per_step()` and `syncs.sites()`."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device_only = device.type != "cpu"
        self.events: list[str | None] = []  # a site per sync, None per backward()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name == "backward" or name in SYNCS:
            site = _site(sys._getframe(1))
            on_device = bool(args) and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu"
            if name == "backward":
                self.events.append(None)
            elif site and (on_device or not self.device_only):
                self.events.append(f"{site} {name}")
        return func(*args, **(kwargs or {}))

    def _steps(self, accum: int) -> list[list[str]]:
        """The syncs of each optimizer step: from after one step's first backward to after the next one's."""
        marks = [i for i, e in enumerate(self.events) if e is None][::accum]
        return [[e for e in self.events[a:b] if e] for a, b in zip(marks, marks[1:])]

    def per_step(self, accum: int = 1) -> tuple[float, float]:
        """(typical, mean) host syncs per optimizer step: the median step, and the mean with the rare ones
        (logging, an epoch's evaluation and checkpoint) spread over all steps."""
        counts = [len(step) for step in self._steps(accum)]
        return (statistics.median(counts), sum(counts) / len(counts)) if counts else (0.0, 0.0)

    def sites(self, accum: int = 1) -> dict[str, float]:
        """`file:line method` -> calls per optimizer step, busiest first."""
        steps = self._steps(accum)
        return {site: k / len(steps) for site, k in Counter(e for step in steps for e in step).most_common()}
