"""Day 1 — the environment, and what a tensor really is.

Part 1 prints an environment report and walks the six-step "why is torch.cuda.is_available() False?" chain
(`diagnose_cuda.py`), returning the step that explains this machine. Part 2 shows the tensor lessons with evidence
rather than prose: the three attributes (dtype / device / shape), broadcasting and its silent (N,) vs (N,1) trap,
and view / reshape / permute / contiguous seen through stride(), is_contiguous() and storage sharing.

Run:    python day01_env_and_tensors/main.py     (writes runs/day01_env_and_tensors/report.json and .md)
Gates:  python day01_env_and_tensors/check.py
"""
import dataclasses
import importlib.metadata
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import torch

from day01_env_and_tensors.diagnose_cuda import Diagnosis, diagnose_cuda
from day01_env_and_tensors.report import report_markdown
from sprint import cpu_info, runs_dir, write_results
from sprint.cli import arg, parse, run, validate
from sprint.device import pick_device


# ----------------------------------------------------------------------------------------------------------
# Part 1: the environment report (the CUDA diagnosis chain is in diagnose_cuda.py)
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    count: int
    name: str
    total_memory_gib: float
    compute_capability: str  # 8.0 = A100, 9.0 = H100/H200
    sm_count: int  # streaming multiprocessors: the GPU's "cores"


@dataclass(frozen=True)
class Environment:
    python: str
    platform: str
    torch: str
    torchvision: str
    cuda_build: str | None  # torch.version.cuda: the CUDA runtime the wheel ships with; None on CPU builds
    cuda_available: bool
    device: str
    cpu_model: str
    cpu_threads: int  # intra-op threads torch will use
    cpu_count: int | None
    mps_available: bool
    gpu: Gpu | None  # filled when CUDA is available


def environment_report() -> Environment:
    """Versions, the chosen device, and the accelerator's key figures (None when there is no GPU)."""
    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = Gpu(torch.cuda.device_count(), props.name, round(props.total_memory / 2**30, 2),
                  f"{props.major}.{props.minor}", props.multi_processor_count)
    return Environment(
        python=platform.python_version(), platform=platform.platform(), torch=torch.__version__,
        torchvision=importlib.metadata.version("torchvision"),  # metadata only: importing it costs seconds
        cuda_build=torch.version.cuda, cuda_available=torch.cuda.is_available(), device=str(pick_device()),
        cpu_model=cpu_info()[0], cpu_threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
        mps_available=torch.backends.mps.is_available(), gpu=gpu)


# ----------------------------------------------------------------------------------------------------------
# Part 2: tensor lessons, each returning its evidence
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Error:
    type: str
    message: str


def shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when both tensors look into the same block of memory (a view), False for a copy."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def error_of(fn) -> Error | None:
    """Run fn and return the error it raised, or None if it ran fine."""
    try:
        fn()
    except Exception as exc:  # the lesson is the error itself, whichever it is
        return Error(type(exc).__name__, str(exc))
    return None


@dataclass(frozen=True)
class Attributes:
    shape: list[int]
    dtype: str
    device: str
    to_float16: str  # dtype after .to(dtype=float16)
    float32_plus_float64: str  # dtype of the sum: type promotion, the wider dtype wins
    float32_matmul_float64: Error | None  # no promotion in matmul: an error


def three_attributes() -> Attributes:
    """A tensor = data + dtype + device + shape. Mixed dtypes promote in elementwise ops but not in matmul."""
    x = torch.zeros(2, 3, dtype=torch.float32, device="cpu")  # state all three explicitly
    half = x.to("cpu", dtype=torch.float16)  # .to() changes device and dtype in one call
    a32, b64 = torch.ones(3, 2), torch.ones(2, 2, dtype=torch.float64)
    return Attributes(list(x.shape), str(x.dtype), str(x.device), str(half.dtype), str((a32[:2] + b64).dtype),
                      error_of(lambda: a32 @ b64))


def checked_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """MSE with the one-line defence: equal shapes before anything can broadcast."""
    assert pred.shape == target.shape, (pred.shape, target.shape)
    return ((pred - target) ** 2).mean()


@dataclass(frozen=True)
class Broadcasting:
    rule_shape: list[int]  # (8,1,128) + (1,16,128)
    loud_mismatch: Error | None  # (32,10) - (32,): breaks the rules, so it raises
    trap_shape: list[int]  # (N,1) - (N,): allowed by the rules, silently (N,N)
    trap_loss: float  # a perfect model's MSE through the trap
    right_loss: float  # the same model's MSE with aligned shapes
    assert_defence: Error | None  # checked_mse on (N,1) vs (N,)


