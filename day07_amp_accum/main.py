"""Day 7 — mixed precision (autocast, GradScaler) and gradient accumulation, with the trade-off measured.

Day 6's trainer gets a new step. The forward pass and the loss run under `torch.autocast` (bf16, fp16 or off);
`backward()` and the optimizer stay outside it, so the parameters, their gradients and AdamW's moments stay fp32.
fp16 adds a `GradScaler`: the loss is multiplied by a large scale so small gradients do not underflow, `unscale_`
divides it back out before `clip_grad_norm_`, and a step whose gradients overflowed is skipped (the scale halves).
Gradient accumulation pushes each batch through in micro-batches; each micro-batch loss is weighted by its share
of the batch, so the summed gradient is the full batch's and only one micro-batch of activations is alive at once.

Then the fp32 / fp16 / bf16 table: step time, and memory — on CUDA `torch.cuda.max_memory_allocated`, on CPU the
bytes autograd saves for backward (`saved_tensors_hooks`) — next to what stays the same (parameters, gradients,
optimizer state). On a CPU without native bf16/fp16 low precision is *slower*: the table says so, and says why
(matmul GFLOP/s). Schedules, clipping and batch-size scaling are measured in `optim_lab.py`.

Run:    python day07_amp_accum/main.py                       # the table and a bf16 run with 4-way accumulation
        python day07_amp_accum/main.py --amp fp16 --accum 2
        python day07_amp_accum/main.py --out day07_amp_accum/results   # refresh the committed figures
Gates:  python day07_amp_accum/check.py
"""
import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch
import torch.nn as nn
import torch.nn.functional as F

from day04_mlp_mnist.main import MLP
from day06_ckpt_resume.checkpoint import refuse_existing_run
from day06_ckpt_resume.main import Config, Trainer
from day07_amp_accum.report import plot_table, training_table, write_table
from sprint import runs_dir
from sprint.cli import arg, from_args, parser_for, run, unwritable
from sprint import cpu_info
from sprint.measure import median_seconds, min_cpu_seconds, saved_bytes

AMP_DTYPES = {"off": None, "fp16": torch.float16, "bf16": torch.bfloat16}
PRECISION = {"off": "fp32", "fp16": "fp16 autocast", "bf16": "bf16 autocast"}


@dataclass
class AmpConfig(Config):
    amp: str = arg("bf16", "autocast dtype of the forward pass (fp16 also turns on the GradScaler)",
                   choices=tuple(AMP_DTYPES))
    accum: int = arg(4, "micro-batches per optimizer step (must divide --batch-size)", gt=0)
    train_subset: int = arg(8192, "train on the first N of the remaining images; 0: all of them", ge=0)
    epochs: int = arg(2, "passes over the training split", gt=0)
    warmup_steps: int = arg(20, "steps of linear warmup before the cosine decay", ge=0)
    threads: int = arg(1, "torch threads (one per process is the fast setting on a shared 2-core machine)", ge=0,
                      le=256)
    norm: bool = arg(True, "LayerNorm after the first layer (CUDA's autocast runs it in fp32, the CPU's does not)")

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size % self.accum:
            raise ValueError(f"--accum must divide --batch-size {self.batch_size}, got {self.accum}")


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

    def build_model(self) -> nn.Module:
        return MLP(784, self.cfg.hidden, 10, self.cfg.dropout, norm=self.cfg.norm)

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
    _, flags = cpu_info()
    if not flags:
        return f"CPU ({torch.backends.cpu.get_cpu_capability()}; flags unknown)"
    native = [f for f in ("amx_bf16", "amx_fp16", "avx512_bf16", "avx512_fp16") if f in flags]
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")  # oneDNN (the bf16/fp16 matmuls) told to ignore newer ISAs
    return (f"CPU ({torch.backends.cpu.get_cpu_capability()}, threads={torch.get_num_threads()}); "
            f"native low precision: {', '.join(native) if native else 'none (bf16/fp16 are emulated)'}"
            + (f"; oneDNN capped at {capped} by ONEDNN_MAX_CPU_ISA" if capped else ""))


@dataclass
class PrecisionRow:
    """One training step of the MLP in one precision, measured."""
    amp: str
    precision: str
    step_ms: float  # median over the timed steps
    saved_bytes: int  # saved for backward (saved_tensors_hooks), parameters excluded
    state_bytes: int  # parameters + gradients + AdamW state
    cuda_peak_bytes: int | None  # torch.cuda.max_memory_allocated() during one step; None off CUDA
    matmul_gflops: float
    hardware: str
    batch: int
    hidden: int
    step_cpu_ms: float  # the fastest timed step in this process's CPU time (what the gates compare)


