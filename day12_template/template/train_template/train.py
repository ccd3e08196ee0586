"""train.py — the training loop you keep: a config in, a run folder out. It trains image classifiers and language
models alike: the data says what it is, the task (tasks.py) turns the model's output into a loss and metrics.

    python train.py --config configs/mnist_mlp.toml                              # train
    python train.py --config configs/mnist_mlp.toml --set optim.lr=1e-3 train.epochs=3
    python train.py --config configs/mnist_mlp.toml --set checkpoint.resume=auto  # continue after any stop
    python train.py --config configs/shakespeare_cpu.toml                        # a GPT on Shakespeare
    python sample.py --run runs/shakespeare_cpu --prompt "ROMEO:"                 # ... and what it writes
    torchrun --nproc_per_node=2 train.py --config configs/mnist_mlp.toml --set train.strategy=fsdp
    python train.py --help-config                                                # every field, and why

Read it from `run()`: `setup()` builds the run's parts into a `Run`, writing nothing until nothing can be refused;
`fit()` trains to each evaluation (`train_until_evaluation`, one `train_step` at a time), checkpoints, evaluates
(`validate`) and ends with `final_test`. The checkpointer (checkpoint/) decides what a checkpoint holds.

The run folder (run.out_dir) gets config.toml, run.json, metrics.jsonl, tb/ (or mlruns/: run.tracker), ckpt-*.pt,
last.pt, best.pt and run.lock.
Exit codes (`main` and `exit_with`, at the end of this file; the other commands share `exit_with`): 0 done; 1 error
(data, checkpoint, a log file, non-finite loss, out of memory, a rank of the job gone); 2 bad config (nothing
written); 143 / 130 stopped by SIGTERM / SIGINT after writing last.pt (resume with checkpoint.resume=auto); 141
stdout's reader gone (`| head`).
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; must be set before CUDA starts

import contextlib
import dataclasses
import functools
import logging
import math
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import checkpoint, config, data, distributed, models, optimizers, runlog, runlock, tasks
from .signals import StopSignal, Stopped, stopped
from .troubleshoot import NonFinite, nonfinite_error


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    torch.backends.cudnn.benchmark = not deterministic  # the autotuner may pick another algorithm each run
    # Strict: an op with no deterministic kernel fails (exit_with says which, in one line) rather than warn, and the
    # ops with a slower deterministic path take it (CUDA's fused attention backward keeps its faster, non-deterministic
    # one under warn_only). The switch imports the compiler's config, a start-up cost paid once per process, and only
    # when the setting changes.
    if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != \
            (deterministic, False):
        torch.use_deterministic_algorithms(deterministic)


def build_model(cfg: config.Config, info, dist: distributed.Dist) -> torch.nn.Module:
    """The model on dist.device, initialised from run.seed. Under FSDP it is sharded on the meta device, before any
    memory exists, so that no rank ever allocates more than its shard plus one full tensor: every rank draws the
    same initial tensors, one at a time, and keeps its own rows (models.init_weights)."""
    shard = None
    if dist.enabled and cfg.train.strategy == "fsdp":
        bf16 = cfg.train.amp and cfg.train.amp_dtype == "bfloat16"
        shard = functools.partial(distributed.shard, dist=dist, bf16=bf16)
    model = models.build(cfg.model, info, cfg.run.seed, dist.device, shard)
    if cfg.model.channels_last and not shard:  # NHWC kernels (FSDP2 keeps its shards contiguous; inputs still NHWC)
        model.to(memory_format=torch.channels_last)
    return model


def warmup_cosine(optimizer, total_steps: int, cfg: config.Optim):
    """Linear warmup, then a cosine to lr * min_lr_ratio, counted in optimizer steps (so accumulation is included)."""
    warmup = int(total_steps * cfg.warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class Hook:
    """Code attached to a run from outside the loop: faults.py's drills, or your own probes. Override what you need;
    pass a list of them to `run(cfg, hooks)`."""

    def data(self, splits: data.Splits) -> data.Splits:
        """The splits, before any loader is made (may return other splits)."""
        return splits

    def states(self, model: torch.nn.Module) -> dict:
        """State this hook keeps for `model` across a resume: name -> anything with state_dict() and load_state_dict()
        (EMA weights, say). Every checkpoint saves each entry, and a resume restores it before `attach`."""
        return {}

    def attach(self, model: torch.nn.Module, module: torch.nn.Module, progress: "Progress") -> None:
        """The built model and the module that trains it (DDP wrapper, FSDP2-sharded model or the model itself)."""

    def step(self, progress: "Progress") -> None:
        """After each optimizer step (progress.step is the number done)."""


@dataclass
class Progress:
    """The loop's own state, saved in every checkpoint beside the modules' states."""
    step: int = 0  # optimizer steps done
    best: dict = field(default_factory=lambda: {"step": None, "val_loss": math.inf})  # the lowest val loss so far
    bad_evals: int = 0  # evaluations since the best one (early stopping)
    window: list = field(default_factory=lambda: [0.0, 0])  # training losses summed since the last record, steps

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, state[f.name])

    def forget_best(self) -> None:
        """The best validation loss so far no longer counts (it was measured on other data)."""
        self.best, self.bad_evals = Progress().best, 0


def build_sampler(cfg: config.Config, train_data, micro: int, dist: distributed.Dist) -> data.ResumableSampler:
    """The training data's order on this rank: a permutation each epoch or, for a dataset drawn at random (text
    windows), `train.eval_every` (else `train.steps`) steps' worth of random draws at a time, fixed for the run."""
    draws = 0
    if getattr(train_data, "sampling", "permutation") == "random":
        draws = cfg.train.eval_every or cfg.train.steps
    return data.ResumableSampler(len(train_data), cfg.train.batch_size, micro, dist.rank, dist.world, cfg.run.seed,
                                 draws)


