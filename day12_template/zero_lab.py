"""zero_lab.py — what each rank holds, sends and writes, measured: the GPT config under DDP and FSDP2 (ZeRO-3) on 1, 2
and 4 CPU ranks (gloo), next to the six-week plan's formulas.

    python zero_lab.py --out results            # results/zero.json, zero.md and zero.png

Per rank, from the live tensors (an FSDP2 parameter is a DTensor: its local shard is what the rank holds): parameter,
gradient and AdamW-state bytes; the peak of building the model (train.build_model: on the meta device, sharded
there under FSDP2, then materialised and initialised); the peak a steady training step allocates above what was live
before it (the profiler's allocation record, the CPU stand-in for torch.cuda.max_memory_allocated); and the bytes it
sends per optimizer step, counted from the collectives it calls (DDP's gradient buckets through a comm hook; FSDP2's
all-gathers and reduce-scatters) as a ring algorithm sends them: all-reduce 2(N-1)/N of the payload, all-gather and
reduce-scatter (N-1)/N. Formulas (fp32 weights, gradients and two AdamW moments, Psi parameters): DDP 16 Psi per
rank, ZeRO-3 16 Psi / N; the volume each rank sends per step: DDP's all-reduce of the gradients 2(N-1)/N * 4 Psi,
ZeRO-3's all-gather in forward, again in backward, and reduce-scatter of the gradients 3(N-1)/N * 4 Psi. (FSDP2 keeps
the root module's parameters, here the embeddings and the last norm, gathered from forward to backward: it gathers
them once, so it sends (N-1)/N * 4 (3 Psi - Psi_root).)

Then one checkpoint of each format, timed on every rank: full (the whole model and optimizer gathered on rank 0,
one file) and sharded (each rank writes its own shard with torch.distributed.checkpoint): the training stall per
save (every rank waits for it), the bytes each rank writes and the bytes rank 0 holds to write them.
"""
import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch
import torch.distributed as dist

from train_template import checkpoint, config, distributed, memory, models, optimizers, runlog, tasks, train
from train_template.checkpoint import sharded, state

CONFIG = TEMPLATE / "configs" / "shakespeare_cpu.toml"
RANKS = (1, 2, 4)


