"""Repo-wide pytest setup: headless plots, `gpu` gates skipped without CUDA, torch's process-wide settings given back
after each test module, fixtures that run a script's command line, and the gate table at the end."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")  # plots render to files; no display needed

import argparse

import pytest
import torch

from sprint import cli, gates

# The template's own tests run where a learner runs them, in a copy of the folder outside the repo with the package
# installed: day12_template/check.py's copy gate runs them there, so the suite collects each of them once.
collect_ignore = gates.NOT_COLLECTED


def pytest_addoption(parser):
    parser.addoption("--session-record", metavar="FILE", default=None,
                     help="also write this session's every outcome and gate to FILE (scripts/gpu_gates.sh uses it)")


def pytest_configure(config):
    recorder = gates.OutcomeRecorder(session_record=config.getoption("--session-record"))
    config.pluginmanager.register(recorder, "sprint-outcomes")  # runs/gates/<folder>.outcomes.json


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("after_all") is not None)  # stable: the rest keep their order
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


@pytest.fixture
def run_cli(capsys):
    """`run_cli(main, argv)` runs a script's `main` as its command line does (`sprint.cli.run`) and expects it to
    exit: returns (exit code, the non-empty lines it wrote to stderr)."""
    def run_(main, argv):
        with pytest.raises(SystemExit) as exc:
            cli.run(main, argv)
        return exc.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]

    return run_


@pytest.fixture
def parser_of(monkeypatch):
    """`parser_of(main)`: the ArgumentParser a script's `main` builds, caught when it parses (no work is done)."""
    def parser_(main):
        caught = []

        def catch(parser, *args, **kwargs):
            caught.append(parser)
            raise SystemExit(0)

        with monkeypatch.context() as patch:
            patch.setattr(argparse.ArgumentParser, "parse_args", catch)
            with pytest.raises(SystemExit):
                main([])
        return caught[0]

    return parser_


def pytest_terminal_summary(terminalreporter):
    if gates.RECORDED:
        terminalreporter.section("gates (measured figure vs threshold; also in runs/gates/<day>.json)")
        terminalreporter.write_line(gates.format_table(gates.RECORDED))
