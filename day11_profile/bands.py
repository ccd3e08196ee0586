"""The data/step bands: which side of a training loop waits, and what to do about it (curriculum §9)."""
import math

# data/step -> verdict. The curriculum (§9) gives < 5%, 20-60% and > 100%; the gaps are filled here:
# 5-20% is below the 20% at which it says moving work off the data path pays, and 60-100% means the step
# waits for data almost as long as it computes. Each band is [lower, upper).
BANDS = [
    (0.05, "compute-bound", "the device is the bottleneck: a better device, mixed precision or a smaller model"),
    (0.20, "mostly compute-bound", "data loading is visible but under 20% of a step: leave the pipeline alone"),
    (0.60, "partly data-bound", "more workers, pin_memory, augmentation on the device, a faster storage format"),
    (1.00, "mostly data-bound", "the step waits for data almost as long as it computes: fix the pipeline first"),
    (math.inf, "data-bound", "the device idles waiting for data: fix the pipeline before buying hardware"),
]


def classify(ratio: float) -> str:
    """The verdict for a measured data-time / step-time ratio."""
    if not ratio >= 0:  # also rejects NaN
        raise ValueError(f"data/step ratio must be a number >= 0, got {ratio!r}")
    return next(verdict for upper, verdict, _ in BANDS if ratio < upper)


def band_of(verdict: str) -> tuple[float, float]:
    """The [lower, upper) data/step range a verdict stands for."""
    uppers = [0.0] + [upper for upper, _, _ in BANDS]
    i = [v for _, v, _ in BANDS].index(verdict)
    return uppers[i], uppers[i + 1]
