"""Datasets by config (`data.dataset`), and the sampler that makes resume exact on any number of ranks.

Every dataset answers `batch(epoch, indices) -> (x, y)`: whole micro-batches, so in-memory data is sliced instead
of collated sample by sample, and augmentation can be seeded by (epoch, sample) instead of by the worker. Each one
describes itself (`Splits.info`): `ImageInfo` (channels, size, classes: the `classify` task) or `TextInfo`
(vocabulary, window: the `lm` task).

    mnist          data.root, or the repo's bundle (../data/mnist/*.gz); MD5-checked, never downloaded
    fashion_mnist  data.root, or the repo's bundle (../data/fashion-mnist), or Debian's dataset-fashion-mnist
    synthetic      generated: one random prototype image per class + noise (smoke tests, benchmarks)
    imagefolder    data.root/train/<class>/<image> (+ optional val/ and test/): your own images
    shakespeare    the repo's bundle (../data/shakespeare: 42 works, SHA-256-checked) as bytes; whole works held out
    tokens         data.root/{train,val[,test]}.bin + meta.json|meta.pkl: nanoGPT's token files, memory-mapped

A new dataset is a config table (its own fields, each with a reason) and one function returning `Splits`,
registered together (see `synthetic`):

    @dataclass
    class MyDataTable:
        val_size: int = opt(1000, "training samples held out for validation", ge=1)

    @register("my_data", MyDataTable, task="classify")
    def my_data(cfg, table: MyDataTable, seed: int) -> Splits:   # cfg: the [data] section (root, subset, ...)
        ...

and `[data.my_data]` in a config file (or `--set data.my_data.val_size=500`) sets its fields; a `check(self, cfg)`
method on the table refuses what cannot work before the run starts. text.py holds the text datasets' files and
windows.
"""
import functools
import gzip
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from . import text
from .config import ConfigError, opt

SPLIT_SEED = 1234  # the validation split never changes with the training seed
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
# MD5 of the decompressed IDX files (the .gz bytes differ between mirrors and Debian's recompressed copy).
RAW_MD5 = {
    "mnist": {
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    },
}
STATS = {"mnist": (0.1307, 0.3081), "fashion_mnist": (0.2860, 0.3530)}  # training-set pixel mean, std
SEARCH = {"mnist": [text.REPO_DATA / "mnist"],  # the repo's bundles, when the template sits in the repo
          "fashion_mnist": [text.REPO_DATA / "fashion-mnist",
                            Path("/usr/share/datasets/fashion-mnist")]}  # Debian's dataset-fashion-mnist
TORCHVISION = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}  # torchvision's folder names: root/NAME/raw


class DataError(RuntimeError):
    """The data cannot be found or read; the message says where it looked and what to do."""


@dataclass
class ImageInfo:
    channels: int
    size: int
    num_classes: int


@dataclass
class TextInfo:
    vocab_size: int
    block_size: int  # tokens per window
    bytes_per_token: torch.Tensor | None = None  # (vocab_size,) UTF-8 bytes of each token id: bits per byte
    vocab: str | None = None  # the vocabulary's fingerprint (text.vocab_fingerprint): sample.py refuses another one


def info_from(saved: dict):
    """The ImageInfo / TextInfo a checkpoint recorded (its "info": the task's name and the fields)."""
    kind = {"classify": ImageInfo, "lm": TextInfo}[saved["task"]]
    return kind(**{k: v for k, v in saved.items() if k != "task"})


@dataclass
class Splits:
    train: "BatchData"
    val: "BatchData"
    test: "BatchData | None"
    info: ImageInfo | TextInfo


@dataclass(frozen=True)
class Registered:
    build: Callable  # (the [data] section, the dataset's table, the run's seed) -> Splits
    table: type  # the dataclass of the dataset's own fields: [data.<name>]
    task: str  # what its samples teach: a name in tasks.TASKS


DATASETS: dict[str, Registered] = {}


def register(name: str, table: type, task: str):
    """Decorator: `build` becomes dataset `name` (`data.dataset = "name"`), configured by `[data.<name>]` (fields of
    `table`)."""
    def add(build: Callable) -> Callable:
        DATASETS[name] = Registered(build, table, task)
        return build
    return add


