"""Offline MNIST.

The four original IDX files ship gzipped in `data/mnist/`. `prepare_mnist()` decompresses them into
`<root>/MNIST/raw/`, exactly where `torchvision.datasets.MNIST(root)` looks, and checks each file's MD5.
Without the bundle it falls back to torchvision's download; if that fails too, or a file is corrupt, it
raises `MNISTUnavailable` with one message that names the file and says what to do.

`mnist_tensors()` parses the IDX files with NumPy (no torchvision import: it costs seconds at start-up);
`mnist()` is torchvision's per-sample dataset, for pipelines that decode one image at a time (Day 5).
"""
import functools
import gzip
import hashlib
import os
import shutil
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

FIX = (
    "Restore the bundled copy with `git checkout -- data/mnist`, or delete the broken file "
    "(and any copy under data/MNIST/raw/) so that torchvision can download it when you are online."
)


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


def _download(root: Path) -> None:
    from torchvision.datasets import MNIST

    try:
        MNIST(str(root), train=True, download=True)
    except Exception as exc:  # any network/HTTP/IO failure ends in the same advice
        raise MNISTUnavailable(
            f"MNIST is not available: the bundled copy {BUNDLE_DIR} is missing and the download failed "
            f"({type(exc).__name__}: {exc}). Restore the bundle with `git checkout -- data/mnist` "
            f"(or copy the four *-ubyte.gz files there), or run once with internet access."
        ) from None


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
        if gz.exists():
            _extract(gz, target)
        else:
            _download(root)
        if not target.exists():
            raise MNISTUnavailable(f"MNIST file {target} is missing after preparation. {FIX}")
        actual = md5sum(target)
        if actual != expected:
            source = gz if gz.exists() else target
            target.unlink()  # never hand a wrong file to torchvision
            raise MNISTUnavailable(
                f"MNIST file {source} is corrupt: MD5 of its content is {actual}, expected {expected}. {FIX}"
            )
    return root


def raw_paths(train: bool = True, root: str | Path | None = None) -> tuple[Path, Path]:
    """(images, labels): the verified, decompressed IDX files of one split."""
    raw = prepare_mnist(root) / "MNIST" / "raw"
    prefix = "train" if train else "t10k"
    return raw / f"{prefix}-images-idx3-ubyte", raw / f"{prefix}-labels-idx1-ubyte"


def read_idx_header(path: Path) -> tuple[tuple[int, ...], int]:
    """IDX format: 2 zero bytes, a type code (0x08 = uint8), the number of dims, then each dim as a big-endian int32.

    Returns the shape and the offset where the data starts."""
    with open(path, "rb") as f:
        magic = f.read(4)
        if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] != 0x08:
            raise MNISTUnavailable(f"{path} is not an IDX file of unsigned bytes (magic {list(magic)}). {FIX}")
        shape = tuple(int(d) for d in np.frombuffer(f.read(4 * magic[3]), dtype=">i4"))
    return shape, 4 + 4 * len(shape)


def read_idx(path: Path) -> np.ndarray:
    """The whole IDX file as a uint8 array of its shape (checked against the file size)."""
    shape, offset = read_idx_header(path)
    data = np.fromfile(path, dtype=np.uint8, offset=offset)
    if data.size != np.prod(shape):
        raise MNISTUnavailable(f"{path} holds {data.size} bytes of data, its header says {shape}. {FIX}")
    return data.reshape(shape)


def mnist(train: bool = True, transform=None, root: str | Path | None = None):
    """`torchvision.datasets.MNIST`, offline: the classic per-sample (PIL image) dataset."""
    from torchvision.datasets import MNIST

    return MNIST(str(prepare_mnist(root)), train=train, transform=transform, download=False)


@functools.lru_cache(maxsize=2)
def _raw(train: bool, root: str) -> tuple[np.ndarray, np.ndarray]:
    """The split's uint8 images (N, 28, 28) and labels (N,), parsed once per process and never handed out."""
    images, labels = map(read_idx, raw_paths(train, root))
    return images, labels


def _tensors(images: np.ndarray, labels: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor]:
    """New tensors every call: `.float()` and `.long()` convert uint8, so they copy instead of sharing the cache."""
    x = torch.from_numpy(images).unsqueeze(1).float()  # (N, 1, 28, 28) in [0, 255]
    x.sub_(255 * MEAN).div_(255 * STD)  # (x / 255 - MEAN) / STD, in place on the fresh copy
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
    images, labels = _raw(True, str(root or DATA_ROOT))
    perm = torch.randperm(len(images), generator=torch.Generator().manual_seed(SPLIT_SEED)).numpy()
    val, train = perm[:val_size], perm[val_size:][:train_subset]
    return _tensors(images[train], labels[train], device), _tensors(images[val], labels[val], device)
