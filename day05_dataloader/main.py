"""Day 5 — Dataset, DataLoader and augmentation: the data side of the loop is a producer–consumer pipeline.

A map-style `Dataset` that reads the raw MNIST IDX files itself (one image per `__getitem__`), random-affine
augmentation (torchvision transforms v2) running inside the worker processes, a `DataLoader` with the knobs that
matter (`num_workers`, `pin_memory`, `persistent_workers`, `prefetch_factor`, `drop_last`, seeded `generator` and
`worker_init_fn`), a padding `collate_fn` for variable-length items, and one epoch timed for num_workers = 0, 2, 4.

Run:    python day05_dataloader/main.py     (writes runs/day05_dataloader/: the timing table, its chart, timing.json)
        python day05_dataloader/main.py --smoke --workers 2 --start-method spawn   (small sizes; the macOS/Windows way)
Gates:  python day05_dataloader/check.py
"""
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import numpy as np
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Subset, default_collate, get_worker_info
from torchvision.transforms import v2

from day04_mlp_mnist.main import MLP
from day05_dataloader.report import augmentation_report, demos_table, interpret, plot_augmentations, write_timing
from sprint import runs_dir, write_results
from sprint.cli import arg, parse, progress, run, validate
from sprint.data import MEAN, SIZES, STD, raw_paths, read_idx, read_idx_header
from sprint.device import pick_device
from sprint.measure import median_seconds

# Per sample, in the workers: a small random affine (rotate ±10°, shift ±2 px, scale ±10%) on the uint8 image.
# Digits stay digits, and the model sees new pixels every epoch.
AUGMENT = v2.RandomAffine(degrees=10, translate=(0.08, 0.08), scale=(0.9, 1.1))


def to_input(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Per batch, on the device: uint8 -> normalised float32 (the statistics of sprint.data.mnist_tensors). Cheap
    element-wise work runs once per batch, not per sample; uint8 batches are also 4x smaller to pass around."""
    return (images.to(device, non_blocking=True).float() / 255 - MEAN) / STD


# --- 1. The Dataset: a reader of single records ------------------------------------------------------------------
class MNISTFiles(Dataset):
    """Map-style Dataset over the raw IDX files: `__len__` + `__getitem__(i)` -> {"image", "label", "index"}.
    The parent keeps paths, shapes and the 60 KB of labels; the 47 MB of pixels are memory-mapped lazily by
    whichever process calls `__getitem__` first, so each worker opens its own view of the file."""

    def __init__(self, train: bool = True, transform=None, root: str | Path | None = None):
        self.images_path, labels_path = raw_paths(train, root)  # the decompressed, MD5-checked files
        self.shape, self.offset = read_idx_header(self.images_path)  # (N, 28, 28), 16: IDX = header + raw bytes
        self.labels = read_idx(labels_path)
        if len(self.labels) != self.shape[0]:
            raise ValueError(f"{self.images_path.name} has {self.shape[0]} images but {labels_path.name} "
                             f"has {len(self.labels)} labels")
        self.transform = transform
        self._pixels = None  # opened on first use, in the process that uses it

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def pixels(self) -> np.ndarray:
        """Every image, (N, 28, 28) uint8, memory-mapped on first use in this process."""
        if self._pixels is None:
            self._pixels = np.memmap(self.images_path, np.uint8, "r", offset=self.offset, shape=self.shape)
        return self._pixels

    def __getitem__(self, i: int) -> dict:
        image = torch.from_numpy(np.array(self.pixels[i]))[None]  # copy 784 bytes out: (1, 28, 28) uint8
        if self.transform is not None:
            image = self.transform(image)
        return {"image": image, "label": int(self.labels[i]), "index": i}

    def __getstate__(self):  # what a spawned worker is sent: never the mapped file itself
        return {**self.__dict__, "_pixels": None}


# --- 2. The DataLoader: sampler -> workers (__getitem__ + collate) -> queue -> training loop ------------------------
def seed_worker(worker_id: int) -> None:
    """Seed NumPy and `random` from the worker's torch seed (= the loader's base seed + worker_id): recent torch
    does it too; the documented recipe covers any library with its own RNG (forked workers share NumPy's state)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def make_loader(dataset, batch_size: int = 256, shuffle: bool = True, num_workers: int = 0, seed: int = 0,
                collate_fn=None, drop_last: bool = False, start_method: str | None = None) -> DataLoader:
    workers = num_workers > 0
    return DataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, collate_fn=collate_fn,
        drop_last=drop_last,  # True for training with BatchNorm: no tiny, noisy last batch
        pin_memory=torch.cuda.is_available(),  # page-locked host buffers make .to("cuda", non_blocking=True) async
        persistent_workers=workers,  # keep worker processes alive between epochs (no restart cost per epoch)
        prefetch_factor=4 if workers else None,  # batches each worker prepares ahead of the training loop
        generator=torch.Generator().manual_seed(seed),  # drives the shuffle order and every worker's base seed
        worker_init_fn=seed_worker,
        multiprocessing_context=start_method if workers else None,  # "spawn" is the default on macOS/Windows
    )


