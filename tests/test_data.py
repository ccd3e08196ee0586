"""Offline MNIST: the bundled copy is complete, verified, and failures read as one clear message."""
import gzip
import shutil

import pytest
import torch

from sprint import data
from sprint.data import MNISTUnavailable, RAW_MD5, md5sum, mnist, prepare_mnist

TRAIN_CLASS_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def test_bundle_holds_the_four_files():
    assert sorted(p.name for p in data.BUNDLE_DIR.glob("*.gz")) == sorted(f"{n}.gz" for n in RAW_MD5)


def test_prepared_files_have_the_published_md5s():
    raw = prepare_mnist() / "MNIST" / "raw"
    for name, expected in RAW_MD5.items():
        assert md5sum(raw / name) == expected, name


def test_splits_have_60000_and_10000_images():
    assert len(mnist(train=True)) == 60000
    assert len(mnist(train=False)) == 10000


def test_training_labels_have_the_known_per_class_counts():
    counts = torch.bincount(mnist(train=True).targets, minlength=10).tolist()
    assert counts == TRAIN_CLASS_COUNTS


def test_tensors_are_normalised_images():
    x, y = data.mnist_tensors(train=False)
    assert x.shape == (10000, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1) < 0.1


def _bundle_copy(tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(data.BUNDLE_DIR, bundle)
    return bundle


def test_corrupted_content_names_the_file_and_the_fix(tmp_path):
    bundle = _bundle_copy(tmp_path)
    bad = bundle / "train-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(bad.read_bytes()))
    content[100] ^= 0xFF  # one flipped byte: valid gzip, wrong data
    bad.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(MNISTUnavailable, match=r"train-labels-idx1-ubyte\.gz is corrupt.*git checkout -- data/mnist"):
        prepare_mnist(tmp_path / "root", bundle)
    assert not (tmp_path / "root" / "MNIST" / "raw" / "train-labels-idx1-ubyte").exists()


def test_truncated_gzip_names_the_file(tmp_path):
    bundle = _bundle_copy(tmp_path)
    bad = bundle / "t10k-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:500])
    with pytest.raises(MNISTUnavailable, match=r"t10k-labels-idx1-ubyte\.gz is corrupt"):
        prepare_mnist(tmp_path / "root", bundle)


def test_a_damaged_prepared_file_is_rebuilt_from_the_bundle(tmp_path):
    root = prepare_mnist(tmp_path / "root")
    target = root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    target.write_bytes(b"garbage")
    prepare_mnist(root)
    assert md5sum(target) == RAW_MD5["t10k-labels-idx1-ubyte"]


def test_missing_bundle_falls_back_to_download_and_explains_failure(tmp_path, monkeypatch):
    calls = []

    def offline(root, train=True, download=False):
        calls.append(download)
        raise OSError("network is unreachable")

    monkeypatch.setattr("torchvision.datasets.MNIST", offline)
    with pytest.raises(MNISTUnavailable, match=r"bundled copy .* is missing and the download failed .*network"):
        prepare_mnist(tmp_path / "root", tmp_path / "no-bundle")
    assert calls == [True]