def run_steps(train: config.Train, sampler: data.ResumableSampler) -> int:
    """The run's length in optimizer steps, the one horizon: `train.steps`, else `train.epochs` passes over the
    training set (images), converted once here."""
    return train.steps or train.epochs * sampler.steps_per_epoch


def evaluation_period(train: config.Train, sampler: data.ResumableSampler, total_steps: int) -> int:
    """Optimizer steps between two evaluations: `train.eval_every`, else one epoch of images, or the whole run of
    text (the run's last step is always evaluated)."""
    if train.eval_every:
        return train.eval_every
    return total_steps if sampler.draws else sampler.steps_per_epoch


@torch.no_grad()
def evaluate(model, task, loader, weights, device, autocast, dist, after_batch=None) -> dict:
    """The task's metrics over every rank's share, in eval mode (dropout off, BatchNorm's running statistics).
    `after_batch()`, if given, runs after each batch on every rank: the loop honours a stop signal there."""
    distributed.sync_buffers(model, dist)
    model.eval()
    totals = torch.zeros(len(task.sums), device=device, dtype=torch.float32 if device.type == "mps" else torch.float64)
    for (x, y), w in zip(loader, weights):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            out = model(x)
        totals += w * task.eval_sums(out, y).to(totals.dtype)
        if after_batch:
            after_batch()
    model.train()
    return task.metrics(dist.all_reduce(totals).tolist())


