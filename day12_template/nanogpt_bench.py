"""Side-by-side benchmark, nanoGPT side: its own train.py on the repo's bundled Shakespeare corpus, CPU recipe.

What it does
  1. `prepare(out_dir)` turns the bundled corpus (`data/shakespeare`: 42 works, MANIFEST.tsv) into nanoGPT's
     on-disk format: the works decompressed (each checked against MANIFEST.tsv's SHA-256 of the text), joined in
     MANIFEST order with "\\n\\n" between works, a character vocabulary (the sorted set of characters), the first
     90% of the characters -> train.bin, the last 10% -> val.bin (np.uint16), meta.pkl laid out exactly as
     nanoGPT's data/shakespeare_char/prepare.py writes it ({'vocab_size', 'itos', 'stoi'}), and meta.json
     ({"vocab_size", "itos"}) for readers that refuse pickles.
  2. `run_nanogpt(...)` runs nanoGPT's train.py with config/train_shakespeare_char.py and the README's CPU
     overrides (4 layers, 4 heads, 128 wide, context 64, batch 12, no dropout, no compile), from a temporary
     working directory holding data/<dataset>/ (symlinks to the prepared files) and a symlink to nanoGPT's
     configurator.py (train.py opens both relative to the current directory), and parses its stdout: the time of
     every iteration, the training loss of every iteration, the estimated train/val loss of every evaluation, the
     time from launch to each evaluation's line, the time spent in evaluation, the wall time from launch to exit.
  3. `main()` writes the results JSON (RESULT_KEYS first, then the details) and prints a summary table.

The template side (day12_template/template/train.py on the same files) runs in `run_template(...)`, which returns a
dict with the same RESULT_KEYS, so `summary_table` prints both.

Rules
  * This script never downloads, clones or builds nanoGPT, and never copies its code: `--nanogpt DIR` must name an
    existing checkout of karpathy/nanoGPT, made by hand.
  * nanoGPT's commit MUST be stated in the results: it is read with `git -C DIR rev-parse HEAD` when DIR is a git
    checkout, otherwise pass `--nanogpt-commit HASH` (an exported tree has no .git). The SHA-256 of train.py,
    model.py, configurator.py and the config file are recorded too, so the exact code is named either way.
  * Imports: the standard library, numpy and torch only (nanoGPT itself needs the same at training time).

Run:  python day12_template/nanogpt_bench.py --nanogpt /tmp/nanogpt     (nanoGPT, then each template_runs() run: ~10 min)
      python day12_template/nanogpt_bench.py --nanogpt /tmp/nanogpt --steps 250 --eval-iters 50   (a quick check)

Reading nanoGPT's figures (train.py, see the report in the results JSON, "notes"):
  * `max_iters=N` runs N+1 optimizer steps (iterations 0..N); the evaluation at iteration N sees N updates and
    comes before the last step, whose result nobody evaluates.  Evaluations happen when iter % eval_interval == 0,
    iteration 0 included, and each costs 2 * eval_iters forward passes (train and val split).
  * "iter N: ... time Xms" is the time between two consecutive ends of an optimizer step: it includes the
    evaluation (and a checkpoint save when val improved) done at the top of that iteration, the fetch of the next
    batch, and the previous iteration's print and loss.item().  So the median excludes the iterations that held an
    evaluation; evaluation time is measured separately from line timestamps.
  * The loss on an "iter" line is the loss of that iteration's batch before its update (one batch, noisy).
  * get_batch samples random windows with replacement from torch's global RNG (seed 1337), shared with the
    evaluation's sampling: eval_iters and eval_interval change which batches training sees.
  * The mfu figure is against an A100's 312 TFLOPS: meaningless on CPU.
"""
from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import os
import pickle
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import numpy as np
import torch

REPO = HERE.parent
CORPUS = REPO / "data" / "shakespeare"
DATASET = "shakespeare_full_char"  # data/<DATASET>/ in nanoGPT's working directory; not its 1.1 MB tiny shakespeare
SEPARATOR = "\n\n"                   # between two works
TRAIN_FRACTION = 0.9                 # nanoGPT's prepare.py: data[:int(n*0.9)] / data[int(n*0.9):]
CONFIG_FILE = "config/train_shakespeare_char.py"

