"""The training loop's contract, one behaviour per test: each task trains end to end, a bad config is refused with
exit 2 naming the field before anything is written, a non-finite loss stops the run before its step, and a corrupt,
truncated or foreign checkpoint is refused in one line."""
import errno
import json
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from train_template import checkpoint, runlock, runlog, train
from train_template.troubleshoot.faults import Faults
from helpers import STEPS, TINY, cfg_of, sets, tiny_lm, tiny_tokens, train_records


@pytest.fixture(scope="module")
def tasks(corpus) -> dict:
    """The tiny run of each task: an MLP classifier on generated images, a GPT on the generated corpus."""
    return {"classify": TINY, "lm": tiny_lm(corpus)}


@pytest.mark.parametrize("task", ["classify", "lm"])
def test_each_task_trains_evaluates_and_leaves_its_run_folder(task, tasks, tmp_path):
    run_dir = tmp_path / "run"
    result = train.run(cfg_of(tasks[task], run_dir))
    losses = [r["loss"] for r in runlog.read_metrics(run_dir) if r["kind"] == "train"]
    evaluations = [r for r in runlog.read_metrics(run_dir) if r["kind"] == "val"]
    assert len(losses) == STEPS and sum(losses[-4:]) < sum(losses[:4]), losses
    assert len(evaluations) == 2 and result["step"] == STEPS
    for name in ("config.toml", "run.json", "metrics.jsonl", "last.pt", "best.pt"):
        assert (run_dir / name).exists(), name
    assert checkpoint.load(run_dir / "last.pt")["step"] == STEPS


BAD_INPUT = [  # (--set overrides or a config file's text, a word the one-line message must contain)
    (["optim.lr=0"], "optim.lr"),
    (["optim.lr=-1e-3"], "optim.lr"),
    (["optim.lr=nan"], "optim.lr"),
    (["lr=1e-3"], "did you mean `optim.lr`"),
    (["optim.lrr=1e-3"], "did you mean `optim.lr`"),
    (["train.grad_accum=0"], "train.grad_accum"),
    (["checkpoint.async_save=true"], "checkpoint.format=sharded"),  # one process, format auto: full checkpoints
    (["data.dataset=mnsit"], "did you mean `mnist`"),
    (["model.name=vit"], "model.name"),
    (["train.amp_dtype=fp8"], "train.amp_dtype"),
    (["train.batch_size=100", "train.grad_accum=3"], "train.batch_size"),
    (["train.epochs=two"], "train.epochs"),
    (["train.amp=yes"], "train.amp"),
    (["model.resnet.widths=[16, 0]"], "model.resnet.widths"),
    (["run.device=gpu"], "run.device"),
    (["data.dataset=imagefolder"], "data.root"),
    (["optim"], "key=value"),
    ("[optimizer]\nlr = 1e-3\n", "did you mean `optim"),
    ("[optim]\nlr = \n", "not valid TOML"),
    ("[train]\nbatch_size = 12.5\n", "train.batch_size"),
    (["run.seed=-1"], "run.seed must be >= 0 and <= 4294967295"),  # NumPy's seed range, not its traceback
    (["run.seed=4294967296"], "run.seed must be >= 0 and <= 4294967295"),
    (["model.mlp.hidden=99999999999999999999"], "model.mlp.hidden must fit in 64 bits"),  # not a C++ overflow
    (["model.resnet.widths=[16, 99999999999999999999]"], "model.resnet.widths[1] must fit in 64 bits"),
    (["data.num_workers=1000000"], "data.num_workers"),  # a million worker processes: an OOM kill
    (["run.out_dir=/proc/template/run"], "cannot create /proc/template"),  # os.access says yes to root there
    (b"\xff\xfe[optim]\n", "is not UTF-8"),
    # language models: the GPT's table, text vs images, steps vs epochs
    (["model.gpt.n_layer=0"], "model.gpt.n_layer"),
    (["model.name=gpt", "data.dataset=shakespeare", "train.steps=10", "model.gpt.n_embd=100", "model.gpt.n_head=3"],
     "model.gpt.n_embd=100 must be divisible by model.gpt.n_head=3"),
    (["model.name=gpt", "data.dataset=shakespeare", "train.steps=10", "data.shakespeare.block_size=128"],
     "data.shakespeare.block_size=128 exceeds model.gpt.block_size=64"),
    (["data.dataset=shakespeare", "train.steps=10"], "model.name=mlp learns the 'classify' task"),
    (["model.name=gpt", "data.dataset=shakespeare"], "train.steps"),
    (["model.gpt.bias=maybe"], "model.gpt.bias"),
    (["model.gpt.n_layers=4"], "did you mean `model.gpt.n_layer`"),
    (["data.block_size=32"], "did you mean `data.shakespeare.block_size` or `data.tokens.block_size`?"),  # a table's
    (["data.shakespeare.val_size=10"], "`data.synthetic.val_size`"),  # a field the image datasets have
    ("[model.transformer]\nn_layer = 4\n", "unknown config key `model.transformer`"),
    (["data.dataset=tokens", "model.name=gpt", "train.steps=10"], "data.root"),
]