def forward_backward(module, task, micro_batches, device, autocast, scaler, channels_last: bool) -> torch.Tensor:
    """One optimizer step's gradients, accumulated over its micro-batches; returns the step's mean loss (on device)."""
    step_loss = torch.zeros((), device=device)
    for k, (x, y) in enumerate(micro_batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with distributed.grad_sync(module, k == len(micro_batches) - 1):  # all-reduce once, after the last one
            with autocast():
                loss = task.loss(module(x), y) / len(micro_batches)  # / accum: the sum is the batch's mean
            scaler.scale(loss).backward()  # outside autocast; fp16: scaled so small gradients survive
        step_loss += loss.detach()
    return step_loss


def run(cfg: config.Config, hooks: list[Hook] = ()) -> dict:
    """Train per `cfg` (one process, or one rank of a torchrun job); returns the final figures."""
    try:
        distributed.check_launcher(cfg.checkpoint.resume)
        dist = distributed.setup(cfg.run.device)
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from None
    stop = StopSignal(repeat_stops=not dist.enabled)
    try:
        with contextlib.ExitStack() as closing:  # files and writer threads are closed however the run ends
            result = fit(setup(cfg, dist, stop, closing, hooks))
        dist.barrier()  # no rank tears the group down while another still communicates (gloo aborts at exit)
        return result
    finally:
        dist.close()
        stop.restore()


@dataclass
class Run:
    """One run's built parts: `setup()` makes them; `fit()` and the functions it calls use them."""
    cfg: config.Config
    dist: distributed.Dist
    stop: StopSignal
    hooks: list[Hook]
    task: object  # tasks.py: the loss, the evaluation sums and the metrics
    model: torch.nn.Module
    module: torch.nn.Module  # what trains: a DDP wrapper, the FSDP2-sharded model, or the model itself
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable
    sampler: data.ResumableSampler
    train_loader: Iterable
    eval_loaders: dict  # split -> (loader, the weight of each of its batches)
    progress: Progress
    checkpointer: checkpoint.Checkpointer
    log: runlog.RunLog
    speed: runlog.Speed
    profiler: object
    total_steps: int  # the schedule's length
    last_step: int  # where this run stops (train.max_steps may stop it sooner)
    eval_every: int  # optimizer steps between evaluations (and the last step)
    evaluation_due: bool  # resumed from a checkpoint written before its evaluation: that evaluation comes first

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run.out_dir)