# Fields that several datasets' tables declare (a dataclass field cannot be shared, so each table gets its own).
def val_size_opt():
    return opt(5000, "training images held out for validation (model selection, early stopping), never the test "
               "set", ge=1)


def image_size_opt():
    return opt(28, "square side length of the images (resized to it)", gt=0)


def channels_opt():
    return opt(1, "1 = grayscale, 3 = RGB", choices=(1, 3))


class BatchData:
    """Interface: `len(ds)` samples, `ds.batch(epoch, indices) -> (x float32 (B,C,H,W), y int64 (B,))`, and what a
    resume checks is unchanged, `ds.content()` (see `fingerprint`)."""
    sampling = "permutation"  # how training draws it (ResumableSampler): each epoch a permutation of the samples

    def __len__(self) -> int:
        raise NotImplementedError

    def batch(self, epoch: int, indices: torch.Tensor):
        raise NotImplementedError

    def content(self) -> list:
        """Tensors, arrays or bytes that change when the samples do; [] (this default): only the size is compared."""
        return []


class TensorData(BatchData):
    """Images held in memory, normalised per batch (uint8 pixels; float images are used as they are): slicing a
    tensor beats a per-sample Dataset ~10x."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, mean: float = 0.0, std: float = 1.0):
        self.x, self.y, self.mean, self.std = x, y, mean, std

    def __len__(self) -> int:
        return len(self.y)

    def content(self) -> list:
        return [self.x, self.y]

    def batch(self, epoch, indices):
        x = self.x[indices]
        if x.dtype == torch.uint8:  # (x / 255 - mean) / std, in two in-place passes
            x = x.float().mul_(1 / (255 * self.std)).sub_(self.mean / self.std)
        return x, self.y[indices]


# -- MNIST-format files ------------------------------------------------------------------------------------------
def read_idx(path: Path, expected_md5: str) -> np.ndarray:
    """An IDX file (optionally .gz) as an array, after checking the MD5 of its decompressed bytes."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if hashlib.md5(raw).hexdigest() != expected_md5:
        raise DataError(f"{path} is corrupt (MD5 of its content is not {expected_md5}): restore it (in the repo: "
                        f"`git checkout -- data`) or replace it with an intact copy")
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def find_idx(name: str, root: str) -> Path:
    """The folder holding the four IDX files: data.root (or its torchvision layout NAME/raw), then the known places.
    Nothing is downloaded."""
    places = [Path(root), Path(root) / TORCHVISION[name] / "raw"] if root else []
    places += SEARCH[name]
    for folder in places:
        if all((folder / f).exists() or (folder / f"{f}.gz").exists() for f in IDX_FILES):
            return folder
    looked = ", ".join(str(p) for p in places)
    raise DataError(f"{name} not found (looked in {looked}; nothing is downloaded): put the four *-ubyte[.gz] files "
                    f"in a folder and set data.root to it")


@functools.lru_cache(maxsize=4)
def load_idx(name: str, root: str):
    folder = find_idx(name, root)
    arrays = []
    for f in IDX_FILES:
        path = folder / f if (folder / f).exists() else folder / f"{f}.gz"
        arrays.append(torch.from_numpy(read_idx(path, RAW_MD5[name][f]).copy()))
    x_train, y_train, x_test, y_test = arrays
    return x_train.unsqueeze(1), y_train.long(), x_test.unsqueeze(1), y_test.long()


