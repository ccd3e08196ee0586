"""Day 12 gates: the template trains any dataset and model by config alone, image classifiers and language models
alike, resumes bit-for-bit after SIGKILL, scales out under torchrun (DDP and FSDP2) with checkpoints any run can load,
rejects bad input before writing anything, and fails safely (signals, NaN, a full disk, a kill between two links).

Run:  python day12_template/check.py      (or `pytest day12_template`: the same; the template's own tests/ run
inside the copy gate, in a venv outside the repo, and `pytest day12_template/template/tests` runs them here)
Most gates train a tiny MLP on generated data or a tiny GPT on the bundled Shakespeare, both ways where a promise
holds for every task; the MNIST > 98% and the CPU recipe's 600-step gates (slow) train the shipped configs.
"""
import ast
import dataclasses
import errno
import functools
import gzip
import hashlib
import itertools
import json
import math
import os
import pickle
import random
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.distributed.checkpoint.metadata import BytesStorageMetadata
from torch.optim.optimizer import register_optimizer_step_pre_hook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEMPLATE = HERE / "template"  # what a learner copies: the package train_template, its scripts, configs and tests
sys.path.insert(0, str(ROOT))  # the repo's gate recorder
sys.path.insert(0, str(HERE))  # the day's demo and labs
sys.path.insert(0, str(TEMPLATE))  # the package, imported as its own scripts import it
sys.path.insert(0, str(TEMPLATE / "tests"))  # the helpers the template's own tests share

import architecture_lab as arch_lab
import drills_lab
import main as demo
import modern_lab
import muon_lab
import nanogpt_bench
import rnn_to_attention_lab as rnn_lab
import same_numbers
import zero_lab
from lab_training import spread
from train_template import (checkpoint, compare_runs, config, data, distributed, doctor, memory, models, optimizers,
                            runlock, runlog, signals, tasks, text, train)
from train_template import troubleshoot as ts
from train_template.checkpoint import sharded
from train_template.troubleshoot import checks, faults
from train_template.troubleshoot.faults import Faults
from helpers import (FAULTS, FORMATS, SHARD, STEPS, TINY, cfg_of, child_env, diff_states, every_record,
                     full, launch, reached, sets, sha, tiny_lm, tiny_tokens, train_records)
from sprint.gates import Gates, run_this_file
from sprint.measure import one_thread

gates = Gates(__file__)
for _m in (arch_lab, checkpoint, config, data, demo, doctor, drills_lab, faults, memory, models, muon_lab, rnn_lab,
           runlog, train, checks):
    assert HERE in Path(_m.__file__).parents, f"imported {_m.__name__} from {_m.__file__}, not from {HERE}"

# TINY overfitting: 64 training images, 4 steps an epoch; the best evaluation comes early, early stopping ends it.
OVERFIT = {**TINY, "data.subset": 64, "model.mlp.hidden": 256, "model.mlp.dropout": 0.0, "train.epochs": 30,
           "train.batch_size": 16, "train.early_stop_patience": 2, "optim.warmup_ratio": 0.0}
TINY_LM = tiny_lm("")  # on the repo's bundled Shakespeare
TASKS = {"classify": TINY, "lm": TINY_LM}
SMALL_MNIST = {"data.subset": 2048, "train.epochs": 1, "train.batch_size": 64,
               "train.log_every": 8, "train.progress": "off"}


@pytest.fixture(scope="module", autouse=True)
def restore_torch_globals():
    """In-process runs switch deterministic mode and cuDNN flags for this process; give pytest's back."""
    deterministic, benchmark = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark
    yield
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.benchmark = benchmark


# --- config ------------------------------------------------------------------------------------------------------
def test_config_has_the_curriculum_templates_21_fields_each_with_its_reason():
    names = ("seed out_dir device deterministic dataset num_workers pin_memory epochs batch_size grad_accum lr "
             "weight_decay warmup_ratio min_lr_ratio grad_clip amp amp_dtype early_stop_patience resume log_every "
             "max_steps").split()
    leaves = {key.split(".")[-1] for key in config.fields()}
    gates.check("curriculum template fields present", sum(n in leaves for n in names), "==", 21)
    no_reason = [k for k, (f, _) in config.fields().items() if len(f.metadata["why"]) < 15]
    gates.check("config fields without a one-line reason", len(no_reason), "==", 0)
    reference = (TEMPLATE / "docs" / "config.md").read_text()
    gates.check("config fields missing from the template's docs/config.md",
                [k for k in config.fields() if f"`{k}`" not in reference], "==", [])


def test_a_bad_value_on_the_real_command_line_exits_2_before_any_work(tmp_path):
    out = tmp_path / "run"
    code, text = launch([sys.executable, str(TEMPLATE / "train.py"), "--config",
                         str(TEMPLATE / "configs/mnist_mlp.toml"), "--set", f"run.out_dir={out}", "train.grad_accum=0"])
    gates.check("exit code of `train.py --set train.grad_accum=0`", code, "==", 2)
    assert "train.grad_accum" in text and not out.exists(), text


def test_missing_data_is_one_clear_line_exit_1_and_no_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    code = train.main(["--set", f"run.out_dir={out}", "data.dataset=imagefolder", f"data.root={tmp_path / 'none'}"])
    err = capsys.readouterr().err
    gates.check("exit code when the data is missing", code, "==", 1)
    gates.check("missing data: one line naming the folder, no run folder",
                len(err.strip().splitlines()) == 1 and str(tmp_path / "none") in err and not out.exists(), "==", True)


def test_out_dir_probe_creates_the_missing_folder_and_leaves_nothing_behind(tmp_path):
    train.check_out_dir(cfg_of({}, tmp_path / "a" / "b"))
    gates.check("run.out_dir check: files left in a fresh folder", list(tmp_path.iterdir()), "==", [])


@pytest.mark.parametrize("script, flag", [("train.py", "--help-config"), ("doctor.py", "--checklists")])
def test_output_into_a_closed_pipe_ends_quietly(script, flag):
    read, write = os.pipe()
    os.close(read)  # `| head -1` that has already gone
    proc = subprocess.run([sys.executable, str(TEMPLATE / script), flag], stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=120, env=child_env())
    os.close(write)
    assert proc.returncode in (0, 141) and "Traceback" not in proc.stderr, (proc.returncode, proc.stderr)


def test_running_out_of_memory_is_one_line_exit_1_and_no_run_folder(tmp_path):
    proc = subprocess.run([sys.executable, str(TEMPLATE / "train.py"), "--config",
                           str(TEMPLATE / "configs/synthetic_smoke.toml"), "--set", "model.mlp.hidden=1000000000000",
                           f"run.out_dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120, env=child_env())
    gates.check("a model too big for memory (hidden 1e12): exit code, error lines, traceback, run folder",
                [proc.returncode, proc.stderr.count("error: out of memory"), "Traceback" in proc.stderr,
                 (tmp_path / "run").exists()], "==", [1, 1, False, False])


def test_a_stopped_rank_keeps_ignoring_repeated_signals_until_it_exits():
    """Under torchrun a rank that stops keeps ignoring SIGINT/SIGTERM through teardown: a late forwarded repeat would
    otherwise kill it mid-exit (-2/-15 and a traceback instead of 130/143). One process gets its old handlers back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    after = []
    try:
        for repeat_stops in (False, True):
            stop = signals.StopSignal(repeat_stops=repeat_stops)
            stop.handle(signal.SIGTERM, None)
            stop.restore()
            after.append([signal.getsignal(s) is signal.SIG_IGN for s in before])
            for s, handler in before.items():
                signal.signal(s, handler)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    gates.check("after a stop, SIGINT/SIGTERM ignored: under torchrun / in one process", after, "==",
                [[True, True], [before[signal.SIGINT] is signal.SIG_IGN, before[signal.SIGTERM] is signal.SIG_IGN]])


def test_a_rank_whose_peer_died_stops_with_one_line_and_exit_1(monkeypatch, capsys):
    def lost_peer():  # what gloo raises in a survivor when `kill -9` hits the other rank
        raise RuntimeError("[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:7084: Connection reset by peer")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(train, "leave_rank", sys.exit)  # a rank leaves with os._exit, which would end pytest here
    with pytest.raises(SystemExit) as ended:
        train.exit_with(lost_peer)
    err = capsys.readouterr().err
    gates.check("a rank whose peer died (gloo: connection reset): exit code, one-line errors, says how to resume",
                [ended.value.code, err.count("error (rank 1): another rank"), "resume=auto" in err], "==", [1, 1, True])
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(RuntimeError):  # one process has no peer to lose: the traceback stays
        train.exit_with(lost_peer)


class PutInAHook(train.Hook):
    """A forward hook on the head that writes with put_(accumulate=False): an op with no deterministic kernel (on
    CUDA, the fused attention's fast backward is another, which warn_only would keep)."""

    def attach(self, model, module, progress):
        model.head.register_forward_hook(self.put)

    @staticmethod
    def put(module, args, out):
        index, values = torch.tensor([0, 0], device=out.device), torch.tensor([1.0, 2.0], device=out.device)
        out.detach().clone().put_(index, values)


@pytest.mark.parametrize("deterministic", [True, False])
def test_an_op_without_a_deterministic_kernel_stops_a_deterministic_run_in_one_line_naming_it(deterministic,
                                                                                              tmp_path, capsys):
    def main() -> int:
        train.run(cfg_of({**TINY, "train.max_steps": 2, "run.deterministic": deterministic}, tmp_path / "run"),
                  [PutInAHook()])
        return 0

    with pytest.raises(SystemExit) as ended:
        train.exit_with(main)
    err = capsys.readouterr().err.strip()
    if deterministic:
        gates.check("run.deterministic = true, a put_ in a hook: exit code, one line naming the op and the way out",
                    [ended.value.code, len(err.splitlines()), "put_" in err, "run.deterministic=false" in err], "==",
                    [1, 1, True, True])
    else:
        gates.check("run.deterministic = false, the same hook: exit code", ended.value.code, "==", 0)


def test_demo_and_memory_report_missing_data_in_one_line_exit_1(tmp_path, monkeypatch, capsys):
    def no_files(name, root):
        raise data.DataError(f"{name} not found (looked in {root})")

    monkeypatch.setattr(data, "find_idx", no_files)  # as in a copy outside the repo with no network
    root = str(tmp_path / "mnist")
    for run_it in (lambda: demo.main(["--quick", "--data-root", root, "--runs", str(tmp_path / "runs")]),
                   lambda: memory.main(["--config", str(TEMPLATE / "configs/mnist_mlp.toml"), "--set",
                                        f"data.root={root}"])):
        with pytest.raises(SystemExit) as exit_:
            run_it()
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 1 and err.startswith("error:") and root in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "runs").exists()


def test_resume_with_a_changed_config_is_refused_listing_the_fields(tmp_path, capsys):
    out = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 4}, out))
    # Each of these would silently do nothing after a resume (the optimizer and RNG states come from the file).
    changed = {**TINY, "checkpoint.resume": "auto", "optim.lr": 1e-3, "run.seed": 7, "optim.weight_decay": 0.1}
    code = train.main(["--set", *sets({**changed, "run.out_dir": str(out)})])
    err = capsys.readouterr().err
    listed = [k for k in ("optim.lr", "run.seed", "optim.weight_decay") if k in err]
    gates.check("changed fields listed when a resume is refused", len(listed), "==", 3)
    gates.check("exit code of a resume with a changed config", code, "==", 2)
    safe = {**TINY, "checkpoint.resume": "auto", "train.epochs": 3, "data.num_workers": 1, "train.log_every": 2}
    gates.check("resume accepted when only safe fields change (exit code)",
                train.main(["--set", *sets({**safe, "run.out_dir": str(out)})]), "==", 0)


# --- the smoke run, the shipped configs, the copy ------------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke") / "run"
    cfg = config.load(str(TEMPLATE / "configs/synthetic_smoke.toml"), [f"run.out_dir={out}", "train.progress=off"])
    t0 = time.process_time()  # CPU time: what the run costs, whatever else the machine is doing meanwhile
    result = train.run(cfg)
    return {"result": result, "out": out, "cfg": cfg, "cpu_seconds": time.process_time() - t0}


def test_smoke_config_trains_one_epoch_on_synthetic_data(smoke):
    val = [r for r in runlog.read_metrics(smoke["out"]) if r["kind"] == "val"]
    gates.check("smoke run: epochs evaluated", len(val), "==", 1)
    gates.check("smoke run: validation accuracy after one epoch (chance 0.10)", val[-1]["val_acc"], ">", 0.5)
    gates.check("smoke run: CPU seconds in-process, all threads (imports excluded)", smoke["cpu_seconds"], "<", 30)


def test_run_folder_holds_the_effective_config_and_run_metadata(smoke):
    saved = config.load(str(smoke["out"] / "config.toml"), [])
    gates.check("config.toml reads back as the run's config", saved == smoke["cfg"], "==", True)
    meta = json.loads((smoke["out"] / "run.json").read_text())["launches"][0]
    keys = ("git", "torch", "cuda", "device", "hostname", "world_size", "start", "command")
    gates.check("run metadata fields recorded", sum(k in meta for k in keys), "==", len(keys))
    plain = models.build(smoke["cfg"].model, data.ImageInfo(1, 28, 10)).state_dict().keys()
    saved_keys = checkpoint.load(smoke["out"] / "last.pt")["model"].keys()
    gates.check("checkpoint keys == a plain model's state_dict keys", set(saved_keys) == set(plain), "==", True)


def test_every_shipped_config_is_valid():
    shipped = sorted((TEMPLATE / "configs").glob("*.toml"))
    valid = [p.stem for p in shipped if config.load(str(p), []) is not None]
    gates.check("shipped configs that load and pass every check", len(valid), "==", len(shipped))
    gates.check("datasets and models covered by the shipped configs",
                {(c.data.dataset, c.model.name) for c in map(lambda p: config.load(str(p), []), shipped)} >=
                {("synthetic", "mlp"), ("mnist", "mlp"), ("mnist", "resnet"), ("imagefolder", "resnet")}, "==", True)


@pytest.mark.slow
def test_mnist_mlp_config_passes_98_percent_test_accuracy(tmp_path):
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), [f"run.out_dir={tmp_path / 'run'}",
                                                               "train.progress=off"])
    result = train.run(cfg)
    gates.check("test images evaluated", len(data.build(cfg.data, 0).test), "==", 10_000)
    gates.check("MNIST + MLP config: test accuracy of best.pt", result["test_acc"], ">", 0.98)


def absolute_imports(path: Path) -> set[str]:
    """The top-level name of every module a Python file imports absolutely (`import a.b`, `from a.b import c`: a)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_template_folder_holds_the_template_alone():
    """What `cp -r day12_template/template` copies: no module that imports the course (sprint/, a day, this day's
    demo, labs or gates) and no results or run folder among its files."""
    course = {path.stem for path in HERE.glob("*.py")}  # check, main, the labs and benchmarks
    files = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=TEMPLATE, capture_output=True, text=True,
                           check=True).stdout.split("\0")[:-1]  # each name ends with a NUL
    offenders = [name for name in files if {"runs", "results"} & set(Path(name).parts)]
    for name in [name for name in files if name.endswith(".py")]:
        offenders += [f"{name}: imports {module}" for module in sorted(absolute_imports(TEMPLATE / name))
                      if module in {"sprint", *course} or module.startswith("day")]
    gates.check("files of the template folder: course imports, results or run folders", offenders, "==", [])
    gates.check("files of the template folder", len(files), ">", 40)


def code_lines(page: Path) -> list[str]:
    return [line for block in re.findall(r"```\w*\n(.*?)```", page.read_text(), re.S) for line in block.splitlines()]


def test_the_template_readme_is_a_how_to_and_each_page_keeps_one_working_folder():
    """The template's README reads in 15 minutes; its pages' commands run inside the template folder, the day's
    README's from the repo's root."""
    gates.check("words in the template's README", len((TEMPLATE / "README.md").read_text().split()), "<=", 4000)
    pages = [TEMPLATE / "README.md", *sorted((TEMPLATE / "docs").glob("*.md"))]
    outside = [line for page in pages for line in code_lines(page) if "day12_template" in line or "../" in line]
    gates.check("command lines of the template's pages that name a folder outside it", outside, "==", [])
    elsewhere = [line for line in code_lines(HERE / "README.md")
                 if re.search(r"\bpython3? (?!day\d\d_\w+/|scripts/)", line)]
    gates.check("command lines of the day's README that run a script not named from the repo's root", elsewhere,
                "==", [])


def test_copied_folder_trains_stops_on_ctrl_c_and_resumes_outside_the_repo(tmp_path):
    copy = Path(shutil.copytree(TEMPLATE, tmp_path / "my_project",
                                ignore=shutil.ignore_patterns("runs", "__pycache__")))
    run_dir = copy / "runs" / "synthetic_smoke"  # the config's own relative out_dir, under the copy
    argv = [sys.executable, *FAULTS, "--config", "configs/synthetic_smoke.toml", "--set", "train.log_every=1",
            "data.num_workers=2"]
    env = child_env(TEMPLATE_FAULTS="step_sleep=0.05", PYTHONPATH="")
    code, text = launch(argv, cwd=copy, env=env, kill_when=reached(run_dir, 5), sig=signal.SIGINT)
    gates.check("copy outside the repo: exit code after Ctrl-C (SIGINT to the process group)", code, "==", 130)
    assert "checkpoint.resume=auto" in text and "Traceback" not in text, text
    stopped_at = checkpoint.load(run_dir / "last.pt")["step"]
    code, text = launch(argv + ["checkpoint.resume=auto"], cwd=copy, env=child_env(PYTHONPATH=""))
    gates.check("copy outside the repo: exit code of the resumed run", code, "==", 0)
    launches = json.loads((run_dir / "run.json").read_text())["launches"]
    gates.check("copy outside the repo: the second launch resumed from the Ctrl-C checkpoint",
                launches[-1]["resumed_from"] == str((run_dir / "last.pt").resolve()) and stopped_at > 0, "==", True)
    gates.check("copy outside the repo: steps done after resuming", checkpoint.load(run_dir / "last.pt")["step"],
                "==", 4096 // 128)
    code, text = launch([sys.executable, "doctor.py", "--config", "configs/synthetic_smoke.toml", "--symptom", "nan",
                         "--fault", "nan@blocks.0.1"], cwd=copy, env=child_env(PYTHONPATH=""))
    gates.check("copy outside the repo: doctor.py exit code with a NaN injected (3: problems found)", code, "==", 3)
    assert "first module with a non-finite output: blocks.0.1 (LayerNorm)" in text and "Traceback" not in text, text


def third_party_imports(paths) -> set[str]:
    """The top-level names of every module these files import that is neither the standard library nor theirs."""
    names = set()
    for path in paths:
        names |= absolute_imports(path)
    return names - set(sys.stdlib_module_names) - {"train_template", "helpers", "conftest", "__future__"}


def declared_closure(requirements: list[str]) -> set[str]:
    """The distributions a fresh venv gets for these requirements: each, and what each requires, as installed here."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    closure, todo = set(), [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if (name := canonicalize_name(req.name)) in closure or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        closure.add(name)
        todo += [Requirement(r) for r in metadata.requires(name) or []]
    return closure


def test_the_copys_test_extra_installs_every_module_its_tests_reach():
    """A learner's fresh venv holds what `pip install -e ".[test]"` declares, not this environment: every third-party
    module the tests import, or the package imports for the datasets they train on (torchvision, Pillow for image
    folders), must come from the dependencies and the test extra."""
    from importlib import metadata

    from packaging.utils import canonicalize_name

    project = tomllib.loads((TEMPLATE / "pyproject.toml").read_text())["project"]
    closure = declared_closure([*project["dependencies"], *project["optional-dependencies"]["test"]])
    reached = third_party_imports([*(TEMPLATE / "tests").glob("*.py"), TEMPLATE / "train_template" / "data.py"])
    providers = metadata.packages_distributions()
    missing = sorted(m for m in reached if not {canonicalize_name(d) for d in providers.get(m, [])} & closure)
    gates.check("modules the copy's tests reach that its declared test install lacks", missing, "==", [])


