"""train.py — the training loop you keep: a config in, a run folder out.

    python train.py --config configs/mnist_mlp.toml                              # train
    python train.py --config configs/mnist_mlp.toml --set optim.lr=1e-3 train.epochs=3
    python train.py --config configs/mnist_mlp.toml --set checkpoint.resume=auto  # continue after any stop
    torchrun --nproc_per_node=2 train.py --config configs/mnist_mlp.toml --set train.strategy=fsdp
    python train.py --help-config                                                # every field, and why

The run folder (run.out_dir) gets config.toml, run.json, metrics.jsonl, tb/, ckpt-*.pt, last.pt and best.pt.
Exit codes: 0 done; 1 error (data, checkpoint, non-finite loss, out of memory); 2 bad config (nothing written);
143 / 130 stopped by SIGTERM / SIGINT after writing last.pt (resume with checkpoint.resume=auto).
"""
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS; must be set before CUDA starts

import contextlib
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

import checkpoint
import config
import data
import distributed
import models
import runlog
from faults import Faults
from signals import StopSignal, Stopped, stopped
from troubleshoot import NonFinite, nonfinite_error


def seed_everything(seed: int, deterministic: bool, compiling: bool) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    torch.backends.cudnn.benchmark = not deterministic  # the autotuner may pick another algorithm each run
    if compiling:  # warn_only: warn, don't fail, where an op has no deterministic kernel
        torch.use_deterministic_algorithms(deterministic, warn_only=True)  # also sets the compiler's flag
    else:  # the same kernel switch without importing the compiler just to set its flag (seconds of start-up)
        torch._C._set_deterministic_algorithms(deterministic, warn_only=True)


def build_optimizer(model, cfg: config.Optim) -> torch.optim.Optimizer:
    """AdamW with decay on weight matrices only: pulling biases and norm gains toward 0 does not regularise."""
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


@torch.no_grad()
def evaluate(model, loader, weights, device, autocast, d) -> tuple[float, float]:
    """Mean loss and accuracy over every rank's share, in eval mode (dropout off, BatchNorm's running statistics)."""
    distributed.sync_buffers(model, d)
    model.eval()
    totals = torch.zeros(3, device=device, dtype=torch.float32 if device.type == "mps" else torch.float64)
    for (x, y), w in zip(loader, weights):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast():
            logits = model(x).float()
        totals += w * torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum(),
                                   torch.tensor(len(y), device=device)]).to(totals.dtype)
    model.train()
    loss, correct, n = d.all_reduce(totals).tolist()
    return loss / n, correct / n


def run(cfg: config.Config, faults: Faults | None = None) -> dict:
    """Train per `cfg` (one process, or one rank of a torchrun job); returns the final figures."""
    try:
        d = distributed.setup(cfg.run.device)
    except ValueError as exc:
        raise config.ConfigError(str(exc)) from None
    stop = StopSignal(repeat_stops=not d.enabled)
    try:
        with contextlib.ExitStack() as closing:  # files and writer threads are closed however the run ends
            result = fit(cfg, d, faults or Faults(), stop, closing)
        d.barrier()  # no rank tears the group down while another still communicates (gloo aborts at exit)
        return result
    finally:
        d.close()
        stop.restore()


