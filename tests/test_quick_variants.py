"""Trying the repo never dirties it: each day's quick variant, run as the README shows it (default `--out`), leaves
`git status` as it found it, and every script's default output lies under a git-ignored `runs/` folder."""
import argparse
import hashlib
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "day12_template" / "template"))  # the package that Day 12's template scripts run

import refresh_results  # noqa: E402

# The quick variant of each day's main.py, as its README lists it (a few seconds each, default --out).
QUICK = {
    "day01_env_and_tensors/main.py": [],
    "day02_autograd/main.py": [],
    "day03_linreg/main.py": [],
    "day04_mlp_mnist/main.py": ["--epochs", "1", "--train-subset", "5000"],
    "day05_dataloader/main.py": ["--smoke", "--workers", "0", "2"],
    "day06_ckpt_resume/main.py": ["--train-subset", "2048", "--epochs", "1", "--hidden", "64"],
    "day07_amp_accum/main.py": ["--train-subset", "1024", "--epochs", "1", "--bench-steps", "2"],
    "day08_mini_autograd/main.py": ["--epochs", "1", "--hidden", "64", "--train-subset", "5000", "--test-subset",
                                    "1000"],
    "day09_cnn/main.py": ["--epochs", "1", "--train-subset", "2000", "--test-subset", "500", "--val-size", "500"],
    "day10_bigbatch_ckpt/main.py": ["--batches", "2", "4", "--budget-mib", "1", "--time-batch", "2", "--repeat", "2",
                                    "--layers", "2"],
    "day11_profile/main.py": ["--max-samples", "640"],
    "day12_template/main.py": ["--quick"],
}

# Every script that writes a committed results file when told `--out <day>/results`, and every day's main.py.
SCRIPTS = sorted({s for steps in refresh_results.STEPS.values() for s, _, _ in steps}
                 | {p.relative_to(ROOT).as_posix() for p in ROOT.glob("day*/main.py")})
OUTPUT_FLAGS = ("out", "run_dir", "runs", "prof_dir")

# Runs the quick variants in one process, each as `python <script> <args>` would (`__main__`, its sys.argv).
DRIVER = r"""
import json, runpy, sys
codes = []
for script, args in json.loads(sys.argv[1]):
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
        codes.append(0)
    except SystemExit as exc:
        codes.append(exc.code if isinstance(exc.code, int) else int(exc.code is not None))
print("EXIT CODES " + json.dumps(codes))
"""


def git_state() -> dict[str, str]:
    """`git status --porcelain` (untracked files listed one by one), each entry with a hash of the file's bytes."""
    try:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: nothing to compare against")
    state = {}
    for line in status.splitlines():
        path = ROOT / line[3:].split(" -> ")[-1].strip('"')
        state[line] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
    return state


def test_every_quick_variant_leaves_git_status_unchanged():
    """On a fresh clone `git status --porcelain` is empty before and after; on a working copy with edits, the same
    edits remain, byte for byte, and nothing new appears."""
    before = git_state()
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(list(QUICK.items()))], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    codes = json.loads(done.stdout.rsplit("EXIT CODES ", 1)[-1]) if "EXIT CODES " in done.stdout else None
    assert codes == [0] * len(QUICK), (codes, done.stdout[-2000:], done.stderr[-3000:])
    after = git_state()
    changed = sorted(k for k in after.keys() & before.keys() if after[k] != before[k])
    assert after == before, {"new": sorted(after.keys() - before.keys()), "changed content": changed,
                             "gone": sorted(before.keys() - after.keys())}


def import_script(script: str):
    if script.startswith("day12_template/template/"):  # a script of the template runs its package's module
        return importlib.import_module(f"train_template.{Path(script).stem}")
    if script.startswith("day12_template/"):  # not a package: its scripts put the template's package on the path
        spec = importlib.util.spec_from_file_location(f"day12_template_{Path(script).stem}", ROOT / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    return importlib.import_module(script[:-3].replace("/", "."))


def ignored_by_git(path: Path) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT).returncode == 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_default_output_lies_under_an_ignored_runs_folder(script, parser_of):
    """Days 1-11 write under the repo's runs/ (`sprint.runs_dir`); Day 12, which must run when copied elsewhere,
    under its own runs/. A default computed when the script runs (argparse.SUPPRESS) must come from runs_dir."""
    parser = parser_of(import_script(script).main)
    runs = ROOT / ("day12_template/runs" if script.startswith("day12_template/") else "runs")
    outputs = {a.dest: a.default for a in parser._actions if a.dest in OUTPUT_FLAGS}
    assert "out" in outputs or "runs" in outputs, f"{script} has no --out"
    for dest, default in outputs.items():
        if default is argparse.SUPPRESS:
            assert "runs_dir(__file__" in (ROOT / script).read_text(), f"{script}: --{dest} defaults elsewhere"
        elif default is not None:
            path = Path(default).resolve()
            assert path.is_relative_to(runs), f"{script}: --{dest} defaults to {path}, outside {runs}"
            assert ignored_by_git(path / "x"), f"{script}: git does not ignore {path}"
