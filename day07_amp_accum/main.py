"""Day 7 — mixed precision (autocast, GradScaler) and gradient accumulation, with the trade-off measured.

Day 6's trainer gets a new step. The forward pass and the loss run under `torch.autocast` (bf16, fp16 or off);
`backward()` and the optimizer stay outside it, so the parameters, their gradients and AdamW's moments stay fp32.
fp16 adds a `GradScaler`: the loss is multiplied by a large scale so small gradients do not underflow, `unscale_`
divides it back out before `clip_grad_norm_`, and a step whose gradients overflowed is skipped (the scale halves).
Gradient accumulation pushes each batch through in micro-batches; each micro-batch loss is weighted by its share
of the batch, so the summed gradient is the full batch's and only one micro-batch of activations is alive at once.

Then the fp32 / fp16 / bf16 table: step time, and memory — on CUDA `torch.cuda.max_memory_allocated`, on CPU the
bytes autograd saves for backward (`saved_tensors_hooks`) — next to what stays the same (parameters, gradients,
optimizer state). On a CPU without native bf16/fp16 (like the 2-core machine this was written on) low precision is
*slower*: the table says so, and says why (matmul GFLOP/s).

Run:    python day07_amp_accum/main.py          (~1 min: the table, then a bf16 run with 4-way accumulation)
        python day07_amp_accum/main.py --amp fp16 --accum 2 --out-runs runs/day07_amp_accum/fp16
Gates:  python day07_amp_accum/check.py
"""
import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F

from day06_ckpt_resume.main import Config, Trainer, config_from_args, config_parser
from day07_amp_accum.report import plot_table, write_table
from sprint.measure import median_seconds, saved_bytes

OUT_DIR = Path(__file__).resolve().parent / "results"
RUNS_DIR = Path(__file__).resolve().parents[1] / "runs" / "day07_amp_accum"
AMP_DTYPES = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}
PRECISION = {"off": "fp32", "fp16": "fp16 autocast", "bf16": "bf16 autocast"}


@dataclass
class AmpConfig(Config):
    amp: str = "bf16"  # off | fp16 | bf16: the dtype autocast runs matmuls in (fp16 also turns on GradScaler)
    accum: int = 4  # micro-batches per optimizer step; batch_size stays the batch the optimizer sees
    batch_size: int = 128
    train_subset: int = 8192  # bf16 is ~9x slower than fp32 on a CPU without native bf16: keep the demo small
    epochs: int = 2
    warmup_steps: int = 20  # of 128 steps in all
    threads: int = 1  # on a busy 2-core machine, 2 OpenMP threads made every step ~20x slower (spinning)

    def __post_init__(self):
        super().__post_init__()
        if self.amp not in AMP_DTYPES:
            raise ValueError(f"amp must be one of {sorted(AMP_DTYPES)}, got {self.amp!r}")
        if self.accum < 1 or self.batch_size % self.accum:
            raise ValueError(f"accum must be >= 1 and divide batch_size={self.batch_size}, got {self.accum}")


