"""Day 8 benchmarks, measured in one run and written to `bench.json` + `bench.md`.

1. The scalar engine against micrograd 0.1.0 on micrograd's own demo: MLP(2, [16, 16, 1]), two-moons points, full
   batch, SVM (hinge) loss + 1e-4 L2, lr 1.0 -> 0.1, the same initial weights and the same number of steps. Each
   engine runs in fresh processes: with Python's default garbage-collector settings and with the collector paused
   during each step, in a process holding only NumPy and in one that has also imported torch (a full collection
   scans every tracked object in the process). Time per step, share of it inside the collector, peak memory.
   Both engines compute the same losses, which the bench checks.
2. The Tensor engine's training step against PyTorch's on CPU: 784-256-10 MLP, batch 128, float32, cross-entropy +
   Adam; the median step time of each (`sprint.measure.median_seconds`, interleaved rounds) and their ratio.

micrograd: the installed package if it is version 0.1.0 (`pip install micrograd==0.1.0`; not in the lock file),
otherwise the faithful copy in `micrograd_0_1_0.py` (MIT licence). Timings depend on the machine: the results
name it, and the README quotes ratios measured in one run.

Run:  python day08_mini_autograd/bench.py                                  (writes runs/day08_mini_autograd/)
      python day08_mini_autograd/bench.py --out day08_mini_autograd/results  (refreshes the committed figures)
      python day08_mini_autograd/bench.py --steps 2 --points 10 --heaps numpy --rounds 1 --tensor-steps 2
"""
import contextlib
import gc
import multiprocessing
import platform
import random
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import numpy as np

from day08_mini_autograd import engine, nn
from sprint import machine, runs_dir, write_results
from sprint.cli import arg, parse, progress, run, validate

SEED = 1337  # micrograd's demo seeds `random` with 1337; both engines draw the same initial weights from it


@dataclass
class Config:
    steps: int = arg(20, "training steps of the scalar demo, the same for every engine", gt=0)
    points: int = arg(100, "two-moons points (the demo's full batch)", ge=2)
    heaps: tuple[str, ...] = arg(("numpy", "torch"), "what else each demo process imports besides the engine",
                                 choices=("numpy", "torch"))
    tensor_steps: int = arg(50, "timed calls per round of the Tensor-engine and PyTorch steps", gt=0)
    rounds: int = arg(5, "interleaved timing rounds (engine, torch, engine, ...)", gt=0)

    def __post_init__(self):
        validate(self)


# ------------------------------------------------------------------------------------------------------------
# 1. The scalar demo
# ------------------------------------------------------------------------------------------------------------
def make_moons(n=100, noise=0.1, seed=0):
    """Two interleaving half circles (labels -1/+1), like sklearn's make_moons, in NumPy."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, np.pi, n)
    upper = np.arange(n) < n // 2
    x = np.where(upper[:, None], np.c_[np.cos(t), np.sin(t)], np.c_[1 - np.cos(t), 0.5 - np.sin(t)])
    return x + rng.normal(0, noise, x.shape), np.where(upper, -1.0, 1.0)


def micrograd():
    """(module, where it came from): the installed micrograd if it is 0.1.0, else the bundled copy."""
    try:
        from importlib.metadata import version

        if version("micrograd") == "0.1.0":
            import micrograd.engine
            import micrograd.nn

            micrograd.nn.Value = micrograd.engine.Value
            return micrograd.nn, "micrograd 0.1.0, installed package"
    except ImportError:  # PackageNotFoundError is an ImportError too
        pass
    from day08_mini_autograd import micrograd_0_1_0

    return micrograd_0_1_0, "micrograd 0.1.0, bundled copy (micrograd_0_1_0.py)"


def demo_model(name):
    """(model, Value class) with the demo's initial weights: uniform(-1, 1) drawn in the same order by both."""
    if name == "ours":
        return nn.MLP(2, [16, 16, 1], seed=SEED), engine.Value
    mg, _ = micrograd()
    random.seed(SEED)
    return mg.MLP(2, [16, 16, 1]), mg.Value


