"""Day 6 gates: a run SIGKILLed at 5 random steps and resumed is bit-for-bit the run that never stopped, and
checkpoints survive kills mid-save, full disks, corruption and the wrong model.

Run:  python day06_ckpt_resume/check.py   (or `pytest day06_ckpt_resume`)
"""
import dataclasses
import errno
import hashlib
import itertools
import os
import pickletools
import random
import shutil
import signal
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day06_ckpt_resume import checkpoint, main as day, prove_resume as prove
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)

# 2,048 training images, 64 steps per epoch, 3 epochs: each run takes about a second after its imports.
SMALL = day.Config(train_subset=2048, batch_size=32, hidden=64, warmup_steps=20, ckpt_every=5, keep_last=2,
                   threads=1, device="cpu")
TOTAL = SMALL.epochs * prove.steps_per_epoch(SMALL)
KILLS = {w: prove.random_kill_points(TOTAL, n, seed=6 + w, first=SMALL.ckpt_every + 1) for w, n in ((0, 2), (2, 3))}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The lesson's demo on the small setting: one uninterrupted run, two SIGKILL chains (num_workers 0 and 2)."""
    tmp = tmp_path_factory.mktemp("day06")
    summary = prove.demo(SMALL, KILLS, tmp / "results", tmp / "runs")
    return {**summary, "tmp": tmp}


