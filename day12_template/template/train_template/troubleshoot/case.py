"""What the doctor's checks work on: a config's data (faults applied), its device, and fresh models on demand."""
import dataclasses
import itertools
from pathlib import Path

import torch

from .. import checkpoint, config, data, distributed, models, optimizers, tasks, train
from .faults import Faults


class Case:
    """What the checks work on: the config, its data (faults applied), the device, and fresh models on demand."""

    def __init__(self, cfg: config.Config, faults: Faults, out: Path):
        self.cfg, self.faults, self.out = cfg, faults, out
        try:
            self.device = distributed.pick_device(cfg.run.device, 0)
        except ValueError as exc:
            raise config.ConfigError(str(exc)) from None
        self.splits = faults.data(data.build(cfg.data, cfg.run.seed))
        self.task = tasks.for_dataset(cfg.data.dataset, self.splits.info)
        self.weights = weights_of(cfg)
        self.micro = min(cfg.train.batch_size // cfg.train.grad_accum, len(self.splits.train))
        self.autocast = models.autocast(cfg.train, self.device.type)
        # A fault naming a missing module, or a checkpoint that does not fit, fails here; and the first optimizer
        # pays torch's one-time imports here, not inside the first check.
        self.optimizer(self.model())

    def model(self, dropout: bool = True) -> torch.nn.Module:
        """The run's model with its initial weights (or the checkpoint's); dropout=False builds it with the model
        table's dropout at 0, for the checks that must see the model learn without regularisation."""
        model_cfg = self.cfg.model if dropout else without_dropout(self.cfg.model)
        torch.manual_seed(self.cfg.run.seed)  # every check starts with the same dropout masks ...
        model = models.build(model_cfg, self.splits.info, self.cfg.run.seed)  # ... and the run's initial weights
        if self.weights:
            checkpoint.load_weights(model, self.weights)
        model = model.to(self.device).train()
        self.faults.attach(model, model, train.Progress())
        return model

    def optimizer(self, model) -> torch.optim.Optimizer:
        return optimizers.build(model, self.cfg.optim)

    def batches(self, size: int = 0):
        """Training batches in a fixed shuffled order, endlessly, on the device."""
        size = min(size or self.micro, len(self.splits.train))
        order = torch.randperm(len(self.splits.train), generator=torch.Generator().manual_seed(self.cfg.run.seed))
        for epoch in itertools.count():
            for i in range(0, len(order) - size + 1, size):
                x, y = self.splits.train.batch(epoch, order[i:i + size])
                yield x.to(self.device), y.to(self.device)


def weights_of(cfg: config.Config) -> Path | None:
    """The weights to examine: checkpoint.init_from, or the checkpoint checkpoint.resume would continue from."""
    if cfg.checkpoint.init_from:
        return Path(cfg.checkpoint.init_from)
    if cfg.checkpoint.resume == "auto":
        last = Path(cfg.run.out_dir) / "last.pt"
        return last if last.exists() else None
    return Path(cfg.checkpoint.resume) if cfg.checkpoint.resume else None


def without_dropout(model_cfg: config.Model) -> config.Model:
    """The [model] section with the chosen model's table at dropout 0 (unchanged if the table has no dropout)."""
    table = getattr(model_cfg, model_cfg.name)
    if not getattr(table, "dropout", 0):
        return model_cfg
    return dataclasses.replace(model_cfg, tables={**model_cfg.tables,
                                                  model_cfg.name: dataclasses.replace(table, dropout=0.0)})