def setup(cfg: config.Config, dist: distributed.Dist, stop: StopSignal, closing: contextlib.ExitStack,
          hooks: list[Hook]) -> Run:
    """Every part of the run, built in an order that writes nothing until nothing can be refused any more."""
    # 1. Everything that can be refused is checked before anything is written.
    config.check_combinations(cfg, dist.world)
    run_dir, train_cfg, device = Path(cfg.run.out_dir), cfg.train, dist.device
    on_rank0(dist, runlock.check, run_dir)  # a live run in that folder: refused first, before any work
    source, ckpt = checkpoint.resume_source(cfg)
    run_id, continued_run = runlog.identity(run_dir, ckpt, source, cfg.checkpoint.resume == "auto")
    run_id = dist.gather(run_id)[0]  # a fresh run's id, drawn on rank 0
    seed_everything(cfg.run.seed, cfg.run.deterministic)
    splits = data.build(cfg.data, cfg.run.seed)
    for hook in hooks:
        splits = hook.data(splits)
    task = tasks.for_dataset(cfg.data.dataset, splits.info)
    model = build_model(cfg, splits.info, dist)
    fingerprint = data.fingerprint(splits)  # each split's size and content hash: every checkpoint records it
    data_changes = {}  # split -> how it changed since the checkpoint resumed from
    if ckpt:
        data_changes = checkpoint.check_resume(model, ckpt, source, splits, fingerprint, cfg)
    elif cfg.checkpoint.init_from:
        checkpoint.load_weights(model, cfg.checkpoint.init_from, splits.info, cfg.data)
    if dist.enabled:
        torch.manual_seed(cfg.run.seed + 1 + dist.rank)  # from here on, each rank its own dropout
    module = distributed.wrap(model, dist)  # a DDP wrapper under torchrun, else the (perhaps sharded) model itself
    if cfg.model.compile:
        module = torch.compile(module)

    # 2. Data order, optimizer, schedule, scaler: the state a checkpoint must carry.
    pin_memory = cfg.data.pin_memory and device.type == "cuda"
    micro = train_cfg.batch_size // (train_cfg.grad_accum * dist.world)  # one forward's share of the global batch
    sampler = build_sampler(cfg, splits.train, micro, dist)
    if sampler.steps_per_epoch == 0:
        raise data.DataError(f"train.batch_size={train_cfg.batch_size} exceeds the {len(splits.train)} training "
                             f"samples")
    train_loader = data.loader(splits.train, sampler, cfg.data.num_workers, pin_memory)
    # Evaluation batches are a training forward's size: what fits in training fits in evaluation (GPT-2's 480
    # windows of micro-batch x grad_accum would need ~230 GiB).
    eval_loaders = data.eval_loaders(splits, micro, dist.rank, dist.world, cfg.data.num_workers, pin_memory)
    total_steps = run_steps(train_cfg, sampler)
    last_step = min(total_steps, train_cfg.max_steps or total_steps)
    optimizer = optimizers.build(model, cfg.optim)
    scheduler = warmup_cosine(optimizer, total_steps, cfg.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=train_cfg.amp and train_cfg.amp_dtype == "float16")  # fp16
    # Speed measures a CPU's peak FLOP/s (MFU's denominator) here, before the run starts anything else.
    speed = runlog.Speed(train_cfg.batch_size, task.tokens_per_sample, model, device, train_cfg)
    progress = Progress()
    states = {"scheduler": scheduler, "scaler": scaler, "sampler": sampler}  # each checkpointed by its name
    for hook in hooks:
        states.update(hook.states(model))
    about = {"run_id": run_id, "data": fingerprint, "info": {"task": task.name, **dataclasses.asdict(splits.info)}}
    checkpointer = checkpoint.Checkpointer(cfg, dist, model, optimizer, progress, states, about)
    if ckpt:
        checkpointer.load(ckpt, source)
        if "val" in data_changes:  # its losses were measured on other data: not comparable
            progress.forget_best()
    eval_every = evaluation_period(train_cfg, sampler, total_steps)
    # A checkpoint at an evaluation's step (or the run's last) was written before that evaluation: a resume from it
    # does the evaluation again, so one that failed (an out-of-memory, say) loses no training.
    evaluation_due = bool(ckpt) and (progress.step >= last_step or progress.step % eval_every == 0)

    # 3. The run folder (rank 0 writes, the others only compute), now that nothing can be refused any more.
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    lock = on_rank0(dist, runlock.hold, run_dir)  # one writer per run folder, until this run ends
    if lock:
        closing.callback(lock.release)
    if dist.is_main:
        checkpoint.clean_stale_tmp(run_dir)  # safe: no other live run owns these files
        if warning := config.ignored(cfg):
            print(f"warning: {warning}", file=sys.stderr)
        for name, content in data.kept_vocabulary(cfg.data).items():  # the run folder alone decodes (sample.py)
            runlog.write_atomic(run_dir / name, content)
    meta = runlog.metadata(device, dist.world, str(source.resolve()) if source else None)
    if continued_run:
        meta["continued_run"] = continued_run
    if data_changes:
        meta["data_changed"] = list(data_changes.values())
    log = runlog.RunLog(run_dir, cfg, dist.is_main, progress.step, meta, evaluation_due, run_id)
    closing.push(log.ended)
    checkpointer.before_write = log.flush
    for hook in hooks:
        hook.attach(model, module, progress)
    profiler = runlog.profiler(cfg, run_dir, cfg.profile.enabled and dist.is_main, closing)
    run = Run(cfg, dist, stop, hooks, task, model, module, optimizer, scheduler, scaler,
              models.autocast(train_cfg, device.type), sampler, train_loader, eval_loaders, progress, checkpointer,
              log, speed, profiler, total_steps, last_step, eval_every, evaluation_due)
    log.say(f"{cfg.model.name} ({models.count_params(model):,} parameters) on {cfg.data.dataset} "
            f"({len(splits.train):,} train / {len(splits.val):,} val {'windows' if sampler.draws else 'samples'})"
            f" | {device} x {dist.world} | {run_dir}")
    if not train_cfg.steps:  # the one horizon is steps: epochs are converted once, here
        log.say(f"train.epochs={train_cfg.epochs}: {total_steps:,} optimizer steps ({train_cfg.epochs} x "
                f"{sampler.steps_per_epoch:,}), evaluated every {eval_every:,}")
    if ckpt:
        log.say(resumed(run, ckpt, source, continued_run, data_changes))
        if dist.is_main and (note := checkpoint.repair_best(run_dir, ckpt, source)):
            log.say(note)
    if lock and lock.note:
        log.say(lock.note)
    if distributed.is_sharded(model) and not hasattr(model, "init_tensor"):
        log.say(f"{cfg.model.name} has no init_tensor: each rank built it whole before sharding it (see models.py)")
    return run