def svm_loss(model, value, x, y, alpha=1e-4):
    """(loss, scores): micrograd's demo loss, written once for both engines: hinge loss + L2."""
    scores = [model([value(a), value(b)]) for a, b in x]
    scores = [s[0] if isinstance(s, list) else s for s in scores]  # our MLP returns a list of outputs
    losses = [(1 + -yi * s).relu() for yi, s in zip(y, scores)]
    data_loss = sum(losses) * (1.0 / len(losses))
    return data_loss + alpha * sum(p * p for p in model.parameters()), scores


def svm_step(model, value, x, y, lr):
    """micrograd's demo loop: loss, backward, SGD."""
    loss, scores = svm_loss(model, value, x, y)
    model.zero_grad()
    loss.backward()
    for p in model.parameters():
        p.data -= lr * p.grad
    return loss.data, accuracy(scores, y)


def accuracy(scores, y):
    return sum((s.data > 0) == (yi > 0) for yi, s in zip(y, scores)) / len(y)


def phase_timed_step(model, value, x, y, lr, laps):
    """`svm_step` on this engine with each phase's time appended to `laps` (ms): building the graph (forward pass
    and loss), `backward()`, the topological sort inside it (timed by a second sort of the same graph, which the
    step does not need) and the update with freeing the graph."""
    t0 = time.perf_counter()
    loss, scores = svm_loss(model, value, x, y)
    t1 = time.perf_counter()
    laps["nodes"] = len(engine.topological_order(loss))
    t2 = time.perf_counter()
    model.zero_grad()
    loss.backward()
    t3 = time.perf_counter()
    for p in model.parameters():
        p.data -= lr * p.grad
    result = loss.data, accuracy(scores, y)
    del loss, scores  # reference counting frees the graph here
    t4 = time.perf_counter()
    for phase, seconds in (("build", t1 - t0), ("sort", t2 - t1), ("backward", t3 - t2), ("update_and_free", t4 - t3)):
        laps.setdefault(phase, []).append(1e3 * seconds)
    return result


def tensor_demo(x, y):
    """The same demo on the Tensor engine: the same initial weights laid out as matrices, float64, the same loss.
    Fewer, bigger nodes: a step builds a few dozen nodes instead of ~66,000."""
    from day08_mini_autograd import tensor_engine as te

    scalar_net = nn.MLP(2, [16, 16, 1], seed=SEED)
    params = []
    for layer in scalar_net.layers:  # layer[j] = [w_1j, ..., w_nj, b_j]
        params.append(te.Tensor([[neuron[i].data for neuron in layer] for i in range(len(layer[0]) - 1)],
                                requires_grad=True))
        params.append(te.Tensor([neuron[-1].data for neuron in layer], requires_grad=True))
    x, y = te.Tensor(x), np.asarray(y).reshape(-1, 1)

    def step(lr, alpha=1e-4):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            h = h.relu() if i < len(params) - 2 else h
        loss = (1 - h * y).relu().mean() + alpha * sum((p * p).sum() for p in params)
        for p in params:
            p.grad = None
        loss.backward()
        for p in params:
            p.data -= lr * p.grad
        return float(loss.data), float(((h.data > 0) == (y > 0)).mean())

    return step


class GcTimer:
    """Adds up the time Python's garbage collector runs, via `gc.callbacks` (it changes nothing else)."""

    def __init__(self):
        self.seconds, self.passes = 0.0, 0

    def __call__(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.passes += 1

    def __enter__(self):
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self)


