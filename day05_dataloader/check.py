"""Day 5 gates: the loader delivers each sample once per epoch, seeded augmentation is reproducible and differs
between workers, the collate pads, the epoch timer measures the real time and the table says which side is the
bottleneck, bad flags are refused before any work, and the entry point survives 'spawn'.

Run:  python day05_dataloader/check.py   (or `pytest day05_dataloader`)
"""
import ast
import csv
import json
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, Subset, default_collate, get_worker_info

from day05_dataloader import main as day
from day05_dataloader import report
from sprint.data import mnist
from sprint.device import ABSENT_CUDA
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
MAIN = Path(day.__file__)
N = 3000  # samples in the exactly-once check


@pytest.fixture(scope="module")
def two_epochs():
    """Two epochs of a shuffled 2-worker loader over the first N training images (persistent workers); batches of
    256, so the last one is partial and a loader that drops it fails the exactly-once gates."""
    loader = day.make_loader(Subset(day.MNISTFiles(train=True), range(N)), batch_size=256, num_workers=2, seed=0)
    return day.run_epoch(loader), day.run_epoch(loader)


@pytest.fixture(scope="module")
def augmentation():
    return report.augmentation_report(*(day.augmentation_batches(seed, num_workers=2) for seed in (0, 0, 1)))


def test_dataset_reads_the_same_images_and_labels_as_torchvision():
    ours, reference = day.MNISTFiles(train=False), mnist(train=False)
    idx = torch.randperm(len(ours), generator=torch.Generator().manual_seed(0))[:2000].tolist()
    items = [ours[i] for i in idx]
    images = torch.stack([item["image"][0] for item in items])
    labels = torch.tensor([item["label"] for item in items])
    gates.check("MNISTFiles holds as many test images as torchvision's MNIST", len(ours), "==", len(reference))
    gates.check("MNISTFiles pixels equal torchvision's (pixels differing in 2,000 images)",
                (images != reference.data[idx]).sum(), "==", 0)
    gates.check("MNISTFiles labels equal torchvision's (labels differing in 2,000 images)",
                (labels != reference.targets[idx]).sum(), "==", 0)


def test_every_sample_is_seen_exactly_once_per_epoch(two_epochs):
    for epoch, result in enumerate(two_epochs, 1):
        gates.check(f"epoch {epoch}: samples delivered (2 workers, shuffle)", result["samples"], "==", N)
        gates.check(f"epoch {epoch}: samples not seen exactly once", (result["visits"] != 1).sum(), "==", 0)