def fit(cfg: config.Config, d: distributed.Dist, faults: Faults, stop: StopSignal, closing: contextlib.ExitStack
        ) -> dict:
    # 1. Everything that can be refused is checked before anything is written.
    config.check_combinations(cfg, d.world)
    run_dir, device, tc = Path(cfg.run.out_dir), d.device, cfg.train
    resume, ckpt = checkpoint.resume_source(cfg)
    seed_everything(cfg.run.seed, cfg.run.deterministic, cfg.model.compile)
    splits = faults.break_data(data.build(cfg.data, cfg.run.seed))  # no-op unless a drill breaks the data
    layout = torch.channels_last if cfg.model.channels_last else torch.preserve_format  # NHWC for conv Tensor Cores
    model = models.build(cfg.model, splits.info).to(device, memory_format=layout)
    if cfg.checkpoint.init_from and not ckpt:
        checkpoint.load_weights(model, cfg.checkpoint.init_from)
    if d.enabled:
        torch.manual_seed(cfg.run.seed + 1 + d.rank)  # the same init above on every rank; from here, own dropout
    module = distributed.wrap(model, tc.strategy, d)  # a DDP wrapper, or the model sharded in place (FSDP2)
    if cfg.model.compile:
        module = torch.compile(module)

    # 2. Data, optimizer, schedule, scaler: the state a checkpoint must carry.
    accum, pin = tc.grad_accum, cfg.data.pin_memory and device.type == "cuda"
    micro = tc.batch_size // (accum * d.world)  # one forward's share of the global batch
    sampler = data.ResumableSampler(len(splits.train), tc.batch_size, micro, d.rank, d.world, cfg.run.seed)
    if sampler.steps_per_epoch == 0:
        raise data.DataError(f"train.batch_size={tc.batch_size} exceeds the {len(splits.train)} training images")
    train_loader = data.loader(splits.train, sampler, cfg.data.num_workers, pin)
    evals = data.eval_loaders(splits, micro * accum, d.rank, d.world, cfg.data.num_workers, pin)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = warmup_cosine(optimizer, tc.epochs * sampler.steps_per_epoch, cfg.optim)
    scaler = torch.amp.GradScaler(device.type, enabled=tc.amp and tc.amp_dtype == "float16")  # fp16 only
    autocast = models.autocast(tc, device.type)
    st = {"step": 0, "best": {"step": None, "val_loss": math.inf}, "bad_evals": 0, "window": [0.0, 0]}
    if ckpt:
        distributed.load_model_state(model, ckpt["model"], d)
        distributed.load_optimizer_state(model, optimizer, ckpt["optimizer"], d)
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        sampler.load_state_dict(ckpt["sampler"])
        st = {k: ckpt[k] for k in st}
        if ckpt["world_size"] == d.world:  # last: nothing may draw from the RNGs before the next step
            checkpoint.set_rng_state(ckpt["rng"][d.rank], device)

    # 3. The run folder (rank 0 writes, the others only compute), now that nothing can be refused any more.
    if d.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint.clean_stale_tmp(run_dir)
    log = runlog.RunLog(run_dir, cfg, d.is_main, st["step"],
                        runlog.metadata(device, d.world, str(resume.resolve()) if resume else None))
    closing.callback(log.close)
    log.say(f"{cfg.model.name} ({models.count_params(model):,} parameters) on {cfg.data.dataset} "
            f"({len(splits.train):,} train / {len(splits.val):,} val) | {device} x {d.world} | {run_dir}")
    if ckpt:
        log.say(f"resumed from {resume} at step {st['step']} (epoch {sampler.epoch + 1}, sample "
                f"{sampler.position:,})" + ("" if ckpt["world_size"] == d.world else
                                            f"; {ckpt['world_size']} -> {d.world} ranks: same samples, new dropout"))
        if d.is_main and (note := checkpoint.repair_best(run_dir, ckpt, resume)):
            log.say(note)
    faults.install(model, lambda: st["step"])
    between_links = faults.between_links()
    prof = runlog.profiler(cfg, run_dir, cfg.profile.enabled and d.is_main, closing)

    def save(is_best: bool = False) -> None:
        """Every rank gathers; rank 0 writes. Model and optimizer are full, plain state dicts (names, no prefixes)."""
        payload = {"format": checkpoint.FORMAT, **st, "config": config.to_dict(cfg), "world_size": d.world,
                   "model": distributed.model_state(model, d),
                   "optimizer": distributed.optimizer_state(model, optimizer, d),
                   "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(), "sampler": sampler.state_dict(),
                   "rng": d.gather(checkpoint.rng_state(device)), "rank_steps": d.gather(st["step"])}
        error = None
        if d.is_main:
            try:
                log.flush()  # the logs reach the disk before the checkpoint that vouches for them
                checkpoint.save(payload, run_dir, cfg.checkpoint.keep_last, is_best, between_links)
            except (checkpoint.CheckpointError, OSError) as exc:  # OSError: the log's fsync, an old checkpoint's unlink
                error = str(exc)
        if error := d.gather(error)[0]:  # every rank fails together; none waits forever
            raise checkpoint.CheckpointError(error)

    # 4. The loop: micro-batches -> one optimizer step -> log / checkpoint / stop; an evaluation per epoch.
    t0, c0, step0 = time.perf_counter(), time.process_time(), st["step"]
    rate = lambda: (st["step"] - step0) * tc.batch_size / max(1e-9, time.perf_counter() - t0)  # noqa: E731
    stopped_by = ("max_steps" if tc.max_steps and st["step"] >= tc.max_steps else "early_stop"  # resumed: as it ended
                  if tc.early_stop_patience and st["bad_evals"] >= tc.early_stop_patience else None)
    while sampler.epoch < tc.epochs and stopped_by is None:
        epoch = sampler.epoch
        batches = iter(train_loader)
        log.epoch_bar(epoch, sampler.steps_per_epoch, sampler.steps_per_epoch - sampler.steps_left())
        for _ in range(sampler.steps_left()):
            micro_batches = [next(batches) for _ in range(accum)]
            step_loss = torch.zeros((), device=device)
            for k, (x, y) in enumerate(micro_batches):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                if cfg.model.channels_last and x.ndim == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                with distributed.grad_sync(module, k == accum - 1):  # all-reduce once, after the last micro-batch
                    with autocast():
                        loss = F.cross_entropy(module(x), y) / accum  # / accum: the sum is the batch's mean
                    scaler.scale(loss).backward()  # outside autocast; fp16: scaled so small gradients survive
                step_loss += loss.detach()
            scaler.unscale_(optimizer)  # true gradients first, so the clip threshold means what it says
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or math.inf)
            # The one host sync per step: loss, gradient norm and "a signal arrived", summed over the ranks.
            flags = torch.stack([step_loss, distributed.local_norm(norm).float(),
                                 torch.tensor(float(stop.signum > 0), device=device)])
            loss_sum, norm_sum, signals = d.all_reduce(flags).tolist()
            step_loss, grad_norm = loss_sum / d.world, norm_sum / d.world
            if not math.isfinite(step_loss) or not (scaler.is_enabled() or math.isfinite(grad_norm)):
                raise nonfinite_error(st["step"] + 1, epoch, step_loss, grad_norm, model,
                                      [(x.to(device), y) for x, y in micro_batches], autocast, d, run_dir / "last.pt")
            scaler.step(optimizer)  # fp16: skipped when a gradient overflowed (and the scale halves)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            st["step"] += 1
            sampler.advance()
            st["window"] = [st["window"][0] + step_loss, st["window"][1] + 1]
            log.advance()
            faults.after_step()
            prof.step()
            if st["step"] % tc.log_every == 0:
                log.record("train", st["step"], epoch=epoch, loss=st["window"][0] / st["window"][1],
                           lr=scheduler.get_last_lr()[0], grad_norm=grad_norm, scale=scaler.get_scale(),
                           grad_syncs=d.grad_syncs, samples_per_s=rate(), elapsed_s=time.perf_counter() - t0,
                           cpu_s=time.process_time() - c0)  # cpu_s well below elapsed_s: waiting (data, ranks)
                st["window"] = [0.0, 0]
            if signals:  # every rank sees the same sum: all stop after this same step
                save()
                d.barrier()  # as after the last step: no rank leaves while another still writes (gloo aborts)
                raise stopped(stop.name(), st["step"])
            if tc.max_steps and st["step"] >= tc.max_steps:
                stopped_by = "max_steps"
                break
            if cfg.checkpoint.every_steps and st["step"] % cfg.checkpoint.every_steps == 0 and sampler.steps_left():
                save()
        log.end_epoch()
        val_loss, val_acc = evaluate(model, *evals["val"], device, autocast, d)
        if not math.isfinite(val_loss):
            raise NonFinite(f"validation loss is {val_loss} at step {st['step']}; no checkpoint written")
        improved = val_loss < st["best"]["val_loss"]
        st["best"] = {"step": st["step"], "val_loss": val_loss} if improved else st["best"]
        st["bad_evals"] = 0 if improved else st["bad_evals"] + 1
        if not sampler.steps_left():
            sampler.set_epoch(epoch + 1)
        log.record("val", st["step"], epoch=epoch, val_loss=val_loss, val_acc=val_acc, best=improved)
        log.say(f"epoch {epoch + 1}/{tc.epochs} step {st['step']}: val loss {val_loss:.4f}, val acc "
                f"{100 * val_acc:.2f}%" + (" (best)" if improved else f" (not better for {st['bad_evals']})")
                + f", {rate():,.0f} samples/s")
        save(is_best=improved)
        if tc.early_stop_patience and st["bad_evals"] >= tc.early_stop_patience:
            stopped_by = "early_stop"
            log.say(f"early stop: no better validation loss for {tc.early_stop_patience} evaluations")

    # 5. The test split, touched once: best.pt's weights, read back from disk (the last weights if no file holds them).
    if best := checkpoint.load_best(run_dir, st["best"]["step"], resume):
        distributed.load_model_state(model, best["model"], d)
    tested = f"best.pt, step {st['best']['step']}" if best else f"the last weights, step {st['step']}: best.pt is gone"
    result = {"step": st["step"], "stopped_by": stopped_by or "done", "best_step": st["best"]["step"],
              "best_val_loss": st["best"]["val_loss"], "run_dir": str(run_dir), "tested": tested}
    if "test" in evals:
        result["test_loss"], result["test_acc"] = evaluate(model, *evals["test"], device, autocast, d)
        log.record("test", st["step"], **{k: v for k, v in result.items() if k.startswith(("test", "best"))})
        log.say(f"test ({tested}): loss {result['test_loss']:.4f}, accuracy "
                f"{100 * result['test_acc']:.2f}%")
    log.close()
    return result


def main(argv=None) -> int:
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
        run(cfg, Faults.from_env())
    except config.ConfigError as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    except Stopped as exc:
        if rank == 0:
            print(exc, file=sys.stderr)
        return exc.code
    except (data.DataError, checkpoint.CheckpointError, NonFinite) as exc:
        print(f"error{f' (rank {rank})' if rank else ''}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    config.exit_with(main)