def precision_table(cfg: AmpConfig, steps: int = 10) -> list[PrecisionRow]:
    """One row per precision: median step time over `steps` steps (no accumulation) and the fastest of them in CPU
    time, bytes saved for backward, parameter+gradient+optimizer bytes, CUDA peak memory (CUDA only) and matmul
    GFLOP/s."""
    rows = []
    for amp in AMP_DTYPES:
        with tempfile.TemporaryDirectory() as scratch:  # the trainers only step: they write no files
            trainer = AmpTrainer(dataclasses.replace(cfg, amp=amp, accum=1), Path(scratch))
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
        step_cpu_s = min_cpu_seconds(lambda: trainer.train_step(x, y), repeat=steps, warmup=0)
        rows.append(PrecisionRow(amp, PRECISION[amp], 1e3 * step_s, saved,
                                 state_bytes(trainer.model, trainer.optimizer), cuda_peak,
                                 matmul_gflops(trainer.amp_dtype, trainer.device),
                                 low_precision_hardware(trainer.device), cfg.batch_size, cfg.hidden, 1e3 * step_cpu_s))
    return rows


@dataclass
class RangeFigures:
    fp16_70000: float  # 70,000 through an fp16 autocast matmul
    bf16_70000: float
    zero_fraction_fp32: float  # weight gradients of 2^-28 per output that come out 0
    zero_fraction_fp16_unscaled: float
    zero_fraction_fp16_scaled: float  # with a GradScaler at 2^16
    rel_error_fp16_scaled: float  # of the scaled-then-unscaled fp16 gradients against fp32


def fp16_range_figures() -> RangeFigures:
    """fp16 has 5 exponent bits, bf16 has fp32's 8. Overflow: 70,000 > fp16's max 65,504. Underflow: gradients of
    2^-28 (~3.7e-9) fall below fp16's smallest subnormal 2^-24 and become 0 — unless the loss is scaled first."""
    device = "cpu"
    overflow = {}
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        with torch.autocast(device, dtype=dtype):
            overflow[name] = (torch.tensor([[70000.0]]) @ torch.ones(1, 1)).float().item()

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
    return RangeFigures(overflow["fp16"], overflow["bf16"], *((g == 0).float().mean().item()
                                                             for g in (reference, plain, scaled)),
                        ((scaled - reference).norm() / reference.norm()).item())


def main(argv=None) -> dict:
    parser = parser_for(AmpConfig, __doc__, out=runs_dir(__file__))
    parser.add_argument("--bench-steps", type=int, default=10, help="timed steps per precision in the table")
    parser.add_argument("--run-dir", type=Path, default=argparse.SUPPRESS,
                        help="the training run's folder (default: runs/day07_amp_accum/run-<date-time>)")
    args = parser.parse_args(argv)
    cfg = from_args(AmpConfig, args, parser)
    run_dir = getattr(args, "run_dir", None) or runs_dir(__file__, time.strftime("run-%Y%m%d-%H%M%S"))
    if args.bench_steps < 1:
        parser.error(f"--bench-steps must be > 0, got {args.bench_steps}")
    for flag, path in (("--out", args.out), ("--run-dir", run_dir)):
        if why := unwritable(path):
            parser.error(f"{flag} {path}: {why}")
    refuse_existing_run(run_dir)
    t0 = time.perf_counter()

    print(f"precision table: {args.bench_steps} steps each of fp32, fp16 and bf16 ...")
    rows = precision_table(cfg, args.bench_steps)
    ranges = fp16_range_figures()
    for r in rows:
        print(f"  {r.precision:14s} {r.step_ms:8.2f} ms/step  saved for backward {r.saved_bytes / 1024:7.0f} KiB  "
              f"params+grads+AdamW {r.state_bytes / 1024:6.0f} KiB  matmul {r.matmul_gflops:7.1f} GFLOP/s")
    print(f"70000 in fp16: {ranges.fp16_70000}, in bf16: {ranges.bf16_70000}; gradients of 2^-28 that vanish in "
          f"fp16: {ranges.zero_fraction_fp16_unscaled:.0%} unscaled, {ranges.zero_fraction_fp16_scaled:.0%} with "
          "GradScaler")
    args.out.mkdir(parents=True, exist_ok=True)
    write_table(rows, ranges, args.out / "precision.md")
    plot_table(rows, args.out / "precision.png")

    print(f"training: amp={cfg.amp}, {cfg.accum} micro-batches of {cfg.batch_size // cfg.accum} per step ...")
    t_train = time.perf_counter()
    result = AmpTrainer(cfg, run_dir).fit()
    summary = {"config": asdict(cfg), "table": [asdict(r) for r in rows], "ranges": asdict(ranges),
               "training": {**result, "wall_s": time.perf_counter() - t_train},
               "wall_s": time.perf_counter() - t0}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "training.md").write_text(training_table(summary))
    print(f"wrote {args.out / 'precision.md'}, precision.png, training.md and summary.json")
    return summary


if __name__ == "__main__":
    run(main)
