"""Device choice: cuda -> mps -> cpu, and an explicit choice wins."""
import pytest
import torch

from sprint.device import pick_device


def test_explicit_device_wins():
    assert pick_device("cpu") == torch.device("cpu")


def test_cpu_when_no_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert pick_device() == torch.device("cpu")


def test_cuda_preferred_over_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device() == torch.device("cuda")


def test_mps_when_no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert pick_device() == torch.device("mps")


def test_an_absent_device_is_refused_with_what_the_machine_offers(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"--device cuda: not available on this machine \(it offers: cpu\)"):
        pick_device("cuda")


def test_a_misspelled_device_is_refused():
    with pytest.raises(ValueError, match="'gpu' is not a device"):
        pick_device("gpu")
