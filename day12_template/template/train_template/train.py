"""train.py — the training loop you keep: a config in, a run folder out. It trains image classifiers and language
models alike: the data says what it is, the task (tasks.py) turns the model's output into a loss and metrics.

    python train.py --config configs/mnist_mlp.toml                              # train
    python train.py --config configs/mnist_mlp.toml --set optim.lr=1e-3 train.epochs=3
    python train.py --config configs/mnist_mlp.toml --set checkpoint.resume=auto  # continue after any stop
    python train.py --config configs/shakespeare_cpu.toml                        # a GPT on Shakespeare
    python sample.py --run runs/shakespeare_cpu --prompt "ROMEO:"                 # ... and what it writes
    torchrun --nproc_per_node=2 train.py --config configs/mnist_mlp.toml --set train.strategy=fsdp
    python train.py --help-config                                                # every field, and why

The run folder (run.out_dir) gets config.toml, run.json, metrics.jsonl, tb/ (or mlruns/: run.tracker), ckpt-*.pt,
last.pt, best.pt and run.lock.
Exit codes: 0 done; 1 error (data, checkpoint, a log file, non-finite loss, out of memory); 2 bad config (nothing
written); 143 / 130 stopped by SIGTERM / SIGINT after writing last.pt (resume with checkpoint.resume=auto).
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; must be set before CUDA starts

import contextlib
import dataclasses
import functools
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from . import checkpoint, config, data, distributed, models, runlog, runlock, tasks
from .signals import StopSignal, Stopped, stopped
from .troubleshoot import NonFinite, nonfinite_error


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    torch.backends.cudnn.benchmark = not deterministic  # the autotuner may pick another algorithm each run
    # warn_only: warn, don't fail, where an op has no deterministic kernel. The switch imports the compiler's config,
    # a start-up cost paid once per process, and only when the setting changes.
    if torch.are_deterministic_algorithms_enabled() != deterministic:
        torch.use_deterministic_algorithms(deterministic, warn_only=True)


def build_model(cfg: config.Config, info, d: distributed.Dist) -> torch.nn.Module:
    """The model on d.device, initialised from run.seed. Under FSDP it is sharded on the meta device, before any
    memory exists, so that no rank ever allocates more than its shard plus one full tensor: every rank draws the
    same initial tensors, one at a time, and keeps its own rows (models.init_weights)."""
    shard = None
    if d.enabled and cfg.train.strategy == "fsdp":
        shard = functools.partial(distributed.shard, d=d, bf16=cfg.train.amp and cfg.train.amp_dtype == "bfloat16")
    model = models.build(cfg.model, info, cfg.run.seed, d.device, shard)
    if cfg.model.channels_last and not shard:  # NHWC kernels (FSDP2 keeps its shards contiguous; inputs still NHWC)
        model.to(memory_format=torch.channels_last)
    return model


def build_optimizer(model, cfg: config.Optim) -> torch.optim.Optimizer:
    """AdamW with decay on weight matrices only (embeddings included, as nanoGPT): pulling biases and norm gains toward
    0 does not regularise. (A tied embedding is one parameter: it is decayed once.)"""
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                             lr=cfg.lr, betas=cfg.betas)


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


def run_length(train: config.Train, sampler: data.ResumableSampler) -> tuple[int, int]:
    """(evaluation periods, optimizer steps) of the whole run: images train `epochs` passes and evaluate after each;
    text trains `steps` steps and evaluates every `eval_every` (the sampler's "epoch")."""
    if train.steps:
        return math.ceil(train.steps / sampler.steps_per_epoch), train.steps
    return train.epochs, train.epochs * sampler.steps_per_epoch


@torch.no_grad()
def evaluate(model, task, loader, weights, device, autocast, d, after_batch=None) -> dict:
    """The task's metrics over every rank's share, in eval mode (dropout off, BatchNorm's running statistics).
    `after_batch()`, if given, runs after each batch on every rank: the loop honours a stop signal there."""
    distributed.sync_buffers(model, d)
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
    return task.metrics(d.all_reduce(totals).tolist())


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
        d = distributed.setup(cfg.run.device)
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from None
    stop = StopSignal(repeat_stops=not d.enabled)
    try:
        with contextlib.ExitStack() as closing:  # files and writer threads are closed however the run ends
            result = fit(cfg, d, stop, closing, hooks)
        d.barrier()  # no rank tears the group down while another still communicates (gloo aborts at exit)
        return result
    finally:
        d.close()
        stop.restore()


def on_rank0(d: distributed.Dist, claim, run_dir: Path):
    """`claim(run_dir)` on rank 0 (None elsewhere); if it finds the folder busy, every rank refuses (exit 2)."""
    result, error = None, None
    if d.is_main:
        try:
            result = claim(run_dir)
        except runlock.Busy as exc:
            error = str(exc)
        except OSError as exc:  # e.g. run.lock is a folder, or the folder is not writable
            error = f"run.out_dir {run_dir}: cannot take its lock {run_dir / runlock.NAME} ({exc.strerror or exc})"
    if error := d.gather(error)[0]:
        raise config.ConfigError(error)
    return result


def fit(cfg: config.Config, d: distributed.Dist, stop: StopSignal, closing: contextlib.ExitStack, hooks) -> dict:
    # 1. Everything that can be refused is checked before anything is written.
    config.check_combinations(cfg, d.world)
    run_dir, device, tc = Path(cfg.run.out_dir), d.device, cfg.train
    on_rank0(d, runlock.check, run_dir)  # a live run in that folder: refused first, before any work
    resume, ckpt = checkpoint.resume_source(cfg)
    run_id, continued_run = runlog.identity(run_dir, ckpt, resume, cfg.checkpoint.resume == "auto")
    run_id = d.gather(run_id)[0]  # a fresh run's id, drawn on rank 0
    seed_everything(cfg.run.seed, cfg.run.deterministic)
    splits = data.build(cfg.data, cfg.run.seed)
    for hook in hooks:
        splits = hook.data(splits)
    task = tasks.for_data(splits.info)
    model = build_model(cfg, splits.info, d)
    fingerprint = data.fingerprint(splits)  # each split's size and content hash: every checkpoint records it
    data_changes = data.changes(ckpt["data"], fingerprint) if ckpt else {}  # split -> how it changed
    if ckpt:  # data.root may change on resume: data of another vocabulary is a conflicting resume (exit 2)
        try:
            checkpoint.check_fits(model, ckpt, resume, splits.info, cfg.data)
        except checkpoint.CheckpointError as exc:
            raise config.ConfigError(f"refusing to resume: {exc}") from None
        if data_changes and not cfg.checkpoint.accept_new_data:
            raise data.DataError(f"refusing to resume from {resume}: {'; '.join(data_changes.values())}. To train "
                                 f"on the new data on purpose, add --set checkpoint.accept_new_data=true")
    elif cfg.checkpoint.init_from:
        checkpoint.load_weights(model, cfg.checkpoint.init_from, splits.info, cfg.data)
    if d.enabled:
        torch.manual_seed(cfg.run.seed + 1 + d.rank)  # from here on, each rank its own dropout
    module = distributed.wrap(model, d)  # a DDP wrapper under torchrun, else the (perhaps sharded) model itself
    if cfg.model.compile:
        module = torch.compile(module)

    # 2. Data order, optimizer, schedule, scaler: the state a checkpoint must carry.
    accum, pin = tc.grad_accum, cfg.data.pin_memory and device.type == "cuda"
    micro = tc.batch_size // (accum * d.world)  # one forward's share of the global batch
    sampler = data.ResumableSampler(len(splits.train), tc.batch_size, micro, d.rank, d.world, cfg.run.seed,
                                    draws=tc.eval_every or tc.steps)  # text: windows drawn per evaluation period
    if sampler.steps_per_epoch == 0:
        raise data.DataError(f"train.batch_size={tc.batch_size} exceeds the {len(splits.train)} training samples")
    train_loader = data.loader(splits.train, sampler, cfg.data.num_workers, pin)
    evals = data.eval_loaders(splits, micro, d.rank, d.world, cfg.data.num_workers, pin)  # a training forward's size:
    # what fits in training fits in evaluation (GPT-2's 480 windows of micro-batch x grad_accum would need ~230 GiB)
    periods, total_steps = run_length(tc, sampler)
    last_step = min(total_steps, tc.max_steps or total_steps)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = warmup_cosine(optimizer, total_steps, cfg.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.amp and tc.amp_dtype == "float16")  # fp16 only
    autocast = models.autocast(tc, device.type)
    speed = runlog.Speed(tc.batch_size, task.tokens_per_sample, model, device, tc)  # measures the CPU's peak: first
    progress = Progress()
    states = {"scheduler": scheduler, "scaler": scaler, "sampler": sampler}  # each checkpointed by its name
    for hook in hooks:
        states.update(hook.states(model))
    about = {"run_id": run_id, "data": fingerprint, "info": {"task": task.name, **dataclasses.asdict(splits.info)}}
    checkpointer = checkpoint.Checkpointer(cfg, d, model, optimizer, progress, states, about)
    if ckpt:
        checkpointer.load(ckpt, resume)
        if "val" in data_changes:  # its losses were measured on other data: not comparable
            progress.forget_best()
    # A checkpoint at a period's end (or the run's) was written before that period's evaluation: a resume from it
    # does the evaluation again, so one that failed (an out-of-memory, say) loses no training.
    evaluation_due = bool(ckpt) and (progress.step >= last_step or not sampler.steps_left())

    # 3. The run folder (rank 0 writes, the others only compute), now that nothing can be refused any more.
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    lock = on_rank0(d, runlock.hold, run_dir)  # one writer per run folder, until this run ends
    if lock:
        closing.callback(lock.release)
    if d.is_main:
        checkpoint.clean_stale_tmp(run_dir)  # safe: no other live run owns these files
        if warning := config.ignored(cfg):
            print(f"warning: {warning}", file=sys.stderr)
        if vocabulary := data.kept_vocabulary(cfg.data):  # the run folder alone decodes its samples (sample.py)
            runlog.write_atomic(run_dir / "meta.json", vocabulary)
    meta = runlog.metadata(device, d.world, str(resume.resolve()) if resume else None)
    if continued_run:
        meta["continued_run"] = continued_run
    if data_changes:
        meta["data_changed"] = list(data_changes.values())
    log = runlog.RunLog(run_dir, cfg, d.is_main, progress.step, meta, evaluation_due, run_id)
    closing.push(log.ended)
    checkpointer.before_write = log.flush
    log.say(f"{cfg.model.name} ({models.count_params(model):,} parameters) on {cfg.data.dataset} "
            f"({len(splits.train):,} train / {len(splits.val):,} val {'windows' if tc.steps else 'samples'}) | "
            f"{device} x {d.world} | {run_dir}")
    if ckpt:
        resumed = (f"resumed from {resume} at step {progress.step} (period {sampler.epoch + 1}, sample "
                   f"{sampler.position:,})")
        if ckpt["world_size"] != d.world:
            resumed += f"; {ckpt['world_size']} -> {d.world} ranks: same samples, new dropout"
        if run_length(config.from_dict(ckpt["config"]).train, sampler)[1] != total_steps:  # safe, but it re-plans
            resumed += (f"; the schedule is re-planned for {total_steps} steps: the learning rate follows the new "
                        f"warmup + cosine from this step on")
        if progress.step >= total_steps:
            resumed += f"; step {progress.step} is past the {total_steps} planned: nothing more to train"
        if evaluation_due:
            resumed += f"; the evaluation at step {progress.step}, which its checkpoint came before, is done again"
        if continued_run:
            resumed += f"; a checkpoint of another run ({continued_run}), continued as this folder's run {run_id}"
        if data_changes:
            resumed += f"; on new data (checkpoint.accept_new_data): {'; '.join(data_changes.values())}"
            if "val" in data_changes:
                resumed += "; the best validation loss so far is forgotten (it was measured on other data)"
        log.say(resumed)
        if d.is_main and (note := checkpoint.repair_best(run_dir, ckpt, resume)):
            log.say(note)
    if lock and lock.note:
        log.say(lock.note)
    if distributed.is_sharded(model) and not hasattr(model, "init_tensor"):
        log.say(f"{cfg.model.name} has no init_tensor: each rank built it whole before sharding it (see models.py)")
    for hook in hooks:
        hook.attach(model, module, progress)
    prof = runlog.profiler(cfg, run_dir, cfg.profile.enabled and d.is_main, closing)

    def stop_here() -> None:
        """Every rank stops after the same step, once its checkpoint is complete: the run resumes from there."""
        checkpointer.finish()
        d.barrier()  # as after the last step: no rank leaves while another still writes (gloo aborts)
        raise stopped(stop.name(), progress.step)

    def stop_if_asked() -> None:
        """Between two evaluation batches: a stop signal on any rank stops them all here (each asks at the same batch).
        The step's checkpoint was written before its evaluation, so the resumed run evaluates it again."""
        asked = stop.signum > 0
        if d.enabled:
            asked = d.all_reduce(torch.tensor(float(asked), device=device)).item() > 0
        if asked:
            stop_here()

    def early_stopped() -> bool:
        return bool(tc.early_stop_patience) and progress.bad_evals >= tc.early_stop_patience

    def train_period(period: int) -> None:
        """The period's remaining optimizer steps: micro-batches -> one optimizer step -> log / checkpoint / stop (a
        stop signal with its last step is honoured in its evaluation, after the checkpoint)."""
        batches = iter(train_loader)
        log.epoch_bar(f"{period_name} {period + 1}/{periods}", sampler.steps_per_epoch,
                      sampler.steps_per_epoch - sampler.steps_left())
        for _ in range(sampler.steps_left()):
            micro_batches = [next(batches) for _ in range(accum)]
            step_loss = forward_backward(module, task, micro_batches, device, autocast, scaler,
                                         cfg.model.channels_last)
            scaler.unscale_(optimizer)  # true gradients first, so the clip threshold means what it says
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
            # The one host sync per step: loss, gradient norm, "a signal arrived" and "my asynchronous save's files
            # are written", summed over the ranks.
            flags = torch.stack([step_loss, distributed.local_norm(norm).float(),
                                 torch.tensor(float(stop.signum > 0), device=device),
                                 torch.tensor(float(checkpointer.written()), device=device)])
            loss_sum, norm_sum, signals, ready = d.all_reduce(flags).tolist()  # signals: ranks that saw one
            if ready == d.world:  # every rank's shard is on disk: rename and link it now, not at the next save
                checkpointer.finish()
            step_loss, grad_norm = loss_sum / d.world, norm_sum / d.world
            if not math.isfinite(step_loss) or not (scaler.is_enabled() or math.isfinite(grad_norm)):
                raise nonfinite_error(progress.step + 1, period, step_loss, grad_norm, model,
                                      [(x.to(device), y) for x, y in micro_batches], autocast, d, run_dir / "last.pt")
            scaler.step(optimizer)  # fp16: skipped when a gradient overflowed (and the scale halves)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            progress.step += 1
            sampler.advance()
            progress.window = [progress.window[0] + step_loss, progress.window[1] + 1]
            log.advance()
            for hook in hooks:
                hook.step(progress)
            prof.step()
            if progress.step % tc.log_every == 0:
                log.record("train", progress.step, epoch=period, loss=progress.window[0] / progress.window[1],
                           lr=scheduler.get_last_lr()[0], grad_norm=grad_norm, scale=scaler.get_scale(),
                           **speed.figures(progress.step))
                progress.window = [0.0, 0]
            if progress.step >= last_step or not sampler.steps_left():
                break  # the period's last step: saved next, then a stop signal is honoured in its evaluation
            if signals:  # every rank sees the same sum: all stop after this same step
                checkpointer.save()
                stop_here()
            if cfg.checkpoint.every_steps and progress.step % cfg.checkpoint.every_steps == 0:
                checkpointer.save()
        log.end_epoch()

    # 4. The loop: each evaluation period (an epoch of images, train.eval_every steps of text) trains, is saved, then
    # evaluated; a resume whose evaluation is due starts there.
    speed.start(progress.step)
    period_name = "period" if tc.steps else "epoch"  # text evaluates every train.eval_every steps, images per epoch
    while sampler.epoch < periods and (progress.step < last_step or evaluation_due) and not early_stopped():
        period = sampler.epoch
        if not evaluation_due:
            train_period(period)
            checkpointer.save()
        elif not checkpointer.saved_this_step():
            checkpointer.save()  # resumed from another folder (rank 0 decides for all): this one gets the checkpoint too
        evaluation_due = False
        metrics = evaluate(model, task, *evals["val"], device, autocast, d, stop_if_asked)
        if not math.isfinite(metrics["loss"]):
            raise NonFinite(f"validation loss is {metrics['loss']} at step {progress.step}: last.pt holds the "
                            f"weights that gave it")
        improved = metrics["loss"] < progress.best["val_loss"]
        if improved:
            progress.best = {"step": progress.step, "val_loss": metrics["loss"]}
        progress.bad_evals = 0 if improved else progress.bad_evals + 1
        if not sampler.steps_left():
            sampler.set_epoch(period + 1)
        log.record("val", progress.step, epoch=period, best=improved, **{f"val_{k}": v for k, v in metrics.items()})
        where = f"epoch {period + 1}/{periods} step {progress.step}"
        if tc.steps:
            where = f"step {progress.step}/{total_steps}"
        rate = f", {speed.samples_per_s(progress.step):,.0f} samples/s" if progress.step > speed.step0 else ""
        log.say(f"{where}: {task.describe(metrics, 'val')}"
                + (" (best)" if improved else f" (not better for {progress.bad_evals})") + rate)
        if improved:
            checkpointer.mark_best()
        if early_stopped():
            log.say(f"early stop: no better validation loss for {tc.early_stop_patience} evaluations")

    # 5. The test split, touched once: best.pt's weights, read back from disk (the last weights if no file holds them).
    best_step = progress.best["step"]
    best = checkpointer.load_best_weights()
    tested = f"best.pt, step {best_step}" if best else f"the last weights, step {progress.step}: best.pt is gone"
    stopped_by = "done"
    if early_stopped():
        stopped_by = "early_stop"
    elif progress.step < total_steps:
        stopped_by = "max_steps"
    result = {"step": progress.step, "stopped_by": stopped_by, "best_step": best_step,
              "best_val_loss": progress.best["val_loss"], "run_dir": str(run_dir), "tested": tested}
    if "test" in evals:
        metrics = evaluate(model, task, *evals["test"], device, autocast, d, stop_if_asked)
        result.update({f"test_{k}": v for k, v in metrics.items()})
        log.record("test", progress.step, **{k: v for k, v in result.items() if k.startswith(("test", "best"))})
        log.say(f"test ({tested}): {task.describe(metrics, 'test')}")
    log.close()
    return result


def main(argv=None, hooks: list[Hook] = ()) -> int:
    args = config.argument_parser(__doc__, inspect=True).parse_args(argv)
    if args.help_config:
        print(config.describe())
        return 0
    rank = int(os.environ.get("RANK", "0"))
    try:
        cfg = config.load(args.config, args.set)
        config.check_out_dir(cfg)
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


def cli() -> None:
    """`python train.py` at the template's root, and the `template-train` command of `pip install -e .`."""
    config.exit_with(main)