def resumed(run: Run, ckpt: dict, source: Path, continued_run: str | None, data_changes: dict) -> str:
    """What a resume continues, and what differs from the run that wrote its checkpoint."""
    step, world = run.progress.step, run.dist.world
    said = (f"resumed from {source} at step {step} (the sampler at epoch {run.sampler.epoch + 1}, sample "
            f"{run.sampler.position:,})")
    if ckpt["world_size"] != world:
        said += f"; {ckpt['world_size']} -> {world} ranks: same samples, new dropout"
    if run_steps(config.from_dict(ckpt["config"]).train, run.sampler) != run.total_steps:  # safe, but re-planned
        said += (f"; the schedule is re-planned for {run.total_steps} steps: the learning rate follows the new warmup "
                 f"+ cosine from this step on")
    if step >= run.total_steps:
        said += f"; step {step} is past the {run.total_steps} planned: nothing more to train"
    if run.evaluation_due:
        said += f"; the evaluation at step {step}, which its checkpoint came before, is done again"
    if continued_run:
        said += (f"; a checkpoint of another run ({continued_run}), continued as this folder's run "
                 f"{run.checkpointer.about['run_id']}")
    if data_changes:
        said += f"; on new data (checkpoint.accept_new_data): {'; '.join(data_changes.values())}"
        if "val" in data_changes:
            said += "; the best validation loss so far is forgotten (it was measured on other data)"
    return said


def fit(run: Run) -> dict:
    """The loop: train up to the next evaluation (every train.eval_every steps, and at the run's last), checkpoint,
    evaluate; a resume whose evaluation is due starts there. Then the test split, once."""
    progress = run.progress
    run.speed.start(progress.step)
    while (progress.step < run.last_step or run.evaluation_due) and not early_stopped(run):
        if not run.evaluation_due:
            train_until_evaluation(run)
            run.checkpointer.save()
        elif not run.checkpointer.saved_this_step():  # resumed from another folder: this one gets the checkpoint too
            run.checkpointer.save()
        run.evaluation_due = False
        validate(run)
    return final_test(run)


