"""Exact resume: a run SIGKILLed at a random mid-epoch step and resumed with checkpoint.resume=auto logs the same
losses and ends in bitwise the same state (model, optimizer, schedule, scaler, sampler) as the run never killed, for
each of the variants that keep state in different places; so does a run stopped at a period's or the run's last step,
and one whose evaluation there failed."""
import random
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from train_template import checkpoint, runlog, train
from train_template.troubleshoot.faults import Faults
from helpers import (FAULTS, FORMATS, STEPS, TINY, cfg_of, child_env, diff_states, every_record, full, launch,
                     one_thread, reached, sets, tiny_lm, train_records)

VARIANTS = ["fp32", "grad_accum=4 + bf16", "2 data workers", "gpt", "gpt grad_accum=4 + bf16",
            "a modern gpt, muon", "sharded", "sharded, async_save"]
MODERN = {"model.gpt.norm": "rmsnorm", "model.gpt.position": "rope", "model.gpt.mlp": "swiglu",
          "model.gpt.qk_norm": True, "model.gpt.logit_softcap": 30.0, "model.gpt.tie_embeddings": False}


def variant_values(corpus: str) -> dict:
    lm = tiny_lm(corpus)
    return {"fp32": TINY, "grad_accum=4 + bf16": {**TINY, "train.grad_accum": 4, "train.amp": True},
            "2 data workers": {**TINY, "data.num_workers": 2}, "gpt": lm,
            "gpt grad_accum=4 + bf16": {**lm, "train.grad_accum": 4, "train.amp": True},
            "a modern gpt, muon": {**lm, **MODERN, "optim.name": "muon"},
            "sharded": {**TINY, **FORMATS["sharded"]},
            "sharded, async_save": {**TINY, **FORMATS["sharded"], "checkpoint.async_save": True}}


def checkpointed_and_reached(run_dir: Path, step: int):
    """The run logged `step` and last.pt exists (an asynchronous save links it only once its files are written)."""
    logged = reached(run_dir, step)

    def ready() -> bool:
        return logged() and (run_dir / "last.pt").exists()

    return ready


def mid_epoch_kill_step(rng: random.Random) -> int:
    """A random step after the first checkpoint (step 3) and at least 4 steps before an epoch's end (epochs have 16
    steps), so the checkpoint resumed from is a mid-epoch one even if the kill lands a few steps late."""
    return rng.choice([s for s in range(4, STEPS) if 4 <= s % 16 <= 11])


def killed_launch(values: dict, run_dir: Path, kill: int, results: dict, name: str) -> threading.Thread:
    """Start faults.py (train.py, slowed to 50 ms a step) in a thread that SIGKILLs it once `kill` is checkpointed."""
    cmd = [sys.executable, *FAULTS, "--set", *sets({**values, "run.out_dir": str(run_dir)})]
    env = child_env(TEMPLATE_FAULTS="step_sleep=0.05")

    def run() -> None:
        results[name] = launch(cmd, env=env, kill_when=checkpointed_and_reached(run_dir, kill))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.fixture(scope="module", autouse=True)
def single_threaded():
    """Nine runs share the cores at once: every run of this module, killed or not, computes in one thread."""
    with one_thread():
        yield


@pytest.fixture(scope="module")
def sigkilled(tmp_path_factory, corpus):
    """For each variant, a run SIGKILLed at a random step (subprocesses, all at once) and its uninterrupted twin
    (in this process meanwhile)."""
    tmp, rng, values = tmp_path_factory.mktemp("sigkill"), random.Random(), variant_values(corpus)
    jobs, results = {}, {}
    for name in VARIANTS:
        kill, run_dir = mid_epoch_kill_step(rng), tmp / name.replace(" ", "_")
        jobs[name] = (kill, run_dir, killed_launch(values[name], run_dir, kill, results, name))
    out = {}
    for name, (kill, run_dir, thread) in jobs.items():
        ref = tmp / f"{name.replace(' ', '_')}-uninterrupted"
        train.run(cfg_of(values[name], ref))
        thread.join()
        out[name] = {"values": values[name], "kill": kill, "run_dir": run_dir, "ref": ref, "launch": results[name]}
    return out


@pytest.mark.parametrize("name", VARIANTS)
def test_sigkill_at_a_random_step_then_resume_is_bitwise_the_uninterrupted_run(sigkilled, name):
    job = sigkilled[name]
    code, text = job["launch"]
    assert code == -signal.SIGKILL, (code, text)
    resumed_from = checkpoint.load(job["run_dir"] / "last.pt", mmap=True)
    assert resumed_from["sampler"]["position"] > 0  # a mid-epoch checkpoint
    train.run(cfg_of({**job["values"], "checkpoint.resume": "auto"}, job["run_dir"]))
    ref, got = train_records(job["ref"]), train_records(job["run_dir"])
    later = [s for s in ref if s > resumed_from["step"]]
    assert len(later) >= 3
    assert [s for s in later if ref[s]["loss"] != got[s]["loss"]] == [], f"killed near step {job['kill']}"
    a, b = full(job["ref"] / "last.pt"), full(job["run_dir"] / "last.pt")
    keys = ("model", "optimizer", "scheduler", "scaler", "sampler", "step", "best")
    assert diff_states({k: a[k] for k in keys}, {k: b[k] for k in keys}) == []


