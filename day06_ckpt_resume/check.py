"""Day 6 gates: a run SIGKILLed at 5 random steps and resumed is bit-for-bit the run that never stopped; checkpoints
survive kills mid-save and between the last.pt/best.pt links, real write failures, corruption, the wrong model and
changed flags; Ctrl-C saves; every flag is checked before any work; and overfitting is measured, not assumed.

Run:  python day06_ckpt_resume/check.py   (or `pytest day06_ckpt_resume`)
"""
import dataclasses
import hashlib
import itertools
import os
import pickletools
import random
import resource
import shutil
import signal
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day06_ckpt_resume import checkpoint, main as day, overfit_lab, prove_resume as prove
from sprint.device import ABSENT_CUDA
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)

# 2,048 training images, batch 32: 64 steps per epoch, 3 epochs; a checkpoint every 5 steps.
SMALL = day.Config(train_subset=2048, batch_size=32, hidden=64, warmup_steps=20, ckpt_every=5, keep_last=2,
                   threads=1, device="cpu")
TOTAL = SMALL.epochs * prove.steps_per_epoch(SMALL)
KILLS = {w: prove.random_kill_points(TOTAL, n, seed=6 + w, first=SMALL.ckpt_every + 1) for w, n in ((0, 2), (2, 3))}
SMALL_FLAGS = prove.config_args(SMALL)


@pytest.fixture(scope="module")
def proof(tmp_path_factory) -> prove.Proof:
    """prove_resume on the small setting: one uninterrupted run, two SIGKILL chains (num_workers 0 and 2)."""
    tmp = tmp_path_factory.mktemp("day06")
    return prove.prove(SMALL, KILLS, tmp / "results", tmp / "runs")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """Uninterrupted in-process runs of 1 and 3 epochs: {epochs: run folder}."""
    tmp = tmp_path_factory.mktemp("reference")
    for epochs in (1, 3):
        day.train(dataclasses.replace(SMALL, epochs=epochs), tmp / f"e{epochs}")
    return {epochs: tmp / f"e{epochs}" for epochs in (1, 3)}