def children_cpu_seconds() -> float:
    """User + system CPU time of every child process of this one that has ended (and of theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_a_copy_outside_the_repo_installs_as_a_package_and_passes_its_own_tests_in_3_cpu_minutes(tmp_path):
    """The copy's CI (ci.sh: `pip install -e ".[test]"`, the command, its pytest) in a fresh virtual environment that
    sees this one's packages, so nothing is downloaded; then the installed command trains the smoke config."""
    from sprint.venv import seeing_this_environment  # from a venv, conda or the base interpreter (tests/test_venv.py)

    copy = Path(shutil.copytree(TEMPLATE, tmp_path / "my_project",
                                ignore=shutil.ignore_patterns("runs", "__pycache__", "*.egg-info")))
    venv = seeing_this_environment(tmp_path / "venv")
    # The venv runs this environment's pip and setuptools. PIP_NO_BUILD_ISOLATION=0 *turns isolation off* (pip reads
    # its --no-* variables inverted), so the build uses the installed setuptools; PIP_NO_INDEX forbids downloads.
    # Its processes compute in one thread (OMP_NUM_THREADS=1, which the copy's tests hand on to theirs): a two-thread
    # pool spins while it waits for a core, so its CPU time would grow with whatever else runs on the machine.
    with one_thread():
        env = child_env(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv), PYTHONPATH="",
                        PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0")
    cpu_before = children_cpu_seconds()
    code, text = launch(["bash", "ci.sh"], cwd=copy, env=env, timeout=600)
    cpu_seconds = children_cpu_seconds() - cpu_before
    print(text[-6000:])  # pytest shows it when a gate below fails
    gates.check("the copy's ci.sh (install, template-train --help, pytest): exit code", code, "==", 0)
    summary = re.search(r"(\d+) passed.* in ([\d.]+)s", text)
    assert summary and not re.search(r"failed|skipped|error", summary.group(0)), text[-3000:]
    gates.check("the copy's pytest: tests passed (none failed, skipped or in error)", int(summary.group(1)), ">=", 60)
    # CPU time, not the wall clock pytest prints (which a second process on the machine stretches): 3 minutes of
    # it is 90 s of both cores of a 2-core laptop
    gates.check("the copy's ci.sh: CPU seconds of all its processes (install, command, pytest)", cpu_seconds, "<", 180)
    code, text = launch(["template-train", "--config", "configs/synthetic_smoke.toml", "--set", "train.progress=off"],
                        cwd=copy, env=env)
    gates.check("`template-train --config configs/synthetic_smoke.toml` in the copy: exit code", code, "==", 0)
    assert (copy / "runs" / "synthetic_smoke" / "best.pt").exists(), text
    names = ("train_template", "train", "data", "config", "models", "troubleshoot")
    probe = f"import importlib.util; print([n for n in {names!r} if importlib.util.find_spec(n)])"
    code, text = launch(["python", "-c", probe], cwd=tmp_path, env=env)  # outside the copy: what the install added
    gates.check(f"of {', '.join(names)}: the names the copy's venv imports", text.strip(), "==", "['train_template']")


# --- datasets and models switched by config only -------------------------------------------------------------------
SWITCHES = {
    "mnist + mlp": {"data.dataset": "mnist"},
    "mnist + resnet": {"data.dataset": "mnist", "model.name": "resnet", "model.resnet.widths": [8, 16, 16],
                       "optim.lr": 1e-2},
    "fashion_mnist + resnet": {"data.dataset": "fashion_mnist", "model.name": "resnet", "model.resnet.widths": [8, 16, 16],
                               "optim.lr": 1e-2},
    "synthetic + mlp": {"data.dataset": "synthetic"},
    "imagefolder + mlp": {"data.dataset": "imagefolder", "data.imagefolder.val_size": 100, "train.epochs": 3,
                          "train.batch_size": 32, "data.num_workers": 2},
}


@pytest.mark.parametrize("name", SWITCHES)
def test_switching_dataset_or_model_is_a_config_change_and_each_trains(name, tmp_path):
    dataset = SWITCHES[name]["data.dataset"]
    values = {**SMALL_MNIST, f"data.{dataset}.val_size": 1000, **SWITCHES[name]}  # each dataset's own table
    if dataset == "imagefolder":
        values["data.root"] = str(demo.make_digits(tmp_path / "digits", {"train": 40, "test": 5}))
    result = train.run(cfg_of(values, tmp_path / "run"))
    val = [r for r in runlog.read_metrics(tmp_path / "run") if r["kind"] == "val"][-1]
    gates.check(f"{name}: validation accuracy after a short run (chance 0.10)", val["val_acc"], ">", 0.3)
    assert result["test_acc"] > 0.3, result


# --- language models: a GPT on the bundled Shakespeare, nanoGPT's token files, generation -------------------------
BUNDLE_BYTES, BUNDLE_WORKS = 5_057_198, 42  # the repo's data/shakespeare (its README)


def test_the_bundled_corpus_verifies_and_every_work_is_in_its_splits():
    works = text.load_corpus(text.BUNDLE)
    splits = text.shakespeare("", 64, 10, 0)
    total = sum(len(s.tokens) for s in (splits.train, splits.val, splits.test))
    assert len(works) == BUNDLE_WORKS and sum(map(len, works.values())) == BUNDLE_BYTES
    assert total == BUNDLE_BYTES + BUNDLE_WORKS * len(text.SEPARATOR)
    assert splits.vocab_size == 256 and torch.equal(splits.bytes_per_token, torch.ones(256, dtype=torch.float64))


def test_the_bundled_held_out_splits_are_about_five_percent_each():
    splits = text.shakespeare("", 64, 10, 0)
    for split in (splits.val, splits.test):
        gates.check("a held-out split's share of the bundled corpus", len(split.tokens) / BUNDLE_BYTES, "<", 0.06)
        gates.check("a held-out split's share of the bundled corpus", len(split.tokens) / BUNDLE_BYTES, ">", 0.04)


def unigram_loss(splits: data.Splits) -> float:
    """Cross-entropy of the validation windows' targets under the training tokens' frequencies (add-one smoothed):
    what a model that ignores the context scores."""
    vocab = splits.info.vocab_size
    counts = torch.bincount(torch.from_numpy(splits.train.tokens.astype("int64")), minlength=vocab).double() + 1
    log_p = (counts / counts.sum()).log()
    _, targets = splits.val.batch(-1, torch.arange(len(splits.val)))
    return -log_p[targets.flatten()].mean().item()


TINY_GPT_120 = {**TINY_LM, "train.steps": 120, "train.eval_every": 120, "data.shakespeare.eval_windows": 256,
                "model.gpt.dropout": 0.0}


@pytest.fixture(scope="module")
def tiny_gpt_120(tmp_path_factory):
    """The tiny GPT trained 120 steps at its lr (3e-3): the model learns, and the reference of the lr drill."""
    out = tmp_path_factory.mktemp("tiny_gpt_120") / "run"
    cfg = cfg_of(TINY_GPT_120, out)
    t0 = time.process_time()  # CPU time: what the run costs, whatever else the machine is doing meanwhile
    result = train.run(cfg)
    return {"cfg": cfg, "out": out, "result": result, "cpu_seconds": time.process_time() - t0}


def test_a_tiny_gpt_learns_shakespeare_beyond_byte_frequencies_in_seconds(tiny_gpt_120):
    cfg, result = tiny_gpt_120["cfg"], tiny_gpt_120["result"]
    baseline = unigram_loss(data.build(cfg.data, 0))
    gates.check("tiny GPT (2 x 32 wide), 120 steps of 32 windows x 32 bytes: val loss / the unigram baseline "
                f"({baseline:.3f} nats)", result["best_val_loss"] / baseline, "<", 0.97)
    gates.check("tiny GPT on Shakespeare: CPU seconds in-process, all threads", tiny_gpt_120["cpu_seconds"], "<", 30)
    record = [r for r in runlog.read_metrics(tiny_gpt_120["out"]) if r["kind"] == "test"][0]
    gates.check("test record: bits per byte = nats per byte / ln 2 (byte tokens)",
                abs(record["test_bpb"] * math.log(2) - record["test_loss"]), "<", 1e-9)


@pytest.mark.slow
def test_shakespeare_cpu_config_cut_to_600_steps_reaches_its_val_loss(tmp_path):
    cfg = config.load(str(TEMPLATE / "configs/shakespeare_cpu.toml"),
                      [f"run.out_dir={tmp_path / 'run'}", "train.steps=600", "train.eval_every=600",
                       "train.progress=off"])
    result = train.run(cfg)
    gates.check("shakespeare_cpu.toml (nanoGPT's CPU recipe) cut to 600 steps: val loss on the held-out works "
                "(nats per byte)", result["best_val_loss"], "<", 2.40)


def token_folder(folder: Path, train_ids, val_ids, vocab: int, dtype: str = "uint16") -> Path:
    """nanoGPT's on-disk format: raw token ids in train.bin / val.bin and the vocabulary in meta.json."""
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    np.asarray(train_ids, dtype=dtype).tofile(folder / "train.bin")
    np.asarray(val_ids, dtype=dtype).tofile(folder / "val.bin")
    (folder / "meta.json").write_text(json.dumps({"vocab_size": vocab}))
    return folder


def test_nanogpt_token_files_train_a_gpt_memory_mapped(tmp_path):
    ids = torch.randint(0, 50, (20_000,), generator=torch.Generator().manual_seed(0)).tolist()
    root = token_folder(tmp_path / "tokens", ids[:18_000], ids[18_000:], vocab=50)
    result = train.run(cfg_of({**tiny_tokens(root), "train.steps": 8,
                               "train.eval_every": 8}, tmp_path / "run"))
    splits = data.build(cfg_of(tiny_tokens(root), tmp_path / "x").data, 0)
    gates.check("tokens dataset: training split memory-mapped, vocabulary from meta.json",
                [type(splits.train.tokens).__name__, splits.info.vocab_size, result["step"]], "==", ["memmap", 50, 8])


def widen(folder: Path) -> None:
    """train.bin rewritten as uint32 ids while meta.json still says uint16 (the default)."""
    import numpy as np

    np.fromfile(folder / "train.bin", dtype=np.uint16).astype(np.uint32).tofile(folder / "train.bin")


def rewrite_meta(**fields):
    """A break that writes these fields into token_folder's meta.json."""
    return lambda folder: (folder / "meta.json").write_text(json.dumps({"vocab_size": 50, **fields}))


BAD_TOKENS = {  # what is wrong -> (how to break a good folder, a word the one-line error must contain)
    "a .bin of an odd byte length": (lambda f: (f / "val.bin").write_bytes((f / "val.bin").read_bytes() + b"\0"),
                                     "val.bin"),
    "a token id >= the vocabulary": (lambda f: (f / "meta.json").write_text('{"vocab_size": 3}'), "vocab"),
    "no meta file": (lambda f: (f / "meta.json").unlink(), "meta"),
    "a validation split shorter than a window": (lambda f: (f / "val.bin").write_bytes(b"\1\0" * 8), "block_size"),
    "no folder at all": (lambda f: shutil.rmtree(f), "data.root"),
    "uint32 ids where meta.json says uint16": (widen, "uint32"),
    "a meta dtype that is not a name": (rewrite_meta(dtype=["uint16"]), "dtype"),
    "an itos id that is not the digits 0-9": (rewrite_meta(itos={"²": "a"}), "digits 0-9"),  # "²".isdigit() is True
}


@pytest.mark.parametrize("fault", BAD_TOKENS)
def test_bad_token_files_are_one_line_exit_1_and_no_run_folder(fault, tmp_path, capsys):
    root = token_folder(tmp_path / "tokens", [1, 2, 3] * 200, [3, 2, 1] * 100, vocab=50)
    breaks, word = BAD_TOKENS[fault]
    breaks(root)
    out = tmp_path / "run"
    code = train.main(["--set", *sets({**tiny_tokens(root), "run.out_dir": str(out)})])
    err = capsys.readouterr().err.strip()
    gates.check(f"tokens with {fault}: exit code, one error line naming it, run folder",
                [code, len(err.splitlines()), word in err, out.exists()], "==", [1, 1, True, False])


def test_doctor_checks_the_gpt_first_loss_against_ln_vocabulary_and_names_an_injected_nan(tmp_path, capsys):
    values = {**TINY_LM, "model.gpt.dropout": 0.3, "run.out_dir": str(tmp_path / "run")}
    base = ["--set", *sets(values), "--out", str(tmp_path / "doctor")]
    code = doctor.main(["--symptom", "loss", *base])
    clean = capsys.readouterr().out
    gates.check("doctor --symptom loss on a fresh GPT with dropout 0.3: exit code, first loss compared with ln(256), "
                "overfit check run with dropout off", [code, "vs ln(256) = 5.545" in clean,
                                                       "dropout off for this check; the config's is 0.3" in clean],
                "==", [0, True, True])
    code = doctor.main(["--symptom", "nan", "--fault", "nan@blocks.1.attn", *base])
    text = capsys.readouterr().out
    gates.check("doctor --symptom nan --fault nan@blocks.1.attn on the GPT: exit 3 and the module named",
                code == 3 and "first module with a non-finite output: blocks.1.attn" in text, "==", True)


def test_sample_py_writes_text_from_a_run_in_a_copy_outside_the_repo(tmp_path):
    copy = Path(shutil.copytree(TEMPLATE, tmp_path / "my_project",
                                ignore=shutil.ignore_patterns("runs", "__pycache__")))
    bundle = str(ROOT / "data" / "shakespeare")  # outside the repo the bundle is wherever data.root says
    train_cmd = [sys.executable, "train.py", "--set", *sets({**TINY_LM, "train.steps": 16, "data.root": bundle,
                                                               "run.out_dir": "runs/lm"})]
    code, text = launch(train_cmd, cwd=copy, env=child_env(PYTHONPATH=""))
    assert code == 0, text
    code, text = launch([sys.executable, "sample.py", "--run", "runs/lm", "--prompt", "ROMEO:", "--tokens", "40"],
                        cwd=copy, env=child_env(PYTHONPATH=""))
    gates.check("sample.py in a copy outside the repo: exit code, the prompt continued, tokens/s reported",
                [code, text.startswith("ROMEO:"), "tokens/s, KV cache" in text], "==", [0, True, True])
    code, text = launch([sys.executable, "sample.py", "--run", "runs/lm", "--prompt", ""], cwd=copy,
                        env=child_env(PYTHONPATH=""))
    gates.check("sample.py with an empty prompt: exit code, one error line, traceback",
                [code, text.count("error:"), "Traceback" in text], "==", [2, 1, False])


# --- checkpoints that cannot go stale, full disks, corrupt or foreign files -----------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_sigkill_between_linking_best_and_last_leaves_best_correct(fmt, tmp_path):
    values, run_dir, ref = {**TINY, "train.epochs": 3, **FORMATS[fmt]}, tmp_path / "run", tmp_path / "ref"
    code, _ = launch([sys.executable, *FAULTS, "--set", *sets({**values, "run.out_dir": str(run_dir)})],
                     env=child_env(TEMPLATE_FAULTS="kill_between_links=2"))
    assert code == -signal.SIGKILL, code
    best_behind = checkpoint.step_of(run_dir / "best.pt") < checkpoint.step_of(run_dir / "last.pt")
    gates.check(f"{fmt}: after the kill: best.pt is behind last.pt (the kill landed between the links)",
                best_behind, "==", True)
    result = train.run(cfg_of({**values, "checkpoint.resume": "auto"}, run_dir))
    train.run(cfg_of(values, ref))
    best, ref_best = full(run_dir / "best.pt"), full(ref / "best.pt")
    gates.check(f"{fmt}: best.pt step == the best step the run recorded", best["step"], "==", result["best_step"])
    gates.check(f"{fmt}: best.pt weights vs the uninterrupted run's best.pt: entries that differ",
                diff_states(best["model"], ref_best["model"]), "==", [])


def test_an_asynchronous_save_writes_the_same_checkpoints_as_a_synchronous_one(tmp_path):
    values = {**TINY, **FORMATS["sharded"]}
    train.run(cfg_of(values, tmp_path / "sync"))
    train.run(cfg_of({**values, "checkpoint.async_save": True}, tmp_path / "async"))
    names = [p.name for p in checkpoint.step_files(tmp_path / "sync")]
    gates.check("checkpoint.async_save: step folders kept (keep_last 2, and best.pt's)",
                [p.name for p in checkpoint.step_files(tmp_path / "async")], "==", names)
    keys = ("model", "optimizer", "scheduler", "scaler", "sampler", "rng", "step", "best", "window")

    def state(run: str, name: str) -> dict:
        saved = full(tmp_path / run / name)
        return {k: saved[k] for k in keys}

    differ = [diff_states(state("sync", name), state("async", name)) for name in names]
    gates.check("checkpoint.async_save vs a synchronous save: entries that differ bitwise, every kept checkpoint",
                differ, "==", [[] for _ in names])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_stale_best_link_is_repaired_on_resume(fmt, tmp_path):
    """The Day 6 defect: last.pt records itself as best, but best.pt still holds an older step."""
    run_dir, values = tmp_path / "run", {**TINY, **FORMATS[fmt]}
    first = train.run(cfg_of(values, run_dir))
    older = checkpoint.step_files(run_dir)[0]
    checkpoint.link(older, run_dir / "best.pt")
    assert checkpoint.step_of(run_dir / "best.pt") != first["best_step"]
    code = train.main(["--set", *sets({**values, "checkpoint.resume": "auto", "run.out_dir": str(run_dir)})])
    gates.check(f"{fmt}: exit code of the resume over a stale best.pt", code, "==", 0)
    gates.check(f"{fmt}: best.pt step after that resume (the recorded best step)",
                checkpoint.step_of(run_dir / "best.pt"), "==", first["best_step"])


class FailingFile:
    """A real file whose writes fail with ENOSPC once `budget` bytes are written: a full disk, without a tmpfs."""

    def __init__(self, path, mode, budget=2000):
        self.f, self.left = open(path, mode), budget

    def write(self, b):
        if len(b) > self.left:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= len(b)
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_write_failing_mid_save_raises_checkpoint_error_and_keeps_the_previous_file(tmp_path, monkeypatch):
    payload = {"w": torch.randn(4096)}
    target = tmp_path / "last.pt"
    checkpoint.atomic_save(payload, target)
    before = sha(target)
    with pytest.raises(RuntimeError) as torch_error:  # what torch.save itself raises on a full disk
        torch.save(payload, FailingFile(tmp_path / "raw.pt", "wb"))
    gates.check("torch.save on a full disk raises", type(torch_error.value).__name__, "==", "RuntimeError")
    monkeypatch.setattr(checkpoint.files, "open", FailingFile, raising=False)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.atomic_save({"w": torch.randn(4096)}, target)
    assert "disk" in str(err.value) and str(target) in str(err.value)
    gates.check("temporary files left after a failed save", len(list(tmp_path.glob("*.tmp"))), "==", 0)
    gates.check("previous checkpoint unchanged after a failed save", sha(target), "==", before)