def accumulate_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, micro_batch: int, amp_dtype,
                         scaler: torch.amp.GradScaler) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward + backward over (x, y) in micro-batches, adding into .grad; returns (mean loss, correct count).

    Each micro-batch loss is weighted by len(micro) / len(batch) — i.e. divided by the number of accumulation steps
    when they are all full — so the gradients add up to those of the mean loss over the whole batch."""
    total, correct = torch.zeros((), device=x.device), torch.zeros((), device=x.device, dtype=torch.long)
    for xb, yb in zip(x.split(micro_batch), y.split(micro_batch)):
        with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(xb)  # matmuls in fp16/bf16; autocast keeps softmax/cross-entropy in fp32
            loss = F.cross_entropy(logits, yb) * (len(yb) / len(y))
        scaler.scale(loss).backward()  # outside autocast: each backward op runs in the dtype its forward op used
        total += loss.detach()
        correct += (logits.argmax(1) == yb).sum()
    return total, correct


class AmpTrainer(Trainer):
    """Day 6's trainer with autocast, GradScaler and gradient accumulation in its step (and the scaler in its
    checkpoints: a resumed fp16 run must not restart from the initial scale)."""

    def __init__(self, cfg: AmpConfig, run_dir: Path):
        super().__init__(cfg, run_dir)
        self.amp_dtype = AMP_DTYPES[cfg.amp]
        # bf16 has fp32's exponent range, so only fp16 needs loss scaling; disabled, the scaler is a no-op.
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.amp == "fp16")

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss, correct = accumulate_gradients(self.model, x, y, self.cfg.batch_size // self.cfg.accum,
                                             self.amp_dtype, self.scaler)
        self.check_finite(loss)
        self.scaler.unscale_(self.optimizer)  # true gradients first, so the clipping threshold means what it says
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # skips optimizer.step() if unscale_ found an inf/NaN gradient
        self.scaler.update()  # ... and then halves the scale; it doubles after 2,000 clean steps
        self.scheduler.step()
        return {"loss": loss.item(), "acc": correct.item() / len(y), "grad_norm": grad_norm.item(),
                "skipped": self.scaler.get_scale() < scale}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "scaler": self.scaler.state_dict()}

    def load_state_dict(self, ckpt: dict, load_optimizer: bool = True) -> None:
        super().load_state_dict(ckpt, load_optimizer)
        self.scaler.load_state_dict(ckpt["scaler"])


# ---------------------------------------------------------------------------------------------------------------
# Measuring: what does not shrink, matmul throughput, the precision table
# ---------------------------------------------------------------------------------------------------------------
def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Parameters + gradients + optimizer state: what autocast does not touch."""
    tensors = [*model.parameters(), *(p.grad for p in model.parameters() if p.grad is not None),
               *(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))]
    return sum(t.nbytes for t in tensors)


def matmul_gflops(amp_dtype, device: torch.device, n: int = 256, reps: int = 5) -> float:
    """Throughput of an n×n matmul under autocast (median of `reps`): what the hardware can do in that precision."""
    a = torch.randn(n, n, device=device)
    with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
        seconds = median_seconds(lambda: (a @ a).sum().item(), repeat=reps)  # .item() waits for the device
    return 2 * n ** 3 / seconds / 1e9


