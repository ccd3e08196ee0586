"""Repo-wide pytest setup: headless plots, `gpu` gates skipped without CUDA, torch's process-wide settings given back
after each test module, and the gate table at the end."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")  # plots render to files; no display needed

import pytest
import torch

from sprint import gates


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="module", autouse=True)
def restore_torch_globals():
    """Trainers set the thread count and deterministic mode for their process; give pytest's back after each module."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def pytest_terminal_summary(terminalreporter):
    if gates.RECORDED:
        terminalreporter.section("gates (measured figure vs threshold; also in runs/gates/<day>.json)")
        terminalreporter.write_line(gates.format_table(gates.RECORDED))