def test_a_failing_rename_raises_checkpoint_error_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "ckpt-00000005.pt"
    (target / "occupied").mkdir(parents=True)  # os.replace cannot put a file over a non-empty folder
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.atomic_save({"w": torch.ones(3)}, target)
    gates.check("temporary files left after a failed rename", len(list(tmp_path.glob("*.tmp"))), "==", 0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_disk_full_during_a_real_run_fails_clearly_and_keeps_last_pt_loadable(fmt, tmp_path, capsys):
    run_dir, values = tmp_path / "run", {**TINY, **FORMATS[fmt]}
    train.run(cfg_of({**values, "train.max_steps": 4}, run_dir))
    before = sha(run_dir / "last.pt")
    size = max(f.stat().st_size for f in [run_dir / "last.pt", *(run_dir / "last.pt").glob("*")] if f.is_file())
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    # From here the kernel refuses, with EFBIG, to grow any file of this process past half a checkpoint: the
    # write fails inside torch's zip writer exactly as on a full disk (ENOSPC). Logs stay far below the limit.
    resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, hard))
    try:
        code = train.main(["--set", *sets({**values, "run.out_dir": str(run_dir), "checkpoint.resume": "auto"})])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    gates.check(f"{fmt}: exit code when the disk fills during a save", code, "==", 1)
    assert "could not write checkpoint" in err and "Traceback" not in err, err
    gates.check(f"{fmt}: temporary files left on the full disk", len(list(run_dir.glob("*.tmp"))), "==", 0)
    gates.check(f"{fmt}: last.pt unchanged and loadable after the failed save",
                sha(run_dir / "last.pt") == before and checkpoint.load(run_dir / "last.pt")["step"] == 4, "==", True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_old_checkpoint_that_cannot_be_deleted_is_one_warning_and_the_run_finishes(fmt, tmp_path, capsys,
                                                                                     monkeypatch):
    """Pruning is housekeeping: the newest checkpoint is written and linked before it, so the run goes on."""
    unlink, rmtree = Path.unlink, shutil.rmtree

    def refused(path):  # e.g. a file another user owns in a shared folder
        if Path(path).name.startswith("ckpt-") and not Path(path).name.endswith(".tmp"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def refuse_unlink(path, missing_ok=False):
        refused(path)
        unlink(path, missing_ok=missing_ok)

    def refuse_rmtree(path, *args, **kwargs):
        refused(path)
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", refuse_unlink)
    monkeypatch.setattr(shutil, "rmtree", refuse_rmtree)
    run_dir = tmp_path / "run"
    code = train.main(["--set", *sets({**TINY, "train.max_steps": 4, "checkpoint.every_steps": 1, **FORMATS[fmt],
                                       "checkpoint.keep_last": 1, "run.out_dir": str(run_dir)})])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    names = [checkpoint.step_name(step, fmt == "sharded") for step in (1, 2, 3)]
    gates.check(f"{fmt}: old checkpoints that cannot be deleted (keep_last 1, one every step): exit code, warnings, "
                f"those naming steps 1, 2, 3 in turn and saying the newest is intact, last.pt step",
                [code, len(warnings), [n in w and "is intact" in w for n, w in zip(names, warnings)],
                 checkpoint.load(run_dir / "last.pt")["step"]], "==", [0, 3, [True, True, True], 4])


class Gadget:
    """What a hostile .metadata index could name: unpickling it would run code."""

    def __reduce__(self):
        return os.system, ("echo pwned",)


def test_corrupt_truncated_foreign_and_hostile_sharded_checkpoints_fail_with_one_clear_message(tmp_path, capsys):
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 3, **FORMATS["sharded"]}, run_dir))
    good = (run_dir / "last.pt").resolve()
    shard = (good / "__0_0.distcp").read_bytes()
    flipped = bytearray(shard)
    flipped[len(shard) // 2] ^= 0xFF  # inside a tensor: DCP alone would load it
    index = sharded.shard_reader(good).read_metadata()
    index.state_dict_metadata["model.extra"] = BytesStorageMetadata()  # DCP would unpickle it without restriction
    breaks = {"corrupted": ("__0_0.distcp", bytes(flipped)), "corrupted ": ("__0_0.distcp", shard[: len(shard) // 3]),
              "not a checkpoint of this template": ("meta.pt", None),
              "not part of a checkpoint index": (".metadata", pickle.dumps(Gadget())),
              "non-tensor entry": (".metadata", pickle.dumps(index))}
    caught = 0
    for word, (name, content) in breaks.items():
        bad = shutil.copytree(good, tmp_path / f"bad-{len(word)}")
        (bad / name).unlink()
        if content is not None:
            (bad / name).write_bytes(content)
        if name == ".metadata":  # the checksum made to match, as a forger would (meta.pt is in the folder too)
            meta = torch.load(bad / "meta.pt", weights_only=True)
            meta["checksums"][".metadata"] = sharded.crc32(bad / name)
            torch.save(meta, bad / "meta.pt")
        code = train.main(["--set", *sets({**TINY, "run.out_dir": str(tmp_path / f"new-{len(word)}"),
                                           "checkpoint.resume": str(bad)})])
        err = capsys.readouterr().err
        caught += code == 1 and word.strip() in err and str(bad) in err
    gates.check("sharded checkpoints with a flipped byte, a truncated shard, no meta.pt, an index naming os.system, "
                "an index with a non-tensor entry: refused with a message naming the folder", caught, "==", 5)


class LastLinkProbe(train.Hook):
    """Counts the optimizer steps after which run_dir/last.pt does not lead to a checkpoint."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.dangling = run_dir, []

    def step(self, progress) -> None:
        if checkpoint.step_of(self.run_dir / "last.pt") is None:
            self.dangling.append(progress.step)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resume_from_an_older_checkpoint_into_its_own_folder_never_leaves_last_pt_dangling(fmt, tmp_path):
    run_dir, values = tmp_path / "run", {**TINY, **FORMATS[fmt], "checkpoint.every_steps": 1, "checkpoint.keep_last": 4}
    train.run(cfg_of({**values, "train.max_steps": 12}, run_dir))  # keeps steps 9-12; best.pt: step 12
    older, probe = checkpoint.step_files(run_dir, 10)[0], LastLinkProbe(run_dir)
    train.run(cfg_of({**values, "checkpoint.resume": str(older), "checkpoint.keep_last": 1, "train.max_steps": 14},
                     run_dir), [probe])  # steps 11-14 saved again beside the older run's 11 and 12, best.pt on 12
    gates.check(f"{fmt}: resumed at step 10 in its own folder (keep_last 1): steps after which last.pt led nowhere",
                probe.dangling, "==", [])
    gates.check(f"{fmt}: ... last.pt's step at the end", checkpoint.load(run_dir / "last.pt")["step"], "==", 14)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_checkpoint_resumes_into_another_folder(fmt, tmp_path):
    values = {**TINY, **FORMATS[fmt]}
    train.run(cfg_of({**values, "train.max_steps": 4}, tmp_path / "a"))
    result = train.run(cfg_of({**values, "checkpoint.resume": str(tmp_path / "a" / "last.pt")}, tmp_path / "b"))
    launch_b = json.loads((tmp_path / "b" / "run.json").read_text())["launches"]
    gates.check(f"{fmt}: resume from another folder's last.pt: final step", result["step"], "==", STEPS)
    gates.check(f"{fmt}: the new folder's run.json names the checkpoint resumed from",
                launch_b[-1]["resumed_from"] == str((tmp_path / "a" / "last.pt").resolve()), "==", True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_finished_run_resumed_into_another_folder_tests_its_best_checkpoint(fmt, tmp_path):
    values = {**TINY, **FORMATS[fmt]}
    first = train.run(cfg_of(values, tmp_path / "a"))
    result = train.run(cfg_of({**values, "checkpoint.resume": str(tmp_path / "a" / "last.pt")}, tmp_path / "b"))
    gates.check(f"{fmt}: finished run resumed into another folder: best.pt there holds the recorded best step",
                checkpoint.step_of(tmp_path / "b" / "best.pt"), "==", first["best_step"])
    gates.check(f"{fmt}: its test accuracy (best.pt's weights) vs the finished run's", result["test_acc"], "==",
                first["test_acc"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_mid_epoch_checkpoint_resumed_into_another_folder_copies_the_best_checkpoint_from_the_old(fmt, tmp_path):
    values = {**OVERFIT, **FORMATS[fmt]}
    first = train.run(cfg_of(values, tmp_path / "a"))
    # The oldest step file but the best's: mid-epoch, after the best step. (A full best's file is pruned, its bytes
    # kept by the best.pt hard link; a sharded best's folder stays, as best.pt is a symbolic link to it.)
    source = [p for p in checkpoint.step_files(tmp_path / "a") if checkpoint.step_of(p) != first["best_step"]][0]
    step = checkpoint.step_of(source)
    assert step % 4 and checkpoint.load(source)["best"]["step"] == first["best_step"] < step, step  # 4 steps an epoch
    result = train.run(cfg_of({**values, "checkpoint.resume": str(source)}, tmp_path / "b"))
    gates.check(f"{fmt}: overfitting run resumed mid-epoch into another folder: ends like the original",
                (result["stopped_by"], result["step"], result["best_step"]), "==",
                (first["stopped_by"], first["step"], first["best_step"]))
    gates.check(f"{fmt}: its test accuracy (best.pt copied from the old folder) vs the original run's",
                result["test_acc"], "==", first["test_acc"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_resume_whose_best_checkpoint_is_gone_says_so_and_tests_the_last_weights(fmt, tmp_path, capsys):
    values = {**OVERFIT, **FORMATS[fmt]}
    train.run(cfg_of(values, tmp_path / "a"))
    best_step = checkpoint.step_of(tmp_path / "a" / "best.pt")
    oldest = [p for p in checkpoint.step_files(tmp_path / "a") if checkpoint.step_of(p) != best_step][0]
    (tmp_path / "lone").mkdir()
    source = tmp_path / "lone" / oldest.name  # alone in its folder: no file holds the best any more
    if oldest.is_dir():
        shutil.copytree(oldest, source)
    else:
        shutil.copy(oldest, source)
    capsys.readouterr()
    code = train.main(["--set", *sets({**values, "checkpoint.resume": str(source),
                                       "run.out_dir": str(tmp_path / "b")})])
    out = capsys.readouterr().out
    gates.check(f"{fmt}: exit code of a resume whose best checkpoint no file holds", code, "==", 0)
    gates.check(f"{fmt}: start-up says the best checkpoint is gone; the test line says which weights it tested",
                "no file holds the best checkpoint" in out and "test (the last weights, step" in out, "==", True)


def test_init_from_accepts_prefixed_keys_of_ddp_and_compiled_models(tmp_path):
    run_dir = tmp_path / "run"
    train.run(cfg_of({**TINY, "train.max_steps": 3}, run_dir))
    ckpt = checkpoint.load(run_dir / "last.pt")
    ckpt["model"] = {f"_orig_mod.module.{k}": v for k, v in ckpt["model"].items()}
    torch.save(ckpt, tmp_path / "prefixed.pt")
    result = train.run(cfg_of({**TINY, "checkpoint.init_from": str(tmp_path / "prefixed.pt"), "train.max_steps": 1},
                              tmp_path / "ft"))
    gates.check("fine-tune from a checkpoint with module./_orig_mod. prefixes: steps run", result["step"], "==", 1)


# --- non-finite loss ------------------------------------------------------------------------------------------------
def test_nan_before_any_checkpoint_says_none_was_written_instead_of_naming_last_pt(tmp_path, capsys, monkeypatch):
    code = train.main(["--set", *sets({**TINY, "run.out_dir": str(tmp_path / "run")})],
                      [Faults(nan_step=2, nan_module="head")])  # the first checkpoint would be at step 3
    err = capsys.readouterr().err
    gates.check("NaN before the first checkpoint: exit 1, 'no checkpoint was written yet', no last.pt named",
                code == 1 and "no checkpoint was written yet" in err and "last.pt" not in err, "==", True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_nan_after_a_checkpoint_advises_init_from_with_a_lower_lr_and_that_run_starts(fmt, tmp_path, capsys):
    run_dir, last, values = tmp_path / "run", tmp_path / "run" / "last.pt", {**TINY, **FORMATS[fmt]}
    train.main(["--set", *sets({**values, "run.out_dir": str(run_dir)})], [Faults(nan_step=5, nan_module="head")])
    err = capsys.readouterr().err
    gates.check(f"{fmt}: NaN message names last.pt and advises checkpoint.init_from with a lower optim.lr",
                f"checkpoint.init_from={last} optim.lr=" in err, "==", True)
    code = train.main(["--set", *sets({**values, "checkpoint.init_from": str(last), "optim.lr": 1e-3,
                                       "train.max_steps": 2, "run.out_dir": str(tmp_path / "lower")})])
    gates.check(f"{fmt}: exit code of the advised run (init_from last.pt, lower optim.lr, new run.out_dir)", code,
                "==", 0)


# --- the rest of Days 4-11 in the loop ------------------------------------------------------------------------------
def test_early_stopping_ends_an_overfitting_run(tmp_path):
    result = train.run(cfg_of(OVERFIT, tmp_path / "run"))
    val = [r for r in runlog.read_metrics(tmp_path / "run") if r["kind"] == "val"]
    gates.check("overfitting run ended by early stopping", result["stopped_by"], "==", "early_stop")
    gates.check("evaluations after the best one", len(val) - 1 - next(i for i, r in enumerate(val)
                                                                     if r["step"] == result["best_step"]), "==", 2)


def test_resuming_an_early_stopped_run_trains_nothing_more_like_a_finished_run(tmp_path):
    first = train.run(cfg_of(OVERFIT, tmp_path / "run"))
    evals = len([r for r in runlog.read_metrics(tmp_path / "run") if r["kind"] == "val"])
    result = train.run(cfg_of({**OVERFIT, "checkpoint.resume": "auto"}, tmp_path / "run"))
    val = [r for r in runlog.read_metrics(tmp_path / "run") if r["kind"] == "val"]
    gates.check("early-stopped run resumed: evaluations added (a finished run's resume adds none)", len(val) - evals,
                "==", 0)
    gates.check("its result: same step, still early_stop, best.pt's test accuracy again",
                (result["step"], result["stopped_by"], result["test_acc"]), "==",
                (first["step"], "early_stop", first["test_acc"]))


def test_profiler_window_writes_a_chrome_trace(tmp_path):
    train.run(cfg_of({**TINY, "profile.enabled": True, "profile.start_step": 2, "profile.steps": 2,
                      "train.max_steps": 6}, tmp_path / "run"))
    traces = list((tmp_path / "run" / "profile").glob("*.pt.trace.json*"))
    steps = json.loads(traces[0].read_text()) if traces else {"traceEvents": []}
    profiled = {e["name"] for e in steps["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}
    gates.check("profiled steps in the trace", len(profiled), "==", 2)


def test_activation_checkpointing_saves_memory_and_changes_no_gradient():
    info, x, y = data.ImageInfo(1, 28, 10), torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    cfg = config.load(None, ["model.mlp.depth=4", "model.mlp.hidden=256"]).model
    grads, saved = {}, {}
    for ckpt in (False, True):
        model = models.build(dataclasses.replace(cfg, activation_checkpointing=ckpt), info)
        torch.manual_seed(1)  # the same dropout masks in both runs (checkpoint() replays them when recomputing)
        saved[ckpt] = memory.saved_bytes(lambda: torch.nn.functional.cross_entropy(model(x), y), model, x)
        torch.manual_seed(1)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads[ckpt] = [p.grad for p in model.parameters()]
    gates.check("bytes saved for backward, checkpointing on / off", saved[True] / saved[False], "<", 0.5)
    gates.check("gradients with checkpointing equal those without (bitwise)",
                all(torch.equal(a, b) for a, b in zip(grads[False], grads[True])), "==", True)


def test_fp16_gradscaler_state_survives_a_resume(tmp_path):
    """An inf gradient at step 3 halves the scale; a run stopped at step 6 and resumed must carry the halved scale
    (a fresh scaler would restart at 65536, and the fp16 backward would round differently)."""
    values = {**TINY, "train.amp": True, "train.amp_dtype": "float16", "train.max_steps": 12}
    faults = Faults(inf_grad_step=3)
    train.run(cfg_of(values, tmp_path / "ref"), [faults])
    train.run(cfg_of({**values, "train.max_steps": 6}, tmp_path / "run"), [faults])
    train.run(cfg_of({**values, "checkpoint.resume": "auto"}, tmp_path / "run"), [faults])
    ref, got = train_records(tmp_path / "ref"), train_records(tmp_path / "run")
    gates.check("fp16: GradScaler scale after the inf gradient (halved from 65536)", ref[6]["scale"], "==", 32768.0)
    gates.check("fp16 resumed at step 6: steps whose loss or scale differs from the uninterrupted run",
                sum((ref[s]["loss"], ref[s]["scale"]) != (got[s]["loss"], got[s]["scale"]) for s in range(7, 13)), "==",
                0)


def test_fp16_gradscaler_unscales_before_clipping(tmp_path):
    norms = {}
    for amp in ("fp32", "fp16"):
        values = {**TINY, "train.max_steps": 3, "train.amp": amp == "fp16", "train.amp_dtype": "float16"}
        train.run(cfg_of(values, tmp_path / amp))
        norms[amp] = train_records(tmp_path / amp)[1]["grad_norm"]
    gates.check("grad norm at step 1, fp16 + GradScaler / fp32", norms["fp16"] / norms["fp32"], "<=", 1.02)
    gates.check("grad norm at step 1, fp32 / (fp16 + GradScaler)", norms["fp32"] / norms["fp16"], "<=", 1.02)
    scaler = checkpoint.load(tmp_path / "fp16" / "last.pt")["scaler"]
    gates.check("GradScaler state is in the checkpoint (scale)", scaler.get("scale", 0.0), ">", 1.0)


def test_memory_estimate_counts_the_saved_activations_of_the_shipped_config():
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), [])
    est = memory.estimate(cfg, data.ImageInfo(1, 28, 10), device="cpu")
    micro = cfg.train.batch_size // cfg.train.grad_accum
    model = models.build(cfg.model, data.ImageInfo(1, 28, 10))
    x, y = torch.randn(micro, 1, 28, 28), torch.randint(0, 10, (micro,))
    measured = memory.saved_bytes(lambda: torch.nn.functional.cross_entropy(model(x), y), model, x, y)
    gates.check("|estimated / measured bytes saved for backward - 1|, shipped mnist_mlp config",
                abs(est["activations"] / measured - 1), "<=", 0.01)
    gates.check("estimated model states, bytes per parameter (weights+grads+AdamW)",
                (est["weights"] + est["grads"] + est["optimizer"]) / est["params"], "==", 16)


@pytest.mark.parametrize("batch", [256, 2048])  # the shipped batch (AdamW's step peaks) and one where backward does
def test_memory_estimate_within_15_percent_of_the_cpu_step_peak(batch):
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), [f"train.batch_size={batch}"])
    est = memory.estimate(cfg, data.ImageInfo(1, 28, 10), device="cpu")
    measured = memory.cpu_step_peak(cfg, data.ImageInfo(1, 28, 10))
    gates.check(f"|estimated / measured step peak above resting memory - 1|, mnist_mlp, batch {batch} (CPU)",
                abs(est["step_peak"] / measured - 1), "<=", 0.15)


SMALL_GPT2 = ["model.gpt.n_layer=1", "model.gpt.n_head=2", "model.gpt.n_embd=64", "model.gpt.block_size=64",
              "data.tokens.block_size=64"]  # GPT-2's vocabulary: the loss's logits are the evaluation's peak


@pytest.mark.parametrize("name, batch, sets", [("mnist_mlp", 2048, []), ("shakespeare_cpu", 12, []),
                                               ("shakespeare_cpu", 256, []), ("gpt2_124m", 8, SMALL_GPT2)])
def test_memory_estimate_of_an_evaluation_within_15_percent_of_the_cpu_peak(name, batch, sets):
    cfg = config.load(str(TEMPLATE / f"configs/{name}.toml"),
                      [f"train.batch_size={batch}", "train.grad_accum=1", *sets])
    info = memory.info_of(cfg)
    est = memory.estimate(cfg, info, device="cpu")
    gates.check(f"|estimated / measured evaluation peak - 1|, {name}, micro-batch {batch} (CPU)",
                abs(est["evaluation"] / memory.cpu_eval_peak(cfg, info) - 1), "<=", 0.15)


@pytest.mark.parametrize("name, micro", [("mnist_mlp", 2048), ("mnist_resnet", 512)])
def test_the_largest_saved_tensor_extrapolated_from_batch_1_and_2_is_the_one_counted_at_the_micro_batch(name, micro):
    """With bf16 autocast the largest tensor saved at batch 1 and 2 is a weight's bf16 copy, at the micro-batch an
    activation: each saved tensor is extrapolated through its own line."""
    cfg = config.load(str(TEMPLATE / f"configs/{name}.toml"), ["train.amp=true", f"train.batch_size={micro}"])
    info = memory.info_of(cfg)
    est = memory.Estimator(cfg, info, device="cpu")(micro)
    counted = memory.activations(cfg, info, micro)
    gates.check(f"{name}, bf16 autocast, micro-batch {micro}: the backward term's largest saved tensor, estimated / "
                "counted at the micro-batch", (est["backward"] - est["activations"]) / max(max(counted[1]),
                                                                                           2 * counted[2]), "==", 1)


def test_gpt2_124m_evaluates_in_less_memory_than_it_trains():
    cfg = config.load(str(TEMPLATE / "configs/gpt2_124m.toml"), [])
    est = memory.estimate(cfg, memory.info_of(cfg))  # model.gpt.vocab_size is set: no token files needed
    gates.check("gpt2_124m.toml, one GPU: estimated evaluation peak / training peak (GiB: "
                f"{est['eval_peak'] / 2**30:.2f} / {est['peak'] / 2**30:.2f})", est["eval_peak"] / est["peak"], "<", 1)


# --- Muon against AdamW (muon_lab.py) -------------------------------------------------------------------------------
MUON_GATE_STEPS = 40  # the lab trains 240 steps; the gate repeats its comparison, shorter


def test_muon_gets_the_blocks_linear_weights_and_adamw_the_embeddings_and_norms():
    cfg = config.load(str(muon_lab.CONFIG), [])
    model = models.build(cfg.model, memory.info_of(cfg), device="meta")
    muon, adamw = optimizers.build(model, dataclasses.replace(cfg.optim, name="muon")).parts
    names = {id(p): n for n, p in model.named_parameters()}

    def held(group) -> list[str]:
        return sorted(names[id(p)] for p in group["params"])

    linear = sorted(f"blocks.{path}.weight" for path, m in model.blocks.named_modules() if isinstance(m, nn.Linear))
    gates.check("Muon's parameters: the weight of every nn.Linear in the blocks, nothing else",
                held(muon.param_groups[0]), "==", linear)
    gates.check("AdamW's groups beside it: decayed (the token embedding, tied to the head; the position embedding), "
                "not decayed (LayerNorm gains)", [held(g) for g in adamw.param_groups], "==",
                [["wpe.weight", "wte.weight"], sorted(n for n, p in model.named_parameters() if p.ndim == 1)])
    assert model.lm_head.weight is model.wte.weight and len(linear) == 4 * cfg.model.gpt.n_layer


@pytest.mark.parametrize("name", ["mnist_mlp", "mnist_resnet", "shakespeare_cpu"])
def test_adamw_decays_the_weight_matrices_and_embeddings_only(name):
    """optimizers.build's AdamW groups, against the modules that own each parameter: the weight of every Linear, Conv
    and Embedding decayed at optim.weight_decay; biases and the norms' gains and shifts (LayerNorm, BatchNorm) not."""
    cfg = config.load(str(TEMPLATE / "configs" / f"{name}.toml"), [])
    model = models.build(cfg.model, memory.info_of(cfg), device="meta")
    optimizer = optimizers.build(model, cfg.optim)
    names = {id(p): n for n, p in model.named_parameters()}
    owned = {f"{m}.{k}" if m else k: (type(module), k) for m, module in model.named_modules()
             for k, _ in module.named_parameters(recurse=False)}
    decayed = sorted(n for n in names.values() if owned[n][1] == "weight"
                     and issubclass(owned[n][0], (nn.Linear, nn.Conv2d, nn.Embedding)))
    gates.check(f"{name}: AdamW's groups (names, weight decay): the weights of Linear, Conv2d and Embedding modules "
                f"decayed, every other parameter not", [(sorted(names[id(p)] for p in g["params"]), g["weight_decay"])
                                                        for g in optimizer.param_groups], "==",
                [(decayed, cfg.optim.weight_decay), (sorted(set(names.values()) - set(decayed)), 0.0)])


def test_fp32_muon_takes_torchs_muon_steps_to_bf16_precision():
    """optim.name=muon runs Fp32Muon on the CPU (an AVX2-only CPU multiplies bf16 25x slower than fp32): two steps of
    each on one tall matrix and the same gradients, so momentum, Nesterov, weight decay and the lr scaling all act."""
    g = torch.Generator().manual_seed(0)
    start, grads = torch.randn(384, 128, generator=g), [torch.randn(384, 128, generator=g) for _ in range(2)]
    moved = {}
    for optimizer in (torch.optim.Muon, optimizers.Fp32Muon):
        weight = nn.Parameter(start.clone())
        muon = optimizer([weight], lr=0.02, weight_decay=0.1, adjust_lr_fn="original")
        for grad in grads:
            weight.grad = grad.clone()
            muon.step()
        moved[optimizer] = weight.detach() - start
    ours, torchs = moved[optimizers.Fp32Muon], moved[torch.optim.Muon]
    gates.check("two Muon steps, Fp32Muon vs torch.optim.Muon (its iteration in bf16): largest difference of the "
                "weight's change / its largest change", ((ours - torchs).abs().max() / torchs.abs().max()).item(), "<",
                2 ** -5)


@pytest.mark.slow
def test_muon_beats_adamw_at_equal_steps_on_both_seeds_at_the_labs_learning_rates():
    chosen = json.loads((HERE / "results" / "muon.json").read_text())["chosen"]  # the lab's choices on validation
    cfg = config.load(str(muon_lab.CONFIG), [])
    splits = data.build(cfg.data, cfg.run.seed)
    loss = {(name, seed): muon_lab.run(cfg, splits, name, c["lr"], c["adamw_lr"], seed, MUON_GATE_STEPS)["val_loss"]
            for name, c in chosen.items() for seed in (0, 1)}
    gates.check(f"the GPT, {MUON_GATE_STEPS} steps at the lab's learning rates: Muon's val loss / AdamW's, worse of "
                f"seeds 0 and 1", max(loss["muon", s] / loss["adamw", s] for s in (0, 1)), "<", 1.0)


# --- from an RNN to attention (rnn_to_attention_lab.py) -------------------------------------------------------------
def test_the_labs_lstm_has_the_gpts_parameters_within_one_percent_as_its_formula_counts():
    cfg = config.load(str(rnn_lab.CONFIG), [])
    info = data.build(cfg.data, cfg.run.seed).info
    lstm, gpt = rnn_lab.build("lstm", cfg, info, 0), models.build(cfg.model, info, device="meta")
    width = lstm.lstm.hidden_size
    assert models.count_params(lstm) == rnn_lab.lstm_params(info.vocab_size, width, rnn_lab.LSTM_LAYERS)
    gates.check(f"|LSTM parameters / GPT parameters - 1| (width {width}, {rnn_lab.LSTM_LAYERS} layers)",
                abs(models.count_params(lstm) / models.count_params(gpt) - 1), "<", 0.01)


MEMORY_EXPONENTS = {"attention, math path": (">=", 1.6), "attention, fused path": ("<=", 1.2), "LSTM": ("<=", 1.2)}


@pytest.mark.parametrize("name", MEMORY_EXPONENTS)
def test_attentions_score_matrix_makes_its_memory_grow_as_the_context_squared_unless_fused(name):
    lengths = rnn_lab.CONTEXTS[-rnn_lab.FITTED:]
    peaks = [rnn_lab.step_cost(name, length, batch=1, repeats=1)["peak_mib"] for length in lengths]
    op, bound = MEMORY_EXPONENTS[name]
    gates.check(f"{name}: exponent k of a forward + backward's memory ~ T^k, T = {lengths}",
                rnn_lab.exponent(lengths, peaks), op, bound)


REVERSAL_GATE = {"steps": 300, "hidden": 64, "max_length": 16}  # the lab: 1,500 steps, lengths up to 32


@pytest.mark.parametrize("seed", [0, 1])
def test_without_attention_a_seq2seq_lstm_forgets_long_sequences_and_attention_remembers_them(seed):
    short, long = rnn_lab.MIN_LENGTH, REVERSAL_GATE["max_length"]
    plain, attending = (rnn_lab.train_reverser(attention, seed, **REVERSAL_GATE) for attention in (False, True))
    gates.check(f"reversing digits, seed {seed}: without attention, share right at length {short} - at {long}",
                rnn_lab.accuracy(plain, short) - rnn_lab.accuracy(plain, long), ">=", 0.3)
    gates.check(f"reversing digits, seed {seed}: share right at length {long}, with attention - without",
                rnn_lab.accuracy(attending, long) - rnn_lab.accuracy(plain, long), ">=", 0.15)


# --- what each part of a modern GPT buys (architecture_lab.py) -----------------------------------------------------
# The lab trains 300 steps; the gates repeat, shorter, effects that held on its every seed: 120 steps show post-norm's
# stall and RoPE's lead; QK-norm's lead at lr 1e-2 needs 200 (at 120 the worse seed's was 0.001).
ARCH_GATE_STEPS, QK_GATE_STEPS = 120, 200


@functools.cache
def arch_setup() -> tuple:
    """The lab's data (windows of 64 and of 128 characters) and its table of runs."""
    splits = data.build(arch_lab.load(()).data, 0)
    return splits, arch_lab.longer_splits(0), arch_lab.runs(splits.info)


@functools.cache
def arch_run(name: str, seed: int, steps: int = ARCH_GATE_STEPS) -> tuple[dict, nn.Module]:
    """The lab's run `name` on `seed`, evaluated after its last step only (each run once per session, shared by the
    gates)."""
    splits, _, table = arch_setup()
    return arch_lab.train_run(table[name], splits, seed, steps, eval_every=steps)


@pytest.mark.parametrize("depth", arch_lab.DEPTHS)
def test_the_labs_deeper_and_wider_gpts_hold_the_gpt2_blocks_parameters_within_two_percent(depth):
    splits, _, table = arch_setup()
    ratio = arch_lab.params(splits.info, table[f"{depth} layers"]) / arch_lab.params(splits.info)
    gates.check(f"|parameters of {' '.join(table[f'{depth} layers'])} / the config's - 1|", abs(ratio - 1), "<", 0.02)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_post_norm_stalls_on_character_frequencies_at_the_learning_rate_where_pre_norm_learns(seed):
    unigram = arch_lab.unigram_loss(arch_setup()[0])
    gates.check(f"post-norm, lr {arch_lab.LR:g}, seed {seed}, {ARCH_GATE_STEPS} steps: val loss - the unigram "
                f"loss ({unigram:.3f})", arch_run("post-norm", seed)[0]["val_loss"] - unigram, ">", -0.05)
    gates.check("pre-norm (the GPT-2 block), the same: val loss - the unigram loss",
                arch_run("GPT-2 block", seed)[0]["val_loss"] - unigram, "<", -0.3)


@pytest.mark.slow
@pytest.mark.parametrize("change, reference, steps", [("RoPE", "no positions", ARCH_GATE_STEPS),
                                                      ("QK-norm, lr 1e-2", "GPT-2 block, lr 1e-2", QK_GATE_STEPS)])
def test_a_change_that_won_on_every_seed_of_the_lab_wins_on_both_seeds_here(change, reference, steps):
    delta = [arch_run(change, seed, steps)[0]["val_loss"] - arch_run(reference, seed, steps)[0]["val_loss"]
             for seed in (0, 1)]
    gates.check(f"{change} against {reference}, {steps} steps: val loss difference, worse of seeds 0 and 1",
                max(delta), "<", 0.0)


@pytest.mark.slow
def test_rope_reads_windows_twice_its_training_context_and_learned_positions_cannot():
    _, longer, _ = arch_setup()
    windows = spread(longer.val, 64)
    with pytest.raises(ValueError, match="exceed block_size 64"):
        arch_run("GPT-2 block", 0)[1](windows[0])
    trained, beyond = arch_lab.loss_by_position(arch_run("RoPE", 0)[1], windows, 64)
    gates.check(f"RoPE, seed 0, {ARCH_GATE_STEPS} steps, windows of {arch_lab.LONG}: val loss at positions 64-127 - "
                f"at 0-63", beyond - trained, "<", 0.15)


# --- shakespeare_modern.toml, chosen by modern_lab.py -----------------------------------------------------------------
def test_shakespeare_modern_is_the_cpu_recipe_with_the_candidate_modern_lab_chose():
    lab = json.loads((HERE / "results" / "modern.json").read_text())
    modern = config.load(str(modern_lab.MODERN), [])
    chosen_sets = lab["candidates"][lab["chosen"]]
    chosen = config.load(str(modern_lab.CONFIG), [*chosen_sets, f"run.out_dir={modern.run.out_dir}"])
    gates.check(f"shakespeare_modern.toml == shakespeare_cpu.toml + the --sets of modern_lab's choice "
                f"({lab['chosen']}), output folder aside", modern == chosen, "==", True)


def test_shakespeare_modern_s_parts_are_among_those_the_fsdp_init_and_kill_resume_gates_run():
    """The FSDP2 meta-device build (MODERN_LM here) and the SIGKILL resume (the template's test_resume.py) run every
    modern part at once; the config's parts must be among them, at the same values."""
    from test_resume import MODERN

    options = modern_lab.modern_options()
    gates.check("shakespeare_modern.toml's [model.gpt] changes not run by the FSDP2 init and resume gates",
                {k: v for k, v in options.items() if MODERN_LM.get(k) != v or MODERN.get(k) != v}, "==", {})


# --- the CPU speedrun (shakespeare_speedrun.toml, nanogpt_bench.py) ----------------------------------------------------
SPEEDRUN_GATE_STEPS = 25  # the speedrun's steps in the cut-down race; the tuned AdamW recipe takes twice as many


def test_shakespeare_speedrun_is_shakespeare_modern_with_the_bench_s_listed_changes():
    speedrun = config.load(str(TEMPLATE / "configs" / "shakespeare_speedrun.toml"), [])
    listed = config.load(str(modern_lab.MODERN), [*nanogpt_bench.SPEEDRUN_SETS, f"run.out_dir={speedrun.run.out_dir}"])
    gates.check("shakespeare_speedrun.toml == shakespeare_modern.toml + nanogpt_bench.SPEEDRUN_SETS, output folder "
                "aside", speedrun == listed, "==", True)


def test_the_speedrun_config_reaches_a_lower_val_loss_than_the_tuned_adamw_recipe_on_as_many_tokens(tmp_path):
    """A cut-down race on the repo's Shakespeare (validation: the held-out works): the speedrun config, its cosine cut
    to SPEEDRUN_GATE_STEPS steps of 24 windows, against shakespeare_cpu.toml at the tuned rate (3e-3), its cosine over
    twice the steps of 12 windows: the same tokens, half the optimizer steps."""
    cut = ["data.shakespeare.eval_windows=256", "train.progress=off"]
    speedrun = config.load(str(TEMPLATE / "configs" / "shakespeare_speedrun.toml"),
                           [*cut, f"train.steps={SPEEDRUN_GATE_STEPS}", f"train.eval_every={SPEEDRUN_GATE_STEPS}",
                            f"run.out_dir={tmp_path / 'speedrun'}"])
    adamw = config.load(str(TEMPLATE / "configs" / "shakespeare_cpu.toml"),
                        [*cut, "optim.lr=3e-3", f"train.steps={2 * SPEEDRUN_GATE_STEPS}",
                         f"train.eval_every={2 * SPEEDRUN_GATE_STEPS}", f"run.out_dir={tmp_path / 'adamw'}"])
    tokens = [cfg.train.steps * cfg.train.batch_size for cfg in (speedrun, adamw)]
    assert tokens[0] == tokens[1], tokens
    loss = [train.run(cfg)["best_val_loss"] for cfg in (speedrun, adamw)]
    gates.check(f"val loss after {tokens[0]:,} windows: the speedrun config's / the tuned AdamW recipe's",
                loss[0] / loss[1], "<", 1.0)


# --- the 25 M-parameter GPU config (shakespeare_25m.toml; its CUDA gates are at the end) ------------------------------
def test_shakespeare_25m_trains_a_few_steps_on_the_cpu_to_a_finite_loss(tmp_path):
    """The config's model, data and schedule, two steps of 2 windows in fp32 and eager (bf16 on a CPU without native
    bf16 and torch.compile's build would take minutes: the CUDA gate runs them)."""
    cfg = config.load(str(TEMPLATE / "configs/shakespeare_25m.toml"), sets({
        "train.max_steps": 2, "train.batch_size": 2, "data.shakespeare.eval_windows": 2, "train.amp": False,
        "model.compile": False, "train.log_every": 1, "train.progress": "off", "run.out_dir": str(tmp_path / "run")}))
    params = models.count_params(models.build(cfg.model, memory.info_of(cfg), device="meta"))
    gates.check("shakespeare_25m.toml: parameters in millions, to one decimal (its header says 25.3)",
                round(params / 1e6, 1), "==", 25.3)
    result = train.run(cfg)
    losses = [r["loss"] for r in train_records(tmp_path / "run").values()] + [result["best_val_loss"]]
    gates.check("shakespeare_25m.toml, 2 CPU steps of 2 windows: train and val losses, all finite",
                all(math.isfinite(x) for x in losses) and len(losses) == 3, "==", True)


# --- the engineering chapter's drills (drills_lab.py) ----------------------------------------------------------------
def test_the_tensorboard_event_file_holds_every_logged_curve(smoke):
    curves = drills_lab.tensorboard_curves(smoke["out"])
    logged = [r for r in runlog.read_metrics(smoke["out"]) if r["kind"] == "train"]
    gates.check("TensorBoard's reader on the smoke run's tb/: points of train/loss, vs records in metrics.jsonl",
                curves["points"]["train/loss"], "==", len(logged))
    gates.check("... its last train/loss point / the last record's loss - 1 (stored as float32)",
                abs(curves["last_train_loss"] / logged[-1]["loss"] - 1), "<=", 1e-6)
    assert {"train/loss", "train/lr", "val/val_loss", "val/val_acc"} <= set(curves["tags"]), curves["tags"]


def test_ten_times_the_lr_trains_the_tiny_gpt_worse_and_never_reaches_the_nan_stop(tiny_gpt_120, tmp_path):
    """drills_lab's drill 1 (lr 1e-2, ten times shakespeare_cpu.toml's), its own code on the tiny GPT: 10x its lr."""
    tiny = functools.partial(drills_lab.launch, config_file=None, base=sets(TINY_GPT_120))
    drill = drills_lab.high_lr(tmp_path, tiny_gpt_120["out"], tiny)
    gates.check(f"the lr drill on the tiny GPT, lr {drill['lr']:g} (10x): steps done of {TINY_GPT_120['train.steps']}, "
                "the NaN stop's message", [drill["steps_done"], drill["nan_stop"]], "==",
                [TINY_GPT_120["train.steps"], None])
    gates.check(f"... its val loss after them / the val loss at the config's lr {drill['config_lr']:g}",
                drill["val_loss"] / drill["config_lr_val_loss"], ">", 1.0)


def test_two_runs_of_one_seed_are_bitwise_equal_in_deterministic_mode_and_on_a_cpu_without_it(tmp_path):
    """drills_lab's drill 2, its own code on the tiny GPT (dropout on: the masks come from the seed too). The
    curriculum's claim: one seed with deterministic algorithms gives bitwise-equal runs. Without them, what this
    device does, as measured: torch's CPU kernels sum in a fixed order for a fixed thread count, so off mode is bitwise
    too and equals on mode (drills.json shows it on shakespeare_cpu.toml); on a GPU, atomics and cuBLAS/cuDNN's
    algorithm choice may make off mode differ, so there it is reported, not asserted."""
    steps = 16
    seed = drills_lab.same_seed(tmp_path, functools.partial(drills_lab.launch, config_file=None, base=sets(TINY_LM)),
                                steps)
    on, off = seed["deterministic=True"], seed["deterministic=False"]
    gates.check(f"two tiny-GPT runs of seed 0, run.deterministic = true, {steps} steps: records (train, val, test; "
                "timing fields aside), those that differ, final weight tensors that differ",
                [on["records"], on["records_differing"], on["weights_differing"]], "==", [steps + 2, 0, 0])
    gates.check("torch's deterministic algorithms after each run (run.deterministic = false, false, true, true)",
                [*off["algorithms_deterministic"], *on["algorithms_deterministic"]], "==", [False, False, True, True])
    off_mode = [off["records_differing"], off["weights_differing"], seed["between_modes_losses_differing"]]
    print(f"on {seed['device']}, deterministic = false: records and weight tensors that differ between its two runs, "
          f"losses that differ from deterministic = true: {off_mode}; CPU time of a step on / off (fastest of 2 runs "
          f"each, a figure drills.json reports, not a gate): {seed['cost_cpu_ratio']:.3f}")
    if seed["device"] == "cpu":
        gates.check(f"on the CPU, run.deterministic = false, {steps} steps: records and final weight tensors that "
                    "differ between its two runs, losses that differ from run.deterministic = true", off_mode, "==",
                    [0, 0, 0])


def test_resuming_without_the_optimizer_state_changes_the_run_after_its_first_step(tmp_path):
    values = {**TINY_LM, "model.gpt.dropout": 0.0, "train.steps": 16, "train.eval_every": 8,
              "checkpoint.every_steps": 8}
    train.run(cfg_of(values, tmp_path / "uninterrupted"))
    train.run(cfg_of({**values, "train.max_steps": 8}, tmp_path / "stopped"))
    drills_lab.without_optimizer_state(tmp_path / "stopped" / "ckpt-00000008.pt", tmp_path / "model-only.pt")
    train.run(cfg_of({**values, "checkpoint.resume": str(tmp_path / "model-only.pt")}, tmp_path / "model-only"))
    reference, got = train_records(tmp_path / "uninterrupted"), train_records(tmp_path / "model-only")
    gates.check("resumed at step 8 without AdamW's moments: is step 9's loss (the checkpoint's weights) the "
                "uninterrupted run's; steps 10-16 whose loss differs", [got[9]["loss"] == reference[9]["loss"],
                sum(got[s]["loss"] != reference[s]["loss"] for s in range(10, 17))], "==", [True, 7])


def test_compare_runs_shows_the_changed_fields_and_the_mean_and_std_over_seeds(tmp_path, capsys):
    folders = {(lr, seed): tmp_path / f"lr{lr}-seed{seed}" for lr, seed in ((3e-3, 0), (3e-3, 1), (1e-2, 0))}
    for (lr, seed), folder in folders.items():
        train.run(cfg_of({**TINY, "train.epochs": 1, "optim.lr": lr, "run.seed": seed}, folder))
    capsys.readouterr()  # the runs' own output
    assert compare_runs.main([str(f) for f in folders.values()]) == 0
    header, _, *rows = capsys.readouterr().out.splitlines()
    best = [min(r["val_loss"] for r in runlog.read_metrics(folders[3e-3, s]) if r["kind"] == "val") for s in (0, 1)]
    gates.check("compare_runs.py, 3 runs: the columns of config fields it shows", header.split(" | ")[1:3], "==",
                ["optim.lr", "run.seed"])
    gates.check("... the lr 3e-3 group's row: 2 seeds, best val loss as mean ± std (recomputed from metrics.jsonl)",
                rows[2].split(" | ")[2:4], "==", ["2 seeds", f"{statistics.mean(best):.4g} ± {statistics.stdev(best):.2g}"])
    assert compare_runs.main([str(tmp_path)]) == 2 and "not a run folder" in capsys.readouterr().err


# --- experiment tracking: MLflow (run.tracker = "mlflow") -----------------------------------------------------------
MLFLOW = {**TINY, "run.tracker": "mlflow", "train.epochs": 1}  # 16 steps, one evaluation, the test


class SigtermAt(train.Hook):
    """SIGTERM to this process after optimizer step `step`: the run stops after the next one, as under a scheduler."""

    def __init__(self, step: int):
        self.at = step

    def step(self, progress) -> None:
        if progress.step == self.at:
            signal.raise_signal(signal.SIGTERM)


def mlflow_runs_in(run_dir: Path):
    """(MLflow's client on the run folder's store, the MLflow runs in it), read back through MLflow itself."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient((run_dir / "mlruns").resolve().as_uri())
    return client, client.search_runs(["0"])


def mlflow_run(run_dir: Path):
    """(the client, the one MLflow run of a run folder that has one)."""
    client, (run,) = mlflow_runs_in(run_dir)
    return client, run


def histories(client, run) -> dict:
    """{metric: [(step, value), ...]} of an MLflow run."""
    return {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in run.data.metrics}


def jsonl_curves(run_dir: Path) -> dict:
    """{kind/name: [(step, value), ...]} of every number in metrics.jsonl, in file order."""
    curves = {}
    for record in runlog.read_metrics(run_dir):
        for name, value in record.items():
            if name not in ("kind", "step", "epoch") and isinstance(value, (int, float)):
                curves.setdefault(f"{record['kind']}/{name}", []).append((record["step"], float(value)))
    return curves


@pytest.fixture(scope="module")
def mlflow_runs(tmp_path_factory):
    """MLFLOW whole; and stopped by SIGTERM after step 8 (its MLflow run read back then), then resumed to the end."""
    tmp = tmp_path_factory.mktemp("mlflow")
    train.run(cfg_of(MLFLOW, tmp / "whole"))
    with pytest.raises(signals.Stopped):
        train.run(cfg_of(MLFLOW, tmp / "resumed"), [SigtermAt(7)])
    _, stopped = mlflow_run(tmp / "resumed")
    train.run(cfg_of({**MLFLOW, "checkpoint.resume": "auto"}, tmp / "resumed"))
    return {"whole": tmp / "whole", "resumed": tmp / "resumed", "stopped": stopped}


def test_mlflow_params_are_the_flattened_config_toml(mlflow_runs):
    _, run = mlflow_run(mlflow_runs["whole"])
    fields = config.flatten(tomllib.loads((mlflow_runs["whole"] / "config.toml").read_text()))
    gates.check("MLflow params vs config.toml's fields, dotted (values as strings): differences",
                sorted(set(run.data.params.items()) ^ {(k, str(v)) for k, v in fields.items()}), "==", [])


def test_mlflow_metric_histories_equal_metrics_jsonl_values_and_steps(mlflow_runs):
    got, want = histories(*mlflow_run(mlflow_runs["whole"])), jsonl_curves(mlflow_runs["whole"])
    gates.check("MLflow metrics whose (step, value) history differs from metrics.jsonl's",
                sorted(k for k in got.keys() | want.keys() if got.get(k) != want.get(k)), "==", [])
    gates.check("... metrics compared (train, val and test figures)", len(want), ">=", 12)


def test_mlflow_tags_hold_the_git_commit_torch_version_and_world_size(mlflow_runs):
    _, run = mlflow_run(mlflow_runs["whole"])
    launch = json.loads((mlflow_runs["whole"] / "run.json").read_text())["launches"][0]
    tags = {k: run.data.tags.get(k) for k in ("mlflow.source.git.commit", "torch", "world_size")}
    gates.check("MLflow tags: git commit, torch version, world size (as run.json records them)", tags, "==",
                {"mlflow.source.git.commit": launch["git"], "torch": torch.__version__, "world_size": "1"})


def test_mlflow_run_holds_config_toml_as_an_artifact(mlflow_runs):
    client, run = mlflow_run(mlflow_runs["whole"])
    local = client.download_artifacts(run.info.run_id, "config.toml")
    gates.check("MLflow artifact config.toml == the run folder's", Path(local).read_text(), "==",
                (mlflow_runs["whole"] / "config.toml").read_text())


def test_a_resumed_run_continues_the_same_mlflow_run_with_every_step_once(mlflow_runs):
    client, runs = mlflow_runs_in(mlflow_runs["resumed"])
    gates.check("MLflow run ids in the store after the resume: the SIGTERM-stopped run's alone",
                [r.info.run_id for r in runs], "==", [mlflow_runs["stopped"].info.run_id])
    got = histories(client, runs[0])
    gates.check("... train/loss steps (stopped after 8, resumed to the end: each once)",
                [step for step, _ in got["train/loss"]], "==", list(range(1, STEPS // 2 + 1)))
    gates.check("... metrics whose history differs from metrics.jsonl's",
                sorted(k for k, v in jsonl_curves(mlflow_runs["resumed"]).items() if got.get(k) != v), "==", [])


def test_mlflow_run_status_says_how_each_launch_ended(mlflow_runs):
    _, run = mlflow_run(mlflow_runs["resumed"])
    gates.check("MLflow status after the SIGTERM stop, after the resumed run's end",
                [mlflow_runs["stopped"].info.status, run.info.status], "==", ["KILLED", "FINISHED"])


def test_a_kill_leaves_mlflow_only_the_records_a_resume_keeps(tmp_path):
    """Records after the last checkpoint are redone after a SIGKILL (metrics.jsonl drops them); MLflow, which cannot
    delete a point, must never have got them. Here the logger itself: a checkpoint at step 3 (its flush), records 4
    and 5, the kill (no flush, no close), the resume from step 3 redoing 4 and 5."""
    cfg, meta = cfg_of(MLFLOW, tmp_path / "run"), runlog.metadata(torch.device("cpu"), 1, None)
    killed = runlog.RunLog(tmp_path / "run", cfg, True, 0, meta)
    for step in (1, 2, 3, 4, 5):
        killed.record("train", step, loss=float(step) if step <= 3 else -1.0)
        if step == 3:
            killed.flush()
    killed.metrics.close()  # the kill closes the file; nothing else of the launch runs
    resumed = runlog.RunLog(tmp_path / "run", cfg, True, 3, meta)
    for step in (4, 5):
        resumed.record("train", step, loss=float(step))
    resumed.close()
    client, run = mlflow_run(tmp_path / "run")
    gates.check("MLflow's train/loss after a kill at step 5 and a resume from step 3's checkpoint",
                histories(client, run)["train/loss"], "==", [(s, float(s)) for s in range(1, 6)])


def test_a_resume_from_an_older_checkpoint_gets_an_mlflow_run_of_its_own_equal_to_metrics_jsonl(tmp_path):
    """The first launch ends at step 5 (all sent); resumed from step 3's checkpoint, steps 4 and 5 are redone with
    other values (a re-planned schedule). The first MLflow run cannot drop its 4 and 5: the resume gets a new one,
    tagged with the run it branches off."""
    cfg, meta = cfg_of(MLFLOW, tmp_path / "run"), runlog.metadata(torch.device("cpu"), 1, None)
    first = runlog.RunLog(tmp_path / "run", cfg, True, 0, meta)
    for step in (1, 2, 3, 4, 5):
        first.record("train", step, loss=float(step))
    first.close()
    resumed = runlog.RunLog(tmp_path / "run", cfg, True, 3, meta)
    for step in (4, 5):
        resumed.record("train", step, loss=-float(step))
    resumed.close()
    client, runs = mlflow_runs_in(tmp_path / "run")
    (run,) = [r for r in runs if r.info.run_id == resumed.mlflow.run_id]
    gates.check("MLflow runs in the store after a resume from step 3 of a run that reached 5; the resume's "
                "train/loss; the run it is tagged as branching off",
                [len(runs), histories(client, run)["train/loss"], run.data.tags.get("forked_from")], "==",
                [2, jsonl_curves(tmp_path / "run")["train/loss"], first.mlflow.run_id])


def tear_meta_yaml(run_dir: Path, run_id: str) -> None:
    """What a SIGKILL in the middle of MLflow rewriting a run's meta.yaml in place (each status change) leaves."""
    (run_dir / "mlruns" / "0" / run_id / "meta.yaml").write_text("")


@pytest.mark.parametrize("damage", ["meta.yaml torn by a kill", "deleted in MLflow's UI"])
def test_a_resume_whose_mlflow_run_is_unusable_sends_a_new_one_what_metrics_jsonl_kept(damage, tmp_path):
    cfg, meta = cfg_of(MLFLOW, tmp_path / "run"), runlog.metadata(torch.device("cpu"), 1, None)
    first = runlog.RunLog(tmp_path / "run", cfg, True, 0, meta)
    for step in (1, 2, 3):
        first.record("train", step, loss=float(step))
    first.close()
    if damage == "deleted in MLflow's UI":
        first.mlflow.client.delete_run(first.mlflow.run_id)
    else:
        tear_meta_yaml(tmp_path / "run", first.mlflow.run_id)
    resumed = runlog.RunLog(tmp_path / "run", cfg, True, 3, meta)
    resumed.record("train", 4, loss=4.0)
    resumed.close()
    history = first.mlflow.client.get_metric_history(resumed.mlflow.run_id, "train/loss")
    gates.check(f"MLflow run named in run.json {damage}: the resume's MLflow run is a new one; its train/loss",
                [resumed.mlflow.run_id != first.mlflow.run_id, [(m.step, m.value) for m in history]], "==",
                [True, [(s, float(s)) for s in range(1, 5)]])


def test_an_mlflow_store_that_fails_at_a_checkpoint_is_one_error_line_and_exit_1(tmp_path, capsys, monkeypatch):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    def full(client, run_id, metrics=(), **rest):
        if metrics:  # the file store wraps its OSErrors so
            raise MlflowException("[Errno 28] No space left on device")

    monkeypatch.setattr(MlflowClient, "log_batch", full)
    code = train.main(["--set", *sets({**MLFLOW, "train.max_steps": 3, "run.out_dir": str(tmp_path / "run")})])
    err = capsys.readouterr().err
    gates.check("MLflow store failing at the first checkpoint: exit code, error lines, naming mlruns/ and the cause",
                [code, len(err.strip().splitlines()), "mlruns" in err, "No space left" in err], "==",
                [1, 1, True, True])


def test_logging_to_mlflow_switches_mlflow_telemetry_off(tmp_path, monkeypatch):
    """Outside pytest and CI, `import mlflow` fetches a config from mlflow-telemetry.io, sends usage events and writes
    ~/.config/mlflow/telemetry.json: a run reaches nothing outside its folder. (Under pytest MLflow stays quiet by
    itself, so this reads the switch MLflow reads.)"""
    from mlflow.environment_variables import MLFLOW_DISABLE_TELEMETRY

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    runlog.RunLog(tmp_path / "run", cfg_of(MLFLOW, tmp_path / "run"), True, 0,
                  runlog.metadata(torch.device("cpu"), 1, None)).close()
    gates.check("MLflow's telemetry switch after a run logged to MLflow", MLFLOW_DISABLE_TELEMETRY.get(), "==", True)


def test_turning_mlflow_on_at_a_resume_sends_it_the_records_metrics_jsonl_kept(tmp_path):
    """run.tracker may change on resume: the new MLflow run starts with the earlier launches' records."""
    meta = runlog.metadata(torch.device("cpu"), 1, None)
    untracked = runlog.RunLog(tmp_path / "run", cfg_of({**MLFLOW, "run.tracker": "none"}, tmp_path / "run"), True, 0,
                              meta)
    for step in (1, 2, 3):
        untracked.record("train", step, loss=float(step))
    untracked.close()
    tracked = runlog.RunLog(tmp_path / "run", cfg_of(MLFLOW, tmp_path / "run"), True, 3, meta)
    tracked.record("train", 4, loss=4.0)
    tracked.close()
    client, run = mlflow_run(tmp_path / "run")
    gates.check("MLflow's train/loss when run.tracker=mlflow starts at a resume from step 3",
                histories(client, run)["train/loss"], "==", [(s, float(s)) for s in range(1, 5)])


def test_only_rank_0_logs_to_mlflow(tmp_path):
    log = runlog.RunLog(tmp_path / "run", cfg_of(MLFLOW, tmp_path / "run"), False, 0,
                        runlog.metadata(torch.device("cpu"), 2, None))  # a rank other than 0: not active
    log.record("train", 1, loss=1.0, lr=1e-3)
    log.flush()
    log.close()
    gates.check("files or MLflow stores a rank other than 0 wrote", sorted(tmp_path.rglob("*")), "==", [])


def block_mlflow(monkeypatch) -> None:
    """As if MLflow were not installed: importing it, or any of its modules already loaded, raises ImportError."""
    for name in [n for n in sys.modules if n.split(".")[0] == "mlflow"] + ["mlflow"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_tracker_mlflow_without_mlflow_installed_exits_2_naming_the_field_and_the_pip_command(tmp_path, capsys,
                                                                                                 monkeypatch):
    block_mlflow(monkeypatch)
    code = train.main(["--set", *sets({**MLFLOW, "run.out_dir": str(tmp_path / "run")})])
    err = capsys.readouterr().err
    gates.check("run.tracker=mlflow without MLflow: exit code, one line naming run.tracker and pip install "
                "mlflow-skinny, no run folder",
                [code, len(err.strip().splitlines()), "run.tracker" in err, "pip install mlflow-skinny" in err,
                 (tmp_path / "run").exists()], "==", [2, 1, True, True, False])


def test_a_tensorboard_run_trains_without_mlflow_installed(tmp_path, monkeypatch):
    block_mlflow(monkeypatch)
    result = train.run(cfg_of({**TINY, "train.max_steps": 2}, tmp_path / "run"))
    gates.check("default tracker with MLflow not importable: steps trained, tb/ written, no mlruns/",
                [result["step"], (tmp_path / "run" / "tb").is_dir(), (tmp_path / "run" / "mlruns").exists()], "==",
                [2, True, False])


# --- torchrun: DDP and FSDP2 (two launches cover every distributed gate) ---------------------------------------------
DIST = {**TINY, "train.batch_size": 64, "train.epochs": 2, "data.synthetic.size": 1024}  # 16 steps an epoch
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
DIST_LM = {**TINY_LM, "train.batch_size": 64}  # 32 steps, evaluated every 16
MODERN_LM = {**DIST_LM, "model.gpt.norm": "rmsnorm", "model.gpt.position": "rope", "model.gpt.mlp": "swiglu",
             "model.gpt.qk_norm": True, "model.gpt.logit_softcap": 30.0, "model.gpt.tie_embeddings": False}
BN_DIST = {**DIST, "model.name": "resnet", "model.resnet.widths": [4, 8], "train.epochs": 1, "train.max_steps": 6}


def torchrun(plan: list, tmp: Path, name: str, kill_when=None, ranks: int = 2):
    (tmp / f"{name}.json").write_text(json.dumps(plan))
    launcher = [*TORCHRUN[:-1], f"--nproc_per_node={ranks}"]
    return launch([*launcher, str(Path(__file__).resolve()), "--dist-driver", str(tmp / f"{name}.json")],
                  env=child_env(OMP_NUM_THREADS="1"), kill_when=kill_when, sig=signal.SIGTERM, group=False)


@pytest.fixture(scope="module")
def dist_runs(tmp_path_factory):
    """The runs below, this process in one thread: its runs share the cores with the two ranks'."""
    with one_thread():
        return launch_dist_runs(tmp_path_factory.mktemp("dist"))


def launch_dist_runs(tmp: Path) -> dict:
    """Launch 1: E (DDP, no dropout, grad_accum=2), A (DDP), F (FSDP, stopped by max_steps), EL, AL and FL (the
    same three for the GPT, FL not stopped), FE (EL under FSDP, stopped at step 12), the GPT built under FSDP and
    DDP (its peak measured), FM and DM (the GPT in bf16 under FSDP and DDP, 12 steps), FP and FR (FL stopped by
    SIGTERM at its first evaluation period's last step and at its last step), S (DDP, SIGTERM to torchrun at a random
    step). Launch 2: FP and FR resumed, S resumed under
    DDP, F and G (a single-process run) resumed under FSDP, B (a BatchNorm ResNet under DDP), FI (FSDP
    initialised from E1's weights), BF (B under FSDP, channels_last).
    Meanwhile, in this process: E's and EL's single-process twins with the same global batch, G, and S's and F's
    checkpoints resumed in a single process."""
    rng = random.Random()
    dirs = {k: tmp / k for k in "E A F S E1 S1 F1 G B EL AL FL EL1 FM DM FD FE FI BF FP FR FN".split()}
    audit = tmp / "audit"
    audit.mkdir()
    e_vals, el_vals = {**DIST, "model.mlp.dropout": 0.0}, {**DIST_LM, "model.gpt.dropout": 0.0}
    mixed = {**el_vals, "train.amp": True, "train.max_steps": 12}  # bf16 autocast; under FSDP2 also its policy
    plan1 = [{"set": sets({**e_vals, "train.grad_accum": 2, "train.strategy": "ddp", "run.out_dir": str(dirs["E"])}),
              "faults": f"audit_writes={audit},grad_syncs={audit}"},
             {"set": sets({**DIST, "train.strategy": "ddp", "run.out_dir": str(dirs["A"])}),
              "state": str(audit / "state-A")},
             {"set": sets({**DIST, "train.strategy": "fsdp", "train.max_steps": 12, "run.out_dir": str(dirs["F"])}),
              "state": str(audit / "state-F"), "init": str(audit / "init-F.pt")},
             {"set": sets({**el_vals, "train.grad_accum": 2, "train.strategy": "ddp", "run.out_dir": str(dirs["EL"])})},
             {"set": sets({**DIST_LM, "train.strategy": "ddp", "run.out_dir": str(dirs["AL"])}),
              "state": str(audit / "state-AL"), "sent": str(audit / "sent-AL")},
             {"set": sets({**DIST_LM, "train.strategy": "fsdp", "run.out_dir": str(dirs["FL"])}),
              "state": str(audit / "state-FL"), "init": str(audit / "init-FL.pt"), "sent": str(audit / "sent-FL")},
             {"set": sets({**el_vals, "train.strategy": "fsdp", "train.max_steps": 12, "run.out_dir": str(dirs["FE"])})},
             {"set": sets({**MODERN_LM, "train.strategy": "fsdp", "train.max_steps": 2,
                           "run.out_dir": str(dirs["FN"])}), "init": str(audit / "init-FN.pt")},
             *({"set": sets({**DIST_LM, "train.strategy": strategy}), "build": str(audit / f"build-{strategy}")}
               for strategy in ("fsdp", "ddp")),
             {"set": sets({**mixed, "train.strategy": "fsdp", "run.out_dir": str(dirs["FM"])}),
              "dtypes": str(tmp / "dtypes.json")},
             {"set": sets({**mixed, "train.strategy": "ddp", "run.out_dir": str(dirs["DM"])})},
             *({"set": sets({**DIST_LM, "train.strategy": "fsdp", "run.out_dir": str(dirs[k])}),
                "faults": f"stop_at={step}", "stops": True} for k, step in (("FP", 16), ("FR", STEPS))),
             {"set": sets({**DIST, "train.strategy": "ddp", "run.out_dir": str(dirs["S"])}),
              "faults": "step_sleep=0.05"}]
    for name in same_numbers.CASES:  # the shipped configs' first steps under DDP and FSDP2 (before S, which is
        for strategy in ("ddp", "fsdp"):  # stopped), and in this process below
            dirs[f"{name}/{strategy}"] = tmp / name / strategy
            config_file, values = same_numbers.case_settings(name, strategy, same_numbers.GATE_STEPS)
            plan1.insert(-1, {"config": str(config_file),
                              "set": [*values, f"run.out_dir={dirs[f'{name}/{strategy}']}"]})
    stop_at = rng.randrange(5, 2 * 16 - 4)
    result = {}
    launcher = threading.Thread(target=lambda: result.__setitem__(
        1, torchrun(plan1, tmp, "launch1", kill_when=reached(dirs["S"], stop_at))))
    launcher.start()
    train.run(cfg_of(e_vals, dirs["E1"]))  # one process, the same global batch of 64
    train.run(cfg_of(el_vals, dirs["EL1"]))
    train.run(cfg_of({**DIST, "train.max_steps": 8}, dirs["G"]))  # a single-process checkpoint for FSDP to resume
    for name in same_numbers.CASES:
        dirs[f"{name}/single"] = tmp / name / "single"
        config_file, values = same_numbers.case_settings(name, "single", same_numbers.GATE_STEPS)
        train.run(config.load(str(config_file), [*values, f"run.out_dir={dirs[f'{name}/single']}"]))
    launcher.join()
    for k in ("S", "F"):
        shutil.copytree(dirs[k], dirs[f"{k}1"], symlinks=True)
    shutil.copytree(dirs["F"], dirs["FD"], symlinks=True)
    shutil.copytree((dirs["F"] / "last.pt").resolve(), tmp / "fsdp-step12")  # sharded (checkpoint.format auto)
    shutil.copytree(dirs["FE"], tmp / "FE-step12", symlinks=True)  # for the 4 ranks to resume
    plan2 = [{"set": sets({**DIST, "train.strategy": "ddp", "checkpoint.resume": "auto",
                           "run.out_dir": str(dirs["S"])})},
             {"set": sets({**DIST, "train.strategy": "fsdp", "checkpoint.resume": "auto",
                           "run.out_dir": str(dirs["F"])})},
             {"set": sets({**DIST, "train.strategy": "fsdp", "checkpoint.resume": "auto",
                           "run.out_dir": str(dirs["G"])})},
             {"set": sets({**DIST, "train.strategy": "ddp", "checkpoint.resume": "auto",
                           "run.out_dir": str(dirs["FD"])})},
             {"set": sets({**BN_DIST, "train.strategy": "ddp", "run.out_dir": str(dirs["B"])})},
             {"set": sets({**DIST, "train.strategy": "fsdp", "train.max_steps": 1, "run.out_dir": str(dirs["FI"]),
                           "checkpoint.init_from": str(dirs["E1"] / "last.pt")}), "init": str(audit / "init-FI.pt")},
             {"set": sets({**BN_DIST, "train.strategy": "fsdp", "model.channels_last": True, "train.max_steps": 2,
                           "run.out_dir": str(dirs["BF"])})},
             *({"set": sets({**DIST_LM, "train.strategy": "fsdp", "checkpoint.resume": "auto",
                             "run.out_dir": str(dirs[k])})} for k in ("FP", "FR"))]
    launcher = threading.Thread(target=lambda: result.__setitem__(2, torchrun(plan2, tmp, "launch2")))
    launcher.start()
    stopped = checkpoint.load(dirs["S1"] / "last.pt")
    single = {k: train.run(cfg_of({**DIST, "checkpoint.resume": "auto"}, dirs[f"{k}1"])) for k in ("S", "F")}
    launcher.join()
    return {"dirs": dirs, "launch": result, "audit": audit, "stop_at": stop_at, "stopped": stopped, "single": single,
            "fsdp_ckpt": tmp / "fsdp-step12", "fe_step12": tmp / "FE-step12", "dtypes": json.loads((tmp / "dtypes.json").read_text())}


def max_loss_diff(a: Path, b: Path, steps=None) -> float:
    ra, rb = train_records(a), train_records(b)
    return max(abs(ra[s]["loss"] - rb[s]["loss"]) for s in (steps or ra))


def shard_index(path: Path) -> dict:
    """A sharded checkpoint's index: "model.<name>" / "optimizer.<name>.<state>" -> its shape, dtype and chunks."""
    return sharded.shard_reader(path).read_metadata().state_dict_metadata


DIST_DIRS = {"classify": {"ddp": "E", "single": "E1", "ddp_dropout": "A", "fsdp": "F"},  # run folders by task
             "lm": {"ddp": "EL", "single": "EL1", "ddp_dropout": "AL", "fsdp": "FL"}}


@pytest.mark.parametrize("task", TASKS)
def test_ddp_two_ranks_of_batch_b_match_one_process_of_batch_2b(dist_runs, task):
    d, runs = dist_runs["dirs"], DIST_DIRS[task]
    assert dist_runs["launch"][1][0] != 0  # torchrun was stopped by SIGTERM
    gates.check(f"{task}: DDP (2 ranks x 32, grad_accum 2) vs 1 process x 64: max |loss diff| over 32 steps",
                max_loss_diff(d[runs["ddp"]], d[runs["single"]]), "<=", 1e-5)
    a, b = (checkpoint.load(d[runs[k]] / "last.pt")["model"] for k in ("ddp", "single"))
    gates.check(f"{task}: DDP vs 1 process: max |weight diff| after 32 steps",
                max((a[k] - b[k]).abs().max().item() for k in a), "<=", 1e-4)


def test_ddp_all_reduces_gradients_once_per_optimizer_step_with_accumulation(dist_runs):
    counts = json.loads((dist_runs["audit"] / "grad-syncs-rank0.json").read_text())  # the grad_syncs drill
    gates.check("DDP gradient all-reduces per optimizer step (grad_accum=2: no_sync on the first micro-batch)",
                counts["syncs"] / counts["steps"], "==", 1.0)


def test_only_rank_0_writes_files_but_each_rank_its_own_checkpoint_shard(dist_runs):
    writes = {r: json.loads((dist_runs["audit"] / f"audit-rank{r}.json").read_text())["writes"] for r in (0, 1)}
    run_root = str(dist_runs["dirs"]["E"].parent)
    mine = {r: [w for w in writes[r] if w.startswith(run_root) and "/audit" not in w] for r in (0, 1)}
    gates.check("files written by rank 1 in launch 1's 9 run folders (3 FSDP2 runs: sharded checkpoints), its own "
                "shard files left out", [w for w in mine[1] if not SHARD.fullmatch(w)], "==", [])
    gates.check("shard files rank 1 wrote into sharded checkpoints", len([w for w in mine[1] if w.endswith(".distcp")]),
                ">", 10)
    gates.check("files written by rank 0 in the run folders", len(mine[0]), ">", 10)


def test_sigterm_to_torchrun_stops_every_rank_at_the_same_step_and_resumes_exactly(dist_runs):
    d, stopped = dist_runs["dirs"], dist_runs["stopped"]
    gates.check("distinct steps among the ranks when SIGTERM's checkpoint was written",
                len(set(stopped["rank_steps"])), "==", 1)
    gates.check("SIGTERM landed mid-run (stopped step < 32)", stopped["step"], "<", 32)
    later = [s for s in train_records(d["A"]) if s > stopped["step"]]
    differ = sum(train_records(d["A"])[s]["loss"] != train_records(d["S"])[s]["loss"] for s in later)
    gates.check(f"DDP resume after SIGTERM (step {stopped['step']}): losses that differ from the uninterrupted "
                f"DDP run", differ, "==", 0)
    a, b = checkpoint.load(d["A"] / "last.pt"), checkpoint.load(d["S"] / "last.pt")
    gates.check("DDP resume: final model/optimizer entries that differ bitwise",
                diff_states({k: a[k] for k in ("model", "optimizer")}, {k: b[k] for k in ("model", "optimizer")}),
                "==", [])


@pytest.mark.parametrize("run", ["FP", "FR"])
def test_an_fsdp_gpt_stopped_at_a_periods_or_the_runs_last_step_resumes_to_every_record_of_the_run(dist_runs, run):
    """FP stops at step 16 (eval_every=16), FR at step 32 (the run's last): the resumed run's train, val and test
    records (floats as float.hex, timing aside) and best.pt's weights are those of FL, which ran uninterrupted."""
    dirs = dist_runs["dirs"]
    records, expected = every_record(dirs[run]), every_record(dirs["FL"])
    gates.check(f"{run}: records (train, val, test) that differ from the uninterrupted FSDP run's",
                sum(a != b for a, b in itertools.zip_longest(records, expected)), "==", 0)
    gates.check(f"{run}: best.pt weight tensors that differ from the uninterrupted run's",
                len(diff_states(full(dirs[run] / "best.pt")["model"], full(dirs["FL"] / "best.pt")["model"])), "==", 0)


@pytest.mark.parametrize("case", [f"{name}/{strategy}" for name in same_numbers.CASES
                                  for strategy in same_numbers.STRATEGIES])
def test_the_shipped_configs_train_to_the_reference_records_of_this_machine_bitwise(dist_runs, case):
    """A refactor changes no number: the first steps of each shipped config, in one process and under DDP and FSDP2,
    against the records `same_numbers.py --write` stored at a commit before (one entry per machine: CPUs differ)."""
    reference = same_numbers.reference_for(same_numbers.machine())
    if reference is None:
        pytest.skip(f"no reference records for this machine ({same_numbers.machine()}): floating-point results differ "
                    "between CPUs; `python day12_template/same_numbers.py --write` at a commit before a change "
                    "records one")
    run = same_numbers.records(dist_runs["dirs"][case])
    found = same_numbers.differences(reference[case], run, up_to=same_numbers.GATE_STEPS)
    gates.check(f"{case}, its first {same_numbers.GATE_STEPS} steps: records that differ from the reference "
                f"(float.hex, of {len(run)})", found, "==", [])


def test_a_ddp_checkpoint_loads_into_one_process_and_finishes(dist_runs):
    d, single = dist_runs["dirs"], dist_runs["single"]["S"]
    gates.check("single-process resume of the 2-rank checkpoint: final step", single["step"], "==", 32)
    ref = checkpoint.load(d["A"] / "last.pt")["best"]["val_loss"]
    gates.check("single-process resume: |final val loss / uninterrupted DDP's - 1|",
                abs(single["best_val_loss"] / ref - 1), "<=", 0.05)


def best_val_loss_in_one_process(values: dict, run_dir: Path) -> tuple[float, float]:
    """(best.pt's val loss evaluated here in one process, the val loss the run logged for its step)."""
    cfg = cfg_of(values, run_dir)
    splits = data.build(cfg.data, cfg.run.seed)
    model = models.build(cfg.model, splits.info)
    checkpoint.load_weights(model, run_dir / "best.pt")  # a full file or a sharded folder
    loader, weights = data.eval_loaders(splits, 64, 0, 1, 0, False)["val"]
    task = tasks.for_dataset(cfg.data.dataset, splits.info)
    metrics = train.evaluate(model, task, loader, weights, torch.device("cpu"), models.autocast(cfg.train, "cpu"),
                             distributed.Dist())
    step = checkpoint.step_of(run_dir / "best.pt")
    logged = [r["val_loss"] for r in runlog.read_metrics(run_dir) if r["kind"] == "val" and r["step"] == step]
    return metrics["loss"], logged[-1]


def test_ddp_validation_figures_are_those_of_the_saved_batchnorm_model(dist_runs):
    here, logged = best_val_loss_in_one_process(BN_DIST, dist_runs["dirs"]["B"])  # rank 0's running statistics
    gates.check("ResNet (BatchNorm) under DDP: |best.pt's val loss in one process / the logged one - 1|",
                abs(here / logged - 1), "<=", 1e-6)


def test_a_gpt_trained_by_2_fsdp_ranks_gives_its_logged_val_loss_from_its_shards_in_one_process(dist_runs):
    here, logged = best_val_loss_in_one_process(DIST_LM, dist_runs["dirs"]["FL"])
    gates.check("GPT under FSDP2, sharded best.pt read in one process: |val loss / the 2 ranks' logged one - 1|",
                abs(here / logged - 1), "<=", 1e-6)


@pytest.mark.parametrize("task", TASKS)
def test_fsdp_trains_like_ddp_and_its_checkpoint_loads_into_a_plain_model(dist_runs, task):
    d, runs = dist_runs["dirs"], DIST_DIRS[task]
    gates.check(f"{task}: FSDP2 vs DDP: max |loss diff| over the first 12 steps",
                max_loss_diff(d[runs["fsdp"]], d[runs["ddp_dropout"]], range(1, 13)), "<=", 1e-5)
    path = dist_runs["fsdp_ckpt"] if task == "classify" else d["FL"] / "last.pt"
    index = shard_index(path)  # sharded: checkpoint.format auto
    cfg = config.load(None, sets(DIST if task == "classify" else DIST_LM))
    plain = models.build(cfg.model, data.build(cfg.data, 0).info)
    gates.check(f"{task}: FSDP2 sharded checkpoint: model keys in its index vs a plain model's state_dict keys",
                sorted(k.removeprefix("model.") for k in index if k.startswith("model.")), "==",
                sorted(plain.state_dict()))
    checkpoint.load_weights(plain, path)  # every key and shape of a plain model, read from the shards


@pytest.mark.parametrize("task", TASKS)
def test_fsdp_holds_a_1_over_n_share_of_ddps_parameters_gradients_and_adamw_state_on_each_rank(dist_runs, task):
    runs = DIST_DIRS[task]
    held = {(k, r): json.loads((dist_runs["audit"] / f"state-{runs[k]}-rank{r}.json").read_text())
            for k in ("fsdp", "ddp_dropout") for r in (0, 1)}
    total = {key: sum(v.values()) for key, v in held.items()}
    gates.check(f"{task}: per rank, FSDP2's params + grads + AdamW bytes / (DDP's / 2) - 1, worst of 2 ranks "
                f"(live tensors, before step 2)",
                max(abs(total["fsdp", r] / (total["ddp_dropout", r] / 2) - 1) for r in (0, 1)), "<=", 0.05)
    gates.check(f"{task}: DDP's bytes per rank / (16 x parameters) - 1 (fp32 weights, gradients, 2 moments)",
                abs(held["ddp_dropout", 0]["params"] * 4 / total["ddp_dropout", 0] - 1), "<=", 0.01)


def test_the_bytes_each_rank_sends_per_step_are_the_ring_formulas_for_ddp_and_zero_3(dist_runs):
    """zero_lab's count of what DDP and FSDP2 hand their collectives in one steady step of the GPT (AL and FL, on
    gloo ranks), against the six-week plan's volumes at the run's world size N: DDP 2(N-1)/N * 4 Psi; ZeRO-3
    3(N-1)/N * 4 Psi, less the root module's parameters, which FSDP2 gathers once (zero_lab.volume_formula)."""
    for run, strategy in (("AL", "ddp"), ("FL", "fsdp")):
        sent = [json.loads(path.read_text()) for path in sorted(dist_runs["audit"].glob(f"sent-{run}-rank*.json"))]
        world, psi, root = sent[0]["world"], sent[0]["psi"], sent[0]["root_psi"]
        formula = zero_lab.volume_formula(strategy, world, psi, root)
        gates.check(f"GPT ({psi:,} parameters, root module {root:,}), {strategy}: ranks that wrote their count, of N",
                    len(sent), "==", world)
        gates.check(f"... {strategy}, N = {world}: bytes each rank sends per step / zero_lab.volume_formula - 1, "
                    "worst rank", max(abs(s["sent"] / formula - 1) for s in sent), "<=", 1e-3)


INIT_RUNS = {"classify": (DIST, "F"), "lm": (DIST_LM, "FL"), "lm, a modern GPT's parts": (MODERN_LM, "FN")}


@pytest.mark.parametrize("task", INIT_RUNS)
def test_fsdp_initialises_each_shard_as_the_same_rows_of_one_process_init(dist_runs, task):
    values, run = INIT_RUNS[task]
    cfg = config.load(None, sets(values))
    one_process = models.build(cfg.model, data.build(cfg.data, 0).info, seed=cfg.run.seed).state_dict()
    sharded = torch.load(dist_runs["audit"] / f"init-{run}.pt", weights_only=True)
    gates.check(f"{task}: FSDP2 (built on meta, 2 ranks) vs one process, same seed: initial entries that differ "
                f"bitwise", [k for k in one_process if not torch.equal(one_process[k], sharded[k])], "==", [])


def test_init_from_a_full_checkpoint_loads_into_fsdp_shards(dist_runs):
    d = dist_runs["dirs"]
    weights = checkpoint.load(d["E1"] / "last.pt")["model"]
    loaded = torch.load(dist_runs["audit"] / "init-FI.pt", weights_only=True)
    gates.check("checkpoint.init_from (a single-process checkpoint) under FSDP2, 2 ranks: entries that differ "
                "bitwise from the file's", [k for k in weights if not torch.equal(weights[k], loaded[k])], "==", [])


def test_a_channels_last_resnet_trains_under_fsdp(dist_runs):
    gates.check("ResNet, model.channels_last under FSDP2 (2 ranks): optimizer steps done",
                checkpoint.load(dist_runs["dirs"]["BF"] / "last.pt")["step"], "==", 2)


def test_under_fsdp_no_rank_ever_holds_the_whole_model(dist_runs):
    built = {(s, r): json.loads((dist_runs["audit"] / f"build-{s}-rank{r}.json").read_text())
             for s in ("fsdp", "ddp") for r in (0, 1)}
    gates.check("GPT built under FSDP2 (2 ranks): worst rank's peak allocation / (its share of the model + the "
                "largest tensor whole and its share of it)",
                max(built["fsdp", r]["init_peak"] / zero_lab.init_bound(built["fsdp", r], 2) for r in (0, 1)),
                "<=", 1.0)
    gates.check("the same GPT built under DDP: rank 0's peak / the model's bytes (the profiler sees a whole model "
                "where one is built)",
                built["ddp", 0]["init_peak"] / built["ddp", 0]["model_bytes"], ">=", 1.0)


def test_fsdp_checkpoints_resume_under_fsdp_and_in_one_process_and_vice_versa(dist_runs):
    d = dist_runs["dirs"]
    gates.check("FSDP2 stopped at step 12, resumed under FSDP2, vs DDP: max |loss diff| over steps 13-32",
                max_loss_diff(d["F"], d["A"], range(13, 33)), "<=", 1e-4)
    gates.check("FSDP2 sharded checkpoint (2 ranks, step 12) resumed under DDP vs DDP: max |loss diff| over steps "
                "13-32", max_loss_diff(d["FD"], d["A"], range(13, 33)), "<=", 1e-4)
    gates.check("FSDP checkpoint resumed in a plain single process: final step", dist_runs["single"]["F"]["step"],
                "==", 32)
    gates.check("single-process checkpoint resumed under FSDP2 (2 ranks): final step",
                checkpoint.load(d["G"] / "last.pt")["step"], "==", 32)


@pytest.fixture(scope="module")
def resumed_on_4_ranks(dist_runs, tmp_path_factory):
    """FE's sharded checkpoint (2 ranks, step 12) resumed by 4 FSDP2 ranks for 8 steps."""
    run_dir = dist_runs["fe_step12"]
    plan = [{"set": sets({**DIST_LM, "model.gpt.dropout": 0.0, "train.strategy": "fsdp", "checkpoint.resume": "auto",
                          "train.max_steps": 20, "run.out_dir": str(run_dir)})}]
    code, out = torchrun(plan, tmp_path_factory.mktemp("four"), "launch4", ranks=4)
    return code, out, run_dir


def test_a_sharded_checkpoint_of_2_ranks_resumes_on_4_ranks_on_the_same_samples(resumed_on_4_ranks, dist_runs):
    code, out, run_dir = resumed_on_4_ranks
    assert code == 0 and "2 -> 4 ranks: same samples" in out, out[-3000:]
    gates.check("GPT, FSDP2 on 2 ranks stopped at step 12, resumed on 4, vs DDP on 2 (no dropout): max |loss diff| "
                "over steps 13-20", max_loss_diff(run_dir, dist_runs["dirs"]["EL"], range(13, 21)), "<=", 1e-5)


def test_fsdp_in_bf16_gathers_bf16_weights_keeps_fp32_shards_and_trains_like_ddp_with_autocast(dist_runs):
    d, dtypes = dist_runs["dirs"], dist_runs["dtypes"]
    moment = shard_index(d["FM"] / "last.pt")["optimizer.blocks.0.attn.c_attn.weight.exp_avg"]
    gates.check("FSDP2 + train.amp (bf16): dtype of a block's weight inside forward (all-gathered); of its shard; "
                "of AdamW's moments in the checkpoint", [dtypes["in_forward"], dtypes["shard"],
                                                         str(moment.properties.dtype)],
                "==", ["torch.bfloat16", "torch.float32", "torch.float32"])
    gates.check("GPT in bf16: FSDP2 (MixedPrecisionPolicy + autocast) vs DDP + autocast: max |loss diff|, 12 steps",
                max_loss_diff(d["FM"], d["DM"]), "<=", 1e-2)


# --- torchrun's launcher faults: orphaned ranks, a second writer, elastic restarts ----------------------------------
LIVE = {**DIST, "train.strategy": "ddp", "train.epochs": 20}  # 320 slowed-down steps: alive until killed


def pids_of(marker: str) -> list[int]:
    """The live ranks whose command line names `marker` (their run folder), torchrun itself left out."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in b" ".join(argv) and b"torch.distributed.run" not in argv and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie is dead: only its exit status is left for its new parent to collect)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rank_env(pid: int) -> dict:
    text = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in text.split("\0") if "=" in item)


@pytest.fixture(scope="module")
def killed_launcher(tmp_path_factory):
    """torchrun, 2 DDP ranks slowed down, into run folder L; after step 3 a second launch into L (refused, its writes
    audited), then `kill -9` on torchrun alone; then 10 s of watching the ranks."""
    tmp = tmp_path_factory.mktemp("launcher")
    run_dir, audit = tmp / "L", tmp / "audit"
    audit.mkdir()
    live = sets({**LIVE, "run.out_dir": str(run_dir)})
    seen = {}

    def second_launch_then_kill() -> bool:
        if not reached(run_dir, 3)():
            return False
        seen["ranks"] = pids_of(str(run_dir))
        seen["rank0"] = [pid for pid in seen["ranks"] if rank_env(pid).get("RANK") == "0"]
        seen["second"] = launch([sys.executable, *FAULTS, "--set", *live, "checkpoint.resume=auto"],
                                env=child_env(TEMPLATE_FAULTS=f"audit_writes={audit}"))
        seen["step_at_kill"], seen["killed_at"] = max(train_records(run_dir)), time.monotonic()
        return True

    seen["torchrun"] = launch([*TORCHRUN, *FAULTS, "--set", *live],
                              env=child_env(OMP_NUM_THREADS="1", TEMPLATE_FAULTS="step_sleep=0.2"),
                              kill_when=second_launch_then_kill, sig=signal.SIGKILL, group=False)
    while any(map(alive, seen["ranks"])) and time.monotonic() < seen["killed_at"] + 10:
        time.sleep(0.1)
    seen["alive_10s_later"] = [pid for pid in seen["ranks"] if alive(pid)]
    for pid in seen["alive_10s_later"]:
        os.kill(pid, signal.SIGKILL)
    return {**seen, "run_dir": run_dir, "audit": audit}


def test_kill_9_on_torchrun_leaves_no_rank_alive_10_s_later(killed_launcher):
    gates.check("ranks of the launch seen before torchrun was killed", len(killed_launcher["ranks"]), "==", 2)
    gates.check("ranks alive 10 s after kill -9 on torchrun", killed_launcher["alive_10s_later"], "==", [])


def test_ranks_of_a_killed_launcher_stop_gracefully_writing_only_last_pt(killed_launcher):
    run_dir, seen_at_kill = killed_launcher["run_dir"], killed_launcher["step_at_kill"]
    last = checkpoint.load(run_dir / "last.pt")
    gates.check(f"steps trained after kill -9 on torchrun (last record seen: step {seen_at_kill}): the one in flight "
                f"and the one that carries the stop", last["step"] - seen_at_kill, "<=", 2)
    gates.check("records written after the stop's checkpoint", max(train_records(run_dir)) - last["step"], "==", 0)
    gates.check("distinct steps among the ranks when the stop was written", len(set(last["rank_steps"])), "==", 1)


def test_a_second_launch_into_a_live_run_folder_exits_2_naming_the_holder_and_writes_nothing(killed_launcher):
    code, text = killed_launcher["second"]
    run_dir = str(killed_launcher["run_dir"])
    gates.check("second launch into a live run folder: exit code", code, "==", 2)
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and f"in use by a live run (pid {killed_launcher['rank0'][0]} on " in lines[0], text
    writes = json.loads((killed_launcher["audit"] / "audit-rank0.json").read_text())["writes"]
    gates.check("files the refused launch created, changed or deleted in the run folder",
                [w for w in writes if w.startswith(run_dir)], "==", [])


def test_a_killed_run_leaves_no_stale_lock(killed_launcher):
    lock = runlock.hold(killed_launcher["run_dir"])  # the ranks are gone: the kernel released their lock
    gates.check("run.lock taken over after its holder was killed", lock.file is not None, "==", True)
    lock.release()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launchers(nodes: int, name: str) -> list[list[str]]:
    """torchrun command lines for 2 ranks with `--max-restarts=1`: one `--standalone` launcher, or 2 "nodes" of one
    rank each on this machine meeting through the c10d rendezvous, as the README's SLURM script has them."""
    if nodes == 1:
        return [[*TORCHRUN, "--max-restarts=1"]]
    node = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{free_port()}", f"--rdzv_id={name}", "--max-restarts=1"]
    return [node, node]


def restart_run(run_dir: Path, strategy: str, nodes: int, kill_at: int) -> dict:
    """The config of dist_runs' A plus a checkpoint every 4 steps, launched as the README launches it for restarts
    (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, resume=auto); rank 1 SIGKILLed once the run logged step `kill_at` and
    last.pt exists (an asynchronous save links it only once written: on a loaded machine the first one can lag)."""
    victims, results = [], {}
    logged = reached(run_dir, kill_at)

    def kill_rank_1() -> None:
        while not (logged() and (run_dir / "last.pt").exists()):
            time.sleep(0.005)
        victims.extend(pid for pid in pids_of(str(run_dir)) if rank_env(pid).get("RANK") == "1")
        for pid in victims:
            os.kill(pid, signal.SIGKILL)

    def one(i: int, argv: list[str]) -> None:
        results[i] = launch(argv, env=child_env(OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1",
                                                TEMPLATE_FAULTS="step_sleep=0.05"))

    values = {**DIST, "train.strategy": strategy, "checkpoint.every_steps": 4, "checkpoint.resume": "auto",
              "checkpoint.async_save": strategy == "fsdp", "run.out_dir": str(run_dir)}
    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    threads = [threading.Thread(target=one, args=(i, [*argv, *FAULTS, "--set", *sets(values)]))
               for i, argv in enumerate(launchers(nodes, run_dir.name))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    killer.join(1)
    return {"codes": [results[i][0] for i in sorted(results)], "outputs": [results[i][1] for i in sorted(results)],
            "run_dir": run_dir, "kill_at": kill_at, "victims": victims, "nodes": nodes}


@pytest.fixture(scope="module")
def restarted(tmp_path_factory, dist_runs):
    """At the same time, each with rank 1 SIGKILLed at a random step and both ranks restarted by torchrun from
    last.pt: dist_runs' A config under DDP as a 2-node job on loopback (two launchers), and under FSDP2 (sharded
    checkpoints written asynchronously) from one launcher."""
    tmp, rng, runs = tmp_path_factory.mktemp("elastic"), random.Random(), {}
    nodes = {"ddp": 2, "fsdp": 1}
    kill_at = {strategy: rng.randrange(5, 2 * 16 - 2) for strategy in nodes}

    def one(strategy: str) -> None:
        runs[strategy] = restart_run(tmp / strategy, strategy, nodes[strategy], kill_at[strategy])

    threads = [threading.Thread(target=one, args=(strategy,)) for strategy in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {**runs, "reference": dist_runs["dirs"]["A"]}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_killed_worker_is_restarted_by_torchrun_and_the_run_equals_an_uninterrupted_one(restarted, strategy):
    run, reference = restarted[strategy], restarted["reference"]
    run_dir, where = run["run_dir"], "2 nodes on loopback" if run["nodes"] == 2 else "--standalone"
    gates.check(f"{strategy} ({where}): torchrun --max-restarts=1, rank 1 SIGKILLed after step {run['kill_at']}: "
                f"ranks killed", len(run["victims"]), "==", 1)
    sharded = checkpoint.load(run_dir / "last.pt", mmap=True).get("sharded", False)
    gates.check("... checkpoints sharded (checkpoint.format auto: under FSDP2)", sharded, "==", strategy == "fsdp")
    if run["codes"] != [0] * run["nodes"]:
        print(*run["outputs"], sep="\n")  # shown with the failure: what the launchers and their ranks said
    gates.check("... the launchers' exit codes after the restarted ranks finished", run["codes"], "==",
                [0] * run["nodes"])
    launches = json.loads((run_dir / "run.json").read_text())["launches"]
    gates.check("... launches in run.json (the first and the restart, resumed from last.pt)",
                [bool(item["resumed_from"]) for item in launches], "==", [False, True])
    ours, theirs = train_records(run_dir), train_records(reference)
    gates.check("... train records that differ from the uninterrupted --standalone DDP run (every step of the run)",
                [s for s in theirs if ours.get(s, {}).get("loss") != theirs[s]["loss"]], "==", [])
    a, b = full(run_dir / "last.pt"), full(reference / "last.pt")
    gates.check("... final model/optimizer entries that differ bitwise from the uninterrupted DDP run",
                diff_states({k: a[k] for k in ("model", "optimizer")}, {k: b[k] for k in ("model", "optimizer")}),
                "==", [])


def test_max_restarts_without_the_rendezvous_fix_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    for agent_store, resume, fix in [("True", "auto", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"),
                                     ("False", "", "checkpoint.resume=auto")]:
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", agent_store)
        code = train.main(["--set", *sets({**TINY, "run.out_dir": str(tmp_path / "R"), "checkpoint.resume": resume})])
        err = capsys.readouterr().err
        gates.check(f"torchrun --max-restarts=2, agent store {agent_store}, resume {resume!r}: exit code", code,
                    "==", 2)
        assert err.count("\n") == 1 and fix in err, err
    assert not (tmp_path / "R").exists()


# --- the troubleshooting toolkit (troubleshoot/, doctor.py): each tool finds its fault, and nothing when clean -----
INFO = data.ImageInfo(1, 28, 10)
TOOL_MODELS = {"mlp": ["model.mlp.depth=2", "model.mlp.hidden=32"],
               "resnet": ["model.name=resnet", "model.resnet.widths=[4, 8, 8]"]}


def tool_model(name: str, *breaks) -> torch.nn.Module:
    torch.manual_seed(0)
    model = models.build(config.load(None, TOOL_MODELS[name]).model, INFO).train()
    for spec in breaks:
        faults.break_model(model, *spec)
    return model


def tool_batch(n: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g)


def leaves(model) -> list[str]:
    return [n for n, m in model.named_modules() if n and not list(m.children())]


@pytest.mark.parametrize("name", TOOL_MODELS)
def test_forward_hooks_name_the_module_where_a_nan_was_injected_and_none_on_a_clean_model(name):
    batch = [tool_batch()]
    gates.check(f"{name}: first non-finite module of the clean model",
                ts.first_nonfinite_module(tool_model(name), batch), "==", None)
    targets = [n for n, m in tool_model(name).named_modules()  # every module that runs, containers included
               if n and not isinstance(m, torch.nn.ModuleList)]
    named = [t for t in targets if (ts.first_nonfinite_module(tool_model(name, ("nan", t)), batch) or "").split(" (")[0]
             == t]
    gates.check(f"{name}: modules where an injected NaN was named by the forward hooks (of {len(targets)})",
                len(named), "==", len(targets))


@pytest.mark.parametrize("kind, function", [("sqrt_neg", "SqrtBackward0"), ("log0", "LogBackward0")])
def test_anomaly_mode_names_the_backward_op_that_made_the_nan(kind, function):
    """sqrt of a negative and log(0), hidden in forward by torch.where: every forward output is finite, so the hooks
    see nothing; anomaly mode names the backward function and the line that created it."""
    batch, model = [tool_batch()], tool_model("mlp")
    gates.check("anomaly mode on the clean model: backward ops that made a NaN", ts.backward_nan_op(model, batch),
                "==", None)
    module = random.Random().choice(leaves(model))
    broken = tool_model("mlp", (kind, module))
    found = ts.backward_nan_op(broken, batch)
    gates.check(f"{kind} injected at {module}: the backward function anomaly mode names",
                found and found.function, "==", function)
    assert "faults.py" in found.where and ("sqrt" if kind == "sqrt_neg" else "log") in found.where, found
    gates.check(f"{kind}: first non-finite module in forward (the NaN exists only in backward)",
                ts.first_nonfinite_module(broken, batch), "==", None)


def test_overfit_one_batch_memorises_with_the_mlp_and_flags_the_variants_that_cannot_learn():
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), [])
    splits = data.build(cfg.data, 0)
    batch = splits.train.batch(0, torch.arange(8))

    def attempt(*breaks, lr=None):
        torch.manual_seed(0)
        model = models.build(cfg.model, splits.info)
        for spec in breaks:
            faults.break_model(model, *spec)
        optimizer = optimizers.build(model, cfg.optim)
        for group in optimizer.param_groups:
            group["lr"] = cfg.optim.lr if lr is None else lr
        return ts.overfit_one_batch(model, optimizer, batch)

    clean = attempt()
    gates.check("MNIST MLP (shipped config), 8 samples: memorised (loss < 0.05)", clean.memorised, "==", True)
    # 7 steps measured: an optimizer that moves the weights too slowly fails this, not only a broken one
    gates.check("MNIST MLP, 8 samples: steps to loss < 0.05", clean.steps, "<=", 50)
    gates.check("MNIST MLP, 8 samples: flagged", clean.flagged, "==", False)
    variants = {"every weight frozen": attempt(("freeze", "")), "learning rate 0": attempt(lr=0.0),
                "graph detached at the head's output": attempt(("detach", "head")),
                "graph detached after blocks.0 (the head alone still memorises)": attempt(("detach", "blocks.0"))}
    for name, result in variants.items():
        gates.check(f"overfit one batch, {name}: flagged", result.flagged, "==", True)
    gates.check("overfit one batch, partial detach: layers named as never changed",
                variants["graph detached after blocks.0 (the head alone still memorises)"].unchanged, "==",
                ["blocks.0.0", "blocks.0.1"])


@pytest.mark.parametrize("name", TOOL_MODELS)
def test_gradient_norms_name_the_exploding_and_the_vanishing_layer_and_none_on_a_clean_model(name):
    batch = tool_batch()
    clean = ts.gradient_norms(tool_model(name), batch)
    model = tool_model(name)
    torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
    reference = torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")).item()
    gates.check(f"{name}: |global norm / clip_grad_norm_'s - 1|", abs(clean.total / reference - 1), "<=", 1e-5)
    gates.check(f"{name}, clean: exploding, vanishing and gradient-less layers",
                clean.exploding + clean.vanishing + clean.no_gradient, "==", [])
    layers = list(clean.norms)
    for kind, field in (("explode", "exploding"), ("vanish", "vanishing")):
        named = [layer for layer in layers
                 if getattr(ts.gradient_norms(tool_model(name, (kind, layer)), batch), field) == [layer]]
        gates.check(f"{name}: layers whose gradient was scaled by {'1e4' if kind == 'explode' else '1e-6'} named as "
                    f"the (only) {field} one (of {len(layers)})", len(named), "==", len(layers))


def test_lr_range_test_suggests_a_rate_that_trains_the_day4_mlp(tmp_path):
    values = ["data.subset=4096", "data.mnist.val_size=1000", "train.epochs=2", "train.batch_size=64",
              "train.progress=off", "train.log_every=1000"]
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), values)
    splits = data.build(cfg.data, 0)
    torch.manual_seed(0)
    model = models.build(cfg.model, splits.info)
    order = torch.randperm(len(splits.train), generator=torch.Generator().manual_seed(0))
    batches = itertools.cycle([splits.train.batch(0, order[i:i + 64]) for i in range(0, len(order) - 63, 64)])
    sweep = ts.lr_range_test(model, optimizers.build(model, cfg.optim), batches)
    files = ts.lr_range.save(sweep, tmp_path / "doctor", cfg.optim.lr)
    gates.check("LR range test: plot and CSV written", sorted(f.name for f in files if f.stat().st_size), "==",
                ["lr_range.csv", "lr_range.png"])
    gates.check("LR range test: smoothed loss at the valley bottom / at the start", min(sweep.smoothed) /
                sweep.smoothed[0], "<", 0.5)
    gates.check("LR range test: the sweep saw the loss turn up (diverged before lr_max)", sweep.diverged_at is not None,
                "==", True)
    val = {}
    for name, lr in (("suggested", sweep.suggestion), ("diverged", sweep.diverged_at)):
        result = train.run(config.load(str(TEMPLATE / "configs/mnist_mlp.toml"),
                                       values + [f"optim.lr={lr}", f"run.out_dir={tmp_path / name}"]))
        assert result["step"] == 2 * 4096 // 64
        val[name] = [r for r in runlog.read_metrics(tmp_path / name) if r["kind"] == "val"][-1]
    gates.check(f"Day 4 MLP at the suggested lr {sweep.suggestion:.2g}, 4,096 MNIST images, 2 epochs: val accuracy",
                val["suggested"]["val_acc"], ">=", 0.90)
    gates.check(f"val loss at the suggested lr / at the lr where the sweep diverged ({sweep.diverged_at:.2g})",
                val["suggested"]["val_loss"] / val["diverged"]["val_loss"], "<=", 0.8)


def test_data_check_flags_each_injected_data_fault_and_finds_real_mnist_clean():
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), [])
    splits = data.build(cfg.data, 0)
    report = ts.check_data(splits, 10)
    gates.check("real MNIST: exact duplicates (val in train, test in train, test in val)",
                list(report.duplicates.values()), "==", [0, 0, 0])
    gates.check("real MNIST (55,000 / 5,000 / 10,000): problems found", report.problems(), "==", [])
    gates.check("real MNIST: train inputs mean, std after normalisation",
                [round(report.splits["train"].mean, 2), round(report.splits["train"].std, 2)], "==", [0.0, 1.0])
    train_x, train_y = splits.train.x[:2000], splits.train.y[:2000]
    rare = torch.cat([(train_y != 5).nonzero().flatten(), (train_y == 5).nonzero().flatten()[:10]])
    cases = {  # fault -> (splits, the kind of problem expected, words the problem must say)
        "nan_input=500": (faults.break_data(splits, "nan_input", "500"), "nonfinite", "3,136 NaN/Inf input values"),
        "leak=7": (faults.break_data(splits, "leak", "7"), "leak", "test in train: 7 exact duplicate(s)"),
        "drop_class=3": (faults.break_data(splits, "drop_class", "3"), "labels", "no sample of class(es) [3]"),
        "class 5 cut to 10 samples": (data.Splits(data.TensorData(train_x[rare], train_y[rare], *data.STATS["mnist"]),
                                                  splits.val, splits.test, splits.info), "labels", "class imbalance"),
        "raw 0-255 pixels": (data.Splits(data.TensorData(train_x.float(), train_y), splits.val, splits.test,
                                         splits.info), "normalisation", "train inputs not normalised")}
    for name, (broken, kind, words) in cases.items():
        problems = ts.check_data(broken, 10, limit=2000).problems()
        gates.check(f"MNIST with {name}: kinds of problem found", sorted({k for k, _ in problems}), "==", [kind])
        assert any(words in line for _, line in problems), problems


def test_data_vs_step_flags_a_slow_loader_as_data_bound(tmp_path):
    verdicts = {}
    for name, fault in (("in-memory", []), ("slow loader", ["slow_data=0.02"])):
        cfg = cfg_of(TINY, tmp_path / "run")
        case = checks.Case(cfg, Faults(breaks="+".join(fault)), tmp_path / "doctor")
        verdicts[name] = checks.check_data_vs_step(case)[0].figures
    gates.check("tiny MLP, in-memory data: data/step band", verdicts["in-memory"]["band"], "!=", "data-bound")
    gates.check("tiny MLP, loader slowed by 20 ms a batch: data/step ratio", verdicts["slow loader"]["ratio"], ">",
                0.20)


def test_data_vs_step_charges_the_copy_to_the_device_to_the_data(monkeypatch):
    """On CUDA the batch's non-blocking copy may still be running when next_batch returns: a sync before the data
    clock stops charges the copy to the data, not to the step. Recorded with a fake device and a fake synchronize."""
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    ts.speed.data_vs_step(lambda: events.append("batch"), lambda batch: events.append("step"), torch.device("cuda"),
                          n=1, warmup=0)
    gates.check("data_vs_step on CUDA: the order of fetching, syncing and stepping", events, "==",
                ["sync", "batch", "sync", "step", "sync"])


def test_gpu_check_leaves_this_process_s_cuda_context_out_of_other_processes(monkeypatch, tmp_path):
    """A card with nothing else on it: all that is in use besides this process's cached blocks is its own context."""
    gib = 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * gib - 4 * gib - 0.5 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 4 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * gib)
    case = checks.Case(cfg_of(TINY, tmp_path / "run"), Faults(), tmp_path / "doctor")
    case.device = torch.device("cuda")
    finding = checks.check_gpu_only(case)[0]
    gates.check("GPU check, a card this process has alone: status", finding.status, "==", "ok")
    assert "other processes hold about 0.0 GiB" in finding.text, finding.text


