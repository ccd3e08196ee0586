"""Repo-wide pytest setup: headless plots, `gpu` gates skipped without CUDA, and the gate table at the end."""
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


def pytest_terminal_summary(terminalreporter):
    if gates.RECORDED:
        terminalreporter.section("gates (measured figure vs threshold; also in runs/gates/<day>.json)")
        terminalreporter.write_line(gates.format_table(gates.RECORDED))