def test_malformed_configs_exit_2_with_one_line_naming_the_field_and_write_nothing(tmp_path, capsys):
    for i, (bad, word) in enumerate(BAD_INPUT):
        out = tmp_path / f"run{i}"
        argv = ["--set", f"run.out_dir={out}"]
        if isinstance(bad, (str, bytes)):
            (tmp_path / f"bad{i}.toml").write_bytes(bad if isinstance(bad, bytes) else bad.encode())
            argv = ["--config", str(tmp_path / f"bad{i}.toml"), *argv]
        else:
            argv += bad
        code = train.main(argv)
        err = capsys.readouterr().err
        assert code == 2 and word in err and len(err.strip().splitlines()) == 1 and not out.exists(), (bad, code, err)


NAN_MODULES = {"classify": ["blocks.0.0", "blocks.0.1", "blocks.0.2", "head"],
               "lm": ["wte", "blocks.0.attn", "blocks.1.mlp.c_fc", "ln_f"]}


@pytest.mark.parametrize("task", ["classify", "lm"])
def test_a_nan_at_a_random_step_stops_before_that_step_names_the_module_and_keeps_the_last_good_checkpoint(
        task, tasks, tmp_path, capsys):
    rng = random.Random()
    step, module = rng.randrange(5, STEPS), rng.choice(NAN_MODULES[task])
    run_dir = tmp_path / "run"
    code = train.main(["--set", *sets({**tasks[task], "run.out_dir": str(run_dir)})],
                      [Faults(nan_step=step, nan_module=module)])
    err = capsys.readouterr().err
    assert code == 1 and f"at step {step} " in err and f"output: {module} " in err, err
    assert max(train_records(run_dir)) == step - 1  # the NaN step itself never updated the weights or got logged
    assert all(checkpoint.step_of(p) < step for p in run_dir.glob("*.pt"))
    assert checkpoint.load(run_dir / "last.pt")["step"] < step


