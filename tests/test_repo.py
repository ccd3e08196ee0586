"""The repo keeps its promises: layout, two-command quick start, CI = README, an installable lock file."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DAYS = ["day01_env_and_tensors", "day02_autograd", "day03_linreg", "day04_mlp_mnist", "day05_dataloader",
        "day06_ckpt_resume", "day07_amp_accum", "day08_mini_autograd", "day09_cnn", "day10_bigbatch_ckpt",
        "day11_profile", "day12_template"]


def readme_block(title: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {title}", 1)[1]
    block = section.split("```", 2)[1]
    return [line for line in block.splitlines()[1:] if line.strip()]


def test_twelve_day_folders_each_with_a_readme():
    for day in DAYS:
        assert (ROOT / day / "README.md").is_file(), day


def test_every_day_with_a_main_has_gates_and_a_main_guard():
    for main in ROOT.glob("day*/main.py"):
        assert (main.parent / "check.py").is_file(), f"{main.parent.name} has main.py but no check.py"
        tree = ast.parse(main.read_text())
        guards = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
        assert guards, f"{main} runs code on import: put the entry point under if __name__ == '__main__'"


def test_every_check_is_a_script_and_records_gates():
    for check in ROOT.glob("day*/check.py"):
        text = check.read_text()
        assert "Gates(__file__)" in text and "run_this_file(__file__)" in text, check


def test_quick_start_is_install_run_test():
    assert readme_block("Quick start") == [
        "pip install -r requirements.lock.txt",
        "python day04_mlp_mnist/main.py",
        "pytest",
    ]


def test_ci_installs_the_lock_file_and_runs_the_readme_test_command():
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert any("pip install" in c and "-r requirements.lock.txt" in c for c in commands)
    assert commands[-1] == readme_block("Quick start")[-1]


def test_lock_file_pins_everything_without_local_suffixes():
    lines = [l for l in (ROOT / "requirements.lock.txt").read_text().splitlines() if l and not l.startswith("#")]
    pins = dict(re.match(r"^([A-Za-z0-9_.\-]+)==([^;\s]+)", l).groups() for l in lines)
    assert pins["torch"] == "2.14.1" and pins["torchvision"] == "0.29.1"
    assert not [v for v in pins.values() if "+" in v], "local version suffixes (+cpu, +cu13x) break other platforms"
    for name in ("numpy", "matplotlib", "tensorboard", "pytest", "tqdm", "hypothesis"):
        assert name in pins, name


def test_cuda_wheels_are_linux_only_like_torch_requires_them():
    for line in (ROOT / "requirements.lock.txt").read_text().splitlines():
        if re.match(r"^(nvidia-|cuda-|triton)", line):
            assert line.endswith('; platform_system == "Linux"'), line


def test_no_checkpoint_is_loaded_with_pickle_execution_enabled():
    needle = "weights_only=" + "False"  # spelled in two parts so this file does not match itself
    offenders = [p for p in ROOT.rglob("*.py") if needle in p.read_text()]
    assert not offenders, offenders


def test_every_command_and_image_in_the_readmes_points_at_a_real_file():
    missing = []
    for readme in [ROOT / "README.md", *ROOT.glob("day*/README.md")]:
        text = readme.read_text()
        for script in re.findall(r"python3? ((?:day\d\d_\w+|scripts)/[\w/]+\.py)", text):
            if not (ROOT / script).is_file():
                missing.append(f"{readme.relative_to(ROOT)}: {script}")
        for image in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", text):
            if not (readme.parent / image).is_file():
                missing.append(f"{readme.relative_to(ROOT)}: {image}")
    assert not missing, missing
