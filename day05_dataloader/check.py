"""Day 5 gates: the loader delivers each sample once per epoch, seeded augmentation is reproducible and differs
between workers, the collate pads, the timing table is complete, and the entry point survives 'spawn'.

Run:  python day05_dataloader/check.py   (or `pytest day05_dataloader`)
"""
import ast
import csv
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # repo root: `sprint` and the day folders

import pytest
import torch
from torch.utils.data import Subset

from day05_dataloader import main as day
from day05_dataloader import report
from sprint.data import mnist
from sprint.gates import Gates, run_this_file

gates = Gates(__file__)
MAIN = Path(day.__file__)
N = 3000  # samples in the exactly-once check


@pytest.fixture(scope="module")
def two_epochs():
    """Two epochs of a shuffled 2-worker loader over the first N training images (persistent workers)."""
    loader = day.make_loader(Subset(day.MNISTFiles(train=True), range(N)), batch_size=250, num_workers=2, seed=0)
    return day.run_epoch(loader), day.run_epoch(loader)


@pytest.fixture(scope="module")
def augmentation():
    return day.augmentation_report(seed=0, num_workers=2)


def test_dataset_reads_the_same_images_and_labels_as_torchvision():
    ours, reference = day.MNISTFiles(train=False), mnist(train=False)
    idx = torch.randperm(len(ours), generator=torch.Generator().manual_seed(0))[:2000].tolist()
    items = [ours[i] for i in idx]
    images = torch.stack([item["image"][0] for item in items])
    labels = torch.tensor([item["label"] for item in items])
    gates.check("test images: MNISTFiles length", len(ours), "==", len(reference))
    gates.check("pixels differing from torchvision's MNIST (2,000 images)", (images != reference.data[idx]).sum(),
                "==", 0)
    gates.check("labels differing from torchvision's MNIST (2,000 images)", (labels != reference.targets[idx]).sum(),
                "==", 0)


def test_every_sample_is_seen_exactly_once_per_epoch(two_epochs):
    for epoch, result in enumerate(two_epochs, 1):
        gates.check(f"epoch {epoch}: samples delivered (2 workers, shuffle)", result["samples"], "==", N)
        gates.check(f"epoch {epoch}: samples not seen exactly once", (result["visits"] != 1).sum(), "==", 0)


def test_shuffle_changes_the_order_every_epoch(two_epochs):
    first, second = two_epochs
    gates.check("positions holding the same sample in epochs 1 and 2", (first["order"] == second["order"]).sum(),
                "<", N // 100)
    gates.check("positions holding sample i at position i (epoch 1)", (first["order"] == torch.arange(N)).sum(),
                "<", N // 100)


def test_same_seed_gives_identical_augmented_batches(augmentation):
    gates.check("max |pixel difference| between two runs with seed 0", augmentation["max_diff_between_runs"], "==", 0)


def test_different_workers_produce_different_augmentations(augmentation):
    gates.check("worker ids of the two batches", augmentation["workers"], "==", [0, 1])
    gates.check("max |pixel difference| worker 0 vs worker 1 (same image)", augmentation["max_diff_between_workers"],
                ">", 0)
    gates.check("max |pixel difference| seed 0 vs seed 1", augmentation["max_diff_between_seeds"], ">", 0)


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
    gates.check("padded rows that differ from item + zeros", wrong, "==", 0)


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # 4 > 2 cores on purpose
def test_timing_table_has_rows_for_0_2_4_workers_with_positive_times(tmp_path):
    timing = day.time_workers((0, 2, 4), samples=768, batch_size=128, log=lambda *_: None)
    report.write_timing(timing, report.interpret(timing), tmp_path)
    with open(tmp_path / "worker_timing.csv") as f:
        rows = list(csv.DictReader(f))
    times = [float(r[k]) for r in rows for k in ("first_batch_s", "data_epoch_s", "train_epoch_s")]
    gates.check("timing table: num_workers rows", [int(r["num_workers"]) for r in rows], "==", [0, 2, 4])
    gates.check("timing table: smallest time (s)", min(times), ">", 0)
    gates.check("timing table: rows where each sample came exactly once",
                sum(r["exactly_once"] == "True" for r in rows), "==", 3)
    assert (tmp_path / "worker_timing.png").stat().st_size > 0 and (tmp_path / "worker_timing.md").exists()


def test_entry_point_is_behind_main_guard():
    tree = ast.parse(MAIN.read_text())
    guards = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    bare_calls = [ast.unparse(node) for node in tree.body if isinstance(node, ast.Expr)
                  and isinstance(node.value, ast.Call) and not ast.unparse(node).startswith("sys.path.insert")]
    gates.check("module-level calls outside the __main__ guard", bare_calls, "==", [])
    gates.check("main() calls inside `if __name__ == '__main__':`",
                sum("main(" in ast.unparse(g) for g in guards), "==", 1)


def test_main_runs_with_spawned_workers(tmp_path):
    """The macOS/Windows start method: each worker re-imports main.py, which must not start training again."""
    cmd = [sys.executable, str(MAIN), "--smoke", "--timing-only", "--workers", "2", "--start-method", "spawn",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout[-2000:], proc.stderr[-3000:])  # shown by pytest if a gate below fails
    gates.check("exit code of main.py --smoke with 2 spawned workers", proc.returncode, "==", 0)
    rows = json.loads((tmp_path / "timing.json").read_text())["rows"]
    gates.check("spawn run: each sample exactly once with 2 workers", [r["exactly_once"] for r in rows], "==", [True])


if __name__ == "__main__":
    run_this_file(__file__)
