"""The states a checkpoint holds besides the files' bookkeeping: plain (full) state dicts of the model and optimizer,
gathered from any strategy, and every RNG's state."""
import random

import numpy as np
import torch
import torch.nn as nn

from ..distributed import Dist, is_sharded


# -- RNG states, in forms torch.load(weights_only=True) accepts (no NumPy objects) ----------------------------------


def rng_state(device: torch.device) -> dict:
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                      "gauss": float(gauss)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def set_rng_state(state: dict, device: torch.device) -> None:
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


# -- state dicts ---------------------------------------------------------------------------------------------------
# One process: the plain state dicts, the optimizer's keyed by parameter name. Several: torch.distributed.checkpoint
# gathers the same format (FULL: gathered, on CPU, kept by rank 0); it is imported only then, as it is slow to load.


def _dcp():
    from torch.distributed.checkpoint import state_dict as dcp

    return dcp, dcp.StateDictOptions(full_state_dict=True, cpu_offload=True)


def _names(model: nn.Module, optimizer) -> list[str]:
    """Parameter names in the order optimizer.state_dict() numbers the parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def model_state(model: nn.Module, dist: Dist) -> dict:
    """The full model state dict on CPU, on rank 0 (a collective under FSDP: every rank calls it)."""
    if not dist.enabled:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    dcp, full = _dcp()
    return dcp.get_model_state_dict(model, options=full)


def optimizer_state(model: nn.Module, optimizer, dist: Dist) -> dict:
    """The full optimizer state keyed by parameter *names* (not positions), so it loads into any strategy."""
    if not dist.enabled:
        sd, names = optimizer.state_dict(), _names(model, optimizer)
        return {"state": {names[i]: {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in s.items()}
                          for i, s in sd["state"].items()},
                "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in sd["param_groups"]]}
    dcp, full = _dcp()
    return dcp.get_optimizer_state_dict(model, optimizer, options=full)


def load_model_state(model: nn.Module, state: dict) -> None:
    """A full state dict into the model, or into its shards."""
    if not is_sharded(model):
        model.load_state_dict(state)
        return
    dcp, _ = _dcp()
    dcp.set_model_state_dict(model, state, options=dcp.StateDictOptions(full_state_dict=True))


def load_optimizer_state(model: nn.Module, optimizer, state: dict, dist: Dist) -> None:
    if not dist.enabled:
        index = {n: i for i, n in enumerate(_names(model, optimizer))}
        optimizer.load_state_dict({"state": {index[n]: s for n, s in state["state"].items()},
                                   "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                                                    for g in state["param_groups"]]})
        return
    dcp, _ = _dcp()
    dcp.set_optimizer_state_dict(model, optimizer, state, options=dcp.StateDictOptions(full_state_dict=True))


def strip_prefixes(state: dict) -> dict:
    """Keys as a plain model names them: drops the `module.` (DDP) and `_orig_mod.` (torch.compile) prefixes."""
    out = {}
    for key, value in state.items():
        while key.startswith(("module.", "_orig_mod.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out