def sha_of_files(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def run_copy(source: Path, tmp_path) -> Path:
    """A private copy of a finished run's folder (checkpoints included) to break things in."""
    return Path(shutil.copytree(source, tmp_path / "run"))


def final_report(run_dir: Path) -> dict:
    return next(r for r in checkpoint.read_metrics(run_dir) if r["kind"] == "test")


# --- the SIGKILL chains ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_runs_were_sigkilled_at_5_points_mid_epoch_with_0_and_2_workers(proof):
    segments = [s for c in proof.chains.values() for s in c.segments]
    gates.check("processes ended by SIGKILL", sum(s.died_after_step is not None for s in segments), ">=", 5)
    for w, chain in proof.chains.items():
        mid = sum(s.resumed_mid_epoch for s in chain.segments)
        gates.check(f"resumes from a mid-epoch checkpoint, num_workers={w}", mid, ">=", 1)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_every_step_after_a_resume_has_the_uninterrupted_loss_bitwise(proof, workers):
    c = proof.chains[workers].comparison
    gates.check(f"reference steps never recomputed by the chain, num_workers={workers}", c.steps_never_computed,
                "==", 0)
    gates.check(f"steps whose loss (float.hex) differs, num_workers={workers}", c.loss_mismatches, "==", 0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_every_step_after_a_resume_sees_the_uninterrupted_samples(proof, workers):
    gates.check(f"steps whose sample indices differ, num_workers={workers}",
                proof.chains[workers].comparison.sample_mismatches, "==", 0)


@pytest.mark.slow
def test_each_epoch_of_the_resumed_run_visits_every_sample_exactly_once(proof):
    records = checkpoint.read_metrics(Path(proof.chains[2].run_dir))
    bad = sum(sorted(i for r in records if r["kind"] == "train" and r["epoch"] == e for i in r["samples"])
              != list(range(SMALL.train_subset)) for e in range(SMALL.epochs))
    gates.check("epochs with a replayed or skipped sample after 3 kills", bad, "==", 0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_final_model_optimizer_scheduler_and_rng_state_are_bitwise_equal(proof, workers):
    diffs = proof.chains[workers].comparison.state_diffs
    gates.check(f"final state entries that differ, num_workers={workers}", len(diffs), "==", 0)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_metrics_log_equals_the_uninterrupted_log(proof, workers):
    gates.check(f"metrics.jsonl identical after kills, num_workers={workers}",
                proof.chains[workers].comparison.final_log_equal, "==", True)


@pytest.mark.slow
def test_state_comparison_detects_a_one_ulp_change(proof):
    ckpt = checkpoint.load_checkpoint(proof.reference / "last.pt")
    nudged = {k: v.clone() for k, v in ckpt["model"].items()}
    w = nudged["fc1.weight"].view(-1)
    w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))
    gates.check("differences found after a 1-ulp nudge", len(prove.diff_states(ckpt["model"], nudged)), "==", 1)


@pytest.mark.slow
def test_tensorboard_events_hold_every_logged_scalar_once(proof):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(proof.chains[2].run_dir) / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    expected = {"train/loss", "train/acc", "train/lr", "train/grad_norm", "val/loss", "val/acc"}
    gates.check("logged scalar tags missing from the event files", len(expected - set(events.Tags()["scalars"])),
                "==", 0)
    ref = [r for r in checkpoint.read_metrics(proof.reference) if r["kind"] == "train"]
    tb = events.Scalars("train/loss")
    gates.check("train/loss events after 3 kills and purges (one per step)", len(tb), "==", len(ref))
    # TensorBoard stores float32: compare against the logged loss rounded the same way.
    off = sum(e.step != r["step"] or e.value != torch.tensor(r["loss"], dtype=torch.float32).item()
              for e, r in zip(tb, ref))
    gates.check("train/loss events whose step or value differs from metrics.jsonl", off, "==", 0)


@pytest.mark.slow
def test_keep_last_n_leaves_n_step_checkpoints_and_last_is_the_newest(proof):
    ckpts = sorted(proof.reference.glob("ckpt-*.pt"))
    gates.check("step checkpoints on disk", len(ckpts), "==", SMALL.keep_last)
    gates.check("last.pt is the newest checkpoint (same file)",
                os.path.samefile(proof.reference / "last.pt", ckpts[-1]), "==", True)


# --- saving: kills mid-save, between the links, before the rename; real write failures -------------------------
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


def sigkill_when_linking_best(cfg: day.Config, run_dir: Path, at_step: int) -> bool:
    """Train `cfg` in a forked child that SIGKILLs itself right after last.pt points at step `at_step` and before
    best.pt does: the window between the two links of save_checkpoint. True if it died there."""
    pid = os.fork()
    if pid == 0:
        try:
            link = checkpoint.atomic_link

            def link_or_die(src: Path, dst: Path) -> None:
                if dst.name == "best.pt" and src.name == f"ckpt-{at_step:08d}.pt":
                    os.kill(os.getpid(), signal.SIGKILL)
                link(src, dst)

            checkpoint.atomic_link = link_or_die
            day.train(cfg, run_dir)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [1, 3])
def test_sigkill_between_last_and_best_links_is_repaired_on_resume(reference, tmp_path, epochs):
    cfg, end = dataclasses.replace(SMALL, epochs=epochs), epochs * 64  # the last epoch improves in both settings
    gates.check(f"writer SIGKILLed between last.pt and best.pt at step {end}, epochs={epochs}",
                sigkill_when_linking_best(cfg, tmp_path, end), "==", True)
    last, best = checkpoint.load_checkpoint(tmp_path / "last.pt"), tmp_path / "best.pt"
    stale = not best.exists() or checkpoint.load_checkpoint(best)["step"] != last["best_step"]
    gates.check(f"best.pt stale after the kill (last.pt says the best is step {end}), epochs={epochs}",
                stale and last["best_step"] == end, "==", True)
    report = day.train(cfg, tmp_path, resume=tmp_path / "last.pt")  # nothing left to train: the final report
    gates.check(f"best.pt step after the resume, epochs={epochs}", checkpoint.load_checkpoint(best)["step"], "==", end)
    gates.check(f"final test loss equals the uninterrupted run's (bitwise), epochs={epochs}",
                report["test_loss"], "==", final_report(reference[epochs])["test_loss"])