def collate_with_worker(batch: list[dict]) -> dict:
    """default_collate plus the id of the worker that built the batch (collate_fn runs inside the worker)."""
    out = default_collate(batch)
    info = get_worker_info()
    out["worker"] = info.id if info else -1
    return out


# --- 3. Variable-length items need their own collate_fn ----------------------------------------------------------
SENTENCES = ["the loss went down", "eval mode", "workers feed the loop", "pad me", "GELU", "no softmax in forward"]


def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode()), dtype=torch.long)  # byte codes 32..126: 0 stays free for padding


def pad_collate(batch: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack sequences of different lengths into (B, max_len), padded with `pad_id`, plus their true lengths."""
    lengths = torch.tensor([len(seq) for seq in batch])
    return pad_sequence(batch, batch_first=True, padding_value=pad_id), lengths


def collate_demo(batch_size: int = 3) -> dict:
    items = [encode(s) for s in SENTENCES]
    try:
        default_collate(items[:batch_size])
        error = None
    except RuntimeError as exc:  # torch.stack refuses tensors of different sizes
        error = f"{type(exc).__name__}: {exc}"
    loader = DataLoader(items, batch_size=batch_size, collate_fn=pad_collate)  # shuffle off: a readable demo
    return {"items": items, "default_collate_error": error, "batches": list(loader)}


# --- 4. Seeded augmentation in workers ---------------------------------------------------------------------------
def augmentation_batches(seed: int = 0, num_workers: int = 2, copies: int = 8, start_method: str | None = None):
    """Augment training image 0 `copies` times; batch k comes from worker k % num_workers (round-robin)."""
    same_image = Subset(MNISTFiles(train=True, transform=AUGMENT), [0] * copies)
    loader = make_loader(same_image, batch_size=copies // num_workers, shuffle=False, num_workers=num_workers,
                         seed=seed, collate_fn=collate_with_worker, start_method=start_method)
    return [(batch["worker"], batch["image"]) for batch in loader]


# --- 5. Timing: one epoch per num_workers, data alone vs data + training -----------------------------------------
def run_epoch(loader: DataLoader, step=None, device: torch.device | None = None, desc: str = "epoch") -> dict:
    """Iterate one epoch (training with `step(x, y)` if given); returns wall time, samples/s, order and visits."""
    t0 = time.perf_counter()
    first_batch_s, seen = None, []
    for batch in progress(loader, desc=desc, unit="batch"):
        if first_batch_s is None:
            first_batch_s = time.perf_counter() - t0  # includes starting the workers on a fresh loader
        if step is not None:
            step(to_input(batch["image"], device), batch["label"].to(device, non_blocking=True))
        seen.append(batch["index"])
    seconds = time.perf_counter() - t0
    order = torch.cat(seen)  # dataset indices in the order the loader delivered them
    visits = torch.bincount(order, minlength=len(loader.dataset))
    return {"seconds": seconds, "first_batch_s": first_batch_s, "samples": len(order),
            "samples_per_s": len(order) / seconds, "order": order, "visits": visits}


def make_train_step(seed: int, device: torch.device):
    """The consumer: Day 4's MLP trained with AdamW, one step per batch."""
    torch.manual_seed(seed)
    model = MLP().to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = criterion(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def model_only_throughput(files: MNISTFiles, samples: int, batch_size: int, seed: int, device: torch.device) -> float:
    """Samples/s of the training step alone, on normalised batches already in memory: no loader can beat it.
    The rate is steady, so at most 8,192 samples are timed: the median of 3 passes after one warm-up pass."""
    samples = min(samples, 8192)
    x = to_input(torch.from_numpy(np.array(files.pixels[:samples]))[:, None], device)
    y = torch.from_numpy(files.labels[:samples].astype(np.int64)).to(device)
    step = make_train_step(seed, device)

    def one_pass():
        for i in range(0, samples, batch_size):
            step(x[i:i + batch_size], y[i:i + batch_size])

    return samples / median_seconds(one_pass, repeat=3, warmup=1)


def time_workers(worker_counts=(0, 2, 4), samples: int = 60_000, batch_size: int = 256, seed: int = 0,
                 start_method: str | None = None, device: str | None = None, log=print) -> dict:
    """For each num_workers: a data-only epoch (workers start here), then a training epoch on the same loader."""
    device = pick_device(device)
    files = MNISTFiles(train=True, transform=AUGMENT)
    dataset = Subset(files, range(samples))
    rows = []
    for num_workers in worker_counts:
        loader = make_loader(dataset, batch_size, shuffle=True, num_workers=num_workers, seed=seed,
                             start_method=start_method)
        data = run_epoch(loader, desc=f"num_workers={num_workers}, data only")
        train = run_epoch(loader, make_train_step(seed, device), device,  # persistent workers: no restart
                          desc=f"num_workers={num_workers}, training")
        exactly_once = bool((data["visits"] == 1).all() and (train["visits"] == 1).all())
        rows.append({"num_workers": num_workers, "first_batch_s": round(data["first_batch_s"], 3),
                     "data_epoch_s": round(data["seconds"], 3), "data_samples_per_s": round(data["samples_per_s"]),
                     "train_epoch_s": round(train["seconds"], 3), "train_samples_per_s": round(train["samples_per_s"]),
                     "exactly_once": exactly_once})
        log(f"num_workers={num_workers}: first batch {data['first_batch_s']:.2f} s | data-only epoch "
            f"{data['seconds']:.2f} s | training epoch {train['seconds']:.2f} s | each sample once: {exactly_once}")
    model_only = model_only_throughput(files, samples, batch_size, seed, device)
    log(f"model only (batches already in memory): {model_only:,.0f} samples/s")
    return {"rows": rows, "model_only_samples_per_s": round(model_only), "samples": samples,
            "batch_size": batch_size, "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(), "device": str(device)}


@dataclass
class Config:
    samples: int | None = arg(None, "samples per timed epoch, the first N training images; none given: 60000, or "
                                    "512 with --smoke", gt=0, le=SIZES[True])
    batch_size: int | None = arg(None, "images per batch; none given: 256, or 128 with --smoke", gt=0)
    workers: tuple[int, ...] = arg((0, 2, 4), "num_workers values to time, e.g. --workers 0 2 4", ge=0,
                                    le=256)
    seed: int = arg(0, "seed of the shuffle, the augmentations and the model", ge=0)
    threads: int | None = arg(None, "intra-op threads of the training process; none given: torch's, one per core",
                              gt=0, le=256)
    start_method: str | None = arg(None, "how worker processes start; none given: the platform's (spawn on macOS "
                                         "and Windows)", choices=("fork", "spawn", "forkserver"))
    device: str | None = arg(None, "where the training step runs: cpu, cuda or mps; none given: the best available")
    smoke: bool = arg(False, "small defaults (512 samples, batch 128) for --samples and --batch-size not given")
    timing_only: bool = arg(False, "skip the demos [1]-[3], only time the workers")

    def __post_init__(self):
        validate(self)

    @property
    def sizes(self) -> tuple[int, int]:
        """(samples, batch size): what was asked for, else the defaults (smaller with --smoke)."""
        return self.samples or (512 if self.smoke else SIZES[True]), self.batch_size or (128 if self.smoke else 256)


def run_demos(cfg: Config, dataset: MNISTFiles, out: Path) -> None:
    sample = dataset[0]
    print(f"[1] MNISTFiles: {len(dataset):,} images of shape {tuple(sample['image'].shape)} "
          f"({sample['image'].dtype}), label of image 0 = {sample['label']}")

    demo = collate_demo()
    print(f"[2] default_collate on variable-length items fails:\n    {demo['default_collate_error']}")
    padded, lengths = demo["batches"][0]
    print(f"    pad_collate instead -> padded {tuple(padded.shape)}, lengths {lengths.tolist()}")
    print("    " + "\n    ".join(str(row.tolist()) for row in padded))

    aug = augmentation_report(*(augmentation_batches(seed, 2, start_method=cfg.start_method)
                                for seed in (cfg.seed, cfg.seed, cfg.seed + 1)))  # same seed twice, then the next
    print(f"[3] augmentation in workers {aug['workers']}: max |run 1 - run 2| = {aug['max_diff_between_runs']:.3g} "
          f"(same seed), max |worker 0 - worker 1| = {aug['max_diff_between_workers']:.3g}, "
          f"max |seed {cfg.seed} - seed {cfg.seed + 1}| = {aug['max_diff_between_seeds']:.3g}")
    plot_augmentations(sample["image"], aug, out / "augmentations.png")
    figures = {"default_collate_error": demo["default_collate_error"], "padded_shape": list(padded.shape),
               "lengths": lengths.tolist()} | {k: float(v) for k, v in aug.items() if k.startswith("max_diff")}
    print(f"    wrote {out / 'augmentations.png'}")
    write_results(out, "demos", demos_table(figures), figures)


def main(argv=None) -> dict:
    cfg, out = parse(Config, argv, __doc__, out=runs_dir(__file__))
    samples, batch_size = cfg.sizes
    if cfg.threads:
        torch.set_num_threads(cfg.threads)  # workers always use 1 thread each (DataLoader sets it)
    dataset = MNISTFiles(train=True)  # a missing or corrupt MNIST stops here, before anything is written
    out.mkdir(parents=True, exist_ok=True)

    if not cfg.timing_only:
        run_demos(cfg, dataset, out)

    print(f"[4] one epoch per num_workers in {cfg.workers} ({samples:,} samples, batch {batch_size}):")
    timing = time_workers(cfg.workers, samples, batch_size, cfg.seed, cfg.start_method, cfg.device)
    print(interpret(timing))
    write_timing(timing, out)
    (out / "timing.json").write_text(json.dumps(timing, indent=2) + "\n")
    print(f"wrote {out}/worker_timing.md, worker_timing.csv, worker_timing.png, timing.json")
    return timing


if __name__ == "__main__":
    run(main)