def test_corrupt_truncated_and_foreign_checkpoints_fail_with_one_clear_message(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 3}, run_dir))
    good = (run_dir / "last.pt").read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF  # inside a tensor: torch.load alone would not notice
    cases = {"corrupted": bytes(flipped), "unreadable": good[: len(good) // 3], "not a checkpoint of this template":
             None}
    for word, content in cases.items():
        bad = tmp_path / f"{word.split()[0]}.pt"
        if content is None:
            torch.save({"model": {}}, bad)
        else:
            bad.write_bytes(content)
        code = train.main(["--set", *sets({**TINY, "run.out_dir": str(tmp_path / f"new-{word[:4]}"),
                                "checkpoint.resume": str(bad)})])
        err = capsys.readouterr().err
        assert code == 1 and word in err and str(bad) in err, (word, code, err)
    code = train.main(["--set", *sets({**TINY, "run.out_dir": str(run_dir), "checkpoint.resume": "auto",
                                       "model.name": "resnet"})])
    err = capsys.readouterr().err
    assert code == 2 and "model.name" in err, err  # resumed into another model
    code = train.main(["--set", *sets({**TINY, "run.out_dir": str(tmp_path / "ft"), "model.mlp.hidden": 48,
                            "checkpoint.init_from": str(run_dir / "last.pt")})])
    err = capsys.readouterr().err
    assert code == 1 and "shapes differ" in err, err  # init_from a differently sized model


def text_run(root: Path) -> dict:
    """The smallest GPT run on nanoGPT's token files in `root`: one layer, windows of 16, 4 steps, one evaluation."""
    return {**tiny_tokens(root), "data.tokens.block_size": 16,
            "data.tokens.eval_windows": 16, "model.gpt.n_layer": 1, "model.gpt.block_size": 16, "train.steps": 4,
            "train.eval_every": 4}


def token_folder(root: Path, vocab: int) -> Path:
    """train.bin and val.bin of random ids below `vocab`, and meta.json saying so."""
    ids = np.random.default_rng(vocab).integers(0, vocab, 3000, dtype=np.uint16)
    root.mkdir()
    ids[:2500].tofile(root / "train.bin")
    ids[2500:].tofile(root / "val.bin")
    (root / "meta.json").write_text(json.dumps({"vocab_size": vocab}))
    return root


def test_resuming_onto_data_of_another_vocabulary_exits_2_naming_both_and_the_meta_file(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(cfg_of(text_run(token_folder(tmp_path / "v50", 50)), run_dir))
    other = token_folder(tmp_path / "v60", 60)
    capsys.readouterr()
    code = train.main(["--set", *sets({**text_run(other), "run.out_dir": str(run_dir),
                                       "checkpoint.resume": "auto", "train.steps": 8})])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "vocab_size 60" in err and "vocab_size 50" in err and str(other / "meta.json") in err, err


def test_a_text_run_setting_train_epochs_warns_once_on_stderr_that_train_steps_counts(tmp_path, capsys):
    root = token_folder(tmp_path / "tokens", 50)
    train.run(cfg_of({**text_run(root), "train.epochs": 3}, tmp_path / "run"))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("warning: train.epochs=3 is ignored") and "train.steps" in err[0], err


def test_a_fresh_launch_into_a_live_run_folder_says_it_is_busy_not_to_resume_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 3}, run_dir))  # leaves last.pt: a run to continue
    live = runlock.hold(run_dir)  # as the live run holds it: flock conflicts across open files, even in one process
    try:
        code = train.main(["--set", *sets({**TINY, "run.out_dir": str(run_dir)})])
    finally:
        live.release()
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"in use by a live run (pid {os.getpid()} on " in err and "resume=auto" not in err, err


@pytest.mark.parametrize("task", ["text", "images"])
def test_the_progress_bar_counts_the_runs_own_steps_up_to_each_evaluation(tmp_path, capsys, task):
    values = {**TINY, "train.eval_every": 12}  # 32 steps: evaluations at 12, 24 and 32
    if task == "text":
        values = {**text_run(token_folder(tmp_path / "tokens", 50)), "train.steps": 32, "train.eval_every": 12}
    train.run(cfg_of({**values, "train.progress": "bar"}, tmp_path / "run"))
    err = capsys.readouterr().err
    first_counts = {}  # each bar's label -> the counts it starts from (tqdm redraws a bar as it advances)
    for line in err.split("\r"):
        if line.startswith("to step"):
            label, _, counts = line.split("|")[:3]
            first_counts.setdefault(label.split(":")[0], counts.split()[0])
    assert first_counts == {"to step 12": "0/32", "to step 24": "12/32", "to step 32": "24/32"}, err


def test_a_text_resume_that_changes_only_train_epochs_keeps_its_schedule(tmp_path, capsys):
    root, run_dir = token_folder(tmp_path / "tokens", 50), tmp_path / "run"
    train.run(cfg_of({**text_run(root), "train.steps": 8, "train.max_steps": 4}, run_dir))
    capsys.readouterr()
    train.run(cfg_of({**text_run(root), "train.steps": 8, "train.epochs": 3, "checkpoint.resume": "auto"}, run_dir))
    out = capsys.readouterr().out
    assert "resumed from" in out and "re-planned" not in out, out


