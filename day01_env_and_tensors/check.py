"""Day 1 gates: the environment report is complete, the CUDA chain names the right step, and the tensor
lessons show what they claim (the (N,N) trap, view vs reshape vs permute storage sharing).

Run:  python day01_env_and_tensors/check.py   (or `pytest day01_env_and_tensors`)
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch

from day01_env_and_tensors import main as day
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
N = 16  # trap size for the gates (main's default is 8: the gates run the function, not a printout)

# The fields the report must carry (from the Day 1 spec), on every machine and additionally with CUDA.
COMMON_FIELDS = {"python", "torch", "torchvision", "torch.version.cuda", "cuda_available", "device",
                 "cpu_model", "cpu_threads", "mps_available"}
CUDA_FIELDS = {"device_name", "total_memory_gib", "compute_capability", "sm_count"}


def missing_fields(report: dict, cuda: bool) -> int:
    return len((COMMON_FIELDS | (CUDA_FIELDS if cuda else set())) - report.keys())


# ---------------------------------------------------------------------------------------------- report

def test_report_has_every_field_on_this_machine():
    report = day.environment_report()
    gates.check("report: missing fields (this machine)", missing_fields(report, torch.cuda.is_available()), "==", 0)


def test_report_has_every_cuda_field_on_a_simulated_gpu(monkeypatch):
    props = SimpleNamespace(name="Simulated GPU", total_memory=80 * 2**30, major=9, minor=0, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    report = day.environment_report()
    gates.check("report: missing fields (simulated GPU)", missing_fields(report, cuda=True), "==", 0)
    gates.check("report: SM count read from device properties", report["sm_count"], "==", props.multi_processor_count)


@pytest.mark.gpu
def test_report_and_diagnosis_on_a_real_gpu():
    report = day.environment_report()
    gates.check("report: missing fields (real GPU)", missing_fields(report, cuda=True), "==", 0)
    gates.check("report: compute capability (real GPU)", report["compute_capability"], "==",
                "{}.{}".format(*torch.cuda.get_device_capability(0)))
    gates.check("diagnosis on a real GPU", day.diagnose_cuda()["step"], "==", 0)


# ------------------------------------------------------------------------------------------- diagnosis

BANNER = "| NVIDIA-SMI 580.65   Driver Version: 580.65   CUDA Version: {} |"


@pytest.fixture
def machine(monkeypatch):
    """A simulated machine on which every step of the chain passes, yet CUDA is unavailable (step 6)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(day, "nvidia_smi_output", lambda: BANNER.format("13.0"))
    monkeypatch.setattr(torch, "__version__", "2.14.1+cu130")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(day, "virtualization_hints", lambda: ["wsl"])
    return monkeypatch


def no_driver(m):
    m.setattr(day, "nvidia_smi_output", lambda: None)


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
    "driver older than wheel": (lambda m: m.setattr(day, "nvidia_smi_output", lambda: BANNER.format("12.4")), 4),
    "CUDA_VISIBLE_DEVICES empty": (lambda m: m.setenv("CUDA_VISIBLE_DEVICES", ""), 5),
    "CUDA_VISIBLE_DEVICES -1": (lambda m: m.setenv("CUDA_VISIBLE_DEVICES", "-1"), 5),
    "WSL without passthrough": (lambda m: None, 6),
    "healthy GPU machine": (lambda m: m.setattr(torch.cuda, "is_available", lambda: True), 0),
}


@pytest.mark.parametrize("name", SIMULATED)
def test_diagnosis_names_the_right_step_on_a_simulated_machine(machine, name):
    change, expected = SIMULATED[name]
    change(machine)
    gates.check(f"diagnosis step: {name}", day.diagnose_cuda()["step"], "==", expected)


def test_diagnosis_of_this_machine_agrees_with_is_available():
    step = day.diagnose_cuda()["step"]
    gates.check("diagnosis here: (step == 0) == cuda available", (step == 0) == torch.cuda.is_available(), "==", True)


# --------------------------------------------------------------------------------------------- tensors

@pytest.fixture(scope="module")
def lessons():
    return day.tensor_lessons(n=N)


def test_mixed_dtypes_promote_in_add_but_raise_in_matmul(lessons):
    gates.check("float32 + float64 dtype", lessons["attributes"]["add_float32_float64"], "==", "torch.float64")
    gates.check("float32 @ float64 raises", lessons["attributes"]["matmul_float32_float64"]["type"], "==", "RuntimeError")


def test_broadcasting_rule_aligns_from_the_right(lessons):
    gates.check("(8,1,128) + (1,16,128) shape", lessons["broadcasting"]["rule_shape"], "==", [8, 16, 128])


def test_trap_silently_gives_n_by_n(lessons):
    gates.check("(N,1) - (N,) shape", lessons["broadcasting"]["trap_shape"], "==", [N, N])


def test_trap_makes_a_perfect_model_lose(lessons):
    gates.check("perfect model: loss with aligned shapes", lessons["broadcasting"]["right_loss"], "==", 0.0)
    gates.check("perfect model: loss through the trap", lessons["broadcasting"]["trap_loss"], ">", 0.1)


def test_shape_assert_catches_the_trap(lessons):
    gates.check("shape assert raises on (N,1) vs (N,)", lessons["broadcasting"]["assert_defence"]["type"], "==",
                "AssertionError")


def test_view_on_transposed_tensor_raises(lessons):
    error = lessons["views"]["t.view(24)"]
    gates.check("view on a transpose: error type", error["type"], "==", "RuntimeError")
    gates.check("view on a transpose: message", "view size is not compatible" in error["message"], "==", True)


def test_reshape_of_transposed_tensor_copies(lessons):
    gates.check("reshape of a transpose shares storage", lessons["views"]["t.reshape(24) shares"], "==", False)


def test_reshape_of_contiguous_tensor_shares(lessons):
    gates.check("reshape of a contiguous tensor shares storage", lessons["views"]["a.reshape(2,12) shares"], "==", True)


def test_permute_shares_storage_and_breaks_contiguity(lessons):
    gates.check("permute shares storage", lessons["views"]["permute shares"], "==", True)
    gates.check("permute result is contiguous", lessons["views"]["x.permute(2,0,1)"]["contiguous"], "==", False)


def test_contiguous_copies_and_makes_view_legal(lessons):
    gates.check("contiguous() of a transpose shares storage", lessons["views"]["t.contiguous() shares"], "==", False)
    gates.check("view after contiguous() works", lessons["views"]["t.contiguous().view(24) works"], "==", True)


def test_main_writes_report(tmp_path, capsys):
    day.main(["--n", "4", "--out", str(tmp_path)])
    written = json.loads((tmp_path / "report.json").read_text())
    gates.check("report.json sections", sorted(written), "==", ["diagnosis", "environment", "lessons"])
    assert "chain step" in capsys.readouterr().out


if __name__ == "__main__":
    run_this_file(__file__)