# -- a stop at the last step of an evaluation period, or of the run ---------------------------------------------------
STOPS = {"a period's last step": 16, "the run's last step": STEPS}  # both tasks evaluate every 16 steps


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, corpus) -> dict:
    tmp = tmp_path_factory.mktemp("uninterrupted")
    values = {"classify": TINY, "lm": tiny_lm(corpus)}
    return {task: (v, tmp / task, train.run(cfg_of(v, tmp / task))) for task, v in values.items()}


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("task", ["classify", "lm"])
def test_a_stop_at_a_periods_or_the_runs_last_step_resumes_to_every_record_best_and_test_of_the_run(
        uninterrupted, tmp_path, task, stop):
    values, ref_dir, ref = uninterrupted[task]
    with pytest.raises(train.Stopped):
        train.run(cfg_of(values, tmp_path), [Faults(stop_at=STOPS[stop])])
    assert checkpoint.load(tmp_path / "last.pt")["step"] == STOPS[stop]
    result = train.run(cfg_of({**values, "checkpoint.resume": "auto"}, tmp_path))
    assert every_record(tmp_path) == every_record(ref_dir)
    assert (result["best_step"], result["tested"]) == (ref["best_step"], ref["tested"])
    assert diff_states(full(tmp_path / "best.pt")["model"], full(ref_dir / "best.pt")["model"]) == []


# -- a stop signal during an evaluation ------------------------------------------------------------------------------
@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("task", ["classify", "lm"])
def test_a_stop_during_an_evaluation_is_honoured_after_its_batch_and_a_resume_redoes_it_to_every_record_of_the_run(
        uninterrupted, tmp_path, task, stop):
    """SIGTERM lands in the evaluation's first forward: the run stops after that batch, not after the evaluation
    (which may be minutes long), and no record of the unfinished evaluation is written."""
    values, ref_dir, ref = uninterrupted[task]
    with pytest.raises(train.Stopped):
        train.run(cfg_of(values, tmp_path), [Faults(eval_stop_at=STOPS[stop])])
    assert checkpoint.load(tmp_path / "last.pt")["step"] == STOPS[stop]
    assert [r for r in runlog.read_metrics(tmp_path) if r["kind"] != "train" and r["step"] == STOPS[stop]] == []
    result = train.run(cfg_of({**values, "checkpoint.resume": "auto"}, tmp_path))
    assert every_record(tmp_path) == every_record(ref_dir)
    assert (result["best_step"], result["tested"]) == (ref["best_step"], ref["tested"])


# -- an evaluation that fails (out of memory) loses none of its period's training ------------------------------------
@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("task", ["classify", "lm"])
def test_an_evaluation_that_fails_keeps_its_periods_training_and_a_resume_redoes_it_to_every_record_of_the_run(
        uninterrupted, tmp_path, task, stop):
    values, ref_dir, ref = uninterrupted[task]
    values = {**values, "checkpoint.every_steps": 0}  # the default: no checkpoint within a period
    with pytest.raises(torch.OutOfMemoryError):
        train.run(cfg_of(values, tmp_path), [Faults(eval_fail_at=STOPS[stop])])
    assert checkpoint.load(tmp_path / "last.pt")["step"] == STOPS[stop]
    result = train.run(cfg_of({**values, "checkpoint.resume": "auto"}, tmp_path))
    assert every_record(tmp_path) == every_record(ref_dir)
    assert (result["best_step"], result["tested"]) == (ref["best_step"], ref["tested"])
    assert diff_states(full(tmp_path / "best.pt")["model"], full(ref_dir / "best.pt")["model"]) == []


@dataclass
class CountedProgress(train.Progress):
    hook_steps: int = 0  # the README's "piece of checkpointed state": one field more


class CountSteps(train.Hook):
    def step(self, progress):
        progress.hook_steps += 1


def test_a_field_added_to_progress_is_in_every_checkpoint_and_continues_after_a_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "Progress", CountedProgress)
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 10}, run_dir), [CountSteps()])
    assert checkpoint.load(run_dir / "last.pt")["hook_steps"] == 10
    train.run(cfg_of({**TINY, "checkpoint.resume": "auto"}, run_dir), [CountSteps()])
    assert checkpoint.load(run_dir / "last.pt")["hook_steps"] == STEPS


class EMA(train.Hook):
    """The README's example of a piece of checkpointed state: an exponential moving average of the weights."""

    def states(self, model):
        self.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        return {"ema": self.ema}  # the one entry: saved in every checkpoint, restored on resume

    def attach(self, model, module, progress):
        self.model = model

    def step(self, progress):
        self.ema.update_parameters(self.model)


def test_ema_weights_added_as_one_state_entry_continue_bitwise_after_a_resume(tmp_path):
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    train.run(cfg_of(TINY, ref_dir), [EMA()])
    train.run(cfg_of({**TINY, "train.max_steps": 10}, run_dir), [EMA()])
    train.run(cfg_of({**TINY, "checkpoint.resume": "auto"}, run_dir), [EMA()])
    last, ref = checkpoint.load(run_dir / "last.pt"), checkpoint.load(ref_dir / "last.pt")
    averaged = {name.removeprefix("module."): t for name, t in last["ema"].items() if name != "n_averaged"}
    assert last["ema"]["n_averaged"].item() == STEPS
    assert diff_states(last["ema"], ref["ema"]) == []
    assert diff_states(averaged, last["model"]) != []  # an average, not the weights themselves


def test_resuming_a_checkpoint_without_a_state_entry_the_run_now_keeps_is_one_line_exit_1(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 10}, run_dir))
    code = train.main(["--set", *sets({**TINY, "run.out_dir": str(run_dir), "checkpoint.resume": "auto"})], [EMA()])
    err = capsys.readouterr().err
    assert code == 1 and len(err.splitlines()) == 1 and "holds no ema" in err and "init_from" in err, err
