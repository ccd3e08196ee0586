"""drills_lab.py — the engineering chapter's hands-on drills, run on the template's GPT (shakespeare_cpu.toml) and
measured, each through train.py's own `run`:

    python drills_lab.py --out results          # results/drills.json and drills.md

1. A too-high learning rate: ten times the config's (lr 1e-2) for STEPS steps. Does the NaN stop fire, at which step,
   and where does the validation loss end against the config's lr?
2. Reproducibility: two runs of one seed (100 steps), with and without `run.deterministic`: are their records and
   final weights bitwise equal, does the flag switch torch's deterministic algorithms, what does it change on this
   machine, and what does it cost (CPU time per step, on / off, the lower of each mode's two runs)?
3. Resuming without the optimizer state: a run stopped at the middle, resumed once from its full checkpoint and once
   from the same checkpoint with the optimizer's per-parameter state removed (AdamW's moments and step counts start
   again from zero; its settings, the schedule, data order and RNG are restored in both). The loss over the next
   JUMP_STEPS steps against the uninterrupted run. (The template's weights-only start, checkpoint.init_from, also
   restarts the step count, the warmup and the data order: a bigger change than this one.)
4. The TensorBoard curves: the uninterrupted run's event file read back with TensorBoard's own reader.
The drills' run folders go to runs/drills_lab/runs/ (git-ignored) whatever --out says.
"""
import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts and configs
sys.path.insert(0, str(TEMPLATE))

import torch

from train_template import checkpoint, config, runlog, train
from train_template.troubleshoot import NonFinite

CONFIG = TEMPLATE / "configs" / "shakespeare_cpu.toml"
STEPS, JUMP_STEPS, SEED_STEPS = 300, 50, 100
BASE = [f"train.steps={STEPS}", "train.eval_every=150", "train.log_every=1", "data.shakespeare.eval_windows=256",
        "train.progress=off", "checkpoint.every_steps=150"]


def launch(out: Path, name: str, *sets: str, config_file: Path | None = CONFIG, base: list[str] = BASE) -> Path:
    """One template run of the drills' config (or of `config_file` and `base`: check.py's tiny GPT) into out/name;
    returns its run folder."""
    run_dir = out / name
    train.run(config.load(config_file and str(config_file), [*base, f"run.out_dir={run_dir}", *sets]))
    return run_dir


def losses(run_dir: Path, kind: str = "train", key: str = "loss") -> dict[int, float]:
    return {r["step"]: r[key] for r in runlog.read_metrics(run_dir) if r["kind"] == kind}


def step_cpu_s(run_dir: Path) -> list[float]:
    """CPU seconds of the training process in each step after the first (its warm-up), from the per-step records."""
    cpu = losses(run_dir, key="cpu_s")
    return [cpu[s] - cpu[s - 1] for s in sorted(cpu)[1:] if s - 1 in cpu]


def high_lr(out: Path, reference: Path, run=launch) -> dict:
    """Drill 1: ten times the lr of the `reference` run (the config's), the same run otherwise."""
    config_lr = config.load(str(reference / "config.toml"), []).optim.lr
    try:
        run_dir = run(out, "lr-x10", f"optim.lr={10 * config_lr!r}")
        stopped = None
    except NonFinite as exc:
        run_dir, stopped = out / "lr-x10", str(exc).splitlines()[0]
    val, reference_val = losses(run_dir, "val", "val_loss"), losses(reference, "val", "val_loss")
    last = max(reference_val)
    return {"nan_stop": stopped, "steps_done": max(losses(run_dir), default=0), "val_loss": val.get(last),
            "config_lr_val_loss": reference_val[last], "config_lr": config_lr, "lr": 10 * config_lr}


def same_seed(out: Path, run=launch, steps: int = SEED_STEPS) -> dict:
    """Drill 2: two runs of one seed in each mode, the modes taking turns (off, on, off, on: a change in the machine's
    load hits both): the device they ran on, records and final state entries that differ, whether torch's
    deterministic algorithms were on (the flag train.run leaves set), and the CPU time of a step (the fastest of both
    runs' steps after the first: the least disturbed by other processes)."""
    result, switched = {}, {}
    for k in (0, 1):
        for deterministic in (False, True):
            run(out, f"det{deterministic}-{k}", f"run.deterministic={str(deterministic).lower()}",
                f"train.steps={steps}", f"train.eval_every={steps}")
            switched.setdefault(deterministic, []).append(torch.are_deterministic_algorithms_enabled())
    for deterministic in (False, True):
        dirs = [out / f"det{deterministic}-{k}" for k in (0, 1)]
        a, b = (losses(d) for d in dirs)
        states = [checkpoint.load(d / "last.pt")["model"] for d in dirs]
        ra, rb = (runlog.reproducible_records(d) for d in dirs)
        result[f"deterministic={deterministic}"] = {
            "losses_differing": sum(a[s] != b[s] for s in a),
            "records_differing": sum(x != y for x, y in zip(ra, rb)) + abs(len(ra) - len(rb)), "records": len(ra),
            "weights_differing": sum(not torch.equal(states[0][k], states[1][k]) for k in states[0]),
            "algorithms_deterministic": switched[deterministic], "last_loss": a[steps],
            "step_cpu_s": min(t for d in dirs for t in step_cpu_s(d))}
    result["device"] = runlog.previous_launches(out / "detFalse-0" / "run.json")[-1]["device"]
    modes = [losses(out / f"det{d}-0") for d in (False, True)]
    result["between_modes_losses_differing"] = sum(modes[0][s] != modes[1][s] for s in modes[0])
    result["cost_cpu_ratio"] = result["deterministic=True"]["step_cpu_s"] / result["deterministic=False"]["step_cpu_s"]
    return result


