"""Day 8 benchmarks, in one run: the scalar engine's classic demo, and the Tensor engine's step vs PyTorch.

1. Scalar engine: MLP(2, [16, 16, 1]) trained full-batch on 100 two-moons points for 100 steps with an SVM
   (hinge) loss + L2, as in micrograd's demo; wall time, time spent in Python's garbage collector (which stays
   enabled), and peak RSS along the way — flat, because every graph is freed by reference counting.
2. Tensor engine vs PyTorch on CPU: the same 784-256-10 MLP, batch 128, float32, cross-entropy + Adam; the
   median step time of each (interleaved rounds, so background load hits both alike) and their ratio.

Run:  python day08_mini_autograd/bench.py            (about a minute on a quiet 2-core CPU)
      python day08_mini_autograd/bench.py --quick    (seconds; checks that it runs)
      python day08_mini_autograd/bench.py --torch-first   (the scalar demo with torch already imported)
"""
import argparse
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import numpy as np

from day08_mini_autograd import tensor_engine as te
from day08_mini_autograd.engine import Value
from day08_mini_autograd.nn import MLP


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# ------------------------------------------------------------------------------------------------------------
# 1. Scalar engine on the classic demo
# ------------------------------------------------------------------------------------------------------------
def make_moons(n=100, noise=0.1, seed=0):
    """Two interleaving half circles (labels -1/+1), like sklearn's make_moons, in NumPy."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    upper = np.arange(n) < n // 2
    x = np.where(upper[:, None], np.c_[np.cos(t), np.sin(t)], np.c_[1 - np.cos(t), 0.5 - np.sin(t)])
    return x + rng.normal(0, noise, x.shape), np.where(upper, -1.0, 1.0)


class GcTimer:
    """Adds up the time Python's garbage collector runs, via `gc.callbacks` (the collector stays on)."""

    def __init__(self):
        self.seconds, self.collections = 0.0, 0

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections += 1

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def svm_step(model, params, x, y, lr, alpha=1e-4):
    """One full-batch step: hinge loss + L2, backward, SGD. The graph dies when this function returns."""
    scores = [model([Value(a), Value(b)])[0] for a, b in x]
    data_loss = sum((1 - yi * s).relu() for yi, s in zip(y, scores)) * (1.0 / len(y))
    loss = data_loss + alpha * sum(p * p for p in params)
    model.zero_grad()
    loss.backward()
    for p in params:
        p.data -= lr * p.grad
    return loss.data, sum((s.data > 0) == (yi > 0) for yi, s in zip(y, scores)) / len(y)


def bench_scalar_demo(steps=100, n=100, seed=1337):
    x, y = make_moons(n)
    x, y = x.tolist(), y.tolist()
    model = MLP(2, [16, 16, 1], act="relu", seed=seed)
    params = model.parameters()
    rss = {}
    with GcTimer() as gc_timer:
        start = time.perf_counter()
        for k in range(steps):
            loss, acc = svm_step(model, params, x, y, lr=1.0 - 0.9 * k / steps)  # micrograd's lr schedule
            if k + 1 in (1, 10, steps // 2, steps):
                rss[k + 1] = peak_rss_mb()
                print(f"   step {k + 1:3d}  loss {loss:.4f}  accuracy {100 * acc:.0f}%  "
                      f"peak RSS {rss[k + 1]:.0f} MiB  ({time.perf_counter() - start:.1f} s)")
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "gc_seconds": gc_timer.seconds, "gc_collections": gc_timer.collections,
            "final_loss": loss, "final_accuracy": acc, "peak_rss_mb": rss, "params": len(params), "steps": steps}


# ------------------------------------------------------------------------------------------------------------
# 2. Tensor engine vs PyTorch
# ------------------------------------------------------------------------------------------------------------
def bench_tensor_step(hidden=256, batch_size=128, steps=50, rounds=5, seed=0):
    import torch  # imported only now: see `--torch-first`

    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(batch_size, 784)).astype(np.float32), rng.integers(0, 10, batch_size)

    model = te.MLP([784, hidden, 10], seed)
    opt = te.Adam(model.parameters(), lr=1e-3)

    def engine_step():
        loss = te.cross_entropy(model(te.Tensor(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(784, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    topt = torch.optim.Adam(net.parameters(), lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        loss = torch.nn.functional.cross_entropy(net(tx), ty)
        topt.zero_grad()
        loss.backward()
        topt.step()

    times = {"engine": [], "torch": []}
    for _ in range(rounds):  # alternate, so a burst of background load does not favour one side
        for name, step in (("engine", engine_step), ("torch", torch_step)):
            step()  # warm-up (first-call allocations)
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    engine_ms, torch_ms = statistics.median(times["engine"]), statistics.median(times["torch"])
    return {"engine_ms": engine_ms, "torch_ms": torch_ms, "ratio": engine_ms / torch_ms, "hidden": hidden,
            "batch_size": batch_size, "torch_threads": torch.get_num_threads()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings: just check that it runs")
    parser.add_argument("--torch-first", action="store_true",
                        help="import torch before the scalar demo, to see the collector slow down")
    args = parser.parse_args(argv)
    tensor_kw, scalar_kw = (dict(steps=2, rounds=1), dict(steps=2, n=10)) if args.quick else ({}, {})
    if args.torch_first:
        import torch  # noqa: F401  (its ~160k long-lived objects are re-scanned by every full gc pass)

    # The scalar demo runs first, in a process holding only NumPy, as micrograd's demo does: a full gc pass
    # scans every tracked object in the process, so importing torch first makes each pass slower.
    print(f"1. Scalar engine: MLP(2, [16, 16, 1]), two moons, full batch, SVM loss + L2, gc enabled "
          f"(thresholds {gc.get_threshold()}, {len(gc.get_objects()):,} tracked objects before the demo)")
    s = bench_scalar_demo(**scalar_kw)
    rss = list(s["peak_rss_mb"].values())
    print(f"   {s['steps']} steps in {s['seconds']:.1f} s (target <= 20 s), {s['gc_seconds']:.1f} s of it in "
          f"{s['gc_collections']} gc passes; peak RSS {rss[0]:.0f} -> {rss[-1]:.0f} MiB; "
          f"final accuracy {100 * s['final_accuracy']:.0f}%")

    t = bench_tensor_step(**tensor_kw)
    print(f"2. Tensor engine vs PyTorch CPU ({t['torch_threads']} thread(s)), 784-{t['hidden']}-10 MLP, "
          f"batch {t['batch_size']}, cross-entropy + Adam")
    print(f"   engine {t['engine_ms']:.2f} ms/step   torch {t['torch_ms']:.2f} ms/step   "
          f"ratio {t['ratio']:.2f}x (target <= 2x)")
    return {"scalar": s, "tensor": t}


if __name__ == "__main__":
    main(sys.argv[1:])
