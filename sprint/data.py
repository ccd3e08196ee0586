"""Offline MNIST.

The four original IDX files ship gzipped in `data/mnist/`. `prepare_mnist()` decompresses them into
`<root>/MNIST/raw/`, exactly where `torchvision.datasets.MNIST(root)` looks, and checks each file's MD5.
Nothing is downloaded: a missing or corrupt file raises `MNISTUnavailable` with one message that names the file
and says what to do. Fashion-MNIST ships the same way in `data/fashion-mnist/` and is read in place.

`mnist_tensors()` parses the IDX files with NumPy (no torchvision import: it costs seconds at start-up);
`mnist()` is torchvision's per-sample dataset, for pipelines that decode one image at a time (Day 5).
"""
import functools
import gzip
import hashlib
import io
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
import torch

from sprint import REPO_ROOT
from sprint.cli import UserError

BUNDLE_DIR = REPO_ROOT / "data" / "mnist"
DATA_ROOT = REPO_ROOT / "data"

# MD5 of the decompressed files (see data/mnist/README.md); the .gz bytes may be recompressed.
RAW_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}
MEAN, STD = 0.1307, 0.3081  # training-set pixel statistics, the usual MNIST normalisation
SIZES = {True: 60_000, False: 10_000}  # images in the training and test splits
SPLIT_SEED = 1234  # the train/validation split never changes, whatever the training seed

FIX = "Restore the bundled copy with `git checkout -- data/mnist` (nothing is downloaded)."