# -- nothing lost, nothing silently wrong (issue 43's hostile cases) ---------------------------------------------------
def refused(capsys, values: dict, run_dir: Path) -> tuple[int, str]:
    """train.py's exit code and stderr for a launch of `values` into `run_dir`."""
    capsys.readouterr()
    code = train.main(["--set", *sets({**values, "run.out_dir": str(run_dir)})])
    return code, capsys.readouterr().err.strip()


@pytest.fixture(scope="module")
def text_run_evaluated_every_8(tmp_path_factory) -> tuple[dict, Path]:
    """A 24-step text run evaluated every 8 steps, never stopped: (its values, its run folder)."""
    tmp = tmp_path_factory.mktemp("cadence")
    values = {**text_run(token_folder(tmp / "tokens", 50)), "train.steps": 24, "train.eval_every": 8,
              "train.log_every": 1}
    train.run(cfg_of(values, tmp / "ref"))
    return values, tmp / "ref"


@pytest.mark.parametrize("eval_every", [12, 0])
def test_a_text_resume_that_changes_eval_every_trains_on_the_same_windows_to_the_runs_end(
        tmp_path, text_run_evaluated_every_8, eval_every):
    """The windows are drawn in chunks fixed when the run starts (kept in the sampler's state), so a resume at
    another evaluation cadence trains on the same samples, step for step, and ends where the run ends."""
    values, ref_dir = text_run_evaluated_every_8
    run_dir = tmp_path / "run"
    train.run(cfg_of({**values, "train.max_steps": 8}, run_dir))
    result = train.run(cfg_of({**values, "checkpoint.resume": "auto", "train.eval_every": eval_every}, run_dir))
    losses = {step: r["loss"] for step, r in train_records(run_dir).items()}
    evaluated = [r["step"] for r in runlog.read_metrics(run_dir) if r["kind"] == "val"]
    assert result["step"] == 24 and losses == {step: r["loss"] for step, r in train_records(ref_dir).items()}
    assert evaluated == ([8, 12, 24] if eval_every else [8, 24]), evaluated


def test_a_fresh_run_leaves_the_users_tmp_files_in_its_folder(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "cache.tmp").mkdir(parents=True)
    (run_dir / "draft.tmp").write_text("mine")
    train.run(cfg_of({**TINY, "train.epochs": 1}, run_dir))
    assert (run_dir / "cache.tmp").is_dir() and (run_dir / "draft.tmp").read_text() == "mine"


def test_a_resume_removes_the_temporary_files_a_killed_run_left_and_only_those(tmp_path):
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 3}, run_dir))
    stale = [run_dir / "ckpt-00000006.pt.tmp", run_dir / "last.pt.tmp", run_dir / "metrics.jsonl.tmp"]
    for path in stale:
        path.write_bytes(b"half")
    (run_dir / "ckpt-00000009.tmp").mkdir()  # a sharded checkpoint's folder, half written
    (run_dir / "notes.tmp").write_text("mine")
    train.run(cfg_of({**TINY, "checkpoint.resume": "auto"}, run_dir))
    assert not any(p.exists() for p in [*stale, run_dir / "ckpt-00000009.tmp"]) and (run_dir / "notes.tmp").exists()