def sha_of_files(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def small_run_copy(demo, tmp_path) -> Path:
    """A private copy of the uninterrupted run's directory (checkpoints included) to break things in."""
    return Path(shutil.copytree(demo["reference"], tmp_path / "run"))


# --- the SIGKILL chains ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_runs_were_sigkilled_at_5_points_mid_epoch_with_0_and_2_workers(demo):
    segments = [s for c in demo["chains"].values() for s in c["segments"]]
    gates.check("processes ended by SIGKILL", sum(s["died_after_step"] is not None for s in segments), ">=", 5)
    for w, chain in demo["chains"].items():
        mid = sum(s["resumed_mid_epoch"] for s in chain["segments"])
        gates.check(f"resumes from a mid-epoch checkpoint, num_workers={w}", mid, ">=", 1)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_every_step_after_a_resume_has_the_uninterrupted_loss_bitwise(demo, workers):
    chain = demo["chains"][workers]
    gates.check(f"reference steps never recomputed by the chain, num_workers={workers}",
                chain["steps_never_computed"], "==", 0)
    gates.check(f"steps whose loss (float.hex) differs, num_workers={workers}", chain["loss_mismatches"], "==", 0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_every_step_after_a_resume_sees_the_uninterrupted_samples(demo, workers):
    chain = demo["chains"][workers]
    gates.check(f"steps whose sample indices differ, num_workers={workers}", chain["sample_mismatches"], "==", 0)


@pytest.mark.slow
def test_each_epoch_of_the_resumed_run_visits_every_sample_exactly_once(demo):
    records = checkpoint.read_metrics(Path(demo["chains"][2]["run_dir"]))
    bad = sum(sorted(i for r in records if r["kind"] == "train" and r["epoch"] == e for i in r["samples"])
              != list(range(SMALL.train_subset)) for e in range(SMALL.epochs))
    gates.check("epochs with a replayed or skipped sample after 3 kills", bad, "==", 0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_final_model_optimizer_scheduler_and_rng_state_are_bitwise_equal(demo, workers):
    diffs = demo["chains"][workers]["state_diffs"]
    gates.check(f"final state entries that differ, num_workers={workers}", len(diffs), "==", 0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_metrics_log_equals_the_uninterrupted_log(demo, workers):
    gates.check(f"metrics.jsonl identical after kills, num_workers={workers}",
                demo["chains"][workers]["final_log_equal"], "==", True)


@pytest.mark.slow
def test_state_comparison_detects_a_one_ulp_change(demo):
    ckpt = checkpoint.load_checkpoint(Path(demo["reference"]) / "last.pt")
    nudged = {k: v.clone() for k, v in ckpt["model"].items()}
    w = nudged["fc1.weight"].view(-1)
    w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))
    gates.check("differences found after a 1-ulp nudge", len(prove.diff_states(ckpt["model"], nudged)), "==", 1)


@pytest.mark.slow
def test_tensorboard_events_hold_every_logged_scalar_once(demo):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(demo["chains"][2]["run_dir"]) / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    expected = {"train/loss", "train/acc", "train/lr", "train/grad_norm", "val/loss", "val/acc"}
    gates.check("logged scalar tags missing from the event files", len(expected - set(events.Tags()["scalars"])),
                "==", 0)
    ref = [r for r in checkpoint.read_metrics(Path(demo["reference"])) if r["kind"] == "train"]
    tb = events.Scalars("train/loss")
    gates.check("train/loss events after 3 kills and purges (one per step)", len(tb), "==", len(ref))
    # TensorBoard stores float32: compare against the logged loss rounded the same way.
    off = sum(e.step != r["step"] or e.value != torch.tensor(r["loss"], dtype=torch.float32).item()
              for e, r in zip(tb, ref))
    gates.check("train/loss events whose step or value differs from metrics.jsonl", off, "==", 0)


@pytest.mark.slow
def test_keep_last_n_leaves_n_step_checkpoints_and_last_is_the_newest(demo):
    run = Path(demo["reference"])
    ckpts = sorted(run.glob("ckpt-*.pt"))
    gates.check("step checkpoints on disk", len(ckpts), "==", SMALL.keep_last)
    gates.check("last.pt is the newest checkpoint (same file)", os.path.samefile(run / "last.pt", ckpts[-1]),
                "==", True)


# --- saving: kills mid-save, crashes before the rename, full disks ---------------------------------------------
def payload(step: int) -> dict:
    return {"step": step, "w": torch.full((1 << 20,), float(step % 7))}  # 4 MB: a save takes a few ms


def test_sigkill_at_random_moments_during_saves_leaves_last_pt_loadable(tmp_path):
    templates = [payload(i) for i in range(7)]  # built before forking: the child only serialises
    checkpoint.save_checkpoint(payload(0), tmp_path, keep_last=2)
    rng, broken, mid_write = random.Random(0), 0, 0
    for trial in range(12):
        pid = os.fork()
        if pid == 0:  # child: save new checkpoints as fast as it can until killed
            try:
                for i in itertools.count(1):
                    step = 1000 * (trial + 1) + i
                    checkpoint.save_checkpoint({**templates[step % 7], "step": step}, tmp_path, keep_last=2)
            finally:
                os._exit(0)
        time.sleep(rng.uniform(0.01, 0.1))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        mid_write += bool(list(tmp_path.glob("*.tmp")))
        for p in [tmp_path / "last.pt", *tmp_path.glob("ckpt-*.pt")]:
            try:
                ckpt = checkpoint.load_checkpoint(p)
                broken += not bool((ckpt["w"] == ckpt["step"] % 7).all())
            except checkpoint.CheckpointError:
                broken += 1
        checkpoint.clean_stale_tmp(tmp_path)
    gates.check("kills that landed mid-save (a .tmp was left)", mid_write, ">=", 1)
    gates.check("unloadable or inconsistent checkpoints after 12 SIGKILLs", broken, "==", 0)


@pytest.mark.slow
def test_crash_between_temp_write_and_rename_keeps_last_pt_and_startup_cleans_the_temp(demo, tmp_path):
    run = small_run_copy(demo, tmp_path)
    before = sha_of_files(run)["last.pt"]
    pid = os.fork()
    if pid == 0:  # child: die exactly between the fsynced temporary file and os.replace
        try:
            os.replace = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
            checkpoint.save_checkpoint(payload(10_000), run, keep_last=2)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    gates.check("writer died by SIGKILL before os.replace", killed, "==", True)
    gates.check("temporary files left by the crash", len(list(run.glob("*.tmp"))), "==", 1)
    gates.check("last.pt unchanged by the crash", sha_of_files(run)["last.pt"] == before, "==", True)
    gates.check("last.pt still loads after the crash", checkpoint.load_checkpoint(run / "last.pt")["step"], "==", TOTAL)
    day.Trainer(SMALL, run)  # start-up
    gates.check("temporary files after the next start-up", len(list(run.glob("*.tmp"))), "==", 0)


def test_disk_full_raises_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    checkpoint.save_checkpoint(payload(1), tmp_path, keep_last=2)
    before = sha_of_files(tmp_path)

    def disk_full(obj, f):
        f.write(b"\0" * 4096)  # part of the file made it, then the disk filled up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.save_checkpoint(payload(2), tmp_path, keep_last=2)
    msg = str(err.value)
    gates.check("disk-full error names the file and the cause",
                "ckpt-00000002.pt" in msg and "No space left" in msg, "==", True)
    gates.check("files changed by the failed save", sha_of_files(tmp_path) != before, "==", False)


# --- loading: corruption, the wrong model, untrusted files -----------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "bit-flipped"])
def test_damaged_checkpoint_gives_an_error_naming_the_file_and_touches_nothing(demo, tmp_path, damage):
    run = small_run_copy(demo, tmp_path)
    data = bytearray((run / "last.pt").read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x10  # inside a tensor: torch.load alone would load it silently
    bad = run / f"{damage}.pt"
    bad.write_bytes(data)
    before = sha_of_files(run)
    with pytest.raises(checkpoint.CheckpointError) as err:
        day.Trainer(SMALL, run).resume(bad)
    gates.check(f"{damage} checkpoint: error names the file", str(bad) in str(err.value), "==", True)
    gates.check(f"{damage} checkpoint: files changed", sha_of_files(run) != before, "==", False)


@pytest.mark.slow
def test_checkpoint_of_a_different_model_lists_mismatched_keys_and_touches_nothing(demo, tmp_path):
    run = small_run_copy(demo, tmp_path)
    ckpt = checkpoint.load_checkpoint(run / "last.pt")
    # As saved from a torch.compile'd model: every key gains an `_orig_mod.` prefix.
    compiled = run / "compiled.pt"
    torch.save({**ckpt, "model": {f"_orig_mod.{k}": v for k, v in ckpt["model"].items()}}, compiled)
    before = sha_of_files(run)
    with pytest.raises(checkpoint.CheckpointError) as err:
        day.Trainer(SMALL, run).resume(compiled)
    msg = str(err.value)
    gates.check("prefixed keys: error names the file and lists missing and unexpected keys",
                str(compiled) in msg and "Missing key(s)" in msg and "Unexpected key(s)" in msg, "==", True)
    with pytest.raises(checkpoint.CheckpointError) as err:
        day.Trainer(dataclasses.replace(SMALL, hidden=32), run).resume(run / "last.pt")
    gates.check("hidden 64 checkpoint into hidden 32: error lists the size mismatches",
                "size mismatch for fc1.weight" in str(err.value), "==", True)
    gates.check("files changed by the failed resumes", sha_of_files(run) != before, "==", False)


@pytest.mark.slow
def test_checkpoint_references_only_torch_globals_so_weights_only_loads_it(demo):
    path = Path(demo["reference"]) / "last.pt"
    with zipfile.ZipFile(path) as zf:
        pkl = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    modules = {arg.split(" ")[0] for op, arg, _ in pickletools.genops(pkl) if op.name == "GLOBAL"}
    gates.check("pickled globals outside torch/collections (e.g. numpy)",
                sorted(m for m in modules if m.split(".")[0] not in ("torch", "collections")), "==", [])
    resumes = sum(s["resumed_from"] > 0 for c in demo["chains"].values() for s in c["segments"])
    gates.check("resumes that loaded with weights_only=True and no add_safe_globals", resumes, ">=", 5)


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    torch.save({"model": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.load_checkpoint(tmp_path / "evil.pt")
    gates.check("code from the malicious checkpoint ran", marker.exists(), "==", False)


# --- why the optimizer state is part of the checkpoint ---------------------------------------------------------
@pytest.mark.slow
def test_resuming_without_the_optimizer_state_changes_the_next_losses(demo):
    opt = demo["model_only"]
    gates.check("max |loss diff| over 20 steps, full resume", opt["full_max_abs_diff"], "==", 0.0)
    gates.check("max |loss diff| over 20 steps, model weights only", opt["model_only_max_abs_diff"], ">", 1e-3)


@pytest.mark.slow
def test_demo_writes_the_overlay_plot_and_the_optimizer_table(demo):
    out = demo["tmp"] / "results"
    gates.check("resume_overlay.png bytes", (out / "resume_overlay.png").stat().st_size, ">", 10_000)
    rows = (out / "optimizer_state.md").read_text().count("\n")
    gates.check("optimizer_state.md rows (header + 20 steps + max)", rows, "==", 23)


def test_nan_loss_stops_with_a_clear_error(tmp_path):
    trainer = day.Trainer(SMALL, tmp_path)
    x = torch.full((4, 1, 28, 28), float("nan"))
    with pytest.raises(FloatingPointError) as err:
        trainer.train_step(x, torch.zeros(4, dtype=torch.long))
    gates.check("NaN loss error says which step and what to do", "step 1" in str(err.value)
                and "--lr" in str(err.value), "==", True)


if __name__ == "__main__":
    run_this_file(__file__)