class ItemInAHook(train.Hook):
    """A forward hook on the head that reads a value back with .item(): one more host sync per step."""

    def attach(self, model, module, progress):
        model.head.register_forward_hook(self.read_back)

    @staticmethod
    def read_back(module, args, out):
        if out.sum().item():
            print(end="")


def test_host_syncs_per_step_counts_one_in_the_template_and_an_added_item(tmp_path):
    counts = {}
    for name, extra in (("template", False), ("+ .item() in a hook", True)):
        syncs = ts.HostSyncs(torch.device("cpu"))
        with syncs:
            train.run(cfg_of({**TINY, "train.max_steps": 6, "checkpoint.every_steps": 0},  # a save copies to the host
                             tmp_path / name.replace(" ", "_")), [ItemInAHook()] if extra else [])
        counts[name] = (syncs.per_step()[0], syncs.sites())
    gates.check("host syncs in a typical step of train.py's loop", counts["template"][0], "==", 1)
    gates.check("host syncs in a typical step with a forward hook calling .item()", counts["+ .item() in a hook"][0],
                "==", 2)
    assert any(site.startswith("check.py:") and site.endswith(" item") for site in counts["+ .item() in a hook"][1])


def test_doctor_runs_the_checklists_cheapest_first_and_finds_injected_faults(tmp_path, capsys):
    base = ["--set", *sets({**TINY, "run.out_dir": str(tmp_path / "run")}), "--out", str(tmp_path / "doctor")]
    gates.check("doctor --symptom all on the tiny clean config: exit code (0: no problem)",
                doctor.main(["--symptom", "all", *base]), "==", 0)
    clean = capsys.readouterr().out
    order = [line.split(" | ")[0].split("] ")[1] for line in clean.splitlines() if line.startswith("[")]
    gates.check("doctor: the checks in the order printed", list(dict.fromkeys(order)), "==", [
        "config", "forward", "gradients", "anomaly", "overfit", "data_vs_step", "data", "short_run", "lr_range",
        "gpu_only"])  # free, one pass, a few steps, a pass over the data, training runs, what needs a GPU
    seconds = json.loads((tmp_path / "doctor" / "findings.json").read_text())["seconds"]
    gates.check("doctor: slowest single-pass check (forward, gradients, anomaly) / fastest training check "
                "(short run, LR sweep)", max(seconds[k] for k in ("forward", "gradients", "anomaly")) /
                min(seconds[k] for k in ("short_run", "lr_range")), "<", 1)
    cases = {"nan": ("sqrt_neg@blocks.0.0", "SqrtBackward0"), "loss": ("freeze", "cannot train"),
             "exploding": ("explode@head", "exploding: head"), "gpu": ("slow_data=0.02", "data-bound")}
    for symptom, (fault, words) in cases.items():
        code = doctor.main(["--symptom", symptom, "--fault", fault, *base])
        text = capsys.readouterr().out
        gates.check(f"doctor --symptom {symptom} --fault {fault}: exit code 3 and the fault named",
                    code == 3 and words in text, "==", True)
    bad = {"--set optim.lr=0": ["--set", "optim.lr=0"], "--fault melt": ["--fault", "melt"],
           "--fault nan@nowhere": ["--fault", "nan@nowhere"]}
    refused = 0
    for argv in bad.values():
        code = doctor.main(["--symptom", "nan", *argv, "--out", str(tmp_path / "bad")])
        err = capsys.readouterr().err
        refused += code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit) as exc:
        doctor.main(["--symptom", "slow"])
    gates.check("doctor: bad --set/--fault/--symptom refused with exit 2, one line, nothing written",
                refused + (exc.value.code == 2), "==", len(bad) + 1)