def train_until_evaluation(run: Run) -> None:
    """Optimizer steps up to the next evaluation, each logged, checkpointed every checkpoint.every_steps, and stopped
    after a signal (a signal at the evaluation's step is honoured in the evaluation, after the checkpoint)."""
    progress, sampler, every_steps = run.progress, run.sampler, run.cfg.checkpoint.every_steps
    evaluation = min(run.last_step, (progress.step // run.eval_every + 1) * run.eval_every)
    run.log.start_bar(f"to step {evaluation}", run.last_step, progress.step)
    batches = iter(run.train_loader)
    while progress.step < evaluation:
        epoch = sampler.epoch  # the epoch this step's samples come from
        micro_batches = [next(batches) for _ in range(run.cfg.train.grad_accum)]
        step_loss, grad_norm, signalled = train_step(run, micro_batches, epoch)
        record_step(run, epoch, step_loss, grad_norm)
        if progress.step == evaluation:
            break  # saved next, then a stop signal is honoured in the evaluation
        if signalled:  # every rank knows: all stop after this same step
            run.checkpointer.save()
            stop_here(run)
        if every_steps and progress.step % every_steps == 0:
            run.checkpointer.save()
    run.log.end_bar()


def train_step(run: Run, micro_batches: list, epoch: int) -> tuple[float, float, bool]:
    """One optimizer step: gradients accumulated over the micro-batches, unscaled and clipped, the step's one host
    sync, then the update, unless the loss is not finite (the run stops before the step is applied). Returns the
    step's loss and gradient norm (means over the ranks), and whether a stop signal reached any rank."""
    dist, device, optimizer, scaler = run.dist, run.dist.device, run.optimizer, run.scaler
    step_loss = forward_backward(run.module, run.task, micro_batches, device, run.autocast, scaler,
                                 run.cfg.model.channels_last)
    scaler.unscale_(optimizer)  # true gradients first, so the clip threshold means what it says
    norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.cfg.optim.grad_clip or math.inf)
    # The one host sync per step: loss, gradient norm, "a signal arrived" and "my asynchronous save's files are
    # written", summed over the ranks.
    flags = torch.stack([step_loss, distributed.local_norm(norm).float(),
                         torch.tensor(float(run.stop.signum > 0), device=device),
                         torch.tensor(float(run.checkpointer.written()), device=device)])
    loss_sum, norm_sum, signals, written = dist.all_reduce(flags).tolist()  # signals: ranks that saw one
    if written == dist.world:  # every rank's shard is on disk: rename and link it now, not at the next save
        run.checkpointer.finish()
    step_loss, grad_norm = loss_sum / dist.world, norm_sum / dist.world
    if not math.isfinite(step_loss) or not (scaler.is_enabled() or math.isfinite(grad_norm)):
        raise nonfinite_error(run.progress.step + 1, epoch, step_loss, grad_norm, run.model,
                              [(x.to(device), y) for x, y in micro_batches], run.autocast, dist,
                              run.run_dir / "last.pt")
    scaler.step(optimizer)  # fp16: skipped when a gradient overflowed (and the scale halves)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    run.progress.step += 1
    run.sampler.advance()
    return step_loss, grad_norm, signals > 0


def record_step(run: Run, epoch: int, step_loss: float, grad_norm: float) -> None:
    """A step's bookkeeping: the progress bar, the hooks, the profiler, and every train.log_every steps a record."""
    progress = run.progress
    progress.window = [progress.window[0] + step_loss, progress.window[1] + 1]
    run.log.advance()
    for hook in run.hooks:
        hook.step(progress)
    run.profiler.step()
    if progress.step % run.cfg.train.log_every == 0:
        run.log.record("train", progress.step, epoch=epoch, loss=progress.window[0] / progress.window[1],
                       lr=run.scheduler.get_last_lr()[0], grad_norm=grad_norm, scale=run.scaler.get_scale(),
                       **run.speed.figures(progress.step))
        progress.window = [0.0, 0]


def evaluate_split(run: Run, split: str) -> dict:
    """`evaluate` on one of the run's evaluation splits, a stop signal honoured between its batches."""
    return evaluate(run.model, run.task, *run.eval_loaders[split], run.dist.device, run.autocast, run.dist,
                    functools.partial(stop_if_asked, run))


def validate(run: Run) -> None:
    """The validation split at this step: its record and line, best.pt if it is the best so far, early stopping."""
    progress, train_cfg = run.progress, run.cfg.train
    metrics = evaluate_split(run, "val")
    if not math.isfinite(metrics["loss"]):
        raise NonFinite(f"validation loss is {metrics['loss']} at step {progress.step}: last.pt holds the weights "
                        f"that gave it")
    improved = metrics["loss"] < progress.best["val_loss"]
    if improved:
        progress.best = {"step": progress.step, "val_loss": metrics["loss"]}
    progress.bad_evals = 0 if improved else progress.bad_evals + 1
    run.log.record("val", progress.step, epoch=run.sampler.last_epoch(), best=improved,
                   **{f"val_{k}": v for k, v in metrics.items()})
    verdict = " (best)" if improved else f" (not better for {progress.bad_evals})"
    rate = ""
    if progress.step > run.speed.step0:
        rate = f", {run.speed.samples_per_s(progress.step):,.0f} samples/s"
    run.log.say(f"step {progress.step}/{run.total_steps}: {run.task.describe(metrics, 'val')}{verdict}{rate}")
    if improved:
        run.checkpointer.mark_best()
    if early_stopped(run):
        run.log.say(f"early stop: no better validation loss for {train_cfg.early_stop_patience} evaluations")


def early_stopped(run: Run) -> bool:
    patience = run.cfg.train.early_stop_patience
    return bool(patience) and run.progress.bad_evals >= patience


def final_test(run: Run) -> dict:
    """The test split, touched once: best.pt's weights, read back from disk (the last weights if no file holds them
    any more). Returns the run's final figures."""
    progress = run.progress
    best_step = progress.best["step"]
    tested = f"the last weights, step {progress.step}: best.pt is gone"
    if run.checkpointer.load_best_weights():
        tested = f"best.pt, step {best_step}"
    stopped_by = "done"
    if early_stopped(run):
        stopped_by = "early_stop"
    elif progress.step < run.total_steps:
        stopped_by = "max_steps"
    result = {"step": progress.step, "stopped_by": stopped_by, "best_step": best_step,
              "best_val_loss": progress.best["val_loss"], "run_dir": str(run.run_dir), "tested": tested}
    if "test" in run.eval_loaders:
        metrics = evaluate_split(run, "test")
        result.update({f"test_{k}": v for k, v in metrics.items()})
        run.log.record("test", progress.step, **{k: v for k, v in result.items() if k.startswith(("test", "best"))})
        run.log.say(f"test ({tested}): {run.task.describe(metrics, 'test')}")
    run.log.close()
    return result


def stop_here(run: Run) -> None:
    """Every rank stops after the same step, once its checkpoint is complete: the run resumes from there."""
    run.checkpointer.finish()
    run.dist.barrier()  # as after the last step: no rank leaves while another still writes (gloo aborts)
    raise stopped(run.stop.name(), run.progress.step)


def stop_if_asked(run: Run) -> None:
    """Between two evaluation batches: a stop signal on any rank stops them all here (each asks at the same batch).
    The step's checkpoint was written before its evaluation, so the resumed run evaluates it again."""
    asked = run.stop.signum > 0
    if run.dist.enabled:
        asked = run.dist.all_reduce(torch.tensor(float(asked), device=run.dist.device)).item() > 0
    if asked:
        stop_here(run)


def on_rank0(dist: distributed.Dist, claim, run_dir: Path):
    """`claim(run_dir)` on rank 0 (None elsewhere); if it finds the folder busy, every rank refuses (exit 2)."""
    result, error = None, None
    if dist.is_main:
        try:
            result = claim(run_dir)
        except runlock.Busy as exc:
            error = str(exc)
        except OSError as exc:  # e.g. run.lock is a folder, or the folder is not writable
            error = f"run.out_dir {run_dir}: cannot take its lock {run_dir / runlock.NAME} ({exc.strerror or exc})"
    if error := dist.gather(error)[0]:
        raise config.ConfigError(error)
    return result


def check_out_dir(cfg: config.Config) -> None:
    """run.out_dir must be creatable: its nearest existing ancestor is a writable folder, and (on rank 0, the one
    that writes) the first missing folder can really be made: os.access trusts root and knows nothing of /proc or
    /sys. The probe folder is removed at once, so nothing is left behind."""
    existing = Path(cfg.run.out_dir).resolve()
    while not existing.exists():
        missing, existing = existing, existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise config.ConfigError(f"run.out_dir {cfg.run.out_dir}: {existing} is not a writable folder")
    if existing != Path(cfg.run.out_dir).resolve() and int(os.environ.get("RANK", "0")) == 0:
        try:
            missing.mkdir()
        except FileExistsError:
            return  # made meanwhile by someone else: it exists, that is all the run needs
        except OSError as exc:
            raise config.ConfigError(f"run.out_dir {cfg.run.out_dir}: cannot create {missing}: "
                              f"{exc.strerror or exc}") from None
        missing.rmdir()


def main(argv=None, hooks: list[Hook] = ()) -> int:
    args = config.argument_parser(__doc__, inspect=True).parse_args(argv)
    if args.help_config:
        print(config.describe())
        return 0
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = config.load(args.config, args.set)
        check_out_dir(cfg)
        if args.print_config:
            print(config.dump_toml(cfg))
            return 0
        run(cfg, hooks)
    except config.ConfigError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except Stopped as exc:
        if rank == 0:
            print(exc, file=sys.stderr)
        return exc.code
    except (data.DataError, checkpoint.CheckpointError, runlog.LogError, NonFinite) as exc:
        print(f"error{f' (rank {rank})' if rank else ''}: {exc}", file=sys.stderr)
        return 1
    return 0


OUT_OF_MEMORY = ("out of memory", "allocate memory")  # torch's CPU allocator; CUDA's OutOfMemoryError
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")  # gloo, when a rank has died
NOT_DETERMINISTIC = "does not have a deterministic implementation"  # torch, under use_deterministic_algorithms(True)


def exit_with(main) -> None:
    """sys.exit(main()) for the entry points; quietly (141, as for SIGPIPE) when stdout's reader has gone: `| head`;
    one line and exit 1 when memory runs out, when an op has no deterministic kernel under run.deterministic, or,
    under torchrun, when another rank has died (RuntimeErrors all)."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the flush at exit cannot fail again
        code = 141
    except (MemoryError, RuntimeError) as exc:
        first_line = (str(exc) or type(exc).__name__).splitlines()[0]
        rank = os.environ.get("RANK", "0")
        where = "" if rank == "0" else f" (rank {rank})"
        if isinstance(exc, MemoryError) or any(s in first_line for s in OUT_OF_MEMORY):
            print(f"error{where}: out of memory ({first_line}); lower train.batch_size (raise train.grad_accum) or "
                  "the model size", file=sys.stderr)
        elif NOT_DETERMINISTIC in first_line:
            op = first_line.split(NOT_DETERMINISTIC)[0].strip()
            print(f"error{where}: run.deterministic = true, and {op} has no deterministic kernel on this device; "
                  "--set run.deterministic=false runs it (two runs of one seed may then differ)", file=sys.stderr)
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1 and any(s in first_line for s in PEER_GONE):
            print(f"error{where}: another rank of this job has gone (killed or crashed: its log says why), so this "
                  "one stops too; resume from the last checkpoint with --set checkpoint.resume=auto",
                  file=sys.stderr)
        else:
            raise
        code = 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        leave_rank(code)
    sys.exit(code)


def leave_rank(code: int) -> None:
    """A torchrun rank's exit, once its run has closed its files and left the process group: os._exit, after flushing
    the output. The interpreter's own exit races the process group's worker threads: one still releasing a finished
    collective's tensors needs the GIL that the exit is tearing down, and the rank dies of SIGABRT ("terminate called
    without an active exception"; PyTorch issue 190489), now and then, more often on busy cores. A rank therefore runs
    no atexit handlers (docs/scale_out.md)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cli() -> None:
    """`python train.py` at the template's root, and the `template-train` command of `pip install -e .`."""
    exit_with(main)
