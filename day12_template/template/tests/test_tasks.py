"""A task is one registered class: the README's regression example, registered with a toy dataset and a linear model,
trains through train.py's loop unchanged."""
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from train_template import config, data, models, tasks, train

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_code(after: str) -> str:
    """The first ```python block after `after` in the template's README."""
    text = README.read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(after):], re.S).group(1)


@dataclass
class RegressionInfo:
    features: int


@dataclass
class LinearTable:
    bias: bool = config.opt(True, "a bias term")


@dataclass
class ToyRegressionTable:
    features: int = config.opt(16, "inputs of each sample", gt=0)


def toy_regression(cfg, table: ToyRegressionTable, seed: int) -> data.Splits:
    """y = x . w + noise."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(table.features, generator=g)

    def make(n):
        x = torch.randn(n, table.features, generator=g)
        return data.TensorData(x, x @ w + 0.01 * torch.randn(n, generator=g))

    return data.Splits(make(1024), make(256), make(256), RegressionInfo(table.features))


def linear(cfg: LinearTable, info) -> nn.Module:
    return nn.Linear(info.features, 1, bias=cfg.bias)


def test_the_readme_regression_task_trains_through_the_unchanged_loop(tmp_path, monkeypatch):
    namespace = {"register": lambda name: lambda cls: cls, "F": F, "torch": torch}
    exec(readme_code("**A new task**"), namespace)
    regress = namespace["Regress"]
    regress.name = "regress"
    monkeypatch.setitem(tasks.TASKS, "regress", regress)
    monkeypatch.setitem(data.DATASETS, "toy_regression",
                        data.Registered(toy_regression, ToyRegressionTable, "regress"))
    monkeypatch.setitem(models.MODELS, "linear", models.Registered(linear, LinearTable, "regress"))
    config.fields.cache_clear()  # the field table now has [data.toy_regression] and [model.linear]
    try:
        cfg = config.load(None, ["data.dataset=toy_regression", "model.name=linear", "train.epochs=4",
                                 "train.batch_size=32", "optim.lr=3e-2", "train.progress=off",
                                 f"run.out_dir={tmp_path / 'run'}"])
        result = train.run(cfg)
    finally:
        monkeypatch.undo()
        config.fields.cache_clear()
    assert result["test_loss"] < 0.01 * 16, result  # the targets' variance is about 16 (16 unit-normal features)