# -- what a rank holds ----------------------------------------------------------------------------------------------
def local_bytes(t: torch.Tensor) -> int:
    """Bytes this rank stores for `t` (for a DTensor: its local shard)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


def held_bytes(model: torch.nn.Module, optimizer) -> dict:
    """Parameter, gradient and optimizer-state bytes this rank holds now."""
    states = [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return {"params": sum(local_bytes(p) for p in model.parameters()),
            "grads": sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None),
            "optimizer": sum(local_bytes(v) for v in states)}


# -- what a rank sends --------------------------------------------------------------------------------------------
class SentBytes:
    """Bytes this rank sends per collective, ring-equivalent, counted where DDP and FSDP2 call them."""

    COLLECTIVES = ("all_gather_single", "reduce_scatter_single")  # FSDP2 calls these on torch.distributed

    def __init__(self, module: torch.nn.Module, world: int):
        self.world, self.total = world, 0
        if hasattr(module, "register_comm_hook"):  # DDP: each gradient bucket is all-reduced once per step
            module.register_comm_hook(None, self.ddp_bucket)
        self.originals = {name: getattr(dist, name) for name in self.COLLECTIVES}
        for name, collective in self.originals.items():
            setattr(dist, name, self.counted(collective))

    def close(self) -> None:
        """Stop counting FSDP2's collectives (DDP's comm hook stays with its module)."""
        for name, collective in self.originals.items():
            setattr(dist, name, collective)

    def ring(self, nbytes: int, factor: int) -> None:
        self.total += factor * (self.world - 1) * nbytes // self.world

    def ddp_bucket(self, state, bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        buffer = bucket.buffer()
        self.ring(buffer.numel() * buffer.element_size(), 2)
        return default_hooks.allreduce_hook(dist.group.WORLD, bucket)

    def counted(self, collective):
        def call(output, input, *args, **kwargs):
            full = output if collective.__name__ == "all_gather_single" else input  # the unsharded side
            self.ring(full.numel() * full.element_size(), 1)
            return collective(output, input, *args, **kwargs)

        call.__name__ = collective.__name__
        return call


def volume_formula(strategy: str, ranks: int, psi: int, root_psi: int = 0) -> float:
    """Bytes each rank sends per optimizer step for fp32 gradients (and, sharded, fp32 weights) of psi parameters:
    DDP's ring all-reduce 2(N-1)/N * 4 Psi; ZeRO-3 (FSDP2) all-gathers the weights in forward and in backward and
    reduce-scatters the gradients, 3(N-1)/N * 4 Psi. With `root_psi`, the parameters of FSDP2's root module (kept
    gathered from forward to backward, so gathered once): (N-1)/N * 4 (3 Psi - Psi_root); DDP ignores it."""
    if strategy == "ddp":
        return 2 * (ranks - 1) / ranks * 4 * psi
    return (ranks - 1) / ranks * 4 * (3 * psi - root_psi)


# -- one rank's measurement ---------------------------------------------------------------------------------------
def build_measured(cfg: config.Config, info, d: distributed.Dist) -> tuple[torch.nn.Module, dict]:
    """train.build_model, and what it allocated at its peak, next to the bytes of the whole model and of its largest
    tensor (initialised whole, then cut to this rank's rows)."""
    built = []

    def build() -> None:
        built.append(train.build_model(cfg, info, d))

    gc.collect()  # earlier objects freed inside the measured window would lower the running total it reads
    peak = memory.allocation_peak(build)
    model = built[0]
    sizes = [p.numel() * p.element_size() for p in model.parameters()]  # a DTensor's numel is its full shape's
    return model, {"init_peak": peak, "model_bytes": sum(sizes), "largest_bytes": max(sizes)}


def worker(strategy: str, out: Path) -> None:
    """Under torchrun (or alone): one steady step measured, then one save of each checkpoint format timed."""
    d = distributed.setup("cpu")
    cfg = config.load(str(CONFIG), [f"train.strategy={strategy}"])
    info = memory.info_of(cfg)
    model, built = build_measured(cfg, info, d)
    module = distributed.wrap(model, d)
    torch.manual_seed(cfg.run.seed)  # the batch below
    optimizer = optimizers.build(model, cfg.optim)
    task = tasks.for_dataset(cfg.data.dataset, info)
    x, y = memory.sample_batch(info, cfg.train.batch_size // d.world)
    sent = SentBytes(module, d.world)
    held = {}

    def step() -> None:
        task.loss(module(x), y).backward()
        held.update(held_bytes(model, optimizer))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # AdamW creates its moments: measure a steady step
    sent.total = 0
    peak = memory.allocation_peak(step)
    figures = {**held, **built, "step_peak": peak, "sent_per_step": sent.total, "saves": saves(model, optimizer, d, out)}
    everyone = d.gather(figures)
    if d.is_main:
        out.write_text(json.dumps({"params": models.count_params(model), "ranks": everyone}))
    d.barrier()
    d.close()


FORMATS = ("full", "sharded", "async sharded")


def saves(model, optimizer, d: distributed.Dist, out: Path) -> dict:
    """One checkpoint of each format into a scratch folder: the seconds every rank waits before training can go on
    (the stall) and until the files are complete, the bytes each rank writes, the bytes rank 0 holds for it."""
    scratch, figures = out.with_suffix(".ckpt"), {}
    for fmt in FORMATS:
        folder = scratch / fmt.replace(" ", "_")
        if d.is_main:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        d.barrier()
        start = time.perf_counter()
        if fmt == "full":  # what the template does with checkpoint.format = full: gather, rank 0 writes
            full = {"model": state.model_state(model, d),
                    "optimizer": state.optimizer_state(model, optimizer, d)}
            held = sum(local_bytes(t) for t in tensors(full)) if d.is_main else 0
            if d.is_main:
                checkpoint.atomic_save(full, folder / "ckpt.pt")
            writing = None
        else:
            held = sum(local_bytes(t) for t in tensors([model.state_dict(), optimizer.state]))
            writing = sharded.save_shards(model, optimizer, d, fmt == "async sharded", folder)
        d.barrier()
        stall = time.perf_counter() - start  # an asynchronous save: training goes on from here
        if writing is not None:
            writing.result()
        d.barrier()
        mine = [f for f in folder.iterdir() if f.name.startswith(f"__{d.rank}_") or f.name == "ckpt.pt"]
        figures[fmt] = {"stall_s": stall, "complete_s": time.perf_counter() - start, "held": held,
                        "written": sum(f.stat().st_size for f in mine) if fmt != "full" or d.is_main else 0}
    return figures


def tensors(tree) -> list[torch.Tensor]:
    """Every tensor in nested dicts and lists."""
    if torch.is_tensor(tree):
        return [tree]
    if isinstance(tree, dict):
        return [t for v in tree.values() for t in tensors(v)]
    if isinstance(tree, (list, tuple)):
        return [t for v in tree for t in tensors(v)]
    return []


# -- the lab ------------------------------------------------------------------------------------------------------
def measure(strategy: str, ranks: int, scratch: Path) -> dict:
    """The worker on `ranks` CPU ranks (one thread each) under torchrun, or alone for 1."""
    out = scratch / f"{strategy}-{ranks}.json"
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    subprocess.run([sys.executable, *launcher, __file__, "--worker", strategy, str(out)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1", "KINETO_LOG_LEVEL": "6"},  # no profiler chatter
                   stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


BOOKKEEPING = 1024  # bytes FSDP2 keeps beside the shards: a few scalars (8 bytes measured for the GPT)


def init_bound(built: dict, shards: int) -> float:
    """The most building the model may allocate on a rank holding 1/shards of it: its share, plus the largest
    tensor whole and its share of it (the temporaries of models.init_weights)."""
    return (built["model_bytes"] + built["largest_bytes"]) / shards + built["largest_bytes"] + BOOKKEEPING


def summarise(strategy: str, ranks: int, got: dict) -> dict:
    """Rank 0's figures (the largest shard under FSDP2), the formula and the ratios the README shows."""
    psi, r0 = got["params"], got["ranks"][0]
    state = r0["params"] + r0["grads"] + r0["optimizer"]
    formula = 16 * psi / (ranks if strategy == "fsdp" else 1)
    return {"strategy": strategy, "ranks": ranks, "psi": psi, **{k: r0[k] for k in ("params", "grads", "optimizer")},
            "state": state, "formula": formula, "init_peak": r0["init_peak"],
            "init_bound": init_bound(r0, ranks if strategy == "fsdp" else 1),
            "step_peak": r0["step_peak"], "sent_per_step": r0["sent_per_step"],
            "allreduce_formula": volume_formula("ddp", ranks, psi), "saves_by_rank": [r["saves"] for r in got["ranks"]]}


def markdown(res: dict) -> str:
    mib = 2 ** 20
    lines = [f"`{res['config']}`: the GPT, {res['psi']:,} parameters (Psi), fp32, AdamW; micro-batch = "
             f"{res['batch']} / N windows; {res['machine']}, torch {res['torch']}, one thread per rank (gloo).", "",
             "| strategy | ranks N | params + grads + AdamW per rank, MiB | formula (DDP 16 Psi, ZeRO-3 16 Psi / N) "
             "| building the model: peak, MiB | its bound (FSDP: (4 Psi + L) / N + L, DDP: 4 Psi + 2L; L: the largest "
             "tensor), MiB "
             "| step peak above resting, MiB | sent per step, MiB | formula (DDP's all-reduce 2(N-1)/N * 4 Psi, ZeRO-3's "
             "3(N-1)/N * 4 Psi), MiB | sent / formula |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in res["rows"]:
        volume = volume_formula(row["strategy"], row["ranks"], row["psi"])
        ratio = f"{row['sent_per_step'] / volume:.3f}" if volume else "-"
        lines.append(f"| {row['strategy']} | {row['ranks']} | {row['state'] / mib:.2f} | {row['formula'] / mib:.2f} | "
                     f"{row['init_peak'] / mib:.2f} | {row['init_bound'] / mib:.2f} | {row['step_peak'] / mib:.2f} | {row['sent_per_step'] / mib:.2f} | "
                     f"{volume / mib:.2f} | {ratio} |")
    lines += ["", "One checkpoint of each format: the training stall (every rank waits that long before training "
              "goes on), the time until its files are complete, and its bytes:", "",
              "| strategy | ranks | format | stall, ms | complete, ms | written by rank 0 / by each other rank, MiB | "
              "held by rank 0 to write it, MiB |", "|---|---:|---|---:|---:|---:|---:|"]
    for row in res["rows"]:
        if row["ranks"] == 1:
            continue
        for fmt in FORMATS:
            r0, r1 = (by_rank[fmt] for by_rank in row["saves_by_rank"][:2])
            lines.append(f"| {row['strategy']} | {row['ranks']} | {fmt} | {1000 * r0['stall_s']:.0f} | "
                         f"{1000 * r0['complete_s']:.0f} | {r0['written'] / mib:.2f} / {r1['written'] / mib:.2f} | "
                         f"{r0['held'] / mib:.2f} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    plt = runlog.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    mib = 2 ** 20
    for strategy, marker in (("ddp", "o"), ("fsdp", "s")):
        rows = [r for r in res["rows"] if r["strategy"] == strategy]
        ax.plot([r["ranks"] for r in rows], [r["state"] / mib for r in rows], marker=marker,
                label=f"{strategy}: measured")
        ax.plot([r["ranks"] for r in rows], [r["formula"] / mib for r in rows], linestyle="--", color="gray")
    ax.set(xlabel="ranks N", ylabel="params + grads + AdamW per rank (MiB)", xticks=list(RANKS),
           title="Per-rank training state: DDP 16 Psi, ZeRO-3 16 Psi / N (dashed)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "runs" / "zero_lab")
    parser.add_argument("--worker", nargs=2, metavar=("STRATEGY", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], Path(args.worker[1]))
        return {}
    cfg = config.load(str(CONFIG), [])
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for strategy in ("ddp", "fsdp"):
            for ranks in RANKS:
                print(f"{strategy} on {ranks} rank(s) ...", flush=True)
                rows.append(summarise(strategy, ranks, measure(strategy, ranks, Path(scratch))))
    res = {"config": CONFIG.name, "psi": rows[0]["psi"], "batch": cfg.train.batch_size,
           "machine": runlog.cpu_name(), "torch": torch.__version__, "rows": rows}
    runlog.write_lab_results(args.out, "zero", res, markdown(res), plot)
    return res


if __name__ == "__main__":
    main()