def test_a_run_folder_inside_data_root_is_refused(tmp_path, capsys):
    root = token_folder(tmp_path / "tokens", 50)
    for out in (root, root / "runs" / "gpt"):
        code, err = refused(capsys, text_run(root), out)
        assert code == 2 and len(err.splitlines()) == 1 and "data.root" in err, err
    assert sorted(p.name for p in root.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_resuming_onto_a_training_split_of_another_size_is_one_line_exit_1(tmp_path, capsys):
    root, run_dir = token_folder(tmp_path / "tokens", 50), tmp_path / "run"
    train.run(cfg_of({**text_run(root), "train.steps": 8, "train.max_steps": 4}, run_dir))
    ids = np.fromfile(root / "train.bin", dtype=np.uint16)
    ids[:2000].tofile(root / "train.bin")
    code, err = refused(capsys, {**text_run(root), "train.steps": 8, "checkpoint.resume": "auto"}, run_dir)
    assert code == 1 and len(err.splitlines()) == 1 and "samples" in err and "Traceback" not in err, err


def test_an_old_checkpoint_that_cannot_be_removed_is_a_warning_and_the_run_finishes(tmp_path, capsys, monkeypatch):
    remove = checkpoint.files.remove

    def refuse_step_3(path: Path) -> None:
        if path.name == "ckpt-00000003.pt":
            raise PermissionError(1, "Operation not permitted", str(path))
        remove(path)

    monkeypatch.setattr(checkpoint.files, "remove", refuse_step_3)
    result = train.run(cfg_of(TINY, tmp_path / "run"))
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert result["step"] == STEPS and "test_acc" in result
    assert warnings and all("ckpt-00000003.pt" in w and "is intact" in w for w in warnings), warnings


def test_more_evaluation_windows_than_the_split_holds_is_one_line_exit_1(tmp_path, capsys):
    root = token_folder(tmp_path / "tokens", 50)  # a validation split of 500 tokens: 484 windows of 16
    code, err = refused(capsys, {**text_run(root), "data.tokens.eval_windows": 100_000_000}, tmp_path / "run")
    assert code == 1 and len(err.splitlines()) == 1 and "data.tokens.eval_windows=100,000,000" in err and "484" in err, err
    assert not (tmp_path / "run").exists()


class FullDisk:
    """metrics.jsonl opened for appending, whose every write fails with ENOSPC: the disk filled during the run."""

    def __init__(self, path, mode="r", *args, **kwargs):
        self.file = open(path, mode, *args, **kwargs)
        self.full = Path(path).name == "metrics.jsonl" and "a" in mode

    def write(self, text):
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.file.write(text)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __iter__(self):
        return iter(self.file)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def refuse_metrics_rename(monkeypatch) -> None:
    """os.replace onto metrics.jsonl fails with EACCES: it cannot be written (a read-only mount, another user's)."""
    replace = os.replace

    def refusing(src, dst, *args, **kwargs):
        if Path(dst).name == "metrics.jsonl":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dst))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", refusing)


@pytest.mark.parametrize("fault", ["disk full mid-run", "permission denied at start"])
@pytest.mark.parametrize("task", ["classify", "lm"])
def test_a_log_file_that_cannot_be_written_is_one_line_naming_it_and_the_intact_checkpoint(task, fault, tasks, tmp_path,
                                                                                            capsys, monkeypatch):
    run_dir, values = tmp_path / "run", {**tasks[task], "train.max_steps": 6}
    train.run(cfg_of(values, run_dir))
    if fault == "disk full mid-run":
        monkeypatch.setattr(runlog, "open", FullDisk, raising=False)
    else:
        refuse_metrics_rename(monkeypatch)
    code, err = refused(capsys, {**values, "train.max_steps": 0, "checkpoint.resume": "auto"}, run_dir)
    monkeypatch.undo()
    assert code == 1 and len(err.splitlines()) == 1 and str(run_dir / "metrics.jsonl") in err, err
    assert f"{run_dir / 'last.pt'} (step 6), is intact" in err, err
    assert list(run_dir.glob("*.tmp")) == [] and checkpoint.load(run_dir / "last.pt")["step"] == 6


def two_runs(case: str, tmp_path: Path) -> tuple[dict, dict]:
    """The values of two runs of one config: of the same images, or (the GPT) of two data folders."""
    if case == "images, the same data":
        return {**TINY, "train.max_steps": 6}, {**TINY, "train.max_steps": 6}
    other = token_folder(tmp_path / "other-tokens", 50)
    reverse_train_bin(other)
    ours = {**text_run(token_folder(tmp_path / "tokens", 50)), "train.steps": 8, "train.max_steps": 4}
    return ours, {**ours, "data.root": str(other)}