def split_val(n: int, val_size: int, dataset: str) -> tuple[torch.Tensor, torch.Tensor]:
    if val_size >= n:
        raise DataError(f"data.{dataset}.val_size={val_size} leaves no training images out of {n}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    return perm[val_size:], perm[:val_size]


def subset(indices: torch.Tensor, n: int) -> torch.Tensor:
    return indices[:n] if n else indices


@dataclass
class IdxTable:
    val_size: int = val_size_opt()


@register("mnist", IdxTable, task="classify")
@register("fashion_mnist", IdxTable, task="classify")
def idx_dataset(cfg, table: IdxTable, seed: int) -> Splits:
    x, y, x_test, y_test = load_idx(cfg.dataset, cfg.root)
    mean, std = STATS[cfg.dataset]
    train, val = split_val(len(y), table.val_size, cfg.dataset)
    train = subset(train, cfg.subset)
    return Splits(TensorData(x[train], y[train], mean, std), TensorData(x[val], y[val], mean, std),
                  TensorData(x_test, y_test, mean, std), ImageInfo(1, 28, 10))


@dataclass
class SyntheticTable:
    size: int = opt(8192, "generated training images (class prototypes + noise)", gt=0)
    val_size: int = val_size_opt()
    image_size: int = image_size_opt()
    channels: int = channels_opt()


@register("synthetic", SyntheticTable, task="classify")
def synthetic(cfg, table: SyntheticTable, seed: int) -> Splits:
    """Ten random prototype images and noisy copies of them: learnable in a few hundred steps, no files needed."""
    g = torch.Generator().manual_seed(SPLIT_SEED)  # the same data whatever the training seed
    shape = (table.channels, table.image_size, table.image_size)
    protos = torch.rand(10, *shape, generator=g) * 2 - 1

    def make(n):
        y = torch.randint(0, 10, (n,), generator=g)
        return TensorData(protos[y] + 5.0 * torch.randn(n, *shape, generator=g), y)

    train = make(cfg.subset or table.size)
    return Splits(train, make(table.val_size), make(table.val_size), ImageInfo(table.channels, table.image_size, 10))


# -- your own images ---------------------------------------------------------------------------------------------
class ImageFolderData(BatchData):
    """root/<class>/<image>: decoded, resized and normalised per sample (in DataLoader workers when num_workers > 0).
    Augmentation draws from a generator seeded by (seed, epoch, index): the same crop whatever the worker or resume."""

    def __init__(self, files: list[Path], labels: list[int], table: "ImageFolderTable", seed: int, train: bool):
        from torchvision.transforms import v2  # only image folders need torchvision

        self.files, self.y, self.seed = files, torch.tensor(labels), seed
        self.mode = "L" if table.channels == 1 else "RGB"  # PIL's grayscale and colour modes
        size = (table.image_size, table.image_size)
        resize = v2.RandomResizedCrop(size, scale=(0.7, 1.0)) if table.augment and train else v2.Resize(size)
        self.transform = v2.Compose([v2.ToImage(), resize, v2.ToDtype(torch.float32, scale=True),
                                     v2.Normalize([0.5] * table.channels, [0.5] * table.channels)])
        self.augment = table.augment and train

    def __len__(self) -> int:
        return len(self.files)

    def content(self) -> list:
        """Each image's class and name, and the bytes of up to SAMPLED_FILES images spread over the list: a folder
        rewritten or replaced changes them; a few edited images may not (reading every file of a large folder at
        each launch would cost minutes)."""
        names = "\n".join(f"{label}\t{f.parent.name}/{f.name}" for f, label in zip(self.files, self.y.tolist()))
        picks = np.unique(np.linspace(0, len(self.files) - 1, min(SAMPLED_FILES, len(self.files))).astype(np.int64))
        return [names.encode(), *(self.files[i].read_bytes() for i in picks)]

    def load(self, i: int):
        from PIL import Image

        try:
            with Image.open(self.files[i]) as img:
                return img.convert(self.mode)
        except Exception as exc:
            raise DataError(f"cannot decode image {self.files[i]}: {exc}") from None

    def batch(self, epoch, indices):
        xs = []
        for i in indices.tolist():
            if self.augment:
                with torch.random.fork_rng(devices=[]):  # the global RNG (dropout) is left untouched
                    torch.manual_seed(self.seed * 1_000_003 + epoch * 100_003 + i)
                    xs.append(self.transform(self.load(i)))
            else:
                xs.append(self.transform(self.load(i)))
        return torch.stack(xs), self.y[indices]


SAMPLED_FILES = 256  # images whose bytes an image folder's fingerprint reads
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp"}


def list_images(folder: Path, classes: list[str] | None = None):
    found = sorted(d.name for d in folder.iterdir() if d.is_dir()) if classes is None else classes
    files, labels = [], []
    for label, name in enumerate(found):
        for f in sorted((folder / name).iterdir()) if (folder / name).is_dir() else []:
            if f.suffix.lower() in IMAGE_SUFFIXES:
                files.append(f)
                labels.append(label)
    return found, files, labels


@dataclass
class ImageFolderTable:
    val_size: int = opt(5000, "training images held out for validation when there is no val/ folder (model "
                        "selection, early stopping), never the test set", ge=1)
    image_size: int = image_size_opt()
    channels: int = channels_opt()
    augment: bool = opt(False, "random resized crops of the training images, seeded per (epoch, sample) so resume "
                        "stays exact")

    def check(self, cfg) -> None:
        if not cfg.data.root:
            raise ConfigError("data.root: imagefolder needs the folder holding train/<class>/<image> files")


@register("imagefolder", ImageFolderTable, task="classify")
def imagefolder(cfg, table: ImageFolderTable, seed: int) -> Splits:
    root = Path(cfg.root)
    if not (root / "train").is_dir():
        raise DataError(f"data.root={root} has no train/ folder: expected {root}/train/<class>/<image> (and "
                        f"optionally val/ and test/)")
    classes, files, labels = list_images(root / "train")
    if len(classes) < 2 or not files:
        raise DataError(f"{root}/train needs at least two class folders with images; found {classes}")

    def part(folder: Path, train=False):
        if not folder.is_dir():
            return None
        _, f, lab = list_images(folder, classes)
        return ImageFolderData(f, lab, table, seed, train)

    val = part(root / "val")
    if val is None:  # no val/ folder: carve it out of train/
        keep, held = split_val(len(files), table.val_size, cfg.dataset)
        keep = subset(keep, cfg.subset)
        val = ImageFolderData([files[i] for i in held], [labels[i] for i in held], table, seed, False)
        files, labels = [files[i] for i in keep], [labels[i] for i in keep]
    elif cfg.subset:
        files, labels = files[:cfg.subset], labels[:cfg.subset]
    train = ImageFolderData(files, labels, table, seed, True)
    return Splits(train, val, part(root / "test"), ImageInfo(table.channels, table.image_size, len(classes)))


# -- text: bytes of the bundled Shakespeare, or any tokenizer's ids in nanoGPT's files (text.py) ----------------------
@dataclass
class TextTable:
    block_size: int = opt(64, "tokens per training window (the context the model learns from)", gt=0)
    eval_windows: int = opt(256, "windows per evaluation, evenly spaced over the split, the same each time; 0 = "
                            "every non-overlapping window", ge=0)


@dataclass
class TokensTable(TextTable):
    def check(self, cfg) -> None:
        if not cfg.data.root:
            raise ConfigError("data.root: tokens needs the folder holding train.bin, val.bin and meta.json/meta.pkl")


def text_splits(read: Callable, cfg, table: TextTable) -> Splits:
    try:
        s = read(cfg.root, table.block_size, table.eval_windows, cfg.subset)
    except text.TextDataError as exc:
        raise DataError(str(exc)) from None
    return Splits(s.train, s.val, s.test, TextInfo(s.vocab_size, s.block_size, s.bytes_per_token, s.vocab))


def kept_vocabulary(cfg) -> dict[str, str]:
    """What a run folder keeps to decode its samples without the data (sample.py): a tokens folder's vocabulary, as
    files {name: text} (text.vocabulary_files); none for other datasets (bytes need none, images no decoding)."""
    return text.vocabulary_files(cfg.root) if cfg.dataset == "tokens" else {}


@register("shakespeare", TextTable, task="lm")
def shakespeare(cfg, table: TextTable, seed: int) -> Splits:
    return text_splits(text.shakespeare, cfg, table)


@register("tokens", TokensTable, task="lm")
def tokens(cfg, table: TokensTable, seed: int) -> Splits:
    return text_splits(text.tokens, cfg, table)


def build(cfg, seed: int) -> Splits:
    """The train/val/test splits named by `cfg.dataset` (the [data] section), built from its table; DataError if the
    files are missing or broken."""
    splits = DATASETS[cfg.dataset].build(cfg, cfg.table, seed)
    if len(splits.val) == 0:
        raise DataError(f"the validation split of {cfg.dataset} is empty")
    return splits


# -- what a resume checks: the data is the checkpoint's ----------------------------------------------------------
WHOLE, BLOCKS, BLOCK = 64 << 20, 256, 256 << 10  # parts up to 64 MiB are hashed whole; larger: 256 blocks of 256 KiB


def digest(parts: list) -> str:
    """SHA-256 over the parts' bytes (tensors, arrays, bytes) and sizes. A part up to 64 MiB is hashed whole (at
    ~1.7 GB/s on a 2-core EPYC: the bundled Shakespeare's splits in 6 ms, MNIST's in 31 ms); a larger one, a token
    file of billions, by 256 blocks of 256 KiB spread evenly over it (64 MiB read: 38 ms from the page cache, more
    from a cold disk): a rewrite, a reordering or another file changes them; a few edited tokens between the blocks
    may not."""
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, torch.Tensor):
            part = part.contiguous().numpy()
        raw = np.frombuffer(part, np.uint8) if isinstance(part, bytes) else np.ascontiguousarray(part).reshape(-1)
        raw = raw.view(np.uint8)
        h.update(f"{raw.nbytes};".encode())
        if raw.nbytes <= WHOLE:
            h.update(raw)
            continue
        for start in np.linspace(0, raw.nbytes - BLOCK, BLOCKS).astype(np.int64):
            h.update(raw[start:start + BLOCK])
    return h.hexdigest()


