"""Measurements every day takes the same way: bytes saved for backward, step time, parameter counts.

Timing convention: the median of `repeat` calls after `warmup` untimed ones, with CUDA synchronised around each
call. Timings are machine-specific, so figures that gates compare are ratios measured in the same run.
"""
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn as nn


class SavedBytes:
    """Counts the bytes autograd saves for backward while the context is open: each storage once (views of one
    buffer count once), the tensors of `skip` (a module's parameters and buffers: model states, not activations)
    left out. The hook returns the tensor itself, so counting changes nothing."""

    def __init__(self, skip: nn.Module | None = None):
        owned = [*skip.parameters(), *skip.buffers()] if skip is not None else []
        self.skip = {t.untyped_storage().data_ptr() for t in owned}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.skip:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def saved_bytes(fn, skip: nn.Module | None = None) -> int:
    """Bytes saved for backward while `fn()` runs (see SavedBytes)."""
    with SavedBytes(skip) as counter:
        fn()
    return counter.total


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def median_seconds(fn, repeat: int = 10, warmup: int = 1) -> float:
    """Median wall time of `fn()` over `repeat` calls, after `warmup` untimed calls (kernel choice, allocations)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def count_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters (shared ones once), only those with requires_grad unless `trainable_only=False`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def cpu_model() -> str:
    """The CPU's marketing name; platform.processor() is empty on most Linux systems, so read /proc/cpuinfo."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """One line naming where a timing was taken: CPU model, cores, torch threads, and the GPU if there is one."""
    text = f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"{text}, {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else text