def demo_worker(conn, name, paused, heap, points):
    """One engine's demo in a fresh process holding NumPy and the engine (and torch, for heap "torch"); one step
    per request. A full collection scans every tracked object in the process, so what else lives there matters."""
    if heap == "torch":
        import torch  # noqa: F401  (~160,000 long-lived objects, as in any training script or notebook)
    x, y = make_moons(points)
    laps = {}
    if name == "tensor":
        step = tensor_demo(x, y)
    else:
        model, value = demo_model("ours" if name == "phases" else name)
        x, y = x.tolist(), y.tolist()

        def step(lr):
            if name == "phases":
                return phase_timed_step(model, value, x, y, lr, laps)
            return svm_step(model, value, x, y, lr)
    conn.send({"tracked_objects": len(gc.get_objects())})
    with GcTimer() as gc_timer:
        while (k := conn.recv()) is not None:
            start, gc_before = time.perf_counter(), gc_timer.seconds
            with engine.collector_paused() if paused else contextlib.nullcontext():
                loss, acc = step(lr=1.0 - 0.9 * k / 100)  # the demo's lr schedule
            if paused:
                gc.collect(0)  # the collector catches up once: what it does at its first allocation after the step
            conn.send((time.perf_counter() - start, gc_timer.seconds - gc_before, loss, acc))
    conn.send({"gc_passes": gc_timer.passes, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "laps": laps})  # ru_maxrss: KiB on Linux


def compare_engines(cfg):
    """Both engines, with the collector at its defaults and paused per step, in a process holding only NumPy and
    in one that has imported torch, plus the Tensor engine on the same demo: one fresh process each. The steps go
    round them in turn, so a burst of load on a shared machine slows all of them alike. One more process, in the
    same rotation, times the phases of this engine's step with the collector paused."""
    spawn = multiprocessing.get_context("spawn")
    workers = []
    settings = [(heap, name, paused) for heap in dict.fromkeys(cfg.heaps) for name in ("ours", "micrograd")
                for paused in (False, True)]
    for heap, name, paused in settings + [(cfg.heaps[0], "tensor", False), (cfg.heaps[0], "phases", True)]:
        conn, child = spawn.Pipe()
        spawn.Process(target=demo_worker, args=(child, name, paused, heap, cfg.points), daemon=True).start()
        workers.append({"engine": name, "collector": "paused per step" if paused else "default",
                        "heap": heap, "conn": conn, "seconds": 0.0, "gc_seconds": 0.0, "losses": []})
    for w in workers:  # the interpreters start side by side
        w |= w["conn"].recv()
    bar = progress(range(cfg.steps), desc=f"scalar demo, {len(workers)} processes in turn", unit="step")
    for k in bar:
        for w in workers:
            w["conn"].send(k)
            seconds, gc_seconds, loss, acc = w["conn"].recv()
            w["seconds"] += seconds
            w["gc_seconds"] += gc_seconds
            w["losses"].append(loss)
            w["final_accuracy"] = acc
        bar.set_postfix(loss=f"{loss:.4f}")
    runs = []
    for w in workers:
        w["conn"].send(None)
        w |= w.pop("conn").recv()
        # the mean, not the median: the collector's cost comes in bursts (a full pass every few steps)
        runs.append(w | {"steps": cfg.steps, "ms_per_step": 1e3 * w["seconds"] / cfg.steps,
                         "gc_share": w["gc_seconds"] / w["seconds"]})
    worst_gap = max(abs(a - b) / abs(b) for r in runs for a, b in zip(r["losses"], runs[0]["losses"]))
    laps = runs.pop()["laps"]  # the phase-timing process: its steps include one extra sort, so it is not a table row
    for r in runs:
        del r["laps"]
    phases = {"nodes": laps.pop("nodes"), "steps": cfg.steps} | {f"{k}_ms": statistics.mean(v)
                                                                  for k, v in laps.items()}
    ms = {(r["heap"], r["engine"], r["collector"]): r["ms_per_step"] for r in runs}
    outside = {(r["heap"], r["engine"], r["collector"]): r["ms_per_step"] * (1 - r["gc_share"]) for r in runs}
    tensor = ms[cfg.heaps[0], "tensor", "default"]
    speedup = {heap: {"default": ms[heap, "micrograd", "default"] / ms[heap, "ours", "default"],
                      "paused": ms[heap, "micrograd", "paused per step"] / ms[heap, "ours", "paused per step"],
                      "paused_outside_collector": outside[heap, "micrograd", "paused per step"]
                      / outside[heap, "ours", "paused per step"],
                      "ours_paused_vs_micrograd_default":
                          ms[heap, "micrograd", "default"] / ms[heap, "ours", "paused per step"]}
               for heap in dict.fromkeys(cfg.heaps)}
    return {"runs": runs, "speedup": speedup, "max_relative_loss_gap": worst_gap, "phases": phases,
            "tensor_engine_vs_micrograd_default": ms[cfg.heaps[0], "micrograd", "default"] / tensor}


