"""The curriculum's checklists (four symptoms, cheapest step first, and its data-preparation list) and the findings
the doctor prints.

Each checklist item has a key (`nan-5`); each finding names the items it answers, so a printed finding says which
question of which checklist it settles. `SYMPTOMS` is the decision path: for a symptom, the checks to run, in order
of cost (free config review -> one forward -> one backward -> a few steps -> a pass over the data -> short
training runs); the doctor prints what each check took. The data checklist also asks the data questions of the NaN
and loss checklists (`SHARED`).
"""
import html
import re
from dataclasses import dataclass, field

ITEMS = {
    # NaN or inf loss
    "nan-1": "learning rate too high: the cheapest bisection is the same run at lr / 10",
    "nan-2": "division by zero, log(0) or sqrt of a negative in a layer or the loss",
    "nan-3": "exp/softmax overflow: a hand-written exp without subtracting the max",
    "nan-4": "fp16 overflow (max 65504) or fp16 without a GradScaler",
    "nan-5": "NaN/Inf already in the input data",
    "nan-6": "still unexplained: anomaly mode names the backward op that made the NaN",
    # loss not decreasing
    "loss-1": "overfit one batch: a working model memorises 8 samples",
    "loss-2": "labels match the inputs: histogram, range, no class missing",
    "loss-3": "a gradient reaches every layer",
    "loss-4": "cross-entropy gets logits, not softmax outputs",
    "loss-5": "learning rate too high (oscillates, NaN) or too low (barely moves)",
    "loss-6": "initialisation not extreme: the first loss is about ln(classes)",
    "loss-7": "the optimizer updates every trainable parameter and the schedule's rate is not 0",
    "loss-8": "inputs normalised, train and evaluation alike",
    "loss-9": "validation/test independent of training: no sample or passage also in train (a leak flatters the "
              "figures)",
    # exploding or vanishing gradients
    "grad-1": "exploding: global norm above 1e3, or one layer far above the others",
    "grad-2": "vanishing: layers with (almost) no gradient",
    "grad-3": "norm pinned at max_norm: every step clipped, training speed-limited",
    # GPU utilisation below ~60%
    "gpu-1": "data loading keeps up: data/step ratio, enough data.num_workers",
    "gpu-2": "pinned host memory for asynchronous copies (data.pin_memory)",
    "gpu-3": "augmentation not too heavy for the CPU",
    "gpu-4": "storage fast enough (not many small files on a network disk)",
    "gpu-5": "workers kept between epochs (persistent_workers)",
    "gpu-6": "model and batch large enough to fill the GPU (kernel launch overhead)",
    "gpu-7": "no host syncs in the loop: .item(), .cpu(), .tolist(), print(tensor)",
    "gpu-8": "Python overhead between kernels",
    "gpu-9": "batch not too small (< 32 per forward)",
    "gpu-10": "mixed precision on (bf16 autocast uses the tensor cores)",
    "gpu-11": "memory not at the limit (allocator churn)",
    "gpu-12": "the GPU not shared with other processes",
    # the data (text: the curriculum's preprocessing checklist)
    "data-1": "exact duplicates: no document twice, no boilerplate line (header, footer) in most documents",
    "data-2": "near duplicates: no two documents a few edits apart (MinHash over character shingles)",
    "data-3": "noise: no HTML tags or entities, no control characters besides \\n \\t \\r",
    "data-4": "length filter: no document too short (or too long) to be prose",
    "data-5": "encoding: every byte valid UTF-8",
    "data-6": "token lengths after tokenisation: min, median, 95th percentile and max per document",
}
SHARED = {"data": ["nan-5", "loss-2", "loss-8", "loss-9"]}  # items another checklist asks too

# check -> what it costs, in the order the doctor runs them (cheapest first; the data pass grows with the dataset)
CHECKS = {
    "config": "free: reads the config and builds the model",
    "forward": "one forward pass on 4 batches",
    "gradients": "one backward pass",
    "anomaly": "2 forward and backward passes under anomaly mode (2-5x slower)",
    "overfit": "up to 200 steps on 8 samples",
    "data_vs_step": "23 timed batches and steps",
    "data": "one pass over the data: every sample hashed (images), every document hashed and shingled (text)",
    "short_run": "train.py's first 30 optimizer steps, its evaluation and checkpoint",
    "lr_range": "an LR sweep of 100 steps",
    "gpu_only": "free: says what only a GPU can measure",
}

SYMPTOMS = {
    "nan": ("NaN or inf loss", ["config", "forward", "gradients", "anomaly", "data", "short_run", "lr_range"]),
    "loss": ("loss not decreasing", ["config", "forward", "gradients", "overfit", "data", "short_run", "lr_range"]),
    "exploding": ("exploding or vanishing gradients", ["config", "gradients", "short_run", "lr_range"]),
    "gpu": ("low GPU utilisation", ["config", "data_vs_step", "short_run", "gpu_only"]),
    "data": ("suspect training data", ["data"]),
}


@dataclass
class Finding:
    check: str
    status: str  # ok | PROBLEM | note | not measured
    text: str
    items: list[str]  # the checklist items it answers ([] : a check that could not run, shown under every symptom)
    fix: str = ""
    figures: dict = field(default_factory=dict)  # the measured values, for findings.json

    def concerns(self, symptom: str) -> bool:
        return symptom == "all" or not self.items or bool(set(self.items) & set(items_of(symptom)))

    def render(self, number: int) -> str:
        tags = ", ".join(self.items) or "the check failed"
        lines = [f"[{number}] {self.check} | {self.status} | {tags}", f"    {self.text}"]
        if self.fix and self.status != "ok":
            lines.append(f"    fix: {self.fix}")
        return "\n".join(lines)

    def markdown_row(self, number: int) -> str:
        """The finding as a row of report.md's table: | # | check | status | items | finding | fix |."""
        fix = self.fix if self.status != "ok" else ""
        cells = [str(number), self.check, self.status, ", ".join(self.items) or "the check failed", self.text, fix]
        return "| " + " | ".join(markdown_cell(c) for c in cells) + " |"


def markdown_cell(text: str) -> str:
    """Text for a Markdown table cell, shown as written: HTML escaped outside `code` (`&egrave;` and `<lambda>` stay
    visible; a code span shows its text as it is), `|` escaped everywhere (GFM splits cells on it even in code)."""
    parts = re.split(r"(`[^`]*`)", text)
    shown = [part if part.startswith("`") else html.escape(part, quote=False) for part in parts]
    return "".join(shown).replace("|", "\\|")


def items_of(symptom: str) -> list[str]:
    """The items of `symptom`'s checklist: its own (`nan-1` ...) and those it shares with another."""
    prefix = symptom.replace("exploding", "grad") + "-"
    return [k for k in ITEMS if k.startswith(prefix) or k in SHARED.get(symptom, [])]


def plan(symptom: str) -> list[str]:
    """The checks for `symptom` (or every symptom: `all`), cheapest first."""
    wanted = {c for s, (_, checks) in SYMPTOMS.items() if symptom in (s, "all") for c in checks}
    return [c for c in CHECKS if c in wanted]
