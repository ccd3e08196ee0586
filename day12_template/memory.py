"""How much GPU memory a config needs, estimated on the CPU before you rent the GPU.

    python memory.py --config configs/mnist_mlp.toml --set train.batch_size=1024

Counted, in bytes, for one process (no FSDP sharding), float32 weights and AdamW:
  resting   weights 4/param + AdamW moments 8/param + one micro-batch (inputs float32, labels int64)
  step peak what one training step adds on top, the larger of
            backward:  the activations autograd saves in one micro-batch's forward (counted exactly with
                       saved_tensors_hooks on the CPU at batch 1 and 2, then scaled: they are linear in the batch,
                       under the same autocast) + one gradient as large as the largest of them
                       (+ gradients 4/param while accumulating)
            optimizer: gradients 4/param + AdamW's temporaries (CUDA foreach: 4/param; CPU: 2 x the largest tensor)
Not counted: the CUDA context, cuBLAS/cuDNN workspaces (fixed, tens of MB: `cuda_library_bytes()` measures them),
allocator rounding and fragmentation. With activation checkpointing only what is kept is counted.
"""
import argparse
import json
import sys
import tempfile

import torch
import torch.nn.functional as F

import config
import models


class SavedBytes:
    """Bytes autograd saves for backward while open: each storage once, the tensors of `skip` left out."""

    def __init__(self, *skip):
        owned = [t for s in skip for t in ([*s.parameters(), *s.buffers()] if isinstance(s, torch.nn.Module) else [s])]
        self.skip = {t.untyped_storage().data_ptr() for t in owned}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.skip:
            self.storages[ptr] = t.untyped_storage().nbytes()
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def saved_bytes(fn, *skip) -> int:
    with SavedBytes(*skip) as counter:
        fn()
    return sum(counter.storages.values())


def activations(cfg: config.Config, info, batch: int) -> tuple[int, int]:
    """(bytes saved for backward, the largest single saved tensor) for one forward at `batch`, on the CPU."""
    torch.manual_seed(0)
    model = models.build(cfg.model, info)
    x = torch.randn(batch, info.channels, info.size, info.size)
    y = torch.randint(0, info.num_classes, (batch,))
    with SavedBytes(model, x, y) as counter, models.autocast(cfg.train, "cpu")():
        F.cross_entropy(model(x), y)
    return sum(counter.storages.values()), max(counter.storages.values())


def estimate(cfg: config.Config, info, device: str = "cuda", world: int = 1) -> dict:
    """The breakdown described in the module docstring, in bytes."""
    model = models.build(cfg.model, info)
    params = sum(p.numel() for p in model.parameters())
    largest_param = max(p.numel() for p in model.parameters()) * 4
    micro = cfg.train.batch_size // (cfg.train.grad_accum * world)
    (a1, l1), (a2, l2) = activations(cfg, info, 1), activations(cfg, info, 2)
    act, largest = (2 * a1 - a2) + (a2 - a1) * micro, (2 * l1 - l2) + (l2 - l1) * micro
    e = {"params": params, "micro_batch": micro, "weights": 4 * params, "grads": 4 * params,
         "optimizer": 8 * params, "batch": micro * (info.channels * info.size * info.size * 4 + 8),
         "activations": act}
    e["backward"] = act + largest + (e["grads"] if cfg.train.grad_accum > 1 else 0)
    e["optimizer_step"] = e["grads"] + (4 * params if device == "cuda" else 2 * largest_param)
    e["step_peak"] = max(e["backward"], e["optimizer_step"])
    e["resting"] = e["weights"] + e["optimizer"] + e["batch"]
    e["peak"] = e["resting"] + e["step_peak"]
    return e


def cpu_step_peak(cfg: config.Config, info) -> int:
    """Measured on the CPU: the most a training step (forward, backward, clip, AdamW) allocates above the memory
    live before it, from the profiler's allocation tracking (the CPU stand-in for max_memory_allocated)."""
    from torch.profiler import ProfilerActivity, profile

    import train

    torch.manual_seed(0)
    model = models.build(cfg.model, info)
    optimizer = train.build_optimizer(model, cfg.optim)
    micro = cfg.train.batch_size // cfg.train.grad_accum
    x = torch.randn(micro, info.channels, info.size, info.size)
    y = torch.randint(0, info.num_classes, (micro,))

    def step():
        with models.autocast(cfg.train, "cpu")():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW creates its moments on the first step: measure a steady one
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.load(open(f.name))["traceEvents"]
    totals = [(e["args"]["Total Allocated"], e["args"]["Bytes"]) for e in events if e.get("name") == "[memory]"]
    # The running total also holds what earlier profiling sessions of this process allocated and never freed:
    # measure from the total before the step's first allocation.
    before = totals[0][0] - totals[0][1]
    return max(total for total, _ in totals) - before


def cuda_library_bytes() -> int:
    """What cuBLAS/cuBLASLt workspaces hold after a Linear-LayerNorm-GELU forward and backward (fp32 and autocast),
    once every tensor of that warm-up is freed: the fixed part the estimate leaves out."""
    for amp in (False, True):
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                                  torch.nn.Linear(64, 10)).cuda()
        with torch.autocast("cuda", torch.bfloat16, enabled=amp):
            loss = net(torch.randn(32, 64, device="cuda")).float().sum()
        loss.backward()
        del net, loss
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def main(argv=None) -> None:
    import data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="a TOML config (see configs/)")
    parser.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the run will train")
    args = parser.parse_args(argv)
    try:
        cfg = config.load(args.config, args.set)
        info = data.build(cfg.data, cfg.run.seed).info
    except (config.ConfigError, data.DataError) as exc:  # one line, the exit codes of train.py
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2 if isinstance(exc, config.ConfigError) else 1)
    e = estimate(cfg, info, args.device)
    print(f"{cfg.model.name}: {e['params']:,} parameters, micro-batch {e['micro_batch']}")
    for key in ("weights", "optimizer", "batch", "resting", "activations", "backward", "optimizer_step",
                "step_peak", "peak"):
        print(f"  {key:<15}{e[key] / 2**20:10.2f} MiB")
    print("  + CUDA context and cuBLAS/cuDNN workspaces (not counted)")


if __name__ == "__main__":
    main()
