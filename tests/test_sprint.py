"""The shared helpers: command lines checked before work starts, and measurements taken one way."""
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from sprint import REPO_ROOT, machine, runs_dir, write_results
from sprint.cli import UserError, arg, parse, run, unwritable, validate
from sprint.measure import PeakBytes, count_params, median_seconds, peak_bytes, saved_bytes


@dataclass
class Example:
    epochs: int = arg(3, "passes over the data", gt=0)
    lr: float = arg(1e-3, "learning rate", gt=0)
    dropout: float = arg(0.1, "dropout probability", ge=0, lt=1)
    amp: str = arg("off", "autocast dtype", choices=("off", "bf16", "fp16"))
    workers: tuple[int, ...] = arg((0, 2), "worker counts to time", ge=0)
    subset: int | None = arg(None, "first N samples only", gt=0)
    shuffle: bool = arg(True, "reshuffle every epoch")
    device: str = arg("cpu", "cpu, cuda or mps")

    def __post_init__(self):
        validate(self)


def test_flags_come_from_the_fields_with_their_types():
    cfg, out = parse(Example, ["--epochs", "5", "--workers", "1", "4", "--subset", "10", "--no-shuffle",
                               "--amp", "bf16"], "doc", out=Path("runs/x"))
    assert cfg == Example(epochs=5, workers=(1, 4), subset=10, shuffle=False, amp="bf16")
    assert out == Path("runs/x")


@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs must be > 0, got 0"),
    (["--lr", "-5"], "--lr must be > 0, got -5.0"),
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--dropout", "1"], "--dropout must be < 1, got 1.0"),
    (["--workers", "2", "-1"], "--workers must be >= 0, got -1"),
    (["--amp", "fp8"], "argument --amp: invalid choice: 'fp8'"),
    (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
    (["--device", "gpu"], "'gpu' is not a device"),
    (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
])
def test_a_bad_value_exits_2_with_one_line_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(Example, argv, "doc")
    assert exc.value.code == 2
    error_lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and message in error_lines[0]


def test_an_unwritable_out_folder_is_refused_before_any_work(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        parse(Example, ["--out", str(blocker / "sub")], "doc", out=tmp_path)
    assert exc.value.code == 2 and "is a file, not a folder" in capsys.readouterr().err
    assert unwritable(tmp_path / "new" / "deeper") is None and not (tmp_path / "new").exists()


def test_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        parse(Example, ["--help"], "doc")
    text = capsys.readouterr().out
    assert "(default: 0.001)" in text and "{off,bf16,fp16}" in text


def test_code_gets_the_same_checks_as_the_command_line():
    with pytest.raises(ValueError, match="--epochs must be > 0"):
        Example(epochs=0)
    assert dataclasses.replace(Example(), epochs=1).epochs == 1


def test_an_expected_failure_is_one_line_and_exit_1(capsys):
    def main(argv):
        raise UserError("data/mnist is missing: run `git checkout -- data/mnist`")

    with pytest.raises(SystemExit) as exc:
        run(main, [])
    assert exc.value.code == 1
    assert capsys.readouterr().err == "error: data/mnist is missing: run `git checkout -- data/mnist`\n"


def test_running_out_of_memory_is_one_line_and_exit_1(capsys):
    def main(argv):
        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: torch's CPU allocator refuses with a RuntimeError

    with pytest.raises(SystemExit) as exc:
        run(main, [])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1 and err.startswith("error: out of memory (")


def test_other_runtime_errors_keep_their_traceback():
    def main(argv):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        run(main, [])


def test_write_results_writes_the_report_and_its_figures_side_by_side(tmp_path, capsys):
    write_results(tmp_path / "new", "lab", "| a |\n\n", {"x": 1.5})
    assert (tmp_path / "new" / "lab.md").read_text() == "| a |\n"  # exactly one final newline
    assert json.loads((tmp_path / "new" / "lab.json").read_text()) == {"x": 1.5}
    assert "lab.md and lab.json" in capsys.readouterr().out


def test_runs_dir_is_under_the_git_ignored_runs_folder():
    assert runs_dir(str(REPO_ROOT / "day04_mlp_mnist" / "main.py"), "x") == REPO_ROOT / "runs" / "day04_mlp_mnist" / "x"
    ignored = subprocess.run(["git", "check-ignore", "-q", "runs/day04_mlp_mnist/x"], cwd=REPO_ROOT)
    assert ignored.returncode == 0


def test_saved_bytes_counts_activations_once_and_skips_parameters():
    layer = nn.Linear(100, 100, bias=False)
    x = torch.randn(8, 100, requires_grad=True)
    # x @ W.T saves x (3,200 B) and W (a parameter, skipped); tanh saves its output (3,200 B).
    assert saved_bytes(lambda: torch.tanh(layer(x)), skip=layer) == 2 * 8 * 100 * 4
    assert saved_bytes(lambda: torch.tanh(layer(x))) == 2 * 8 * 100 * 4 + 100 * 100 * 4


def test_median_seconds_times_the_call():
    import time

    assert 0.009 < median_seconds(lambda: time.sleep(0.01), repeat=3) < 0.05


def test_count_params_counts_trainable_ones_unless_told_otherwise():
    model = nn.Sequential(nn.Linear(10, 5), nn.Linear(5, 2))
    model[0].requires_grad_(False)
    assert count_params(model) == 12 and count_params(model, trainable_only=False) == 67


def test_python_m_runs_a_usage_error_without_a_traceback(tmp_path):
    script = tmp_path / "cli_example.py"
    script.write_text(
        "import sys\nsys.path.insert(0, %r)\n" % str(REPO_ROOT)
        + "from dataclasses import dataclass\nfrom sprint.cli import arg, parse, run, validate\n"
        "@dataclass\nclass C:\n    n: int = arg(1, 'count', gt=0)\n"
        "    def __post_init__(self):\n        validate(self)\n"
        "run(lambda argv: parse(C, argv, 'doc'))\n")
    done = subprocess.run([sys.executable, str(script), "--n", "-1"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--n must be > 0" in done.stderr


def test_peak_bytes_counts_temporaries_until_freed_and_skips_views_and_existing_tensors():
    x = torch.randn(1000)  # 4,000 bytes that existed before: not counted

    def step():
        a = x * 2  # +4,000
        b = a.view(10, 100).t()  # a view of a: no new memory
        c = torch.exp(b)  # +4,000: the peak, 8,000
        del a, b
        x.add_(1)  # in place on an existing tensor: nothing new
        return c.sum()  # +4 (a 0-d result); c (4,000) is freed when step returns

    with PeakBytes() as counter:
        result = step()
    assert counter.peak == 8_000 and counter.live == 4 and result.numel() == 1
    assert peak_bytes(lambda: torch.ones(256) + 1) == 2 * 256 * 4


def test_machine_names_the_hardware_and_threads():
    assert "threads" in machine() or torch.cuda.is_available()