def without_optimizer_state(ckpt: Path, path: Path) -> None:
    """A copy of a full-format checkpoint whose optimizer holds no state: the model, schedule, data order and RNG
    resume, AdamW's moments and step counts start again from zero."""
    payload = checkpoint.load(ckpt)
    payload["optimizer"] = {**payload["optimizer"], "state": {}}
    checkpoint.atomic_save(payload, path)


def model_only_resume(out: Path) -> dict:
    """Drill 3: the stopped run resumed with and without its optimizer state."""
    half = STEPS // 2
    stopped = launch(out, "stopped", f"train.max_steps={half}")
    ckpt = stopped / f"ckpt-{half:08d}.pt"
    without_optimizer_state(ckpt, out / "model-only.pt")
    launch(out, "resumed-full", f"checkpoint.resume={ckpt}")
    launch(out, "resumed-model-only", f"checkpoint.resume={out / 'model-only.pt'}")
    reference = losses(out / "uninterrupted")
    after = range(half + 1, half + JUMP_STEPS + 1)
    result = {"resumed_at": half}
    for name in ("resumed-full", "resumed-model-only"):
        got = losses(out / name)
        gaps = [got[s] - reference[s] for s in after]
        result[name] = {"max_gap": max(gaps, key=abs), "mean_gap": sum(gaps) / len(gaps), "first_gap": gaps[0],
                        "losses_differing": sum(g != 0 for g in gaps)}
    return result


def tensorboard_curves(run_dir: Path) -> dict:
    """Drill 4: the scalars TensorBoard would plot, read back from the event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})  # 0: every point, not 10,000
    events.Reload()
    tags = events.Tags()["scalars"]
    return {"tags": sorted(tags), "points": {tag: len(events.Scalars(tag)) for tag in tags},
            "last_train_loss": events.Scalars("train/loss")[-1].value}


def markdown(res: dict) -> str:
    lr, seed, resume, tb = res["high_lr"], res["same_seed"], res["resume"], res["tensorboard"]
    fired = f"did not fire in {lr['steps_done']} steps; validation loss after them {lr['val_loss']:.3f}"
    if lr["nan_stop"]:
        fired = f"fired after {lr['steps_done']} logged steps: {lr['nan_stop']}"
    lines = [f"`{res['config']}`'s GPT, {STEPS} steps per run (the same-seed runs {SEED_STEPS}); {res['machine']}, "
             f"torch {res['torch']}, {res['threads']} threads.", "",
             "| drill | measured |", "|---|---|",
             f"| lr {lr['lr']:g}, ten times the config's ({lr['config_lr']:g}: validation loss after {STEPS} steps "
             f"{lr['config_lr_val_loss']:.3f}) | the NaN stop {fired} |"]
    for mode in ("deterministic=False", "deterministic=True"):
        m = seed[mode]
        lines.append(f"| two runs of seed 0, `run.{mode.replace('=', ' = ').lower()}` | records that differ: "
                     f"{m['records_differing']} of {m['records']} (losses: {m['losses_differing']} of {SEED_STEPS}); "
                     f"final weight tensors that differ: {m['weights_differing']}; torch's deterministic algorithms "
                     f"{'on' if all(m['algorithms_deterministic']) else 'off'} |")
    on, off = (seed[f"deterministic={d}"]["step_cpu_s"] for d in (True, False))
    lines.append(f"| deterministic on against off | losses that differ: {seed['between_modes_losses_differing']} "
                 f"of {SEED_STEPS}; CPU time of a step (the fastest of steps 2-{SEED_STEPS} in two runs) "
                 f"{1000 * on:.0f} ms on, {1000 * off:.0f} ms off: on / off {seed['cost_cpu_ratio']:.3f} |")
    for name, label in (("resumed-full", "full checkpoint"),
                        ("resumed-model-only", "checkpoint without the optimizer's state (moments, step counts)")):
        r = resume[name]
        lines.append(f"| resumed at step {resume['resumed_at']} from the {label}: loss minus the uninterrupted "
                     f"run's over the next {JUMP_STEPS} steps | first step {r['first_gap']:+.4f}, largest "
                     f"{r['max_gap']:+.4f}, mean {r['mean_gap']:+.4f}; steps that differ: {r['losses_differing']} |")
    lines.append(f"| TensorBoard event file, read back | {len(tb['tags'])} scalar curves "
                 f"({', '.join(tb['tags'])}); train/loss has {tb['points']['train/loss']} points |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "runs" / "drills_lab")
    args = parser.parse_args(argv)
    scratch = HERE / "runs" / "drills_lab" / "runs"  # the drills' run folders, made afresh
    shutil.rmtree(scratch, ignore_errors=True)
    uninterrupted = launch(scratch, "uninterrupted")
    res = {"config": CONFIG.name, "machine": runlog.cpu_name(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "high_lr": high_lr(scratch, uninterrupted),
           "same_seed": same_seed(scratch), "resume": model_only_resume(scratch),
           "tensorboard": tensorboard_curves(uninterrupted)}
    runlog.write_lab_results(args.out, "drills", res, markdown(res))
    return res


if __name__ == "__main__":
    main()