# ------------------------------------------------------------------------------------------------------------
# 2. Tensor engine vs PyTorch
# ------------------------------------------------------------------------------------------------------------
def tensor_vs_torch(steps, rounds, hidden=256, batch_size=128, seed=0):
    import torch

    from day08_mini_autograd import tensor_engine as te
    from sprint.measure import median_seconds

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
    for _ in progress(range(rounds), desc="Tensor engine vs torch", unit="round"):  # alternate: load hits both
        times["engine"].append(median_seconds(engine_step, repeat=steps))
        times["torch"].append(median_seconds(torch_step, repeat=steps))
    engine_ms, torch_ms = (1e3 * statistics.median(times[k]) for k in ("engine", "torch"))
    return {"engine_ms": engine_ms, "torch_ms": torch_ms, "ratio": engine_ms / torch_ms, "hidden": hidden,
            "batch_size": batch_size, "torch_threads": torch.get_num_threads(), "rounds": rounds, "calls": steps}


# ------------------------------------------------------------------------------------------------------------
def markdown(result):
    """The README's two tables, from the figures of this run."""
    s, heaps = result["scalar"], {"numpy": "NumPy only", "torch": "NumPy + torch"}
    lines = [f"Machine: {result['machine']}; Python {result['python']}; baseline: {result['micrograd']}.", "",
             f"Scalar demo: MLP(2, [16, 16, 1]) (337 parameters), {result['config']['points']} "
             f"two-moons points, {result['config']['steps']} full-batch steps, hinge loss + L2; the same initial "
             f"weights, and the same losses to {s['max_relative_loss_gap']:.0e}.", "",
             "| process also holds (tracked objects) | engine | garbage collector | ms / step | time in the collector "
             "| peak RSS (MiB) |", "|---|---|---|---:|---:|---:|"]
    for r in s["runs"]:
        name = {"ours": "this engine (`engine.py`)", "micrograd": "micrograd 0.1.0",
                "tensor": "the Tensor engine (`tensor_engine.py`), same weights as matrices"}[r["engine"]]
        lines.append(f"| {heaps[r['heap']]} ({r['tracked_objects']:,}) | {name} | {r['collector']} | "
                     f"{r['ms_per_step']:.{0 if r['ms_per_step'] >= 10 else 2}f} | {r['gc_share']:.0%} | "
                     f"{r['peak_rss_mib']:.0f} |")
    lines += ["", "| process also holds | speed-up, both at the default collector | both paused per step | "
                  "this engine paused vs micrograd as shipped |", "|---|---:|---:|---:|"]
    for heap, sp in s["speedup"].items():
        lines.append(f"| {heaps[heap]} | {sp['default']:.1f}x | {sp['paused']:.1f}x | "
                     f"{sp['ours_paused_vs_micrograd_default']:.1f}x |")
    ph = s["phases"]
    first = s["runs"][0]["heap"]
    ms = {(r["engine"], r["collector"]): r["ms_per_step"] for r in s["runs"] if r["heap"] == first}
    total = ph["build_ms"] + ph["backward_ms"] + ph["update_and_free_ms"]
    outside = s["speedup"][first]["paused_outside_collector"]
    lines += ["", f"Outside the collector's own time, both paused: {outside:.1f}x ({heaps[first]}).", "",
              f"Where this engine's step goes, collector paused, timed in one more process in the same rotation (mean "
              f"of {ph['steps']} steps, {ph['nodes']:,} nodes): building the graph {ph['build_ms']:.1f} ms "
              f"({1e6 * ph['build_ms'] / ph['nodes']:.0f} ns per node), `backward()` {ph['backward_ms']:.1f} ms, of "
              f"which the topological sort {ph['sort_ms']:.1f} ms ({1e6 * ph['sort_ms'] / ph['nodes']:.0f} ns per "
              f"node, timed by sorting the same graph once more), the update and freeing the graph "
              f"{ph['update_and_free_ms']:.1f} ms: {total:.1f} ms in all (the table's paused step: "
              f"{ms['ours', 'paused per step']:.1f} ms). The goal set for this engine, 30x micrograd as shipped "
              f"({heaps[first]}), is {ms['micrograd', 'default'] / 30:.1f} ms per step."]
    lines += ["", f"Fewer, bigger nodes: the Tensor engine runs the same demo (same weights, same losses) "
                  f"{s['tensor_engine_vs_micrograd_default']:.0f}x faster than micrograd, both at the default "
                  f"collector."]
    t = result["tensor"]
    lines += ["", f"Tensor engine vs PyTorch ({t['torch_threads']} torch thread(s)), 784-{t['hidden']}-10 MLP, batch "
                  f"{t['batch_size']}, cross-entropy + Adam, median of {t['rounds']} rounds of {t['calls']} calls:", "",
              "| Tensor engine (ms / step) | PyTorch (ms / step) | ratio |", "|---:|---:|---:|",
              f"| {t['engine_ms']:.2f} | {t['torch_ms']:.2f} | {t['ratio']:.2f}x |"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    _, source = micrograd()
    print(f"1. Scalar engine vs {source}, {cfg.steps} steps on {cfg.points} points, one fresh process per setting")
    scalar = compare_engines(cfg)
    for r in scalar["runs"]:
        print(f"   {r['heap']:5s} {r['engine']:9s} collector {r['collector']:15s} {r['ms_per_step']:8.1f} ms/step  "
              f"{r['gc_share']:4.0%} in gc ({r['gc_passes']} passes)  peak RSS {r['peak_rss_mib']:.0f} MiB")
    for heap, sp in scalar["speedup"].items():
        print(f"   {heap} heap: speed-up {sp['default']:.1f}x (default collector), {sp['paused']:.1f}x (paused), "
              f"{sp['ours_paused_vs_micrograd_default']:.1f}x (ours paused vs micrograd as shipped)")
    print(f"   the Tensor engine on the same demo: {scalar['tensor_engine_vs_micrograd_default']:.0f}x micrograd's "
          f"speed; all runs compute the same losses, to {scalar['max_relative_loss_gap']:.1e}")
    phases = scalar["phases"]
    print(f"   this engine, collector paused, {phases['nodes']:,} nodes per step: build {phases['build_ms']:.1f} ms, "
          f"backward {phases['backward_ms']:.1f} ms (sort {phases['sort_ms']:.1f} ms), update and free "
          f"{phases['update_and_free_ms']:.1f} ms")
    print("2. Tensor engine vs PyTorch, 784-256-10 MLP, batch 128, cross-entropy + Adam")
    tensor = tensor_vs_torch(cfg.tensor_steps, cfg.rounds)
    print(f"   engine {tensor['engine_ms']:.2f} ms/step   torch {tensor['torch_ms']:.2f} ms/step   "
          f"ratio {tensor['ratio']:.2f}x")
    result = {"machine": machine(), "python": platform.python_version(), "micrograd": source,
              "config": asdict(cfg), "scalar": scalar, "tensor": tensor}
    write_results(out, "bench", markdown(result), result)
    return result


if __name__ == "__main__":
    run(main)