def low_precision_hardware(device: torch.device) -> str:
    """What the device offers for bf16/fp16 matmuls: the GPU's name, or the CPU's native instructions (Linux)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return f"CPU ({torch.backends.cpu.get_cpu_capability()}; flags unknown)"
    native = [f for f in ("amx_bf16", "amx_fp16", "avx512_bf16", "avx512_fp16") if f in flags]
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")  # oneDNN (the bf16/fp16 matmuls) told to ignore newer ISAs
    return (f"CPU ({torch.backends.cpu.get_cpu_capability()}, threads={torch.get_num_threads()}); "
            f"native low precision: {', '.join(native) if native else 'none (bf16/fp16 are emulated)'}"
            + (f"; oneDNN capped at {capped} by ONEDNN_MAX_CPU_ISA" if capped else ""))


def precision_table(cfg: AmpConfig, run_dir: Path, steps: int = 10) -> list[dict]:
    """One row per precision: median step time over `steps` steps (no accumulation), bytes saved for backward,
    parameter+gradient+optimizer bytes, CUDA peak memory (CUDA only) and matmul GFLOP/s."""
    rows = []
    for amp in AMP_DTYPES:
        trainer = AmpTrainer(dataclasses.replace(cfg, amp=amp, accum=1), Path(run_dir) / amp)
        x, y, _ = next(iter(trainer.loader))
        x, y = x.to(trainer.device), y.to(trainer.device)
        trainer.train_step(x, y)  # warm-up: allocations, AdamW state
        saved = saved_bytes(lambda: trainer.train_step(x, y), skip=trainer.model)
        cuda_peak = None
        if trainer.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
            trainer.train_step(x, y)
            cuda_peak = torch.cuda.max_memory_allocated()
        step_s = median_seconds(lambda: trainer.train_step(x, y), repeat=steps, warmup=0)  # warmed up above
        rows.append({"amp": amp, "precision": PRECISION[amp], "step_ms": 1e3 * step_s,
                     "saved_bytes": saved, "state_bytes": state_bytes(trainer.model, trainer.optimizer),
                     "cuda_peak_bytes": cuda_peak, "matmul_gflops": matmul_gflops(trainer.amp_dtype, trainer.device),
                     "hardware": low_precision_hardware(trainer.device), "batch": cfg.batch_size,
                     "hidden": cfg.hidden})
    return rows


def fp16_range_figures() -> dict:
    """fp16 has 5 exponent bits, bf16 has fp32's 8. Overflow: 70,000 > fp16's max 65,504. Underflow: gradients of
    2^-28 (~3.7e-9) fall below fp16's smallest subnormal 2^-24 and become 0 — unless the loss is scaled first."""
    device = "cpu"
    figures = {}
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        with torch.autocast(device, dtype=dtype):
            figures[f"{name}_70000"] = (torch.tensor([[70000.0]]) @ torch.ones(1, 1)).float().item()

    torch.manual_seed(0)
    layer, x = nn.Linear(64, 64), torch.randn(32, 64)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)  # unscale_ works per optimizer

    def weight_grad(amp_dtype, scaler):
        layer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp_dtype, enabled=amp_dtype is not None):
            out = layer(x)
        loss = out.float().sum() * 2.0 ** -28  # every output gradient is 2^-28
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        return layer.weight.grad.clone()

    reference = weight_grad(None, torch.amp.GradScaler(device, enabled=False))
    plain = weight_grad(torch.float16, torch.amp.GradScaler(device, enabled=False))
    scaled = weight_grad(torch.float16, torch.amp.GradScaler(device, init_scale=2.0 ** 16))
    figures.update(zero_fraction_fp32=(reference == 0).float().mean().item(),
                   zero_fraction_fp16_unscaled=(plain == 0).float().mean().item(),
                   zero_fraction_fp16_scaled=(scaled == 0).float().mean().item(),
                   rel_error_fp16_scaled=((scaled - reference).norm() / reference.norm()).item())
    return figures


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[config_parser(AmpConfig)])
    parser.add_argument("--bench-steps", type=int, default=10, help="timed steps per precision in the table")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where the table, plot and summary go")
    parser.add_argument("--out-runs", type=Path, default=RUNS_DIR / "run", help="the training run (wiped first)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    cfg = config_from_args(AmpConfig, args, parser)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(args.out_runs, ignore_errors=True)

    print(f"precision table: {args.bench_steps} steps each of fp32, fp16 and bf16 ...")
    rows = precision_table(cfg, args.out_runs / "bench", args.bench_steps)
    ranges = fp16_range_figures()
    for r in rows:
        print(f"  {r['precision']:14s} {r['step_ms']:8.2f} ms/step  "
              f"saved for backward {r['saved_bytes'] / 1024:7.0f} KiB  "
              f"params+grads+AdamW {r['state_bytes'] / 1024:6.0f} KiB  matmul {r['matmul_gflops']:7.1f} GFLOP/s")
    print(f"70000 in fp16: {ranges['fp16_70000']}, in bf16: {ranges['bf16_70000']}; gradients of 2^-28 that "
          f"vanish in fp16: {ranges['zero_fraction_fp16_unscaled']:.0%} unscaled, "
          f"{ranges['zero_fraction_fp16_scaled']:.0%} with GradScaler")
    write_table(rows, ranges, args.out / "precision.md")
    plot_table(rows, args.out / "precision.png")

    print(f"training: amp={cfg.amp}, {cfg.accum} micro-batches of {cfg.batch_size // cfg.accum} per step ...")
    t0 = time.perf_counter()
    result = AmpTrainer(cfg, args.out_runs / "train").fit()
    result["wall_s"] = time.perf_counter() - t0
    summary = {"config": asdict(cfg), "table": rows, "ranges": ranges, "training": result}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out / 'precision.md'}, precision.png and summary.json")
    return summary


if __name__ == "__main__":
    main()