# --- text-data hygiene (troubleshoot/text_checks.py; doctor.py --symptom data): each fault alone; the real corpus ---
HYGIENE_TRAIN = ["alls_well_that_ends_well", "antony_and_cleopatra", "as_you_like_it", "comedy_of_errors", "coriolanus",
                 "cymbeline", "hamlet", "henry_iv_part_1"]
LICENCE = (b"This eBook is for the use of anyone anywhere at no cost and with almost no restrictions whatsoever.\n"
           b"You may copy it, give it away or re-use it under the terms of the Project Gutenberg License\n"
           b"included with this eBook or online at www.gutenberg.org.\n")  # 248 characters in every split: > LEAK_CHARS
TEXT_FAULTS = {  # the fault put in (into the first training work, or a document added) -> (its check, words it says)
    "an exact copy of a work added": ("exact", "copy = alls_well_that_ends_well"),
    "a validation work with every 40th word replaced added to train": ("near", "midsummer_nights_dream ~ near_copy at "
                                                                                "0.86 (val and train: a leak)"),
    "a validation work with every 10th word replaced added to train": ("leak", "of val/midsummer_nights_dream's"),
    "two HTML tags and an entity": ("markup", "3 HTML tags/entities (<i> x1, </i> x1, &amp; x1)"),
    "a form feed and a NUL": ("control", "2 control characters"),
    "three cp1252 apostrophes (byte 0x92)": ("utf8", "3 bytes that are not UTF-8 in 1 document(s)"),
    "a 6-word document added": ("length", "stub (6 words)"),
    "1,000 bytes of a validation work pasted in": ("leak", "characters in val/midsummer_nights_dream"),
    "a 3-line licence at the end of every document": ("lines", "in 12 of 12"),
}


