"""Offline MNIST: the bundled copy is complete, verified, and failures read as one clear message."""
import gzip
import importlib
import shutil
import socket
import subprocess
import sys

import pytest
import torch

from sprint import data
from sprint.cli import run
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


def test_a_missing_bundle_is_one_message_naming_the_file_and_nothing_is_downloaded(tmp_path, monkeypatch):
    connections = []
    monkeypatch.setattr(socket.socket, "connect", lambda sock, address: connections.append(address))
    with pytest.raises(MNISTUnavailable, match=r"no-bundle/train-images-idx3-ubyte\.gz is missing.*git checkout"):
        prepare_mnist(tmp_path / "root", tmp_path / "no-bundle")
    assert connections == []


def test_in_memory_tensors_equal_torchvisions_decoding():
    x, y = data.mnist_tensors(train=False)
    reference = mnist(train=False)
    expected = ((reference.data.float() / 255 - data.MEAN) / data.STD).unsqueeze(1)
    assert (x - expected).abs().max() < 1e-5 and torch.equal(y, reference.targets)


def test_editing_the_returned_tensors_cannot_change_the_next_call():
    x, y = data.mnist_tensors(train=False)
    x.zero_()  # an in-place augmentation or a second normalisation
    y.fill_(3)
    again_x, again_y = data.mnist_tensors(train=False)
    assert again_x.abs().sum() > 0 and (again_y != 3).any()


def test_the_split_is_fixed_disjoint_and_takes_the_subset_from_the_training_part():
    (x, y), (xv, yv) = data.mnist_split(5000)
    assert len(x) == 55000 and len(xv) == 5000
    (x2, _), (xv2, _) = data.mnist_split(5000, train_subset=1000)
    assert torch.equal(xv, xv2) and torch.equal(x[:1000], x2)  # same validation set, the subset is a prefix
    flat_train, flat_val = x[:5000].flatten(1), xv.flatten(1)
    assert not (torch.cdist(flat_val[:200], flat_train) == 0).any()  # no validation image among the training ones


def test_the_in_memory_path_never_imports_torchvision():
    code = ("import sys; sys.path.insert(0, %r)\n" % str(data.REPO_ROOT)
            + "from sprint.data import mnist_split, mnist_tensors\n"
            "mnist_split(100, train_subset=10); mnist_tensors(train=False)\n"
            "assert 'torchvision' not in sys.modules, 'torchvision was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_a_truncated_idx_file_is_refused(tmp_path):
    raw = prepare_mnist() / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    short = tmp_path / "t10k-labels-idx1-ubyte"
    short.write_bytes(raw.read_bytes()[:-10])
    with pytest.raises(MNISTUnavailable, match="holds 9990 bytes of data"):
        data.read_idx(short)


@pytest.fixture
def no_mnist(tmp_path, monkeypatch):
    """No prepared copy and no bundle: where `sprint.data` looks, nothing is found."""
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path / "root")
    monkeypatch.setattr(data, "BUNDLE_DIR", tmp_path / "no-bundle")
    return tmp_path


@pytest.fixture
def corrupt_mnist(tmp_path, monkeypatch):
    """The bundle with one file truncated, and no prepared copy."""
    bundle = _bundle_copy(tmp_path)
    bad = bundle / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(bad.read_bytes()[:500])
    monkeypatch.setattr(data, "DATA_ROOT", tmp_path / "root")
    monkeypatch.setattr(data, "BUNDLE_DIR", bundle)
    return tmp_path


MNIST_MAINS = {"day04_mlp_mnist.main": ["--epochs", "1"], "day05_dataloader.main": ["--smoke", "--workers", "0"]}


@pytest.mark.parametrize("broken", ["no_mnist", "corrupt_mnist"])
@pytest.mark.parametrize("module", MNIST_MAINS)
def test_a_main_without_usable_mnist_prints_one_line_and_exits_1(module, broken, request, capsys):
    folder = request.getfixturevalue(broken)
    with pytest.raises(SystemExit) as exc:
        run(importlib.import_module(module).main, [*MNIST_MAINS[module], "--out", str(folder / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: MNIST") and "git checkout -- data/mnist" in err
    assert not (folder / "out").exists()


def test_the_fashion_mnist_bundle_holds_the_four_files_and_its_test_split_verifies():
    assert sorted(p.name for p in data.FASHION_DIR.glob("*.gz")) == sorted(f"{n}.gz" for n in data.FASHION_MD5)
    x, y = data.fashion_tensors(train=False)
    assert x.shape == (10000, 1, 28, 28) and torch.bincount(y).tolist() == [1000] * 10


def test_fashion_mnist_missing_says_how_to_restore_it(tmp_path):
    with pytest.raises(MNISTUnavailable, match="missing.*git checkout -- data/fashion-mnist"):
        data.fashion_split(folder=tmp_path)


def test_a_fashion_mnist_file_with_other_content_is_refused_by_its_checksum(tmp_path):
    for name in data.FASHION_MD5:
        shutil.copy(data.FASHION_DIR / f"{name}.gz", tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    content = bytearray(gzip.decompress(labels.read_bytes()))
    content[-1] = (content[-1] + 1) % 10  # one label changed: still a valid IDX file
    labels.write_bytes(gzip.compress(bytes(content)))
    with pytest.raises(MNISTUnavailable, match="is corrupt: MD5 of its content"):
        data.fashion_tensors(train=False, folder=tmp_path)


def test_a_fashion_mnist_file_with_damaged_compressed_data_is_refused_as_corrupt(tmp_path):
    for name in data.FASHION_MD5:
        shutil.copy(data.FASHION_DIR / f"{name}.gz", tmp_path)
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    damaged = bytearray(labels.read_bytes())
    damaged[20:60] = bytes(b ^ 0xFF for b in damaged[20:60])  # the deflate stream, past the gzip header: zlib.error
    labels.write_bytes(bytes(damaged))
    with pytest.raises(MNISTUnavailable, match="t10k-labels-idx1-ubyte.gz is corrupt"):
        data.fashion_tensors(train=False, folder=tmp_path)