def broadcasting(n: int = 8, seed: int = 0) -> Broadcasting:
    """Align from the right; each dim equal, 1, or missing. A mismatch that fits the rules is silently wrong."""
    g = torch.Generator().manual_seed(seed)
    rule = (torch.randn(8, 1, 128, generator=g) + torch.randn(1, 16, 128, generator=g)).shape
    loud = error_of(lambda: torch.randn(32, 10) - torch.randn(32))
    target = torch.randn(n, generator=g)  # labels as a flat vector: (N,)
    pred = target.unsqueeze(1).clone()  # a perfect model's output, shaped like a model's: (N, 1)
    trap = pred - target  # (N,1) - (N,) -> (N,N): every prediction minus every label
    return Broadcasting(list(rule), loud, list(trap.shape), (trap ** 2).mean().item(),
                        checked_mse(pred, target.unsqueeze(1)).item(), error_of(lambda: checked_mse(pred, target)))


@dataclass(frozen=True)
class Layout:
    shape: list[int]
    stride: list[int]
    contiguous: bool


def layout(t: torch.Tensor) -> Layout:
    return Layout(list(t.shape), list(t.stride()), t.is_contiguous())


@dataclass(frozen=True)
class Views:
    a: Layout  # a = arange(24).reshape(4, 6)
    view_shares: bool  # a.view(2, 12)
    reshape_contiguous_shares: bool  # a.reshape(2, 12): a view when it can be one
    transpose: Layout  # t = a.t()
    transpose_shares: bool
    transpose_view: Error | None  # t.view(24)
    transpose_reshape_shares: bool  # t.reshape(24): could not view, so it silently copied
    permute: Layout  # arange(24).reshape(2, 3, 4).permute(2, 0, 1)
    permute_shares: bool
    contiguous: Layout  # t.contiguous()
    contiguous_shares: bool
    contiguous_view_works: bool  # t.contiguous().view(24)
    contiguous_of_contiguous_is_itself: bool  # a.contiguous() is a: no copy when none is needed


def views_and_copies() -> Views:
    """A tensor is storage + shape + stride. view/permute only rewrite stride; reshape/contiguous may copy."""
    a = torch.arange(24.0).reshape(4, 6)  # contiguous: stride (6, 1)
    t = a.t()  # transpose swaps the strides -> (1, 6); nothing moves
    x = torch.arange(24.0).reshape(2, 3, 4)
    p = x.permute(2, 0, 1)  # permute is a transpose in N dims: strides reordered, memory untouched
    fixed = t.contiguous()  # a real copy, laid out row-major for its new shape
    return Views(layout(a), shares_storage(a, a.view(2, 12)), shares_storage(a, a.reshape(2, 12)),
                 layout(t), shares_storage(a, t), error_of(lambda: t.view(24)), shares_storage(a, t.reshape(24)),
                 layout(p), shares_storage(x, p), layout(fixed), shares_storage(a, fixed),
                 error_of(lambda: fixed.view(24)) is None, a.contiguous() is a)


@dataclass(frozen=True)
class Lessons:
    attributes: Attributes
    broadcasting: Broadcasting
    views: Views


def tensor_lessons(n: int = 8, seed: int = 0) -> Lessons:
    return Lessons(three_attributes(), broadcasting(n, seed), views_and_copies())


# ----------------------------------------------------------------------------------------------------------

def show(title: str, result) -> None:
    """Print a result (a dataclass or a dict) as an aligned two-column list."""
    items = vars(result) if dataclasses.is_dataclass(result) else result
    print(f"\n== {title}")
    for key, value in items.items():
        print(f"  {key:<46} {value}")


@dataclass(frozen=True)
class Report:
    environment: Environment
    diagnosis: Diagnosis
    lessons: Lessons


@dataclass
class Config:
    n: int = arg(8, "batch size N in the (N,) vs (N,1) broadcasting trap (N = 1 would hide the trap; the trap "
                    "makes an N x N tensor, so at most 4096)", ge=2, le=4096)
    seed: int = arg(0, "seed of the random tensors", ge=0)

    def __post_init__(self):
        validate(self)


def main(argv=None) -> Report:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    report = environment_report()
    show("environment", report)
    diagnosis = diagnose_cuda()
    show(f"is CUDA available? chain step {diagnosis.step}",
         {"problem": diagnosis.problem, "fix": diagnosis.fix, **vars(diagnosis.facts)})
    lessons = tensor_lessons(cfg.n, cfg.seed)
    show("three attributes: dtype / device / shape", lessons.attributes)
    show(f"broadcasting (N = {cfg.n})", lessons.broadcasting)
    show("view / reshape / permute / contiguous", lessons.views)

    result = Report(report, diagnosis, lessons)
    figures = dataclasses.asdict(result)
    write_results(out, "report", report_markdown(figures), figures)
    return result


if __name__ == "__main__":
    run(main)
