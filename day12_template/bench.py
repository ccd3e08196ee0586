"""Day 12 benchmark: what the template's loop costs, what a second rank buys, how fast the GPT trains and writes.

1. Overhead. The template (DataLoader over micro-batch keys, the per-step flag sync, logging every 10 steps, a
   checkpoint every 100, the tqdm bar drawn) against a bare hand-written loop doing the same math (same model, data,
   batch, AdamW groups, warmup + cosine, clipping), alternated in one process, each timed over steps 10-210 (warm-up
   and the final evaluation left out). Goal: <= 5% slower. Measured for the image config (mnist_mlp) and for the
   GPT (shakespeare_cpu: nanoGPT's CPU recipe), whose train records also give tokens/s and MFU (model FLOP/s over
   this CPU's fp32 matmul peak, measured by the run at its start).
2. Scale-out. The same global batch trained by 1 process (1 thread), 1 process (2 threads) and torchrun with 2 ranks
   of 1 thread each (DDP, gloo): samples/s over steps 10-210.
3. Generation. sample.py's tokens/s for 500 new tokens with and without the KV cache, on the GPT trained in 1.
   (context 64: the window refills every 32 tokens) and on shakespeare_25m.toml's GPT (context 256, its weights as
   initialised: the speed does not depend on them), one thread.

Run:  python day12_template/bench.py                       (writes day12_template/runs/bench/bench.{json,md})
      python day12_template/bench.py --out day12_template/results
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch

from train_template import config, data, distributed, models, optimizers, runlog, sample, tasks, text, train

FIRST, LAST = 10, 210  # steps timed: after warm-up, before the first evaluation (mnist: 214 steps; GPT: 250)
SAMPLE_TOKENS = 500
BASE = [f"train.max_steps={LAST}", "train.log_every=10", "checkpoint.every_steps=100", "train.progress=bar"]


def steps_per_s(run_dir: Path, clock: str = "elapsed_s") -> float:
    """Steps per second of wall time (elapsed_s) or of this process's CPU time (cpu_s) over steps FIRST-LAST."""
    rec = {r["step"]: r for r in runlog.read_metrics(run_dir) if r["kind"] == "train"}
    return (LAST - FIRST) / (rec[LAST][clock] - rec[FIRST][clock])


def template(cfg_path: Path, runs: Path, i: int) -> tuple[float, float]:
    out = runs / f"template-{cfg_path.stem}-{i}"
    shutil.rmtree(out, ignore_errors=True)
    cfg = config.load(str(cfg_path), [*BASE, f"run.out_dir={out}"])
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # the bar is drawn (its cost counts), not shown
    try:
        train.run(cfg)
    finally:
        sys.stderr.close()
        sys.stderr = stderr
    return steps_per_s(out), steps_per_s(out, "cpu_s")


def bare(cfg_path: Path) -> tuple[float, float]:
    """The same training step, hand-written: no loader, no sync, no logs, no checkpoints; the same batches, drawn
    by the template's sampler."""
    cfg = config.load(str(cfg_path), BASE)
    tc = cfg.train
    train.seed_everything(cfg.run.seed, cfg.run.deterministic)
    splits = data.build(cfg.data, cfg.run.seed)
    task = tasks.for_dataset(cfg.data.dataset, splits.info)
    model = models.build(cfg.model, splits.info, cfg.run.seed)
    optimizer = optimizers.build(model, cfg.optim)
    sampler = train.build_sampler(cfg, splits.train, tc.batch_size, distributed.Dist())  # one process, no micro
    scheduler = train.warmup_cosine(optimizer, train.run_steps(tc, sampler), cfg.optim)
    keys = iter(sampler)
    for step in range(LAST):
        if step == FIRST:
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = splits.train.batch(*next(keys))
        loss = task.loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
    return (LAST - FIRST) / (time.perf_counter() - t0), (LAST - FIRST) / (time.process_time() - c0)