def fingerprint(splits: Splits) -> dict:
    """{split: {"samples": n, "sha256": digest of its content()}}: what every checkpoint records of its data."""
    return {name: {"samples": len(split), "sha256": digest(split.content())}
            for name in ("train", "val", "test") if (split := getattr(splits, name)) is not None}


def changes(saved: dict, now: dict) -> dict[str, str]:
    """{split: how it differs from the one a checkpoint recorded (`fingerprint`s), in words}; {} if none does."""
    out = {}
    for name in ("train", "val", "test"):
        was, new = saved.get(name), now.get(name)
        if was == new:
            continue
        if was is None or new is None:
            out[name] = f"the {name} split {'appeared' if was is None else 'is gone'}"
        elif was["samples"] != new["samples"]:
            out[name] = f"the {name} split has {new['samples']:,} samples, the checkpoint's had {was['samples']:,}"
        else:
            out[name] = (f"the {name} split's content changed (the same {new['samples']:,} samples, SHA-256 "
                         f"{was['sha256'][:12]} -> {new['sha256'][:12]})")
    return out


SIZES = ("vocab_size", "num_classes")  # set by the data's files, not the config: a new data.root may change them


def size_changes(info, cfg, saved: dict, saved_root: str) -> str:
    """How this data's vocabulary or classes (`info`, read per `cfg`) differ from those a checkpoint recorded
    (`saved`: its info, from data.root `saved_root`), naming where each was read; '' if they do not."""
    source = text.meta_path(Path(cfg.root)) if cfg.dataset == "tokens" else f"data.root={cfg.root}"
    return "; ".join(f"this run's data has {name} {getattr(info, name)} ({source}), the checkpoint's had "
                     f"{saved[name]} (data.root={saved_root}): point data.root at data with {name} {saved[name]}"
                     for name in SIZES if name in saved and getattr(info, name, saved[name]) != saved[name])


