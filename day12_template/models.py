"""Models, chosen by `model.name`. Adding one is one function: `def my_net(cfg, info) -> nn.Module`, registered in
BUILDERS (and its name in config.MODELS).

A model returns logits of shape (batch, info.num_classes). Put its repeated layers in `self.blocks`: they become
the units of activation checkpointing (`model.activation_checkpointing`) and of FSDP sharding (`fully_shard`).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class Blocks(nn.Module):
    """Runs `self.blocks` in order, each one recomputed in backward when checkpointing is on (training only)."""

    checkpointing = False

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)  # keeps only x; the block's insides are recomputed
            else:
                x = block(x)
        return x


class MLP(Blocks):
    """Day 4's network: flatten -> [Linear -> LayerNorm -> GELU -> Dropout] x depth -> Linear (logits)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 512, depth: int = 1, dropout: float = 0.1):
        super().__init__()
        widths = [in_features] + [hidden] * depth
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.LayerNorm(b), nn.GELU(), nn.Dropout(dropout))
            for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(hidden, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Linear):  # small random weights break the symmetry between units
                nn.init.trunc_normal_(m.weight, std=0.02, a=-0.04, b=0.04)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.run_blocks(x.flatten(1)))


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus a shortcut (identity, or 1x1 conv + BN when the shape changes)."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride, padding=1, bias=False)  # BN's shift replaces a bias
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, 1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride, bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(Blocks):
    """Day 9's network: a stride-2 stem, one BasicBlock per stage (stride 2 after the first), global average pool."""

    def __init__(self, in_channels: int, num_classes: int, widths=(16, 32, 64)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        chans = [widths[0], *widths]
        self.blocks = nn.ModuleList(BasicBlock(a, b, stride=1 if i == 0 else 2)
                                    for i, (a, b) in enumerate(zip(chans, chans[1:])))
        self.head = nn.Linear(widths[-1], num_classes)

    def forward(self, x):
        return self.head(self.run_blocks(self.stem(x)).mean(dim=(2, 3)))


def mlp(cfg, info) -> nn.Module:
    return MLP(info.channels * info.size * info.size, info.num_classes, cfg.hidden, cfg.depth, cfg.dropout)


def resnet(cfg, info) -> nn.Module:
    return ResNet(info.channels, info.num_classes, cfg.widths)


BUILDERS = {"mlp": mlp, "resnet": resnet}


def build(cfg, info) -> nn.Module:
    """The model named by `cfg.name`, sized for the data (`info`: channels, size, num_classes)."""
    model = BUILDERS[cfg.name](cfg, info)
    model.checkpointing = cfg.activation_checkpointing
    return model


def autocast(train, device_type: str):
    """A factory of autocast contexts for `train.amp` / `train.amp_dtype` (a no-op context when amp is off)."""
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[train.amp_dtype]
    return lambda: torch.autocast(device_type, dtype=dtype, enabled=train.amp)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
