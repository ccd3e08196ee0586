"""Day 1 gates: the environment report is complete, the CUDA chain names the right step (checked against an
independent probe of the driver on this machine), and the tensor lessons show what they claim (the (N,N) trap,
view vs reshape vs permute storage sharing).

Run:  python day01_env_and_tensors/check.py   (or `pytest day01_env_and_tensors`)
"""
import ctypes
import dataclasses
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day01_env_and_tensors import diagnose_cuda as chain
from day01_env_and_tensors import main as day
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
N = 16  # trap size for the gates (main's default is 8: the gates run the function, not a printout)


def empty_fields(report) -> list[str]:
    """The report's fields left empty (None); `gpu` and `cuda_build` may be empty only without CUDA."""
    optional = set() if torch.cuda.is_available() else {"gpu", "cuda_build"}
    return [f.name for f in dataclasses.fields(report) if getattr(report, f.name) is None and f.name not in optional]


# ---------------------------------------------------------------------------------------------- report

def test_report_has_every_field_on_this_machine():
    gates.check("report fields left empty on this machine", empty_fields(day.environment_report()), "==", [])


def test_report_has_every_gpu_field_on_a_simulated_gpu(monkeypatch):
    props = SimpleNamespace(name="Simulated GPU", total_memory=80 * 2**30, major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    monkeypatch.setattr(day, "pick_device", lambda: torch.device("cuda"))
    report = day.environment_report()
    gates.check("report fields left empty on a simulated GPU", empty_fields(report), "==", [])
    gates.check("simulated GPU: SM count read from the device properties", report.gpu.sm_count, "==", 132)
    gates.check("simulated GPU: compute capability read from the device properties", report.gpu.compute_capability,
                "==", "9.0")


@pytest.mark.gpu
def test_report_and_diagnosis_on_a_real_gpu():
    report = day.environment_report()
    gates.check("report fields left empty on a real GPU", empty_fields(report), "==", [])
    gates.check("real GPU: compute capability as torch.cuda reports it", report.gpu.compute_capability, "==",
                "{}.{}".format(*torch.cuda.get_device_capability(0)))
    gates.check("diagnosis on a real GPU: step 0", chain.diagnose_cuda().step, "==", 0)


# ------------------------------------------------------------------------------------------- diagnosis

BANNER = "| NVIDIA-SMI 580.65   Driver Version: 580.65   CUDA Version: {} |"


@pytest.fixture
def machine(monkeypatch):
    """A simulated machine on which every step of the chain passes, yet CUDA is unavailable (step 6)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(chain, "nvidia_smi_output", lambda: BANNER.format("13.0"))
    monkeypatch.setattr(torch, "__version__", "2.14.1+cu130")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(chain, "virtualization_hints", lambda: ["wsl"])
    return monkeypatch


def no_driver(m):
    m.setattr(chain, "nvidia_smi_output", lambda: None)


def cpu_only_build(m):
    m.setattr(torch, "__version__", "2.14.1+cpu")
    m.setattr(torch.version, "cuda", None)


def no_driver_and_cpu_only_build(m):
    no_driver(m)
    cpu_only_build(m)


SIMULATED = {  # name: (what differs from the healthy-but-unavailable machine, the step that must be named)
    "no driver (like this machine)": (no_driver, 1),
    "CPU-only build": (cpu_only_build, 2),
    "no driver and CPU-only build": (no_driver_and_cpu_only_build, 1),  # the chain's order decides
    "torch.version.cuda None": (lambda m: m.setattr(torch.version, "cuda", None), 3),
    "driver older than wheel": (lambda m: m.setattr(chain, "nvidia_smi_output", lambda: BANNER.format("12.4")), 4),
    "CUDA_VISIBLE_DEVICES empty": (lambda m: m.setenv("CUDA_VISIBLE_DEVICES", ""), 5),
    "CUDA_VISIBLE_DEVICES -1": (lambda m: m.setenv("CUDA_VISIBLE_DEVICES", "-1"), 5),
    "WSL without passthrough": (lambda m: None, 6),
    "healthy GPU machine": (lambda m: m.setattr(torch.cuda, "is_available", lambda: True), 0),
}


@pytest.mark.parametrize("name", SIMULATED)
def test_diagnosis_names_the_right_step_on_a_simulated_machine(machine, name):
    change, expected = SIMULATED[name]
    change(machine)
    gates.check(f"simulated {name}: diagnosis names step {expected}", chain.diagnose_cuda().step, "==", expected)


def driver_installed() -> bool:
    """Asked of the operating system, not of `diagnose_cuda`: does the driver's user-space library load, or is
    the kernel module there?"""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return Path("/proc/driver/nvidia").exists()


def expected_step() -> int:
    """The step an independent look at this machine predicts; 4 stands for "4, 5 or 6" (driver and CUDA build
    present: what remains depends on the driver's version, the environment and the virtualisation)."""
    if torch.cuda.is_available():
        return 0
    if not driver_installed():
        return 1
    if torch.version.cuda is None:
        return 2 if "+cpu" in torch.__version__ else 3
    return 4


def test_diagnosis_of_this_machine_agrees_with_an_independent_driver_probe():
    expected, step = expected_step(), chain.diagnose_cuda().step
    gates.check(f"this machine: diagnosis names the step the driver probe predicts ({expected})",
                min(step, 4) if expected == 4 else step, "==", expected)


# --------------------------------------------------------------------------------------------- tensors

@pytest.fixture(scope="module")
def lessons():
    return day.tensor_lessons(n=N)


def test_mixed_dtypes_promote_in_add_but_raise_in_matmul(lessons):
    gates.check("float32 + float64 promotes to float64", lessons.attributes.float32_plus_float64, "==", "torch.float64")
    gates.check("float32 @ float64 raises a RuntimeError", lessons.attributes.float32_matmul_float64.type, "==",
                "RuntimeError")


def test_broadcasting_rule_aligns_from_the_right(lessons):
    gates.check("(8,1,128) + (1,16,128) broadcasts to (8,16,128)", lessons.broadcasting.rule_shape, "==", [8, 16, 128])


def test_trap_silently_gives_n_by_n(lessons):
    gates.check(f"(N,1) - (N,) silently becomes (N,N), N = {N}", lessons.broadcasting.trap_shape, "==", [N, N])


def test_trap_makes_a_perfect_model_lose(lessons):
    gates.check("perfect model: loss with aligned shapes is 0", lessons.broadcasting.right_loss, "==", 0.0)
    gates.check("perfect model: loss through the trap is above 0.1", lessons.broadcasting.trap_loss, ">", 0.1)


def test_shape_assert_catches_the_trap(lessons):
    gates.check("the shape assert raises on (N,1) vs (N,)", lessons.broadcasting.assert_defence.type, "==",
                "AssertionError")


def test_view_on_transposed_tensor_raises(lessons):
    error = lessons.views.transpose_view
    gates.check("view on a transpose raises a RuntimeError", error.type, "==", "RuntimeError")
    gates.check("view on a transpose: the message says the view size is not compatible",
                "view size is not compatible" in error.message, "==", True)


def test_reshape_of_transposed_tensor_copies(lessons):
    gates.check("reshape of a transpose copies (shares no storage)", lessons.views.transpose_reshape_shares, "==",
                False)


def test_reshape_of_contiguous_tensor_shares(lessons):
    gates.check("reshape of a contiguous tensor shares its storage", lessons.views.reshape_contiguous_shares, "==",
                True)


def test_permute_shares_storage_and_breaks_contiguity(lessons):
    gates.check("permute shares storage", lessons.views.permute_shares, "==", True)
    gates.check("a permuted tensor is not contiguous", lessons.views.permute.contiguous, "==", False)


def test_contiguous_copies_and_makes_view_legal(lessons):
    gates.check("contiguous() of a transpose copies (shares no storage)", lessons.views.contiguous_shares, "==", False)
    gates.check("view works after contiguous()", lessons.views.contiguous_view_works, "==", True)


def test_main_writes_report(tmp_path, capsys):
    day.main(["--n", "4", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "report.json").read_text())
    gates.check("report.json holds the environment, the diagnosis and the lessons", sorted(written), "==",
                ["diagnosis", "environment", "lessons"])
    gates.check("report.json: the trap at --n 4 is (4,4)", written["lessons"]["broadcasting"]["trap_shape"], "==",
                [4, 4])
    assert "chain step" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--n", "1"], ["--n", "100000"], ["--n", "two"], ["--seed", "0.5"], ["--bogus"]])
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


if __name__ == "__main__":
    run_this_file(__file__)