class MNISTUnavailable(UserError, RuntimeError):
    """MNIST could not be prepared; the message says which file and what to do."""


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _extract(gz_path: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    try:
        with gzip.open(gz_path, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        tmp.unlink(missing_ok=True)
        raise MNISTUnavailable(f"MNIST file {gz_path} is corrupt ({exc}). {FIX}") from None
    os.replace(tmp, target)  # never leave a half-written file under the name torchvision reads


def prepare_mnist(root: str | Path | None = None, bundle: str | Path | None = None) -> Path:
    """Make `<root>/MNIST/raw/` hold the four verified files; return `root` for torchvision.

    `root` defaults to `data/` and `bundle` to `data/mnist/`, read when called (tests point them elsewhere)."""
    root, bundle = Path(root or DATA_ROOT), Path(bundle or BUNDLE_DIR)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, expected in RAW_MD5.items():
        target = raw / name
        if target.exists() and md5sum(target) == expected:
            continue
        gz = bundle / f"{name}.gz"
        if not gz.exists():
            raise MNISTUnavailable(f"MNIST file {gz} is missing. {FIX}")
        _extract(gz, target)
        actual = md5sum(target)
        if actual != expected:
            target.unlink()  # never hand a wrong file to torchvision
            raise MNISTUnavailable(
                f"MNIST file {gz} is corrupt: MD5 of its content is {actual}, expected {expected}. {FIX}"
            )
    return root


def raw_paths(train: bool = True, root: str | Path | None = None) -> tuple[Path, Path]:
    """(images, labels): the verified, decompressed IDX files of one split."""
    raw = prepare_mnist(root) / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    return raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"


def idx_shape(f, source, fix: str = FIX) -> tuple[int, ...]:
    """IDX format: 2 zero bytes, a type code (0x08 = uint8), the number of dims, then each dim as a big-endian int32.

    Reads the header from the binary file `f` and leaves it at the start of the data."""
    magic = f.read(4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] != 0x08:
        raise MNISTUnavailable(f"{source} is not an IDX file of unsigned bytes (magic {list(magic)}). {fix}")
    return tuple(int(d) for d in np.frombuffer(f.read(4 * magic[3]), dtype=">i4"))


def read_idx_header(path: Path) -> tuple[tuple[int, ...], int]:
    """The shape of an IDX file and the offset where its data starts."""
    with open(path, "rb") as f:
        shape = idx_shape(f, path)
    return shape, 4 + 4 * len(shape)


def checked(data: np.ndarray, shape: tuple[int, ...], source, fix: str = FIX) -> np.ndarray:
    if data.size != np.prod(shape):
        raise MNISTUnavailable(f"{source} holds {data.size} bytes of data, its header says {shape}. {fix}")
    return data.reshape(shape)


def read_idx(path: Path) -> np.ndarray:
    """The whole IDX file as a uint8 array of its shape (checked against the file size)."""
    shape, offset = read_idx_header(path)
    return checked(np.fromfile(path, dtype=np.uint8, offset=offset), shape, path)


def mnist(train: bool = True, transform=None, root: str | Path | None = None):
    """`torchvision.datasets.MNIST`, offline: the classic per-sample (PIL image) dataset."""
    from torchvision.datasets import MNIST

    return MNIST(str(prepare_mnist(root)), train=train, transform=transform, download=False)


@functools.lru_cache(maxsize=2)
def _raw(train: bool, root: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's uint8 images (N, 28, 28) and labels (N,), parsed once per process and never handed out."""
    images, labels = map(read_idx, raw_paths(train, root))
    return images, labels


def _tensors(images: np.ndarray, labels: np.ndarray, device, mean: float = MEAN, std: float = STD):
    """New tensors every call: `.float()` and `.long()` convert uint8, so they copy instead of sharing the cache."""
    x = torch.from_numpy(images).unsqueeze(1).float()  # (N, 1, 28, 28) in [0, 255]
    x.sub_(255 * mean).div_(255 * std)  # (x / 255 - mean) / std, in place on the fresh copy
    return x.to(device), torch.from_numpy(labels).long().to(device)


def mnist_tensors(train: bool = True, device: str | torch.device = "cpu", root: str | Path | None = None):
    """The whole split as normalised tensors `(x: (N,1,28,28) float32, y: (N,) int64)` kept in memory.

    Decoding 60,000 PIL images per epoch is the classic bottleneck; doing it once is the fix (Days 5, 11).
    The files are parsed once per process; each call returns tensors of its own, so editing them in place
    (augmenting, normalising again) cannot change what the next caller gets.
    """
    return _tensors(*_raw(train, str(root or DATA_ROOT)), device)


def mnist_split(val_size: int = 5000, device: str | torch.device = "cpu", train_subset: int | None = None,
                root: str | Path | None = None):
    """`((x_train, y_train), (x_val, y_val))`: the 60,000 training images split by one fixed permutation (seed
    1234), `val_size` of them held out for validation; `train_subset` keeps the first N of the rest. Tune on
    these; the test set (`mnist_tensors(train=False)`) stays for the end."""
    return _split(*_raw(True, str(root or DATA_ROOT)), val_size, device, train_subset)


def _split(images, labels, val_size, device, train_subset=None, mean: float = MEAN, std: float = STD):
    perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    val, train = perm[:val_size], perm[val_size:][:train_subset]
    return _tensors(images[train], labels[train], device, mean, std), _tensors(images[val], labels[val], device, mean, std)


# --- Fashion-MNIST (Day 9's transfer lab): the bundle in data/fashion-mnist/, read in place -----------------------
FASHION_DIR = DATA_ROOT / "fashion-mnist"
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist: the same four files
FASHION_MD5 = {  # of the decompressed files, as for MNIST: Debian recompressed the .gz files Zalando published
    "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
    "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
    "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
    "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
}
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530  # its training-set pixel statistics
FASHION_FIX = "Restore the bundled copy with `git checkout -- data/fashion-mnist` (nothing is downloaded)."


def _fashion_file(folder: Path, name: str) -> np.ndarray:
    gz = folder / f"{name}.gz"
    try:
        content = gzip.decompress(gz.read_bytes())
    except FileNotFoundError:
        raise MNISTUnavailable(f"Fashion-MNIST file {gz} is missing. {FASHION_FIX}") from None
    except (OSError, EOFError, zlib.error) as exc:  # zlib.error: damaged compressed data inside a valid header
        raise MNISTUnavailable(f"Fashion-MNIST file {gz} is corrupt ({exc}). {FASHION_FIX}") from None
    actual = hashlib.md5(content).hexdigest()
    if actual != FASHION_MD5[name]:
        raise MNISTUnavailable(f"Fashion-MNIST file {gz} is corrupt: MD5 of its content is {actual}, expected "
                               f"{FASHION_MD5[name]}. {FASHION_FIX}")
    f = io.BytesIO(content)
    shape = idx_shape(f, gz, FASHION_FIX)
    return checked(np.frombuffer(f.read(), dtype=np.uint8).copy(), shape, gz, FASHION_FIX)  # writable


@functools.lru_cache(maxsize=2)
def _fashion_raw(train: bool, folder: str) -> tuple[np.ndarray, np.ndarray]:
    prefix = "train" if train else "t10k"
    return (_fashion_file(Path(folder), f"{prefix}-images-idx3-ubyte"),
            _fashion_file(Path(folder), f"{prefix}-labels-idx1-ubyte"))


def fashion_available(folder: str | Path) -> bool:
    return all((Path(folder) / f"{name}.gz").exists() for name in FASHION_MD5)


def fashion_folder() -> Path:
    """The bundle, or Debian's package where a checkout lacks the bundle (errors then name the bundle's files)."""
    if not fashion_available(FASHION_DIR) and fashion_available(DEBIAN_FASHION_DIR):
        return DEBIAN_FASHION_DIR
    return FASHION_DIR


def fashion_split(val_size: int = 5000, device: str | torch.device = "cpu", folder: str | Path | None = None):
    """As `mnist_split`, for Fashion-MNIST's 60,000 training images (the same fixed permutation)."""
    return _split(*_fashion_raw(True, str(folder or fashion_folder())), val_size, device, None, FASHION_MEAN,
                  FASHION_STD)


def fashion_tensors(train: bool = False, device: str | torch.device = "cpu", folder: str | Path | None = None):
    """One whole Fashion-MNIST split as normalised tensors; `train=False` is the 10,000 test images."""
    return _tensors(*_fashion_raw(train, str(folder or fashion_folder())), device, FASHION_MEAN, FASHION_STD)