def overhead(cfg_path: Path, runs: Path, repeats: int) -> dict:
    """Wall-clock steps/s (the figure that matters) and CPU-time steps/s (steadier when other processes share the
    cores: it counts only this process's work), medians over alternated rounds."""
    b, t = [], []
    for i in range(repeats):  # alternated, so drifting machine load hits both
        b.append(bare(cfg_path))
        t.append(template(cfg_path, runs, i))
        print(f"  round {i + 1}: bare {b[-1][0]:.1f} steps/s, template {t[-1][0]:.1f} steps/s (wall)", flush=True)
    out = {"rounds": repeats, "bare_all": b, "template_all": t}
    for j, clock in enumerate(("wall", "cpu")):
        bm, tm = statistics.median(r[j] for r in b), statistics.median(r[j] for r in t)
        out[clock] = {"bare_steps_per_s": bm, "template_steps_per_s": tm, "overhead": bm / tm - 1}
    return out


def gpt_figures(cfg_path: Path, run_dir: Path) -> dict:
    """tokens/s and MFU of the template's GPT (a timed round's run folder), and sample.py's speed with and without
    the KV cache on that run's weights."""
    rec = {r["step"]: r for r in runlog.read_metrics(run_dir) if r["kind"] == "train"}
    model, cfg, _ = sample.load_model(run_dir / "last.pt")
    return {"config": cfg_path.name, "tokens_per_s": rec[LAST]["tokens_per_s"], "mfu": rec[LAST]["mfu"],
            **generation_speed(model, text.tokenizer(cfg.data.dataset, cfg.data.root))}


def generation_speed(model: torch.nn.Module, tokenizer) -> dict:
    """sample.py's tokens/s for SAMPLE_TOKENS new tokens after "ROMEO:", with and without the KV cache."""
    speed = {}
    for name, use_cache in (("kv_cache", True), ("no_cache", False)):
        _, seconds = sample.generate(model, tokenizer, "ROMEO:", SAMPLE_TOKENS, 0.8, 50, 0, use_cache)
        speed[name] = SAMPLE_TOKENS / seconds
        print(f"  sample.py, {name}: {speed[name]:,.0f} tokens/s", flush=True)
    return {"sample_tokens": SAMPLE_TOKENS, "sample_tokens_per_s": speed,
            "cache_speedup": speed["kv_cache"] / speed["no_cache"]}


def long_context_generation(cfg_path: Path) -> dict:
    """generation_speed on a config's GPT as initialised (from run.seed), in fp32 and eager, as sample.py runs it."""
    cfg = config.load(str(cfg_path), [])
    model = models.build(cfg.model, data.build(cfg.data, cfg.run.seed).info, cfg.run.seed).eval()
    return {"config": cfg_path.name, "block_size": cfg.model.gpt.block_size,
            "params": models.count_params(model),
            **generation_speed(model, text.tokenizer(cfg.data.dataset, cfg.data.root))}