def test_shuffle_changes_the_order_every_epoch(two_epochs):
    first, second = two_epochs
    gates.check("epochs 1 and 2 hold the same sample at fewer than 1% of positions",
                (first["order"] == second["order"]).sum(), "<", N // 100)
    gates.check("epoch 1 holds sample i at position i for fewer than 1% of positions",
                (first["order"] == torch.arange(N)).sum(), "<", N // 100)


def test_same_seed_gives_identical_augmented_batches(augmentation):
    gates.check("two runs with seed 0 augment identically (max pixel difference)",
                augmentation["max_diff_between_runs"], "==", 0)


def test_different_workers_produce_different_augmentations(augmentation):
    gates.check("the two batches come from workers 0 and 1", augmentation["workers"], "==", [0, 1])
    gates.check("workers 0 and 1 augment the same image differently (max pixel difference)",
                augmentation["max_diff_between_workers"], ">", 0)
    gates.check("seeds 0 and 1 augment differently (max pixel difference)", augmentation["max_diff_between_seeds"],
                ">", 0)


def test_default_collate_fails_on_variable_length_items_and_pad_collate_pads():
    demo = day.collate_demo(batch_size=4)
    gates.check("default_collate error names unequal sizes",
                "stack expects each tensor to be equal size" in (demo["default_collate_error"] or ""), "==", True)
    wrong, rows = 0, 0
    items = iter(demo["items"])
    for padded, lengths in demo["batches"]:
        for row, length in zip(padded, lengths):
            item = next(items)
            rows += 1
            wrong += int(length != len(item) or not torch.equal(row[:length], item)
                         or bool((row[length:] != 0).any()) or len(row) != int(lengths.max()))
    gates.check("padded rows checked", rows, "==", len(day.SENTENCES))
    gates.check("padded rows that differ from their item followed by zeros", wrong, "==", 0)


@pytest.fixture(scope="module")
def timing():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "This DataLoader will create 4 worker processes")  # 4 > 2 cores on purpose
        return day.time_workers((0, 2, 4), samples=768, batch_size=128, log=lambda *_: None)


def test_timing_table_has_a_row_per_worker_count_each_sample_once(timing, tmp_path):
    report.write_timing(timing, tmp_path)
    with open(tmp_path / "worker_timing.csv") as f:
        rows = list(csv.DictReader(f))
    gates.check("timing table: one row per num_workers in 0, 2, 4", [int(r["num_workers"]) for r in rows], "==",
                [0, 2, 4])
    gates.check("timing table: rows where each sample came exactly once",
                sum(r["exactly_once"] == "True" for r in rows), "==", 3)
    assert (tmp_path / "worker_timing.png").stat().st_size > 0 and (tmp_path / "worker_timing.md").exists()


def test_per_sample_augmentation_is_slower_than_the_training_step(timing):
    """The README's conclusion: on a CPU the producer (decode + random affine per sample) is the bottleneck."""
    producer = max(r["data_samples_per_s"] for r in timing["rows"])
    gates.check("the training step alone consumes more samples/s than the fastest loader produces",
                timing["model_only_samples_per_s"] / producer, ">", 1)


def collate_with_process(batch: list[dict]) -> dict:
    """default_collate plus who built the batch: the worker process's id and its seed (a new worker gets a new seed,
    so a process id the OS hands out again is not mistaken for the same worker)."""
    out = default_collate(batch)
    out["process"] = (os.getpid(), get_worker_info().seed)
    return out


def worker_processes(loader, epochs: int = 2) -> list[set]:
    """The worker processes that built each epoch's batches."""
    return [{batch["process"] for batch in loader} for _ in range(epochs)]


def test_persistent_workers_keep_the_same_processes_across_epochs():
    data = Subset(day.MNISTFiles(train=True), range(64))
    kept = worker_processes(day.make_loader(data, batch_size=16, num_workers=2, collate_fn=collate_with_process))
    fresh = worker_processes(DataLoader(data, batch_size=16, num_workers=2, collate_fn=collate_with_process))
    gates.check("persistent_workers=True (make_loader): worker processes of epoch 1, and those of epoch 2 not "
                "among them", [len(kept[0]), len(kept[1] - kept[0])], "==", [2, 0])
    gates.check("persistent_workers=False: worker processes of epoch 2 that also served epoch 1",
                len(fresh[1] & fresh[0]), "==", 0)


def test_pin_memory_without_an_accelerator_is_a_no_op():
    if torch.accelerator.is_available():
        pytest.skip("an accelerator pins: test_pin_memory_with_cuda_delivers_pinned_batches is the gate on CUDA")
    data = Subset(day.MNISTFiles(train=True), range(32))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'pin_memory' argument is set as true")  # torch says pinning is off
        batch = next(iter(DataLoader(data, batch_size=16, pin_memory=True)))
    gates.check("pin_memory=True on a machine without an accelerator: batch tensors pinned (image, label)",
                [batch["image"].is_pinned(), batch["label"].is_pinned()], "==", [False, False])


@pytest.mark.gpu
def test_pin_memory_with_cuda_delivers_pinned_batches():
    loader = day.make_loader(Subset(day.MNISTFiles(train=True), range(32)), batch_size=16, num_workers=2)
    batch = next(iter(loader))
    gates.check("with CUDA: a batch's image and label tensors pinned (page-locked: .to(cuda, non_blocking) is "
                "asynchronous)", [batch["image"].is_pinned(), batch["label"].is_pinned()], "==", [True, True])


class Sleepy(Dataset):
    """Items that each take `delay` seconds to produce: an epoch cannot take less than len × delay / workers."""

    def __init__(self, n: int, delay: float):
        self.n, self.delay = n, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        return {"image": torch.zeros(1, 28, 28, dtype=torch.uint8), "label": 0, "index": i}


def test_the_epoch_timer_measures_the_whole_epoch():
    n, delay = 100, 0.004
    result = day.run_epoch(day.make_loader(Sleepy(n, delay), batch_size=10))
    gates.check(f"an epoch of {n} items taking {1000 * delay:g} ms each is timed at >= {n * delay:g} s",
                result["seconds"], ">=", n * delay)


def test_the_interpretation_names_the_model_when_the_model_is_the_bottleneck(timing):
    slow_model = {**timing, "model_only_samples_per_s": 1}
    gates.check("with a model slower than every loader, the text says the epoch is bound by the model step",
                "bound by the model step" in report.interpret(slow_model), "==", True)


def test_the_reading_of_workers_beyond_the_cores_says_what_the_figures_say(timing):
    """The README's sentence on num_workers past the core count is generated (report.interpret); whichever way the
    figures point, it reports them: a gain as a gain, a loss as a loss, no verdict fixed in advance."""
    cores = 2
    said = []
    for training_ratio, data_ratio in ((1.08, 0.98), (1.0, 1.0), (0.9, 0.8), (1.0, 1.2)):
        two = {**timing["rows"][1], "num_workers": cores}
        four = {**two, "num_workers": 2 * cores, "train_epoch_s": two["train_epoch_s"] / training_ratio,
                "data_samples_per_s": two["data_samples_per_s"] * data_ratio}
        text = report.interpret({**timing, "cpu_count": cores, "rows": [timing["rows"][0], two, four]})
        line = next(line for line in text.splitlines() if line.startswith(f"- num_workers={2 * cores} vs {cores}"))
        said.append([re.search(r"data-only rate \S+ \(([^)]*)\)", line)[1],
                     re.search(r"training epoch \S+ \(([^)]*)\)", line)[1]])
    gates.check("interpret(), 4 vs 2 workers on 2 cores, the training epoch 1.08x / 1x / 0.9x / 1x and the data-only "
                "rate 0.98x / 1x / 0.8x / 1.2x as fast: what the text says of each",
                said, "==", [["no faster", "8% faster"], ["no faster", "no faster"], ["20% slower", "10% slower"],
                             ["20% faster", "no faster"]])


def test_smoke_never_overrides_an_explicit_flag():
    gates.check("--smoke alone: 512 samples, batch 128", list(day.Config(smoke=True).sizes), "==", [512, 128])
    gates.check("--smoke --batch-size 64 keeps 64", list(day.Config(smoke=True, batch_size=64).sizes), "==", [512, 64])
    gates.check("no --smoke: 60,000 samples, batch 256", list(day.Config().sizes), "==", [60000, 256])


BAD_FLAGS = [["--batch-size", "0", "--smoke"], ["--samples", "0"], ["--samples", "60001"], ["--workers", "-1"],
             ["--workers", "two"], ["--threads", "0"], ["--start-method", "thread"], ["--device", ABSENT_CUDA],
             ["--device", "gpu"], ["--threads", "100000"], ["--workers", "0", "1000"], ["--seed", "-1"]]


@pytest.mark.parametrize("argv", BAD_FLAGS, ids=" ".join)
def test_a_bad_flag_exits_2_with_one_line_and_creates_nothing(argv, tmp_path):
    gates.refuses(day.main, argv, tmp_path / "out")


def test_entry_point_is_behind_main_guard():
    tree = ast.parse(MAIN.read_text())
    guards = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    bare_calls = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Call) and not ast.unparse(node).startswith("sys.path.insert")]
    starts = [call for guard in guards for call in ast.walk(guard) if isinstance(call, ast.Call)
              and ast.unparse(call) in ("main()", "run(main)")]
    gates.check("main.py makes no module-level call outside the __main__ guard", bare_calls, "==", [])
    gates.check("main.py starts main() once, inside `if __name__ == '__main__':`", len(starts), "==", 1)


def test_main_runs_with_spawned_workers(tmp_path):
    """The macOS/Windows start method: each worker re-imports main.py, which must not start training again."""
    cmd = [sys.executable, str(MAIN), "--smoke", "--timing-only", "--workers", "2", "--start-method", "spawn",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2000:], proc.stderr[-3000:])  # shown by pytest if a gate below fails
    gates.check("main.py --smoke with 2 spawned workers exits with code 0", proc.returncode, "==", 0)
    rows = json.loads((tmp_path / "timing.json").read_text())["rows"]
    gates.check("spawn run: each sample exactly once with 2 workers", [r["exactly_once"] for r in rows], "==", [True])


if __name__ == "__main__":
    run_this_file(__file__)
