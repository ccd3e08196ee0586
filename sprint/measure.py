"""Measurements every day takes the same way: bytes saved for backward, true peak memory, step time, parameter
counts (the machine a timing belongs to is `sprint.machine()`).

Timing convention: the median of `repeat` calls after `warmup` untimed ones, with CUDA synchronised around each
call. Timings are machine-specific, so figures that gates compare are ratios measured in the same run; a ratio a gate
in the suite asserts uses `min_cpu_seconds` (this process's CPU time, the fastest call), which another process on
the machine disturbs far less than wall time.
"""
import contextlib
import os
import statistics
import time
import weakref

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


def min_cpu_seconds(fn, repeat: int = 10, warmup: int = 1) -> float:
    """The fastest of `repeat` calls of `fn()` in this process's CPU time (all its threads), after `warmup` untimed
    calls. For CPU work: a busy machine stretches wall time, the fastest call's CPU time much less."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        times.append(time.process_time() - c0)
    return min(times)


@contextlib.contextmanager
def one_thread():
    """This process computes in one thread while the context is open (and the children it starts then, where they are
    given its thread count): runs that share the cores each get one instead of oversubscribing them (a thread pool
    whose threads wait for a core spins, and its step waits for its slowest thread), and a CPU-time figure counts the
    work alone. Day 12's template tests keep a copy of their own (tests/helpers.py): the template imports nothing
    from the repo."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def count_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameters (shared ones once), only those with requires_grad unless `trainable_only=False`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


class PeakBytes:
    """The true peak of tensor memory while the context is open: a live-allocation counter (CPU and GPU alike).

    A TorchDispatchMode sees every op; each storage an op creates counts from its creation until it is freed (a
    weakref finalizer on the storage), so temporaries, checkpointing's recomputation and the gradients all count,
    and `peak` is the most that was alive at once. Storages that existed before (weights, the batch) and outputs
    that alias an input (views, in-place ops) are not new memory and are left out. What it cannot see: scratch
    space a kernel allocates and frees inside itself, and the allocator's rounding and caching (CUDA's
    `max_memory_allocated` includes those)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                counter._track(out, args, kwargs)
                return out

        self._mode = _Mode()
        self.live = 0  # bytes allocated inside the context and not yet freed
        self.peak = 0
        self._alive: set[int] = set()  # data_ptr of every storage counted and still alive

    def _track(self, out, args, kwargs) -> None:
        from torch.utils._pytree import tree_leaves

        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in inputs or key in self._alive:
                continue
            self._alive.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        if key in self._alive:
            self._alive.discard(key)
            self.live -= nbytes

    def __enter__(self):
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


def peak_bytes(fn) -> int:
    """The most tensor memory alive at once while `fn()` runs, above what existed before (see PeakBytes)."""
    with PeakBytes() as counter:
        fn()
    return counter.peak


def quiet_profiler() -> None:
    """Without CUDA, keep torch.profiler's Kineto from printing GPU probes ("gpuGetDeviceCount failed") and
    start/stop marks to stderr; call before the first profile. With CUDA its messages stay: they can matter."""
    if not torch.cuda.is_available():
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # above Kineto's highest level: nothing printed