def middle_of(work: bytes, size: int = 8000) -> bytes:
    """About `size` bytes of whole lines from the middle of a work."""
    cut = work[len(work) // 2:len(work) // 2 + size]
    return cut[cut.index(b"\n") + 1:cut.rindex(b"\n") + 1]


@pytest.fixture(scope="module")
def small_corpus() -> dict:
    """A clean corpus of 12 documents: 8 KB from the middle of 8 training works and of the 4 held-out ones."""
    works = text.load_corpus(text.BUNDLE)
    return {"train": {w: middle_of(works[w]) for w in HYGIENE_TRAIN},
            "val": {w: middle_of(works[w]) for w in text.VAL_WORKS},
            "test": {w: middle_of(works[w]) for w in text.TEST_WORKS}}


def with_doc(corpus: dict, split: str, name: str, doc: bytes) -> dict:
    """A copy of `corpus` with `doc` as `name` in `split` (added, or in place of the document of that name)."""
    return {**corpus, split: {**corpus[split], name: doc}}


def text_faults(corpus: dict) -> dict[str, dict]:
    """`corpus` with each fault of TEXT_FAULTS put in."""
    name = next(iter(corpus["train"]))
    doc = corpus["train"][name]
    held_out = corpus["val"]["midsummer_nights_dream"]
    words = list(enumerate(held_out.split(b" ")))
    near = b" ".join(b"thus" if i % 40 == 0 else word for i, word in words)
    edited = b" ".join(b"thus" if i % 10 == 0 else word for i, word in words)  # Jaccard 0.6: not near; a leak
    tagged = doc.replace(b" the ", b" <i>the</i> ", 1).replace(b" and ", b" &amp; ", 1)
    controlled = doc.replace(b"\n", b"\n\x0c", 1).replace(b" ", b"\x00 ", 1)
    pasted = doc + held_out[1000:2000]
    return {"an exact copy of a work added": with_doc(corpus, "train", "copy", doc),
            "a validation work with every 40th word replaced added to train": with_doc(corpus, "train", "near_copy",
                                                                                       near),
            "a validation work with every 10th word replaced added to train": with_doc(corpus, "train", "edited_copy",
                                                                                       edited),
            "two HTML tags and an entity": with_doc(corpus, "train", name, tagged),
            "a form feed and a NUL": with_doc(corpus, "train", name, controlled),
            "three cp1252 apostrophes (byte 0x92)": with_doc(corpus, "train", name, doc.replace(b"'", b"\x92", 3)),
            "a 6-word document added": with_doc(corpus, "train", "stub", b"FINIS. THE END OF THE PLAY.\n"),
            "1,000 bytes of a validation work pasted in": with_doc(corpus, "train", name, pasted),
            "a 3-line licence at the end of every document": {split: {n: d + LICENCE for n, d in docs.items()}
                                                               for split, docs in corpus.items()}}


def test_text_hygiene_finds_nothing_in_twelve_clean_work_excerpts(small_corpus):
    found = {c.kind: c.status for c in ts.text_hygiene(small_corpus)}
    gates.check("text hygiene of 12 excerpts of 8 KB (8 train, 2 val, 2 test): checks that are not ok",
                [k for k, status in found.items() if status != "ok"], "==", [])
    gates.check("... checks run", len(found), "==", 9)


@pytest.mark.parametrize("fault", TEXT_FAULTS)
def test_each_text_fault_put_in_is_found_by_its_own_check_alone(fault, small_corpus):
    kind, words = TEXT_FAULTS[fault]
    found = ts.text_hygiene(text_faults(small_corpus)[fault])
    gates.check(f"text hygiene of the 12 excerpts with {fault}: the checks that are not ok",
                {c.kind: c.status for c in found if c.status != "ok"}, "==", {kind: "PROBLEM"})
    assert words in next(c.text for c in found if c.kind == kind), found


def test_minhash_estimates_the_jaccard_similarity_of_short_and_long_documents():
    """Pairs of overlapping excerpts of Hamlet: a short pair leaves most of the 512 bins empty, a long one none."""
    hamlet, k = text.load_corpus(text.BUNDLE)["hamlet"], ts.text_checks.NEAR_SHINGLE
    errors = {}
    for size in (300, 8000):
        pair = {"a": hamlet[50_000:50_000 + size], "b": hamlet[50_000 + size // 4:50_000 + size + size // 4]}
        shingles = [{t[i:i + k] for i in range(len(t) - k + 1)} for t in pair.values()]
        near, _ = ts.text_checks.check_near(pair, {"a": "train", "b": "train"})
        exact = len(shingles[0] & shingles[1]) / len(shingles[0] | shingles[1])
        errors[size] = abs(near.figures["closest"][0] - exact)
    gates.check("MinHash estimate vs the exact Jaccard similarity (0.6) of 300- and 8,000-byte excerpts: largest error",
                max(errors.values()), "<", 0.06)


@pytest.fixture(scope="module")
def shakespeare_hygiene() -> dict:
    """{kind: TextCheck} of the bundled corpus (computed once per process, as the doctor caches it)."""
    return {c.kind: c for c in checks.corpus_hygiene(text.BUNDLE)}


def test_the_bundled_corpus_raises_no_alarm_but_its_two_html_entities(shakespeare_hygiene):
    gates.check("bundled Shakespeare, 42 works: each text check's verdict",
                {k: c.status for k, c in shakespeare_hygiene.items()}, "==",
                {"utf8": "ok", "markup": "PROBLEM", "control": "ok", "length": "ok", "exact": "ok", "near": "ok",
                 "lines": "note", "tokens": "ok", "leak": "ok"})
    gates.check("bundled Shakespeare: the closest two works' estimated Jaccard similarity (12-character shingles)",
                shakespeare_hygiene["near"].figures["closest"][0], "<", 0.1)
    gates.check("bundled Shakespeare: fewest words in a work (phoenix_and_the_turtle)",
                shakespeare_hygiene["length"].figures["min_words"], "==", 360)


def test_the_bundled_corpus_html_alarm_is_two_real_egrave_entities_in_a_midsummer_nights_dream(shakespeare_hygiene):
    offsets = shakespeare_hygiene["markup"].figures["offsets"]
    work = text.load_corpus(text.BUNDLE)["midsummer_nights_dream"]
    gates.check("bundled Shakespeare: HTML entities found, by work and byte offset", offsets, "==",
                {"midsummer_nights_dream": [44353, 45188]})
    gates.check("... the bytes there", [work[at:at + 8] for at in offsets["midsummer_nights_dream"]], "==",
                [b"&egrave;", b"&egrave;"])


def test_the_bundled_corpus_repeats_stage_directions_and_speaker_names_and_its_byline_is_a_note(shakespeare_hygiene):
    lines = shakespeare_hygiene["lines"].figures
    gates.check("bundled Shakespeare: the 3 most repeated lines", lines["top"][:3], "==",
                [["[Exeunt.]", 537], ["[Exit.]", 521], ["KING.", 460]])
    gates.check("... share of the bytes in repeated lines, all / of 20+ characters",
                [round(lines["copies_share"], 3), round(lines["long_copies_share"], 4)], "==", [0.063, 0.0034])
    gates.check("... boilerplate (a line of 20+ characters in half the works or more): line -> works",
                lines["boilerplate"], "==", {"by William Shakespeare": 42})


def test_the_bundled_held_out_works_share_no_passage_with_the_training_works(shakespeare_hygiene):
    leak = shakespeare_hygiene["leak"].figures
    gates.check(f"bundled Shakespeare: longest passage of val/test also in train (a scene heading), characters "
                f"(< {ts.text_checks.LEAK_CHARS}) and where", [leak["longest"]["chars"], leak["longest"]["where"]], "==",
                [65, "test/twelfth_night"])
    gates.check("... share of val and test 50-character shingles also in train",
                max(leak["val"]["share"], leak["test"]["share"]), "<", 1e-4)


def test_the_bundled_corpus_token_lengths_are_its_bytes_split_by_work(shakespeare_hygiene):
    tokens = shakespeare_hygiene["tokens"].figures
    gates.check("bundled Shakespeare, byte tokens: per split, and in all (the manifest's 5,057,198 bytes)",
                [tokens["per_split"], tokens["total"]], "==",
                [{"train": 4_549_801, "val": 250_768, "test": 256_629}, 5_057_198])
    gates.check("... per work: min, median, 95th percentile, max",
                [tokens["min"], round(tokens["median"]), round(tokens["p95"]), tokens["max"]], "==",
                [2096, 125662, 164535, 175659])


def corpus_folder(root: Path, works: dict[str, bytes]) -> Path:
    """`works` in the bundled corpus's layout: works/<work>.txt.gz and MANIFEST.tsv (each text's SHA-256)."""
    (root / "works").mkdir(parents=True)
    rows = ["work\ttitle\tbytes\tsha256_of_text"]
    for name, work in works.items():
        (root / "works" / f"{name}.txt.gz").write_bytes(gzip.compress(work, mtime=0))
        rows.append(f"{name}\t{name}\t{len(work)}\t{hashlib.sha256(work).hexdigest()}")
    (root / "MANIFEST.tsv").write_text("\n".join(rows) + "\n")
    return root


def test_doctor_symptom_data_reports_a_work_that_is_not_utf8_as_a_finding_and_exits_3(small_corpus, tmp_path):
    broken = text_faults(small_corpus)["three cp1252 apostrophes (byte 0x92)"]
    root = corpus_folder(tmp_path / "corpus", {n: d for docs in broken.values() for n, d in docs.items()})
    code = doctor.main(["--symptom", "data", "--set", *sets({**TINY_LM, "data.root": str(root),
                                                             "run.out_dir": str(tmp_path / "run")}),
                        "--out", str(tmp_path / "doctor")])
    problems = [f for f in json.loads((tmp_path / "doctor" / "findings.json").read_text())["findings"]
                if f["status"] == "PROBLEM"]
    first = next(iter(small_corpus["train"]))
    gates.check("doctor --symptom data on 12 works, one with 3 cp1252 bytes: exit code, the checks flagged, the bytes "
                "counted and the first one's offset", [code, [f["figures"]["kind"] for f in problems],
                                                       problems[0]["figures"]["invalid_bytes"],
                                                       problems[0]["figures"]["first_offset"]], "==",
                [3, ["utf8"], {first: 3}, {first: small_corpus["train"][first].index(b"'")}])
    table = (tmp_path / "doctor" / "text_data.md").read_text()
    assert "| utf8 | PROBLEM | data-5 | 3 bytes that are not UTF-8" in table, table


def test_doctor_symptom_data_on_an_image_config_runs_the_image_data_checks(tmp_path, capsys):
    code = doctor.main(["--symptom", "data", "--set", *sets({**TINY, "run.out_dir": str(tmp_path / "run")}),
                        "--out", str(tmp_path / "doctor")])
    printed = [line.split("] ")[1] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    gates.check("doctor --symptom data on the tiny image config: exit code, the findings (check | status | items)",
                [code, printed], "==", [0, ["data | ok | nan-5", "data | ok | loss-2", "data | ok | loss-8",
                                            "data | ok | loss-9"]])


# --- CUDA only -------------------------------------------------------------------------------------------------------
CUDA_MNIST = {"train.epochs": 1, "train.log_every": 16, "train.progress": "off", "run.device": "cuda"}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_autocast_trains_the_shipped_config(dtype, tmp_path):
    cfg = config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), sets({**CUDA_MNIST, "train.amp": True,
                                                                   "train.amp_dtype": dtype,
                                                                   "run.out_dir": str(tmp_path / dtype)}))
    result = train.run(cfg)
    rec = train_records(tmp_path / dtype)
    gates.check(f"CUDA {dtype} autocast: test accuracy after one epoch (CPU, same config: 96.6%)", result["test_acc"],
                ">", 0.95)
    if dtype == "float16":
        gates.check("CUDA float16: GradScaler scale at the end (>= 1: not collapsed)", rec[max(rec)]["scale"], ">=",
                    1.0)


CUDA_MEMORY = {"mnist_mlp": {**CUDA_MNIST, "train.max_steps": 50},  # the estimate counts an eager run
               "shakespeare_gpu": {"train.max_steps": 20, "data.shakespeare.eval_windows": 64, "train.progress": "off",
                                   "run.device": "cuda", "model.compile": False},
               "shakespeare_25m": {"train.max_steps": 20, "data.shakespeare.eval_windows": 64, "train.progress": "off",
                                   "run.device": "cuda", "model.compile": False}}


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_MEMORY)
def test_cuda_peak_memory_within_15_percent_of_the_estimate(name, tmp_path):
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    workspace = memory.cuda_library_bytes()  # cuBLAS/cuBLASLt workspaces (and anything earlier tests left)
    cfg = config.load(str(TEMPLATE / f"configs/{name}.toml"), sets({**CUDA_MEMORY[name],
                                                               "run.out_dir": str(tmp_path / "run")}))
    torch.cuda.reset_peak_memory_stats()
    train.run(cfg)
    est = memory.estimate(cfg, memory.info_of(cfg), device="cuda")
    peak = torch.cuda.max_memory_allocated()
    gates.check(f"|CUDA max_memory_allocated / (estimate + measured cuBLAS workspace) - 1|, {name} config",
                abs(peak / (est["peak"] + workspace) - 1), "<=", 0.15)


# config -> (steps, the val loss to beat after them, whether its MFU must beat the most an fp32 run could reach (the
# card's fp32 peak over its bf16 one) rather than 1%)
CUDA_GPT = {"shakespeare_gpu": (200, 2.6, False), "shakespeare_25m": (250, 2.4, True)}


@pytest.mark.gpu
@pytest.mark.parametrize("name", CUDA_GPT)
def test_cuda_gpt_config_trains_with_bf16_and_compile_to_its_val_loss_and_mfu(name, tmp_path):
    steps, val_loss, above_fp32 = CUDA_GPT[name]
    out = tmp_path / "run"
    result = train.run(config.load(str(TEMPLATE / f"configs/{name}.toml"), sets({
        "train.max_steps": steps, "data.shakespeare.eval_windows": 256, "train.progress": "off", "run.device": "cuda",
        "run.out_dir": str(out)})))
    rec = train_records(out)
    gates.check(f"{name}.toml on CUDA, bf16 + torch.compile: val loss after {steps} steps (ln 256 = 5.55)",
                result["best_val_loss"], "<", val_loss)
    card = torch.cuda.get_device_name()
    floor, floor_name = 0.01, "1%"
    if above_fp32:
        bf16_peak, fp32_peak = runlog.CUDA_PEAK[runlog.cuda_card(card)]
        floor, floor_name = fp32_peak / bf16_peak, "the most an fp32 run could reach"
    gates.check(f"{name}.toml on CUDA: MFU over steps {steps - 9}-{steps} (the window the last record closes; "
                f"torch.compile's warm-up is in the first) against the card's dense bf16 peak ({card}; tokens/s "
                f"{rec[steps]['tokens_per_s']:,.0f}), above {floor_name}", rec[steps]["mfu"], ">", floor)


@pytest.mark.gpu
def test_torch_compile_on_cuda_matches_eager_and_saves_plain_keys(tmp_path):
    losses = {}
    for compiled in (False, True):
        out = tmp_path / f"compile-{compiled}"
        train.run(config.load(str(TEMPLATE / "configs/mnist_mlp.toml"), sets({  # no dropout: the same math both ways
            **CUDA_MNIST, "train.max_steps": 20, "model.mlp.dropout": 0.0, "model.compile": compiled,
            "run.out_dir": str(out)})))
        losses[compiled] = train_records(out)[16]["loss"]
        keys = checkpoint.load(out / "last.pt")["model"]
    gates.check("torch.compile vs eager on CUDA: relative loss difference at step 16",
                abs(losses[True] - losses[False]) / losses[False], "<=", 1e-3)
    gates.check("compiled checkpoint keys with an _orig_mod. prefix", [k for k in keys if "_orig_mod" in k], "==", [])


# --- the torchrun driver: runs several configs in the same two ranks -------------------------------------------------
class DtypeProbe(train.Hook):
    """Writes (rank 0) the dtype of the first block's attention weight inside its forward and, outside it, of the
    parameter that module holds (under FSDP2: its shard)."""

    def __init__(self, path: str):
        self.path, self.seen = Path(path), {}

    def attach(self, model, module, progress):
        self.linear = model.blocks[0].attn.c_attn
        self.linear.register_forward_pre_hook(self.in_forward)

    def in_forward(self, linear, args) -> None:
        self.seen.setdefault("in_forward", str(linear.weight.dtype))

    def step(self, progress):
        if progress.step == 1 and int(os.environ["RANK"]) == 0:
            self.seen["shard"] = str(self.linear.weight.dtype)
            self.path.write_text(json.dumps(self.seen))


class StateProbe(train.Hook):
    """Writes, on each rank, the parameter, gradient and AdamW-state bytes it holds (zero_lab's count of the live
    tensors: an FSDP2 shard counts its local part) just before the run's second optimizer step."""

    def __init__(self, path: str):
        self.path = path

    def attach(self, model, module, progress):
        self.model, self.progress = model, progress
        self.handle = register_optimizer_step_pre_hook(self.before_step)  # every optimizer, before each step

    def before_step(self, optimizer, args, kwargs) -> None:
        if self.progress.step == 1:  # AdamW's moments exist from the first step on
            held = zero_lab.held_bytes(self.model, optimizer)
            Path(f"{self.path}-rank{os.environ['RANK']}.json").write_text(json.dumps(held))
            self.handle.remove()


class SentProbe(train.Hook):
    """Writes, on each rank, the bytes it sent during the run's third optimizer step (a steady one: DDP has rebuilt
    its buckets, FSDP2 initialised), counted by zero_lab.SentBytes where DDP and FSDP2 call their collectives, beside
    the model's parameter count and that of its root module's own parameters (those outside model.blocks)."""

    def __init__(self, path: str):
        self.path = path

    def attach(self, model, module, progress):
        self.sent = zero_lab.SentBytes(module, int(os.environ["WORLD_SIZE"]))
        self.psi = sum(p.numel() for p in model.parameters())  # a DTensor's numel is its whole tensor's
        self.root_psi = self.psi - sum(p.numel() for p in model.blocks.parameters())

    def step(self, progress):
        if progress.step == 2:
            self.sent.total = 0
        elif progress.step == 3:
            self.sent.close()
            Path(f"{self.path}-rank{os.environ['RANK']}.json").write_text(json.dumps(
                {"sent": self.sent.total, "world": self.sent.world, "psi": self.psi, "root_psi": self.root_psi}))


class InitProbe(train.Hook):
    """Saves (rank 0) the model's parameters and buffers as the run starts, each gathered whole from its shards."""

    def __init__(self, path: str):
        self.path = path

    def attach(self, model, module, progress):
        state = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
        if int(os.environ["RANK"]) == 0:
            torch.save(state, self.path)


def measure_build(cfg: config.Config, path: str) -> None:
    """Each rank writes zero_lab's figures of train.build_model: its peak, the whole model's and its largest tensor's
    bytes."""
    _, built = zero_lab.build_measured(cfg, data.build(cfg.data, cfg.run.seed).info, distributed.setup("cpu"))
    Path(f"{path}-rank{os.environ['RANK']}.json").write_text(json.dumps(built))


def dist_driver(plan_file: str) -> int:
    """Under torchrun: join the process group once, then run each planned config in turn (as train.py would), or
    measure its model's construction ("build")."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        for item in json.loads(Path(plan_file).read_text()):
            if "build" in item:
                measure_build(config.load(None, item["set"]), item["build"])
                continue
            try:
                drills = Faults.from_env(item.get("faults", ""))
                drills.install_process_drills()
                probes = [DtypeProbe(item["dtypes"])] if "dtypes" in item else []
                probes += [StateProbe(item["state"])] if "state" in item else []
                probes += [InitProbe(item["init"])] if "init" in item else []
                probes += [SentProbe(item["sent"])] if "sent" in item else []
                train.run(config.load(item.get("config"), item["set"]), [drills, *probes])
            except train.Stopped as exc:
                if not item.get("stops"):  # a planned stop (a drill) goes on with the next run; any other ends it
                    return exc.code
    finally:
        faults.write_at_end()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dist-driver"]:
        train.exit_with(functools.partial(dist_driver, sys.argv[2]))  # a rank's exit (train.leave_rank)
    run_this_file(__file__)