def scale_out(cfg_path: Path, runs: Path) -> dict:
    """samples/s of 1 process (1 and 2 threads) and of torchrun with 2 single-thread ranks, same global batch."""
    rows = {}
    for name, threads, launcher in (("1 process, 1 thread", 1, []), ("1 process, 2 threads", 2, []),
                                    ("DDP: 2 ranks x 1 thread", 1, ["-m", "torch.distributed.run", "--standalone",
                                                                     "--nproc_per_node=2"])):
        out = runs / name.replace(" ", "_").replace(",", "").replace(":", "")
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, *launcher, str(TEMPLATE / "train.py"), "--config", str(cfg_path), "--set", *BASE,
               "train.progress=off", "train.strategy=ddp", f"run.out_dir={out}"]
        subprocess.run(cmd, check=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        batch = config.load(str(cfg_path), []).train.batch_size
        rows[name] = {"samples_per_s": steps_per_s(out) * batch}
        print(f"  {name}: {rows[name]['samples_per_s']:,.0f} samples/s", flush=True)
    base = rows["1 process, 1 thread"]["samples_per_s"]
    for r in rows.values():
        r["vs_1_process_1_thread"] = r["samples_per_s"] / base
    return rows


def overhead_rows(o: dict) -> list[str]:
    w, c = o["wall"], o["cpu"]
    return ["| loop | steps/s, wall clock | steps/s, process CPU time |", "|---|---:|---:|",
            f"| bare hand-written loop | {w['bare_steps_per_s']:.1f} | {c['bare_steps_per_s']:.1f} |",
            f"| template (loader, flag sync, log every 10, checkpoint every 100, tqdm bar) | "
            f"{w['template_steps_per_s']:.1f} | {c['template_steps_per_s']:.1f} |",
            f"| **template overhead** (goal <= 5%) | **{100 * w['overhead']:+.1f}%** | {100 * c['overhead']:+.1f}% |"]


def long_context_line(g: dict) -> str:
    return (f"At context {g['block_size']}, `{g['config']}`'s GPT ({g['params'] / 1e6:.1f} M parameters, as "
            f"initialised), sample.py, {g['sample_tokens']} new tokens: {g['sample_tokens_per_s']['kv_cache']:,.1f} "
            f"tokens/s with the KV cache, {g['sample_tokens_per_s']['no_cache']:,.1f} without "
            f"({g['cache_speedup']:.1f}x).")


def markdown(res: dict) -> str:
    g = res["gpt"]
    lines = [f"Config `{res['config']}` (batch {res['batch_size']}), steps {FIRST}-{LAST}, one thread, on "
             f"{res['machine']}, torch {res['torch']}; medians of {res['overhead']['rounds']} alternated rounds.", "",
             *overhead_rows(res["overhead"]), "",
             f"The GPT, `{g['config']}` (nanoGPT's CPU recipe: 4 x 4 x 128, context 64, batch 12), the same way:", "",
             *overhead_rows(res["gpt_overhead"]), "",
             f"Its template run: {g['tokens_per_s']:,.0f} tokens/s, MFU {100 * g['mfu']:.1f}% of this CPU's fp32 "
             f"matmul peak (one thread). sample.py, {g['sample_tokens']} new tokens: "
             f"{g['sample_tokens_per_s']['kv_cache']:,.0f} tokens/s with the KV cache, "
             f"{g['sample_tokens_per_s']['no_cache']:,.0f} without ({g['cache_speedup']:.1f}x).", "",
             long_context_line(res["long_context"]), "",
             "| scale-out, same global batch | samples/s | vs 1 process, 1 thread |", "|---|---:|---:|"]
    lines += [f"| {k} | {v['samples_per_s']:,.0f} | {v['vs_1_process_1_thread']:.2f}x |"
              for k, v in res["scale_out"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=TEMPLATE / "configs" / "mnist_mlp.toml")
    parser.add_argument("--gpt-config", type=Path, default=TEMPLATE / "configs" / "shakespeare_cpu.toml")
    parser.add_argument("--long-context-config", type=Path, default=TEMPLATE / "configs" / "shakespeare_25m.toml")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "runs" / "bench")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    runs = HERE / "runs" / "bench"
    torch.set_num_threads(1)  # the overhead comparison runs single-threaded, like one rank
    print(f"overhead of the template's loop ({args.repeats} rounds) ...", flush=True)
    res = {"config": args.config.name, "batch_size": config.load(str(args.config), []).train.batch_size,
           "machine": runlog.cpu_name() if not torch.cuda.is_available() else torch.cuda.get_device_name(),
           "torch": torch.__version__, "overhead": overhead(args.config, runs, args.repeats)}
    print(f"overhead of the template's loop on the GPT ({args.repeats} rounds) ...", flush=True)
    res["gpt_overhead"] = overhead(args.gpt_config, runs, args.repeats)
    res["gpt"] = gpt_figures(args.gpt_config, runs / f"template-{args.gpt_config.stem}-{args.repeats - 1}")
    print(f"generation at {args.long_context_config.stem}'s context ...", flush=True)
    res["long_context"] = long_context_generation(args.long_context_config)
    print("scale-out ...", flush=True)
    res["scale_out"] = scale_out(args.config, runs)
    runlog.write_lab_results(args.out, "bench", res, markdown(res))
    return res


if __name__ == "__main__":
    main()