@pytest.mark.parametrize("case", ["images, the same data", "GPT, another data folder"])
def test_a_last_pt_of_another_run_is_refused_under_resume_auto_and_allowed_when_named(case, tmp_path, capsys):
    (ours, theirs), mine, other = two_runs(case, tmp_path), tmp_path / "mine", tmp_path / "other"
    train.run(cfg_of(ours, mine))
    train.run(cfg_of(theirs, other))
    records = (mine / "metrics.jsonl").read_text()
    shutil.copyfile(other / "last.pt", mine / "last.pt")  # as `cp other/last.pt mine/last.pt` does
    code, err = refused(capsys, {**ours, "checkpoint.resume": "auto"}, mine)
    assert code == 2 and len(err.splitlines()) == 1 and "another run" in err, err
    assert f"checkpoint.resume={mine / 'last.pt'}" in err and (mine / "metrics.jsonl").read_text() == records, err
    named = {**ours, "checkpoint.resume": str(mine / "last.pt"), "checkpoint.accept_new_data": True}
    code, _ = refused(capsys, named, mine)
    launch = json.loads((mine / "run.json").read_text())["launches"][-1]
    assert code == 0 and launch["continued_run"] == checkpoint.load(other / "last.pt")["run_id"], launch


def image_folder(root: Path) -> Path:
    """train/<class>/<image>.png: two classes of eight 8x8 grey images, pixels drawn from a seeded generator."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / "train" / label).mkdir(parents=True)
        for i in range(8):
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(root / "train" / label / f"{i}.png")
    return root


def image_run(root: Path) -> dict:
    return {**TINY, "data.dataset": "imagefolder", "data.root": str(root), "data.imagefolder.channels": 1,
            "data.imagefolder.image_size": 8, "data.imagefolder.val_size": 4, "train.batch_size": 4, "train.epochs": 2, "train.max_steps": 3}


def invert_images(root: Path) -> None:
    from PIL import Image, ImageOps

    for path in sorted(root.glob("train/*/*.png")):
        with Image.open(path) as img:
            inverted = ImageOps.invert(img)
        inverted.save(path)


def reverse_train_bin(root: Path) -> None:
    ids = np.fromfile(root / "train.bin", dtype=np.uint16)
    ids[::-1].copy().tofile(root / "train.bin")


def replace_val_bin(root: Path) -> None:
    np.random.default_rng(7).integers(0, 50, 500, dtype=np.uint16).tofile(root / "val.bin")


CHANGES = {  # what changed: (the data folder, its run, the change, the split it changes)
    "train.bin reversed": (lambda p: token_folder(p, 50), lambda r: {**text_run(r), "train.steps": 8,
                           "train.max_steps": 4}, reverse_train_bin, "train"),
    "val.bin replaced": (lambda p: token_folder(p, 50), lambda r: {**text_run(r), "train.steps": 8,
                         "train.max_steps": 4}, replace_val_bin, "val"),
    "image pixels rewritten": (image_folder, image_run, invert_images, "train"),
}


@pytest.mark.parametrize("change", CHANGES)
def test_a_resume_onto_changed_data_is_refused_in_one_line_naming_the_split(change, tmp_path, capsys):
    make, run, alter, split = CHANGES[change]
    root, run_dir = make(tmp_path / "data"), tmp_path / "run"
    train.run(cfg_of(run(root), run_dir))
    alter(root)
    code, err = refused(capsys, {**run(root), "train.max_steps": 0, "checkpoint.resume": "auto"}, run_dir)
    assert code == 1 and len(err.splitlines()) == 1 and f"the {split} split" in err, err
    assert "checkpoint.accept_new_data=true" in err, err


def test_new_data_accepted_on_purpose_resumes_forgets_the_old_best_and_is_recorded(tmp_path, capsys):
    root, run_dir = token_folder(tmp_path / "tokens", 50), tmp_path / "run"
    values = {**text_run(root), "train.steps": 8, "train.eval_every": 4}
    train.run(cfg_of({**values, "train.max_steps": 4}, run_dir))
    replace_val_bin(root)
    capsys.readouterr()
    result = train.run(cfg_of({**values, "checkpoint.resume": "auto", "checkpoint.accept_new_data": True}, run_dir))
    out = capsys.readouterr().out
    launch = json.loads((run_dir / "run.json").read_text())["launches"][-1]
    assert result["step"] == 8 and result["best_step"] == 8 and "the val split" in out, out
    assert any("the val split" in change for change in launch["data_changed"]), launch


class SlowStart(train.Hook):
    """The first step takes 1.5 s longer, as a torch.compile warm-up does."""

    def step(self, progress) -> None:
        if progress.step == 1:
            time.sleep(1.5)


def test_throughput_is_measured_over_the_window_since_the_previous_record_so_a_slow_start_stays_in_its_own(
        tmp_path, corpus):
    values = {**tiny_lm(corpus), "train.log_every": 4, "train.max_steps": 12, "checkpoint.every_steps": 0}
    train.run(cfg_of(values, tmp_path / "run"), [SlowStart()])
    records = [r for r in runlog.read_metrics(tmp_path / "run") if r["kind"] == "train"]
    window_starts = [0.0] + [r["elapsed_s"] for r in records[:-1]]
    for record, start in zip(records, window_starts):
        assert record["samples_per_s"] == pytest.approx(4 * TINY["train.batch_size"] / (record["elapsed_s"] - start))
        assert record["tokens_per_s"] == pytest.approx(record["samples_per_s"] * values["data.shakespeare.block_size"])
    assert records[-1]["samples_per_s"] > 4 * records[0]["samples_per_s"], records


class EvalBatchSizes(train.Hook):
    """The batch size of every forward the model runs in eval mode."""

    def __init__(self):
        self.sizes = []

    def attach(self, model, module, progress) -> None:
        model.register_forward_pre_hook(self.record)

    def record(self, model, args) -> None:
        if not model.training:
            self.sizes.append(len(args[0]))


@pytest.mark.parametrize("task", ["classify", "lm"])
def test_evaluation_runs_in_micro_batches_as_training_does(task, tmp_path, corpus):
    values = {**(TINY if task == "classify" else tiny_lm(corpus)), "train.grad_accum": 4, "train.max_steps": 2}
    sizes = EvalBatchSizes()
    train.run(cfg_of(values, tmp_path / "run"), [sizes])
    assert sizes.sizes and max(sizes.sizes) == TINY["train.batch_size"] // 4, sizes.sizes


@pytest.mark.parametrize("name, dtype, expected", [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989.4e12), ("NVIDIA H100 80GB HBM3", torch.float32, 66.9e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756.5e12), ("NVIDIA H100 NVL", torch.float16, 835.5e12),
    ("NVIDIA H200", torch.bfloat16, 989.4e12), ("NVIDIA H200 NVL", torch.bfloat16, 835.5e12),
    ("NVIDIA A100-SXM4-80GB", torch.bfloat16, 312e12), ("NVIDIA A100 80GB PCIe", torch.float32, 19.5e12),
    ("NVIDIA L40S", torch.bfloat16, 362.05e12), ("NVIDIA L4", torch.bfloat16, 121e12),
    ("NVIDIA GeForce RTX 3090", torch.bfloat16, 71e12), ("NVIDIA GeForce RTX 3090 Ti", torch.bfloat16, None),
    ("Tesla V100-SXM2-16GB", torch.bfloat16, None)])
def test_the_cuda_peak_is_the_cards_own_at_the_runs_dtype_and_a_card_not_in_the_table_gets_none(name, dtype, expected,
                                                                                                  monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak, source = runlog.peak_flops(torch.device("cuda"), dtype)
    assert peak == expected, source
    assert (name in source) and ("not in runlog.CUDA_PEAK" in source) == (expected is None)
