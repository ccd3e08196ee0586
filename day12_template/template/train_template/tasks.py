"""What a run learns. The loop calls the model and hands its output to the task; the task owns the loss, what an
evaluation adds up, and the metrics it reports. A dataset declares its task once, when it is registered
(`data.register(name, task=...)`), so the loop never knows whether it trains a classifier or a language model.

A new task is one registered class: the `sums` an evaluation adds up, `loss`, `eval_sums`, `metrics`, `describe`,
and two attributes: `classes` (what a uniform guess divides among: the doctor's first-loss check expects
ln(classes)) and `tokens_per_sample` (None, or the tokens in one sample: tokens/s and MFU). README.md shows
regression, whole: its data is registered with `task="regress"` (data.py) and a model for it (models.py).
"""
import math

import torch
import torch.nn.functional as F

from . import data

TASKS: dict[str, type] = {}


def register(name: str):
    """Class decorator: the class becomes task `name`."""
    def add(cls: type) -> type:
        cls.name = name
        TASKS[name] = cls
        return cls
    return add


def for_dataset(dataset: str, info):
    """The task `dataset` was registered with, built for its data's `info`."""
    return TASKS[data.DATASETS[dataset].task](info)


@register("classify")
class Classify:
    """Logits (batch, classes) against labels (batch,): cross-entropy and accuracy."""

    sums = ("loss", "correct", "samples")  # what evaluate() adds up over the batches, then metrics() divides

    def __init__(self, info):
        self.classes = info.num_classes  # a uniform guess scores ln(classes): the first loss to expect
        self.tokens_per_sample = None

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), y)

    def eval_sums(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        return torch.stack([F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum().float(),
                            torch.tensor(float(len(y)), device=y.device)])

    def metrics(self, sums: list[float]) -> dict:
        loss, correct, samples = sums
        return {"loss": loss / samples, "acc": correct / samples}

    def describe(self, m: dict, split: str) -> str:
        return f"{split} loss {m['loss']:.4f}, {split} acc {100 * m['acc']:.2f}%"


@register("lm")
class LanguageModel:
    """Logits (batch, time, vocabulary) against the next tokens (batch, time): cross-entropy over every position,
    perplexity, and bits per byte (nats summed over the targets / their UTF-8 bytes / ln 2), which compares across
    tokenizers: a byte-level model's loss per token is its loss per byte."""

    sums = ("nats", "tokens", "bytes")

    def __init__(self, info):
        self.classes = info.vocab_size
        self.tokens_per_sample = info.block_size
        self.token_bytes = info.bytes_per_token  # (vocabulary,) UTF-8 bytes per token id; None when unknown

    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def eval_sums(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nats = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
        tokens = torch.tensor(float(y.numel()), device=y.device)
        if self.token_bytes is None:
            return torch.stack([nats, tokens, torch.zeros_like(tokens)])
        return torch.stack([nats, tokens, self.token_bytes.to(y.device)[y].sum().to(nats.dtype)])

    def metrics(self, sums: list[float]) -> dict:
        nats, tokens, n_bytes = sums
        out = {"loss": nats / tokens, "ppl": math.exp(min(nats / tokens, 700.0))}  # exp(700) still fits a float
        if n_bytes:
            out["bpb"] = nats / n_bytes / math.log(2)
        return out

    def describe(self, m: dict, split: str) -> str:
        bpb = f", {m['bpb']:.3f} bits/byte" if "bpb" in m else ""
        return f"{split} loss {m['loss']:.4f} (perplexity {m['ppl']:.2f}{bpb})"
