"""Muon for the hidden weight matrices, AdamW for everything else: `optim.name = "muon"`.

Muon (torch.optim.Muon) steps a weight matrix along its momentum orthogonalised by a few Newton-Schulz iterations
(every singular value pushed towards 1), so that no direction of the update dominates: the optimizer of the
modded-nanogpt speedrun records and of nanochat. It is defined for matrices only, so it takes the 2-D weights of the
model's blocks (its hidden layers) at `optim.muon_lr`; the embeddings, the output layer, biases and norm gains stay
with AdamW at `optim.lr`. The two are one `torch.optim.Optimizer` to the rest of the template (the LR schedule, the
gradient scaler, the checkpoint): its param groups and state are theirs.

torch's Muon runs the iteration in bf16, which GPUs multiply fast; a CPU without native bf16 (AVX2-only) multiplies
bf16 some 25x slower than fp32, so on the CPU the iteration runs in fp32 (`Fp32Muon`), the same update. The choice
depends on the device type only, never on a measurement, so that the same config on the same device type is the
same run.
"""
import math

import torch

from .config import ConfigError, Optim


def orthogonalise_fp32(update: torch.Tensor, ns_coefficients: tuple, ns_steps: int, eps: float) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration (torch's coefficients and steps), computed in fp32 instead of bf16: it
    pushes every singular value of the update towards 1."""
    a, b, c = ns_coefficients
    tall = update.size(0) > update.size(1)
    x = update.float().T if tall else update.float()
    x = x / x.norm().clamp(min=eps)  # spectral norm at most 1
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def loss_of(closure) -> torch.Tensor | None:
    """What a step's closure returns (torch.optim's protocol: it recomputes the loss, with gradients on)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class Fp32Muon(torch.optim.Muon):
    """torch.optim.Muon's update with the Newton-Schulz iteration in fp32: its settings, checks and state
    (`momentum_buffer`), and its step as torch documents it (momentum, Nesterov, orthogonalise, decoupled weight decay,
    the lr scaled as adjust_lr_fn "original")."""

    def __init__(self, params, **settings):
        if settings.get("adjust_lr_fn") not in (None, "original"):
            raise ValueError("Fp32Muon scales the lr as adjust_lr_fn='original' only")
        super().__init__(params, **settings)

    @torch.no_grad()
    def step(self, closure=None):
        loss = loss_of(closure)
        for group in self.param_groups:
            momentum = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = orthogonalise_fp32(update, group["ns_coefficients"], group["ns_steps"], group["eps"])
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * math.sqrt(max(1, p.size(0) / p.size(1))))
        return loss


class MuonWithAdamW(torch.optim.Optimizer):
    """Two optimizers stepped as one: its param groups are Muon's followed by AdamW's (each group keeps its own
    learning rate, so one LR schedule scales both), its state is theirs (keyed by parameter, so a checkpoint holds
    both)."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.AdamW):
        self.parts = (muon, adamw)
        super().__init__([*muon.param_groups, *adamw.param_groups], defaults={})
        self.share()

    def share(self) -> None:
        """Let each part step on this optimizer's groups and state (again after load_state_dict replaces them)."""
        muon, adamw = self.parts
        muon.param_groups = self.param_groups[:len(muon.param_groups)]
        adamw.param_groups = self.param_groups[len(muon.param_groups):]
        muon.state = adamw.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = loss_of(closure)
        for part in self.parts:
            part.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.share()


def build(model: torch.nn.Module, cfg: Optim) -> torch.optim.Optimizer:
    """optim.name's optimizer for the model's trainable parameters: AdamW, or Muon for the 2-D weights of
    model.blocks beside AdamW for the rest. Weight decay is equal per step: torch's Muon shrinks a weight by lr *
    weight_decay, so its decay is optim.weight_decay * optim.lr / optim.muon_lr and each matrix shrinks as much as
    AdamW would shrink it."""
    if cfg.name == "adamw":
        return adamw([p for p in model.parameters() if p.requires_grad], cfg)
    matrices, rest = muon_split(model)
    muon_class = Fp32Muon if matrices[0].device.type == "cpu" else torch.optim.Muon
    # adjust_lr_fn "original": a tall matrix's step scaled by sqrt(fan_out / fan_in), as Keller Jordan's Muon
    muon = muon_class(matrices, lr=cfg.muon_lr, weight_decay=cfg.weight_decay * cfg.lr / cfg.muon_lr,
                      adjust_lr_fn="original")
    return MuonWithAdamW(muon, adamw(rest, cfg))


def muon_split(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(the 2-D weights of model.blocks, for Muon; every other trainable parameter, for AdamW)."""
    matrices = [p for p in model.blocks.parameters() if p.requires_grad and p.ndim == 2]
    if not matrices:
        raise ConfigError(f"optim.name=muon: {type(model).__name__}'s blocks hold no 2-D weight matrix for Muon "
                          f"(convolutions are 4-D): use optim.name=adamw")
    chosen = {id(p) for p in matrices}
    return matrices, [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]


def adamw(params: list[torch.Tensor], cfg: Optim) -> torch.optim.AdamW:
    """AdamW with decay on weight matrices only (embeddings included, as nanoGPT): pulling biases and norm gains toward
    0 does not regularise. (A tied embedding is one parameter: it is decayed once.)"""
    return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
                              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                             lr=cfg.lr, betas=cfg.betas)