# -- feeding ranks ---------------------------------------------------------------------------------------------
class Keyed(Dataset):
    """Adapts a BatchData to DataLoader: each "item" is a whole micro-batch, fetched by its (epoch, indices) key."""

    def __init__(self, data: BatchData):
        self.data = data

    def __getitem__(self, key):
        return self.data.batch(*key)


class ResumableSampler(Sampler):
    """Micro-batch keys for one rank, as an endless stream of epochs. Epoch e's order comes from Generator(seed + e),
    never the global RNG: a permutation of the n samples (a dataset whose `sampling` is "permutation": images), or,
    with `draws`=K, K optimizer steps' worth of window starts drawn at random from the n possible ones (text: an
    "epoch" is then a chunk of K steps; K is fixed when the run starts and kept in its state, so the run's evaluation
    cadence may change on resume). Optimizer step s of an epoch uses order[s*B : (s+1)*B] (B = global batch)
    whatever the world size: each of its grad_accum micro-slots holds world x micro samples, and rank r takes its
    contiguous share. The whole state is (epoch, position): the loop advances `position` by B after each optimizer
    step (the next epoch starts after the last one), so prefetching cannot skip or replay a sample, and a checkpoint
    from 2 ranks resumes on 1 (or 8) at the same sample. A resume on new data (checkpoint.accept_new_data) keeps its
    epoch and position, over the new samples."""

    def __init__(self, n: int, batch_size: int, micro: int, rank: int, world: int, seed: int, draws: int = 0):
        self.n, self.batch_size, self.micro, self.rank, self.world, self.seed = n, batch_size, micro, rank, world, seed
        self.draws = draws
        # Images: the last partial global batch is dropped (another one each epoch).
        self.steps_per_epoch = draws or n // batch_size
        self.epoch, self.position = 0, 0

    def order(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed + epoch)
        if self.draws:
            return torch.randint(self.n, (self.draws * self.batch_size,), generator=g)
        return torch.randperm(self.n, generator=g)

    def __iter__(self):
        """From the current (epoch, position) on, epoch after epoch: the loop stops taking when it has enough."""
        slot, start, epoch = self.micro * self.world, self.position, self.epoch
        while True:
            order = self.order(epoch)
            for begin in range(start, self.steps_per_epoch * self.batch_size, slot):
                yield epoch, order[begin + self.rank * self.micro:begin + (self.rank + 1) * self.micro]
            start, epoch = 0, epoch + 1

    def advance(self) -> None:
        """One optimizer step's samples are used: the next step's come next (the next epoch's, after the last)."""
        self.position += self.batch_size
        if self.position >= self.steps_per_epoch * self.batch_size:
            self.epoch, self.position = self.epoch + 1, 0

    def last_epoch(self) -> int:
        """The epoch the last step's samples came from."""
        return self.epoch - 1 if self.position == 0 else self.epoch

    def state_dict(self) -> dict:
        return {"n": self.n, "batch_size": self.batch_size, "seed": self.seed, "draws": self.draws,
                "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if state["batch_size"] != self.batch_size:
            raise ValueError(f"the checkpoint's sampler drew batches of {state['batch_size']}, not {self.batch_size}")
        if self.draws:  # text: the run's chunk of windows, whatever train.eval_every says now
            self.draws = self.steps_per_epoch = state["draws"]
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        if self.position >= self.steps_per_epoch * self.batch_size:  # fewer new images: that epoch has ended
            self.epoch, self.position = self.epoch + 1, 0


def eval_keys(n: int, batch: int, rank: int, world: int) -> tuple[list, list[float]]:
    """This rank's share of an evaluation set as (keys, weights). Every rank gets the same number of batches (FSDP
    ranks must run the same forwards); a rank with fewer samples repeats one with weight 0."""
    shard = torch.arange(rank, n, world)
    count = math.ceil(math.ceil(n / world) / batch)
    keys = [(-1, shard[i * batch:(i + 1) * batch]) for i in range(count)]
    weights = [1.0 if len(k[1]) else 0.0 for k in keys]
    return [(e, idx if len(idx) else torch.arange(1)) for e, idx in keys], weights


def eval_loaders(splits: Splits, batch: int, rank: int, world: int, num_workers: int, pin: bool) -> dict:
    """{"val": (loader, weights), "test": ...}: this rank's share of each evaluation split."""
    out = {}
    for name in ("val", "test"):
        if getattr(splits, name) is not None:
            keys, weights = eval_keys(len(getattr(splits, name)), batch, rank, world)
            out[name] = (loader(getattr(splits, name), keys, num_workers, pin), weights)
    return out


def _quiet_worker(_):
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the trainer handles it


def loader(data: BatchData, sampler, num_workers: int, pin_memory: bool) -> DataLoader:
    """A DataLoader over micro-batch keys. Its private generator keeps worker seeding off the global RNG, which
    would otherwise shift every later dropout mask of a resumed run."""
    return DataLoader(Keyed(data), batch_size=None, sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory, persistent_workers=num_workers > 0, worker_init_fn=_quiet_worker,
                      generator=torch.Generator().manual_seed(0))
