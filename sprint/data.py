"""Offline MNIST.

The four original IDX files ship gzipped in `data/mnist/`. `prepare_mnist()` decompresses them into
`<root>/MNIST/raw/`, exactly where `torchvision.datasets.MNIST(root)` looks, and checks each file's MD5.
Without the bundle it falls back to torchvision's download; if that fails too, or a file is corrupt, it
raises `MNISTUnavailable` with one message that names the file and says what to do.
"""
import functools
import gzip
import hashlib
import os
import shutil
from pathlib import Path

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


def prepare_mnist(root: str | Path = DATA_ROOT, bundle: str | Path = BUNDLE_DIR) -> Path:
    """Make `<root>/MNIST/raw/` hold the four verified files; return `root` for torchvision."""
    root, bundle = Path(root), Path(bundle)
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


def mnist(train: bool = True, transform=None, root: str | Path = DATA_ROOT):
    """`torchvision.datasets.MNIST`, offline: the classic per-sample (PIL image) dataset."""
    from torchvision.datasets import MNIST

    return MNIST(str(prepare_mnist(root)), train=train, transform=transform, download=False)


@functools.lru_cache(maxsize=2)
def _cpu_tensors(train: bool, root: str) -> tuple[torch.Tensor, torch.Tensor]:
    ds = mnist(train=train, root=root)
    x = ((ds.data.float() / 255.0 - MEAN) / STD).unsqueeze(1)  # (N, 1, 28, 28), normalised once
    return x, ds.targets.clone()


def mnist_tensors(train: bool = True, device: str | torch.device = "cpu", root: str | Path = DATA_ROOT):
    """The whole split as normalised tensors `(x: (N,1,28,28) float32, y: (N,) int64)` kept in memory.

    Decoding 60,000 PIL images per epoch is the classic bottleneck; doing it once is the fix (Days 5, 11).
    """
    x, y = _cpu_tensors(train, str(root))
    return x.to(device), y.to(device)


SPLIT_SEED = 1234  # the validation images never change, whatever the training seed


def mnist_split(val_size: int = 5000, device: str | torch.device = "cpu", seed: int = SPLIT_SEED):
    """MNIST's 60,000 training images split once into `((x_train, y_train), (x_val, y_val))` (copies): tune on the
    validation images, keep the test set for one final score. The same images as Day 6's `split_mnist`."""
    x, y = mnist_tensors(train=True, device=device)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed)).to(x.device)
    val, train = perm[:val_size], perm[val_size:]
    return (x[train], y[train]), (x[val], y[val])