@pytest.mark.slow
def test_crash_between_temp_write_and_rename_keeps_last_pt_and_startup_cleans_the_temp(reference, tmp_path):
    run_dir = run_copy(reference[3], tmp_path)
    before = sha_of_files(run_dir)["last.pt"]
    pid = os.fork()
    if pid == 0:  # child: die exactly between the fsynced temporary file and os.replace
        try:
            os.replace = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
            checkpoint.save_checkpoint(payload(10_000), run_dir, keep_last=2)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    gates.check("writer died by SIGKILL before os.replace", killed, "==", True)
    gates.check("temporary files left by the crash", len(list(run_dir.glob("*.tmp"))), "==", 1)
    gates.check("last.pt unchanged by the crash", sha_of_files(run_dir)["last.pt"] == before, "==", True)
    gates.check("last.pt still loads after the crash", checkpoint.load_checkpoint(run_dir / "last.pt")["step"],
                "==", TOTAL)
    day.Trainer(SMALL, run_dir)  # start-up
    gates.check("temporary files after the next start-up", len(list(run_dir.glob("*.tmp"))), "==", 0)


def save_in_child_with_file_size_limit(run_dir: Path, limit: int) -> str:
    """save_checkpoint(payload(2)) in a forked child whose files may not grow past `limit` bytes (RLIMIT_FSIZE, what
    `ulimit -f` sets): the kernel fails the write part-way with EFBIG. Returns the child's exception as text."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # otherwise the kernel kills the writer instead
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
            try:
                checkpoint.save_checkpoint(payload(2), run_dir, keep_last=2)
                outcome = "no error"
            except BaseException as exc:  # report whatever escapes, exactly as a caller would see it
                outcome = f"{type(exc).__name__}: {exc}"
            os.write(write_end, outcome.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        outcome = f.read()
    os.waitpid(pid, 0)
    return outcome


def outcome_of_saving_step_2(run_dir: Path) -> str:
    try:
        checkpoint.save_checkpoint(payload(2), run_dir, keep_last=2)
        return "no error"
    except Exception as exc:  # whatever escapes, exactly as a caller would see it
        return f"{type(exc).__name__}: {exc}"


def assert_failed_save_is_clean(name: str, outcome: str, cause: str, run_dir: Path, before: dict) -> None:
    gates.check(f"{name}: CheckpointError naming the file and the cause", outcome.startswith("CheckpointError")
                and "ckpt-00000002.pt" in outcome and cause in outcome, "==", True)
    gates.check(f"{name}: temporary files left", len(list(run_dir.glob("*.tmp"))), "==", 0)
    gates.check(f"{name}: files changed", sha_of_files(run_dir) != before, "==", False)
    gates.check(f"{name}: last.pt still loads the previous step",
                checkpoint.load_checkpoint(run_dir / "last.pt")["step"], "==", 1)


def test_a_write_that_hits_the_file_size_limit_part_way_keeps_the_previous_checkpoint(tmp_path):
    checkpoint.save_checkpoint(payload(1), tmp_path, keep_last=2)
    before = sha_of_files(tmp_path)
    outcome = save_in_child_with_file_size_limit(tmp_path, limit=1 << 20)  # 1 MiB of a 4 MiB checkpoint
    assert_failed_save_is_clean("file size limit (EFBIG)", outcome, "File too large", tmp_path, before)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="/dev/full (a device that is always full) is Linux-only")
def test_a_full_device_gives_a_clear_error_and_keeps_the_previous_checkpoint(tmp_path):
    checkpoint.save_checkpoint(payload(1), tmp_path, keep_last=2)
    before = sha_of_files(tmp_path)
    (tmp_path / "ckpt-00000002.pt.tmp").symlink_to("/dev/full")  # every write to it fails with ENOSPC
    outcome = outcome_of_saving_step_2(tmp_path)
    assert_failed_save_is_clean("full device (ENOSPC)", outcome, "No space left on device", tmp_path, before)


def test_a_failed_rename_gives_a_clear_error_and_removes_the_temp(tmp_path):
    checkpoint.save_checkpoint(payload(1), tmp_path, keep_last=2)
    (tmp_path / "ckpt-00000002.pt").mkdir()  # a folder squats the name: os.replace fails with EISDIR
    (tmp_path / "ckpt-00000002.pt" / "x").write_text("")
    before = sha_of_files(tmp_path)
    outcome = outcome_of_saving_step_2(tmp_path)
    assert_failed_save_is_clean("failed rename", outcome, "Is a directory", tmp_path, before)


# --- stopping on purpose: Ctrl-C -------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigint_finishes_the_step_saves_and_the_resumed_run_is_exact(reference, tmp_path):
    trainer, forwards, at = day.Trainer(SMALL, tmp_path), [0], 100  # mid-way through epoch 2

    def ctrl_c_at_step(module, inputs, output):
        forwards[0] += module.training
        if module.training and forwards[0] == at:
            os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of step `at`

    trainer.model.register_forward_hook(ctrl_c_at_step)
    handler_before = signal.getsignal(signal.SIGINT)  # SIG_IGN, not Python's default, in a job started with `&`
    with pytest.raises(KeyboardInterrupt):
        trainer.fit()
    gates.check("last.pt step after Ctrl-C during step 100", checkpoint.load_checkpoint(tmp_path / "last.pt")["step"],
                "==", at)
    gates.check("SIGINT handler restored after fit", signal.getsignal(signal.SIGINT), "==", handler_before)
    day.train(SMALL, tmp_path, resume=tmp_path / "last.pt")
    gates.check("metrics.jsonl after Ctrl-C and resume equals the uninterrupted run's",
                checkpoint.read_metrics(tmp_path) == checkpoint.read_metrics(reference[3]), "==", True)


# --- loading: corruption, the wrong model, changed flags, untrusted files ------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "bit-flipped"])
def test_damaged_checkpoint_gives_an_error_naming_the_file_and_touches_nothing(reference, tmp_path, damage):
    run_dir = run_copy(reference[3], tmp_path)
    data = bytearray((run_dir / "last.pt").read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 2] ^= 0x10  # inside a tensor: torch.load alone would load it silently
    bad = run_dir / f"{damage}.pt"
    bad.write_bytes(data)
    before = sha_of_files(run_dir)
    with pytest.raises(checkpoint.CheckpointError) as err:
        day.Trainer(SMALL, run_dir).resume(bad)
    gates.check(f"{damage} checkpoint: error names the file", str(bad) in str(err.value), "==", True)
    gates.check(f"{damage} checkpoint: files changed", sha_of_files(run_dir) != before, "==", False)


@pytest.mark.slow
def test_a_truncated_last_pt_is_one_line_naming_the_newest_loadable_checkpoint(reference, tmp_path, run_cli,
                                                                                monkeypatch):
    run_dir = run_copy(reference[3], tmp_path)  # the copy holds last.pt and ckpt-*.pt as separate files
    os.truncate(run_dir / "last.pt", (run_dir / "last.pt").stat().st_size // 2)
    monkeypatch.setattr(day, "mnist_split", lambda *a: pytest.fail("the data was loaded before the refusal"))
    code, lines = run_cli(day.main, ["--resume", str(run_dir / "last.pt")])
    newest = sorted(run_dir.glob("ckpt-*.pt"))[-1]
    gates.check("truncated last.pt: exit code, stderr lines", (code, len(lines)), "==", (1, 1))
    gates.check("truncated last.pt: the message names the newest loadable ckpt-*.pt and how to resume from it",
                f"--resume {newest}" in lines[0], "==", True)


@pytest.mark.slow
@pytest.mark.parametrize("prefix", ["_orig_mod.", "module."])
def test_checkpoint_of_a_wrapped_model_lists_mismatched_keys_names_the_wrapper_and_touches_nothing(reference,
                                                                                                  tmp_path, prefix):
    run_dir = run_copy(reference[3], tmp_path)
    ckpt = checkpoint.load_checkpoint(run_dir / "last.pt")
    # As saved from a torch.compile'd model (_orig_mod.) or a DistributedDataParallel one (module.).
    wrapped = run_dir / "wrapped.pt"
    torch.save({**ckpt, "model": {f"{prefix}{k}": v for k, v in ckpt["model"].items()}}, wrapped)
    before = sha_of_files(run_dir)
    with pytest.raises(checkpoint.CheckpointError) as err:
        day.Trainer(SMALL, run_dir).resume(wrapped)
    msg = str(err.value)
    gates.check(f"{prefix} keys: error names the file, the wrapper, missing and unexpected keys",
                str(wrapped) in msg and f"start with '{prefix}'" in msg and "Missing key(s)" in msg
                and "Unexpected key(s)" in msg, "==", True)
    gates.check(f"{prefix} keys: files changed by the failed resume", sha_of_files(run_dir) != before, "==", False)


@pytest.mark.slow
def test_weights_of_another_size_list_the_size_mismatches(reference, tmp_path):
    run_dir = run_copy(reference[3], tmp_path)
    ckpt = checkpoint.load_checkpoint(run_dir / "last.pt")
    relabelled = run_dir / "relabelled.pt"  # hidden-64 weights in a checkpoint whose config says hidden 32
    torch.save({**ckpt, "config": {**ckpt["config"], "hidden": 32}}, relabelled)
    with pytest.raises(checkpoint.CheckpointError) as err:
        day.Trainer(dataclasses.replace(SMALL, hidden=32), run_dir).resume(relabelled)
    gates.check("hidden 64 weights into hidden 32: error lists the size mismatches",
                "size mismatch for fc1.weight" in str(err.value), "==", True)


@pytest.mark.slow
def test_resuming_with_changed_flags_is_refused_before_loading_data_and_lists_them(reference, tmp_path, run_cli,
                                                                                   monkeypatch):
    run_dir = run_copy(reference[1], tmp_path)
    before = sha_of_files(run_dir)
    monkeypatch.setattr(day, "mnist_split", lambda *a: pytest.fail("the data was loaded before the refusal"))
    code, lines = run_cli(day.main, ["--resume", str(run_dir / "last.pt"), "--lr", "0.01", "--seed", "3",
                                  "--batch-size", "64", "--epochs", "2"])
    gates.check("changed --lr/--seed/--batch-size on resume: exit code, stderr lines", (code, len(lines)), "==", (1, 1))
    gates.check("the refusal lists each changed flag with both values, not the safe --epochs",
                all(f in lines[0] for f in ("--lr 0.002 -> 0.01", "--seed 0 -> 3", "--batch-size 32 -> 64"))
                and "--epochs 1 -> 2" not in lines[0], "==", True)
    gates.check("files changed by the refused resume", sha_of_files(run_dir) != before, "==", False)


@pytest.mark.slow
def test_resuming_with_only_safe_changes_continues_with_the_checkpoint_settings(reference, tmp_path):
    run_dir = run_copy(reference[1], tmp_path)
    report = day.main(["--resume", str(run_dir / "last.pt"), "--epochs", "2", "--num-workers", "1"])
    saved = checkpoint.load_checkpoint(run_dir / "last.pt")["config"]
    gates.check("steps after resuming a 1-epoch run with --epochs 2 (flags not given: the checkpoint's)",
                report["step"], "==", 128)
    gates.check("config of the resumed run: hidden, lr, epochs", (saved["hidden"], saved["lr"], saved["epochs"]),
                "==", (SMALL.hidden, SMALL.lr, 2))


@pytest.mark.slow
def test_checkpoint_references_only_torch_globals_so_weights_only_loads_it(proof):
    with zipfile.ZipFile(proof.reference / "last.pt") as zf:
        pkl = zf.read(next(n for n in zf.namelist() if n.endswith("data.pkl")))
    modules = {arg.split(" ")[0] for op, arg, _ in pickletools.genops(pkl) if op.name == "GLOBAL"}
    gates.check("pickled globals outside torch/collections (e.g. numpy)",
                sorted(m for m in modules if m.split(".")[0] not in ("torch", "collections")), "==", [])
    resumes = sum(s.resumed_from > 0 for c in proof.chains.values() for s in c.segments)
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
def test_resuming_without_the_optimizer_state_changes_the_next_losses(proof):
    gates.check("max |loss diff| over 20 steps, full resume", proof.model_only.full_max_abs_diff, "==", 0.0)
    gates.check("max |loss diff| over 20 steps, model weights only", proof.model_only.model_only_max_abs_diff,
                ">", 1e-3)


@pytest.mark.slow
def test_prove_resume_writes_the_overlay_plot_the_optimizer_table_and_the_summary(proof):
    out = proof.reference.parents[1] / "results"
    gates.check("resume_overlay.png bytes", (out / "resume_overlay.png").stat().st_size, ">", 10_000)
    rows = (out / "optimizer_state.md").read_text().count("\n")
    gates.check("optimizer_state.md rows (header + 20 steps + max)", rows, "==", 23)
    gates.check("summary.json names the machine", "cores" in (out / "summary.json").read_text(), "==", True)


def test_nan_loss_stops_with_a_clear_error(tmp_path):
    trainer = day.Trainer(SMALL, tmp_path)
    x = torch.full((4, 1, 28, 28), float("nan"))
    with pytest.raises(FloatingPointError) as err:
        trainer.train_step(x, torch.zeros(4, dtype=torch.long))
    gates.check("NaN loss error says which step and what to do", "step 1" in str(err.value)
                and "--lr" in str(err.value), "==", True)


# --- the command line: every flag checked before any work ------------------------------------------------------
BAD_FLAGS = {
    "main": (day.main, [["--epochs", "0"], ["--lr", "-1"], ["--lr", "nan"], ["--batch-size", "0"], ["--dropout", "1"],
                        ["--keep-last", "1"], ["--train-subset", "-5"], ["--train-subset", "60000"],
                        ["--val-size", "0"], ["--device", ABSENT_CUDA], ["--device", "gpu"], ["--min-lr-ratio", "2"],
                        ["--resume", "no-such.pt"], ["--epochs", "two"], ["--bogus"]]),
    "prove_resume": (prove.main, [["--kills", "2"], ["--workers", "-1", "2"], ["--kills", "0", "3"],
                                  ["--device", ABSENT_CUDA]]),
    "overfit_lab": (overfit_lab.main, [["--subset", "0"], ["--epochs", "0"], ["--patience", "0"], ["--dropout", "1"],
                                       ["--weight-decay", "-1"], ["--device", "gpu"]]),
}


@pytest.mark.parametrize("script, argv", [(s, a) for s, (_, cases) in BAD_FLAGS.items() for a in cases],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(script, argv, tmp_path):
    gates.refuses(BAD_FLAGS[script][0], argv, tmp_path / "out")


@pytest.mark.slow
def test_training_into_an_existing_run_is_refused_before_loading_data(reference, tmp_path, run_cli, monkeypatch):
    run_dir = run_copy(reference[1], tmp_path)
    monkeypatch.setattr(day, "mnist_split", lambda *a: pytest.fail("the data was loaded before the refusal"))
    code, lines = run_cli(day.main, [*SMALL_FLAGS, "--out", str(run_dir)])
    gates.check("existing run: exit code, stderr lines, names --resume", (code, len(lines), "--resume" in lines[0]),
                "==", (1, 1, True))


@pytest.mark.parametrize("script", list(BAD_FLAGS))
def test_every_flag_has_a_help_text(script, parser_of):
    silent = [a.dest for a in parser_of(BAD_FLAGS[script][0])._actions if not (a.help or "").strip()]
    gates.check(f"{script}: flags without a help text", silent, "==", [])


# --- overfitting, measured (overfit_lab.py, default settings) ---------------------------------------------------
@pytest.fixture(scope="module")
def lab(tmp_path_factory) -> overfit_lab.Lab:
    return overfit_lab.run_lab(overfit_lab.LabConfig(), tmp_path_factory.mktemp("overfit"))


@pytest.mark.slow
def test_without_regularisation_the_subset_is_memorised_while_validation_loss_turns_up(lab):
    base = lab.curves["no regularisation"]
    gates.check("training-subset accuracy at the last epoch, no regularisation (eval mode)", base.train_acc[-1],
                ">=", 0.99)
    gates.check("validation loss at the last epoch / its minimum, no regularisation", base.val_loss[-1]
                / min(base.val_loss), ">=", 1.05)
    gates.check("epoch of the lowest validation loss, before the last", base.best_epoch, "<", lab.config.epochs)


@pytest.mark.slow
def test_early_stopping_stops_after_patience_epochs_without_improvement(lab):
    e, full = lab.early_stop, lab.curves["no regularisation"].val_loss
    best, waited, expected = float("inf"), 0, len(full)  # the rule, applied to the run that never stopped
    for epoch, loss in enumerate(full, 1):
        best, waited = (loss, 0) if loss < best else (best, waited + 1)
        if waited == e.patience:
            expected = epoch
            break
    gates.check("epoch after which early stopping stopped (expected from the full run's curve)",
                e.stopped_after_epoch, "==", expected)
    gates.check("validation losses of the early-stopped run equal the full run's up to the stop (bitwise)",
                e.val_loss == full[:expected], "==", True)


@pytest.mark.slow
def test_best_pt_holds_the_epoch_of_the_lowest_validation_loss(lab):
    e = lab.early_stop
    gates.check("step held by best.pt (loaded back) == step of the lowest validation loss", e.best_pt_step, "==",
                e.step_of_best_epoch)
    gates.check("validation loss of best.pt's weights, evaluated again == the lowest logged", e.best_pt_val_loss,
                "==", min(e.val_loss))


@pytest.mark.slow
@pytest.mark.parametrize("regulariser", ["Dropout", "weight decay", "augmentation"])
def test_each_regulariser_narrows_the_gap_between_validation_and_training_loss(lab, regulariser):
    base = lab.curves["no regularisation"]
    run_ = next(c for name, c in lab.curves.items() if name.startswith(regulariser))
    gates.check(f"gap (val - train loss) at the last epoch, {run_.name} / no regularisation", run_.gap / base.gap,
                "<", 0.95)


if __name__ == "__main__":
    run_this_file(__file__)
