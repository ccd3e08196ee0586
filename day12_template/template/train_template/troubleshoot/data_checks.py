"""Data sanity: what the model is fed, split by split, before blaming the model.

For each split (as the model sees it: `split.batch(-1, indices)`, normalised, no augmentation): the label histogram
and labels out of range, NaN/Inf input values, the inputs' mean and standard deviation (≈ 0 and ≈ 1 when
normalised; val/test far from train means their preprocessing differs), class imbalance (largest / smallest class),
classes missing from a split, and exact duplicates across splits: every sample hashed (SHA-256 of its input bytes),
each val/test sample looked up among the training hashes. A test image that is also a training image measures
memory, not generalisation.
"""
import hashlib
import math
from dataclasses import dataclass, field

import torch

IMBALANCE = 3.0  # largest / smallest class above this: weigh the loss or resample
CHUNK = 4096


@dataclass
class SplitStats:
    n: int
    counts: list[int]  # samples per class (labels outside [0, num_classes) are counted in out_of_range)
    out_of_range: int
    nonfinite: int  # NaN/Inf input values
    nonfinite_samples: list[int]  # the first few indices holding one
    mean: float
    std: float

    @property
    def imbalance(self) -> float:
        present = [c for c in self.counts if c]
        return max(present) / min(present) if present else math.inf


@dataclass
class DataReport:
    num_classes: int
    splits: dict[str, SplitStats]
    duplicates: dict[str, int] = field(default_factory=dict)  # "test in train" -> samples also in train
    conflicts: dict[str, int] = field(default_factory=dict)  # of those, duplicates with another label

    def problems(self) -> list[tuple[str, str]]:
        """(kind, line) per problem found, kind in nonfinite | labels | normalisation | leak; empty if sane."""
        out = []
        train = self.splits["train"]
        for name, s in self.splits.items():
            if s.nonfinite:
                out.append(("nonfinite", f"{name}: {s.nonfinite:,} NaN/Inf input values (samples "
                                         f"{s.nonfinite_samples})"))
            if s.out_of_range:
                out.append(("labels", f"{name}: {s.out_of_range:,} labels outside 0..{self.num_classes - 1}"))
            missing = [c for c, k in enumerate(s.counts) if k == 0 and (name == "train" or train.counts[c])]
            if missing:
                out.append(("labels", f"{name}: no sample of class(es) {missing}"))
            elif s.imbalance > IMBALANCE:
                out.append(("labels", f"{name}: class imbalance {s.imbalance:.1f}x (largest / smallest class)"))
        if not (abs(train.mean) < 5 and 0.1 < train.std < 10):  # raw 0-255 pixels: mean ~30-130, std ~80
            out.append(("normalisation", f"train inputs not normalised: mean {train.mean:.3g}, std {train.std:.3g} "
                                         f"(want about 0 and 1)"))
        for name, s in self.splits.items():
            if name != "train" and abs(s.mean - train.mean) > 0.5 * train.std:
                out.append(("normalisation", f"{name} inputs differ from train: mean {s.mean:.3g} vs {train.mean:.3g} "
                                             f"(std {s.std:.3g} vs {train.std:.3g}): a different preprocessing?"))
        out += [("leak", f"{k}: {v:,} exact duplicate(s)" + (f", {self.conflicts[k]} with another label"
                                                              if self.conflicts.get(k) else ""))
                for k, v in self.duplicates.items() if v]
        return out


def _batches(split, limit: int | None):
    n = min(len(split), limit) if limit else len(split)
    augment = getattr(split, "augment", False)  # image folders: random crops off, hash what evaluation sees
    if augment:
        split.augment = False
    try:
        for start in range(0, n, CHUNK):
            yield split.batch(-1, torch.arange(start, min(n, start + CHUNK)))
    finally:
        if augment:
            split.augment = True


def split_stats(split, num_classes: int, limit: int | None = None) -> tuple[SplitStats, list[bytes], list[int]]:
    """Statistics of one split, and each sample's hash and label."""
    counts = torch.zeros(num_classes, dtype=torch.long)
    total = total_sq = 0.0
    values = nonfinite = out_of_range = 0
    bad, hashes, labels = [], [], []
    seen = 0
    for x, y in _batches(split, limit):
        flat = x.reshape(len(x), -1)
        chunk_sum = flat.sum(dtype=torch.float64).item()  # NaN/inf if (and only if) a value is
        values += flat.numel()
        if not math.isfinite(chunk_sum):
            finite = torch.isfinite(flat)
            nonfinite += int((~finite).sum())
            values -= int((~finite).sum())
            bad = (bad + (seen + (~finite.all(1)).nonzero().flatten()).tolist())[:5]
            flat = torch.where(finite, flat, 0.0)
            chunk_sum = flat.sum(dtype=torch.float64).item()
        total += chunk_sum
        total_sq += torch.linalg.vector_norm(flat, dtype=torch.float64).item() ** 2
        inside = (y >= 0) & (y < num_classes)
        out_of_range += int((~inside).sum())
        counts += torch.bincount(y[inside], minlength=num_classes)
        hashes += [hashlib.sha256(row).digest()[:16] for row in flat.contiguous().numpy()]
        labels += y.tolist()
        seen += len(y)
    mean = total / max(values, 1)
    std = math.sqrt(max(total_sq / max(values, 1) - mean ** 2, 0.0))
    return SplitStats(seen, counts.tolist(), out_of_range, nonfinite, bad, mean, std), hashes, labels


def check_data(splits, num_classes: int, limit: int | None = None) -> DataReport:
    """The report for `splits` (anything with .train, .val, .test: BatchData or None); `limit` caps the samples
    read per split (the first `limit`)."""
    stats, index = {}, {}
    report = DataReport(num_classes, stats)
    for name in ("train", "val", "test"):
        split = getattr(splits, name)
        if split is None:
            continue
        stats[name], hashes, labels = split_stats(split, num_classes, limit)
        index[name] = dict(zip(hashes, labels))
        for other in [o for o in ("train", "val") if o in index and o != name]:
            # duplicates *within* one split are repeats, not leaks; across splits they are leaks
            hits = [(h, y) for h, y in zip(hashes, labels) if h in index[other]]
            report.duplicates[f"{name} in {other}"] = len(hits)
            report.conflicts[f"{name} in {other}"] = sum(index[other][h] != y for h, y in hits)
    return report