# nanoGPT README's CPU recipe ("on a MacBook"), less the three figures that depend on the run (max_iters,
# lr_decay_iters, eval_iters) and with eval_interval/log_interval set for parsing.
CPU_RECIPE = {
    "device": "cpu",
    "compile": False,
    "log_interval": 1,
    "block_size": 64,
    "batch_size": 12,
    "n_layer": 4,
    "n_head": 4,
    "n_embd": 128,
    "dropout": 0.0,
}
# What the recipe relies on the config file / train.py defaults for; checked against the checkout's files.
EXPECTED = {
    "learning_rate": 1e-3, "min_lr": 1e-4, "warmup_iters": 100, "beta1": 0.9, "beta2": 0.99, "weight_decay": 0.1,
    "grad_clip": 1.0, "gradient_accumulation_steps": 1, "decay_lr": True, "bias": False,
    "always_save_checkpoint": False, "init_from": "scratch", "wandb_log": False,
}

# The shape every side of the benchmark returns (nanoGPT now, the template later).
RESULT_KEYS = (
    "impl",               # "nanogpt" | "template"
    "steps",              # optimizer updates before the last evaluation
    "batch_size", "block_size", "tokens_per_iter",
    "iter_ms_median",     # median time of one training iteration (forward, backward, step), evaluations left out
    "tokens_per_s",       # tokens_per_iter / median iteration time
    "val_loss_by_step",   # {"0": 4.5, "250": 2.4, ...}: estimated val loss after that many updates
    "train_loss_by_step", # the same on the train split (the evaluation's estimate, not one batch)
    "wall_s",             # launch to exit
    "time_to_eval_s",     # {"250": 12.3, ...}: launch to the line reporting that evaluation
    "eval_s",             # time spent in evaluations, all of them
    "eval_share",         # eval_s / wall_s
)

ITER_RE = re.compile(r"^iter (\d+): loss (\S+), time ([\d.]+)ms, mfu (\S+)%")
EVAL_RE = re.compile(r"^step (\d+): train loss (\S+), val loss (\S+)")
TOKENS_RE = re.compile(r"^tokens per iteration will be: ([\d,]+)")
PARAMS_RE = re.compile(r"^number of parameters: ([\d.]+)M")
VOCAB_RE = re.compile(r"^found vocab_size = (\d+)")


# --------------------------------------------------------------------------------------------------------------
# data


def sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_manifest(corpus: Path = CORPUS) -> list[dict]:
    """MANIFEST.tsv's rows, in file order: work, title, bytes, sha256_of_text."""
    lines = (corpus / "MANIFEST.tsv").read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    if header[:4] != ["work", "title", "bytes", "sha256_of_text"]:
        raise ValueError(f"{corpus / 'MANIFEST.tsv'}: unexpected header {header}")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:] if line.strip()]


def load_corpus(corpus: Path = CORPUS) -> tuple[str, list[dict]]:
    """The works decompressed, each checked against MANIFEST.tsv (bytes and SHA-256 of the text), joined in
    MANIFEST order with SEPARATOR between works. Returns (text, rows with each work's character span)."""
    rows, parts, start = read_manifest(corpus), [], 0
    for i, row in enumerate(rows):
        raw = gzip.decompress((corpus / "works" / f"{row['work']}.txt.gz").read_bytes())
        if len(raw) != int(row["bytes"]) or hashlib.sha256(raw).hexdigest() != row["sha256_of_text"]:
            raise ValueError(f"{row['work']}: decompressed text does not match MANIFEST.tsv "
                             f"({len(raw)} bytes, sha256 {hashlib.sha256(raw).hexdigest()})")
        text = raw.decode("utf-8")
        if i:
            start += len(SEPARATOR)
        row["char_start"], row["char_end"] = start, start + len(text)
        start += len(text)
        parts.append(text)
    return SEPARATOR.join(parts), rows


def prepare(out_dir, corpus: Path = CORPUS) -> dict:
    """Write train.bin, val.bin, meta.pkl (nanoGPT's layout) and meta.json into out_dir; return what was written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    text, rows = load_corpus(Path(corpus))
    chars = sorted(set(text))
    if len(chars) > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"{len(chars)} symbols do not fit np.uint16")
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    # encode: code point -> index through a sorted lookup (the same ids as [stoi[c] for c in text], but fast)
    points = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    table = np.array([ord(c) for c in chars], dtype="<u4")
    ids = np.searchsorted(table, points).astype(np.uint16)
    n = len(text)
    split = int(n * TRAIN_FRACTION)
    train_ids, val_ids = ids[:split], ids[split:]
    train_ids.tofile(out_dir / "train.bin")
    val_ids.tofile(out_dir / "val.bin")
    with open(out_dir / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    (out_dir / "meta.json").write_text(json.dumps({"vocab_size": len(chars), "itos": {str(i): c for i, c in
                                                                                    itos.items()}}) + "\n")
    # spot check the encoding against the dictionary (start, split point, end)
    for i in (0, split - 1, split, n - 1):
        assert itos[int(ids[i])] == text[i]
    val_works = [r["work"] for r in rows if r["char_end"] > split]
    return {
        "dir": str(out_dir),
        "corpus": str(corpus),
        "works": len(rows),
        "separator": SEPARATOR,
        "chars": n,
        "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "vocab_size": len(chars),
        "vocabulary": "".join(chars),
        "train_tokens": int(train_ids.size),
        "val_tokens": int(val_ids.size),
        "split_at_char": split,
        "val_starts_inside": val_works[0] if val_works else None,  # the work the 90% cut falls in
        "val_works": val_works,
        "files": {name: sha256_file(out_dir / name) for name in ("train.bin", "val.bin", "meta.pkl", "meta.json")},
    }


# --------------------------------------------------------------------------------------------------------------
# nanoGPT's files, read (never run in this process, never copied)


def literal_assignments(path: Path) -> dict:
    """Top-level `name = <literal>` assignments of a Python file (nanoGPT's config style), read with ast."""
    out = {}
    for node in ast.parse(Path(path).read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass  # e.g. train.py's `dtype = ... if torch.cuda.is_available() ...`
    return out


def nanogpt_identity(nanogpt: Path, commit: str | None = None) -> dict:
    """Commit (git rev-parse HEAD, or the one given) and SHA-256 of the files the run depends on."""
    files = ["train.py", "model.py", "configurator.py", CONFIG_FILE]
    for name in files:
        if not (nanogpt / name).is_file():
            raise FileNotFoundError(f"{nanogpt / name} is missing: --nanogpt must name a nanoGPT checkout")
    found = None
    if (nanogpt / ".git").exists():
        try:
            found = subprocess.run(["git", "-C", str(nanogpt), "rev-parse", "HEAD"], capture_output=True,
                                   text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            found = None
    if commit and found and not found.startswith(commit) and not commit.startswith(found):
        raise ValueError(f"--nanogpt-commit {commit} but {nanogpt} is at {found}")
    if not (found or commit):
        raise ValueError(f"{nanogpt} is not a git checkout: state nanoGPT's commit with --nanogpt-commit HASH "
                         "(the results must name it)")
    return {
        "dir": str(nanogpt),
        "commit": found or commit,
        "commit_source": "git rev-parse HEAD" if found else "--nanogpt-commit (not verified: no .git)",
        "file_sha256": {name: sha256_file(nanogpt / name) for name in files},
    }


def effective_config(nanogpt: Path, overrides: dict) -> tuple[dict, list[str]]:
    """train.py's literal defaults <- the config file <- the overrides (configurator.py's order), and every
    EXPECTED value that differs."""
    cfg = literal_assignments(nanogpt / "train.py")
    cfg.update(literal_assignments(nanogpt / CONFIG_FILE))
    cfg.update(overrides)
    cfg = {k: v for k, v in cfg.items() if isinstance(v, (int, float, bool, str))}
    mismatches = [f"{k}: expected {v!r}, the checkout gives {cfg.get(k)!r}" for k, v in EXPECTED.items()
                  if cfg.get(k) != v]
    return cfg, mismatches


# --------------------------------------------------------------------------------------------------------------
# the run


def cpu_busy_s() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat), to tell how loaded it was."""
    try:
        f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
    return (sum(f[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def thread_env(threads: int) -> dict:
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"  # one line as soon as it is printed: the timestamps below depend on it
    return env


def child_torch_threads(python: str, env: dict) -> int:
    """torch.get_num_threads() in a fresh interpreter with the run's environment (nanoGPT never sets it)."""
    out = subprocess.run([python, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def run_nanogpt(nanogpt_dir, data_dir, steps: int, threads: int, *, eval_iters: int = 200,
                eval_interval: int = 250, python: str = sys.executable, commit: str | None = None,
                log_path=None, keep_workdir: bool = False, timeout_s: float | None = None) -> dict:
    """Run nanoGPT's train.py (CPU recipe, `steps` iterations) on the prepared files in data_dir; parse its output.

    Returns a dict with RESULT_KEYS first, then the per-iteration series and the provenance of the run."""
    nanogpt, data_dir = Path(nanogpt_dir).resolve(), Path(data_dir).resolve()
    if steps <= 0 or steps % eval_interval:
        raise ValueError(f"steps ({steps}) must be a positive multiple of eval_interval ({eval_interval}), "
                         "so that nanoGPT evaluates after the last update")
    for name in ("train.bin", "val.bin", "meta.pkl"):
        if not (data_dir / name).is_file():
            raise FileNotFoundError(f"{data_dir / name} is missing: run prepare() first")
    identity = nanogpt_identity(nanogpt, commit)
    overrides = {**CPU_RECIPE, "dataset": DATASET, "max_iters": steps, "lr_decay_iters": steps,
                 "eval_interval": eval_interval, "eval_iters": eval_iters}
    cfg, mismatches = effective_config(nanogpt, overrides)

    work = Path(tempfile.mkdtemp(prefix="nanogpt_bench_"))
    try:
        (work / "data").mkdir()
        (work / "data" / DATASET).mkdir()
        for name in ("train.bin", "val.bin", "meta.pkl"):
            (work / "data" / DATASET / name).symlink_to(data_dir / name)
        (work / "configurator.py").symlink_to(nanogpt / "configurator.py")  # train.py: open('configurator.py')
        overrides["out_dir"] = str(work / "out")
        cmd = [python, str(nanogpt / "train.py"), str(nanogpt / CONFIG_FILE),
               *(f"--{k}={v}" for k, v in overrides.items())]
        env = thread_env(threads)
        torch_threads = child_torch_threads(python, env)
        lines: list[tuple[float, str]] = []
        cpu0, busy0, load0 = children_cpu_s(), cpu_busy_s(), loadavg()
        t_launch = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        try:
            for line in proc.stdout:
                lines.append((time.perf_counter() - t_launch, line.rstrip("\n")))
                if timeout_s is not None and lines[-1][0] > timeout_s:
                    proc.kill()
                    raise TimeoutError(f"nanoGPT ran past {timeout_s} s")
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        wall_s = time.perf_counter() - t_launch
        cpu_s, busy1, load1 = children_cpu_s() - cpu0, cpu_busy_s(), loadavg()
    finally:
        if not keep_workdir:
            shutil.rmtree(work, ignore_errors=True)
    if log_path is not None:
        Path(log_path).write_text("".join(f"{t:9.3f}  {s}\n" for t, s in lines))
    if rc != 0:
        tail = "\n".join(s for _, s in lines[-20:])
        raise RuntimeError(f"nanoGPT exited {rc}; last lines:\n{tail}")

    result = parse_nanogpt(lines, eval_interval)
    if result["steps"] != steps:
        raise RuntimeError(f"asked for {steps} iterations, the last evaluation was at {result['steps']}")
    result["wall_s"] = wall_s
    result["eval_share"] = result["eval_s"] / wall_s
    result["startup_s"] = result.pop("_first_loop_line_s")
    # contention: nanoGPT's CPU seconds against the whole machine's busy seconds during the run
    machine = busy1 - busy0 if busy0 is not None and busy1 is not None else None
    result["cpu"] = {"nanogpt_cpu_s": cpu_s, "machine_busy_s": machine,
                     "others_cpu_s": None if machine is None else max(machine - cpu_s, 0.0),
                     "cores": os.cpu_count(), "loadavg_at_launch": load0, "loadavg_at_exit": load1}
    result["threads"] = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                         "child_torch_get_num_threads": torch_threads}
    result["command"] = shlex.join(cmd)
    result["cwd"] = f"{work} (temporary: data/{DATASET}/* -> {data_dir}/*, configurator.py -> nanoGPT's)"
    result["nanogpt"] = identity
    result["effective_config"] = cfg
    result["recipe_mismatches"] = mismatches
    result["eval_iters"], result["eval_interval"] = eval_iters, eval_interval
    if result["batch_size"] is None:
        result["batch_size"], result["block_size"] = cfg["batch_size"], cfg["block_size"]
    return {**{k: result[k] for k in RESULT_KEYS}, **{k: v for k, v in result.items() if k not in RESULT_KEYS}}


def parse_nanogpt(lines: list[tuple[float, str]], eval_interval: int) -> dict:
    """nanoGPT's stdout, each line with its arrival time (s since launch) -> figures.

    Evaluation time: an evaluation starts right after the line before its "step N" line (the previous "iter" line,
    or for step 0 the optimizer's "using fused AdamW" line) and ends when "step N" is printed."""
    iters, evals, saves, tokens, params, vocab = {}, {}, 0, None, None, None
    eval_s, first_loop_line = {}, None
    for i, (t, s) in enumerate(lines):
        if m := ITER_RE.match(s):
            iters[int(m[1])] = (float(m[2]), float(m[3]), t)
        elif m := EVAL_RE.match(s):
            step = int(m[1])
            evals[step] = (float(m[2]), float(m[3]), t)
            eval_s[step] = t - lines[i - 1][0] if i else t
            if first_loop_line is None:
                first_loop_line = lines[i - 1][0] if i else 0.0
        elif s.startswith("saving checkpoint"):
            saves += 1
        elif m := TOKENS_RE.match(s):
            tokens = int(m[1].replace(",", ""))
        elif m := PARAMS_RE.match(s):
            params = float(m[1]) * 1e6
        elif m := VOCAB_RE.match(s):
            vocab = int(m[1])
    if not iters or not evals:
        raise RuntimeError("no 'iter' or 'step' lines in nanoGPT's output (is log_interval=1?)")
    order = sorted(iters)
    ms_all = [iters[k][1] for k in order]
    # iterations whose timed interval holds an evaluation (and a possible checkpoint save), and iteration 0
    # (first-call warm-up): left out of the steady-state figures
    held = {k for k in order if k % eval_interval == 0}
    ms_train = [iters[k][1] for k in order if k not in held]
    median = statistics.median(ms_train)
    last_eval = max(evals)
    q = np.percentile(ms_train, [10, 90])
    from_dt = {k: (iters[k][1] - median) / 1000 for k in held if k in iters}  # eval + save + noise, per eval
    return {
        "impl": "nanogpt",
        "steps": last_eval,
        "batch_size": None, "block_size": None,  # filled from the config by the caller
        "tokens_per_iter": tokens,
        "iter_ms_median": median,
        "tokens_per_s": tokens / (median / 1000) if tokens else None,
        "val_loss_by_step": {str(k): evals[k][1] for k in sorted(evals)},
        "train_loss_by_step": {str(k): evals[k][0] for k in sorted(evals)},
        "wall_s": None,
        "time_to_eval_s": {str(k): evals[k][2] for k in sorted(evals)},
        "eval_s": sum(eval_s.values()),
        "eval_share": None,
        # details
        "optimizer_steps_run": len(order),
        "iter_ms_mean_train": statistics.fmean(ms_train),
        "iter_ms_p10_p90_train": [float(q[0]), float(q[1])],
        "iter_ms_first": ms_all[0],
        "loop_s_sum_of_iter_times": sum(ms_all) / 1000,  # first batch fetched -> last step done, evals included
        "train_s_without_eval": sum(ms_all) / 1000 - sum(eval_s.values()),
        "eval_s_by_step": {str(k): eval_s[k] for k in sorted(eval_s)},
        "eval_s_by_step_from_iter_time": {str(k): from_dt[k] for k in sorted(from_dt)},
        # per stretch between two evaluations: a stretch slowed by another process stands out here
        "iter_ms_median_by_segment": {f"{lo}-{hi}": statistics.median(iters[k][1] for k in order if lo < k < hi)
                                      for lo, hi in zip(sorted(evals), sorted(evals)[1:])
                                      if any(lo < k < hi for k in order)},
        "checkpoint_saves": saves,
        "params": params,
        "vocab_size_seen": vocab,
        "_first_loop_line_s": first_loop_line,  # launch -> the line before the first evaluation (imports, build)
        "train_loss_per_iter": [iters[k][0] for k in order],
        "iter_ms": ms_all,
    }


# --------------------------------------------------------------------------------------------------------------
# report


def loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def summary_table(results: list[dict]) -> str:
    """One column per side of the benchmark (nanoGPT, later the template)."""
    steps = sorted({int(s) for r in results for s in r["val_loss_by_step"]})

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    rows = [("", [r["impl"] for r in results]),
            ("iterations (updates)", [str(r["steps"]) for r in results]),
            ("tokens / iteration", [fmt(r["tokens_per_iter"], ",") for r in results]),
            ("median ms / iteration", [fmt(r["iter_ms_median"], ".2f") for r in results]),
            ("tokens / s", [fmt(r["tokens_per_s"], ",.0f") for r in results]),
            ("wall s (launch -> exit)", [fmt(r["wall_s"], ".1f") for r in results]),
            ("evaluation s (share)", [f"{r['eval_s']:.1f} ({100 * r['eval_share']:.0f}%)" for r in results])]
    for s in steps:
        rows.append((f"val loss @ {s} (s from launch)",
                     [f"{r['val_loss_by_step'][str(s)]:.4f} ({r['time_to_eval_s'][str(s)]:.1f})"
                      if str(s) in r["val_loss_by_step"] else "-" for r in results]))
    w0 = max(len(k) for k, _ in rows)
    w = [max(len(v[i]) for _, v in rows) for i in range(len(results))]
    return "\n".join(f"{k:<{w0}}  " + "  ".join(f"{c:>{w[i]}}" for i, c in enumerate(v)) for k, v in rows)


# --------------------------------------------------------------------------------------------------------------
# the template's side: train.py on the same token files (data.dataset = "tokens"), the same model, batch, context

TEMPLATE_VAL_RE = re.compile(r"^step (\d+)/\d+: val loss (\S+)")
TEMPLATE_LOG_EVERY = 10  # train records every 10 steps: the iteration time is read from their elapsed_s
# The template's runs, each a config and its --sets, one change from the run before it: nanoGPT's recipe as
# shakespeare_cpu.toml has it; a higher peak learning rate and a shorter cosine (chosen on the validation loss of
# these files: see the README); the modern block of shakespeare_modern.toml at those settings; its cosine cut to
# 750 steps; Muon for the blocks' matrices (at muon_lab.py's rate); twice the batch for a quarter of the steps;
# shakespeare_speedrun.toml, whose rates and length were re-chosen for that batch (on the same validation loss); and
# the speedrun compiled, its compile time counted. A run of shakespeare_cpu.toml mirrors nanoGPT's (its steps and
# evaluation interval); the other configs keep their own unless a --set changes them.
TEMPLATE_RUNS = {"template": ("shakespeare_cpu.toml", []),
                 "template, tuned": ("shakespeare_cpu.toml", ["optim.lr=3e-3", "train.steps=1250"]),
                 "tuned, modern block": ("shakespeare_modern.toml", ["optim.lr=3e-3", "train.steps=1250"]),
                 "modern, 750 steps": ("shakespeare_modern.toml", ["optim.lr=3e-3", "train.steps=750"]),
                 "750 steps, Muon": ("shakespeare_modern.toml", ["optim.lr=3e-3", "train.steps=750",
                                                                 "optim.name=muon"]),
                 "Muon, 200 steps x 24": ("shakespeare_modern.toml", ["optim.lr=3e-3", "train.steps=200",
                                                                      "optim.name=muon", "train.batch_size=24"]),
                 "speedrun": ("shakespeare_speedrun.toml", []),
                 "speedrun, compiled": ("shakespeare_speedrun.toml", ["model.compile=true"])}
# shakespeare_speedrun.toml is shakespeare_modern.toml with these (Day 12's gates hold it to them)
SPEEDRUN_SETS = ["optim.name=muon", "optim.lr=6e-3", "optim.muon_lr=0.015", "train.batch_size=24", "train.steps=180",
                 "train.eval_every=180"]
MIRRORS_NANOGPT = "shakespeare_cpu.toml"
# The speedrun under bf16 autocast: run only on a CPU that multiplies bf16 matrices faster than fp32 ones (runlog's
# measured peaks: AMX or AVX-512 BF16); on an AVX2-only CPU a bf16 matmul costs ~100x an fp32 one (Day 7)
BF16_RUN = {"speedrun, bf16 autocast": ("shakespeare_speedrun.toml", ["train.amp=true"])}


def template_runs() -> dict:
    """TEMPLATE_RUNS, and BF16_RUN where this CPU's bf16 matmul peak beats its fp32 one."""
    from lab_training import bf16_matmul_is_faster

    if bf16_matmul_is_faster():
        return {**TEMPLATE_RUNS, **BF16_RUN}
    return TEMPLATE_RUNS


def run_template(data_dir, threads: int, overrides: list[str], *, config: str = "shakespeare_cpu.toml",
                 eval_windows: int = 1024, python: str = sys.executable, log_path=None) -> dict:
    """train.py with `config` (of configs/) on the prepared token files; the same RESULT_KEYS as nanoGPT's."""
    from train_template import config as template_config, runlog

    work = Path(tempfile.mkdtemp(prefix="template_bench_"))
    sets = ["data.dataset=tokens", f"data.root={Path(data_dir).resolve()}",
            f"data.tokens.block_size={CPU_RECIPE['block_size']}", f"data.tokens.eval_windows={eval_windows}",
            f"train.log_every={TEMPLATE_LOG_EVERY}", "train.progress=off", f"run.out_dir={work / 'run'}", *overrides]
    cmd = [python, str(TEMPLATE / "train.py"), "--config", str(TEMPLATE / "configs" / config),
           "--set", *sets]
    batch = template_config.load(str(TEMPLATE / "configs" / config), sets).train.batch_size
    lines: list[tuple[float, str]] = []
    t_launch = time.perf_counter()
    proc = subprocess.Popen(cmd, env=thread_env(threads), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            bufsize=1)
    for line in proc.stdout:
        lines.append((time.perf_counter() - t_launch, line.rstrip("\n")))
    rc = proc.wait()
    wall_s = time.perf_counter() - t_launch
    if log_path is not None:
        Path(log_path).write_text("".join(f"{t:9.3f}  {s}\n" for t, s in lines))
    if rc != 0:
        raise RuntimeError(f"train.py exited {rc}; last lines:\n" + "\n".join(s for _, s in lines[-20:]))
    records = runlog.read_metrics(work / "run")
    shutil.rmtree(work, ignore_errors=True)
    steps_at = {r["step"]: r for r in records if r["kind"] == "train"}
    evals = {int(m[1]): (float(m[2]), t) for t, s in lines if (m := TEMPLATE_VAL_RE.match(s))}
    # Iteration time from consecutive records; an interval that holds an evaluation (and its checkpoint) is left out.
    per_iter = {s: (steps_at[s]["elapsed_s"] - steps_at[s - TEMPLATE_LOG_EVERY]["elapsed_s"]) / TEMPLATE_LOG_EVERY
                for s in steps_at if s - TEMPLATE_LOG_EVERY in steps_at}
    train_ms = [1000 * t for s, t in per_iter.items() if s - TEMPLATE_LOG_EVERY not in evals]
    eval_intervals = [1000 * t for s, t in per_iter.items() if s - TEMPLATE_LOG_EVERY in evals]
    median = statistics.median(train_ms)
    block = CPU_RECIPE["block_size"]
    eval_s = sum((ms - median) * TEMPLATE_LOG_EVERY / 1000 for ms in eval_intervals)
    return {"impl": "template", "steps": max(evals), "batch_size": batch, "block_size": block,
            "tokens_per_iter": batch * block, "iter_ms_median": median, "tokens_per_s": batch * block / (median / 1000),
            "val_loss_by_step": {str(k): v for k, (v, _) in sorted(evals.items())}, "train_loss_by_step": {},
            "wall_s": wall_s, "time_to_eval_s": {str(k): t for k, (_, t) in sorted(evals.items())},
            "eval_s": eval_s, "eval_share": eval_s / wall_s, "config": config, "overrides": overrides,
            "command": shlex.join(cmd),
            "mfu_last": records and [r for r in records if r["kind"] == "train"][-1].get("mfu")}


def time_to(result: dict, target: float) -> float | None:
    """Seconds from launch to the first evaluation at or below `target` (None: never reached)."""
    reached = [result["time_to_eval_s"][s] for s, v in result["val_loss_by_step"].items() if v <= target]
    return min(reached) if reached else None


def markdown(results: dict) -> str:
    """The README's record table, from the results written by main(): a row per run, nanoGPT's first."""
    runs, m = results["runs"], results["machine"]
    nano = runs["nanogpt"]
    target = nano["val_loss_by_step"][str(nano["steps"])]
    lines = [f"nanoGPT `{results['nanogpt_commit'][:12]}` against the template on the same token files (the 42 works "
             f"as characters, {results['dataset']['vocab_size']} symbols, nanoGPT's 90/10 split), the same model "
             f"size (4 x 4 x 128, context 64, no bias), fp32, compile off, {m['threads']} threads each, one "
             f"after another on {m['cpu']}, torch {m['torch']}. The target: nanoGPT's val loss at its last step, "
             f"{target:.4f}.", "",
             "| run | steps x windows | ms per step | tokens/s vs nanoGPT | val loss at its last step | seconds from "
             "launch to the target | vs nanoGPT | wall seconds (evaluations' share) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in runs.items():
        lines.append(f"| {name} | {r['steps']:,} x {r['batch_size']} | {r['iter_ms_median']:.1f} | "
                     f"{r['tokens_per_s'] / nano['tokens_per_s']:.2f}x | "
                     f"{r['val_loss_by_step'][str(r['steps'])]:.4f} | "
                     f"{time_cells(time_to(r, target), time_to(nano, target))} | "
                     f"{r['wall_s']:.1f} ({100 * r['eval_share']:.0f}%) |")
    lines += ["", "Runs: " + "; ".join(f"{name}: `{r['config']}` `{' '.join(effective(r['overrides'])) or 'as it is'}`"
                                       for name, r in runs.items() if name != "nanogpt") + "."]
    return "\n".join(lines) + "\n"


def time_cells(reached: float | None, nanogpt_s: float) -> str:
    """The record's two cells: seconds from launch to the target and their ratio to nanoGPT's."""
    if reached is None:
        return "not reached | -"
    return f"{reached:.1f} | {reached / nanogpt_s:.2f}x"


def mirrored(config: str, steps: int, eval_interval: int) -> list[str]:
    """The --sets that make a run of MIRRORS_NANOGPT follow nanoGPT's steps and evaluation interval (none for the
    other configs: they keep their own)."""
    if config != MIRRORS_NANOGPT:
        return []
    return [f"train.steps={steps}", f"train.eval_every={eval_interval}"]


def effective(overrides: list[str]) -> list[str]:
    """--set values as the config reads them: a key set twice keeps its place and its last value."""
    values = {}
    for item in overrides:
        key, _, value = item.partition("=")
        values[key] = value
    return [f"{key}={value}" for key, value in values.items()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", required=True, type=Path, help="an existing nanoGPT checkout (never fetched here)")
    p.add_argument("--nanogpt-commit", help="nanoGPT's commit, when DIR has no .git (an exported tree)")
    p.add_argument("--steps", type=int, default=2000, help="max_iters = lr_decay_iters (a multiple of 250)")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS / MKL_NUM_THREADS of the run")
    p.add_argument("--eval-iters", type=int, default=20,
                   help="batches per split per evaluation (the README's CPU recipe: 20; its config file: 200)")
    p.add_argument("--eval-windows", type=int, default=512,
                   help="the template's windows per evaluation (nanoGPT's 20 batches x 12, on two splits: 480)")
    p.add_argument("--results", type=Path, default=None, help="also write nanogpt.json and nanogpt.md here")
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--out", type=Path, default=HERE / "runs" / "nanogpt_bench")
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--python", default=sys.executable, help="the interpreter that runs nanoGPT (needs torch, numpy)")
    p.add_argument("--timeout", type=float, default=None, help="kill nanoGPT after this many seconds")
    p.add_argument("--keep-workdir", action="store_true")
    a = p.parse_args(argv)
    if a.steps <= 0 or a.threads <= 0 or a.eval_iters <= 0 or a.eval_interval <= 0:
        p.error("--steps, --threads, --eval-iters and --eval-interval must be positive")
    if a.steps % a.eval_interval:
        p.error(f"--steps must be a multiple of --eval-interval ({a.eval_interval}): nanoGPT evaluates when "
                "iter % eval_interval == 0, and the last evaluation must come after the last update")

    try:  # refuse before preparing anything: a checkout is required, and its commit must be known
        nanogpt_identity(a.nanogpt.resolve(), a.nanogpt_commit)
    except (OSError, ValueError) as e:
        p.error(str(e))
    a.out.mkdir(parents=True, exist_ok=True)
    data_dir = a.out / "data" / DATASET
    dataset = prepare(data_dir, a.corpus)
    print(f"prepared {data_dir}: vocab {dataset['vocab_size']}, train {dataset['train_tokens']:,} tokens, "
          f"val {dataset['val_tokens']:,} tokens")
    load_before = loadavg()
    t0 = time.time()
    nano = run_nanogpt(a.nanogpt, data_dir, a.steps, a.threads, eval_iters=a.eval_iters,
                       eval_interval=a.eval_interval, python=a.python, commit=a.nanogpt_commit,
                       log_path=a.out / f"nanogpt_steps{a.steps}.log", keep_workdir=a.keep_workdir,
                       timeout_s=a.timeout)
    runs = {"nanogpt": nano}
    for name, (config, overrides) in template_runs().items():
        print(f"{name}: {config} {' '.join(overrides)} ...", flush=True)
        runs[name] = run_template(data_dir, a.threads, [*mirrored(config, a.steps, a.eval_interval), *overrides],
                                  config=config,
                                  eval_windows=a.eval_windows, log_path=a.out / f"{name.replace(', ', '_')}.log")
    load_after = loadavg()
    from train_template import runlog

    results = {
        "nanogpt_commit": nano["nanogpt"]["commit"],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpu": runlog.cpu_name(),
                    "threads": a.threads, "torch": torch.__version__, "numpy": np.__version__,
                    "cpu_count": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": load_after},
        "dataset": dataset,
        "runs": runs,
    }
    path = a.out / f"results_steps{a.steps}.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(f"nanoGPT {results['nanogpt_commit']}\n  {nano['command']}")
    if nano["recipe_mismatches"]:
        print("recipe mismatches:\n  " + "\n  ".join(nano["recipe_mismatches"]))
    print(summary_table(list(runs.values())))
    print(f"load average before / after: {load_before} / {load_after}")
    print(markdown(results))
    if a.results is not None:
        a.results.mkdir(parents=True, exist_ok=True)
        (a.results / "nanogpt.json").write_text(json.dumps(results, indent=1) + "\n")
        (a.results / "nanogpt.md").write_text(markdown(results))
        print(f"wrote {a.results / 'nanogpt.json'} and nanogpt.md")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
