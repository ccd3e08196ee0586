"""Pick the device: CUDA, then Apple MPS, then CPU — or the one asked for, if this machine has it."""
import torch

AVAILABLE = {"cpu": lambda: True, "cuda": lambda: torch.cuda.is_available(),
             "mps": lambda: torch.backends.mps.is_available()}
# a CUDA device this machine lacks, for the gates that --device refuses it before any work: on a GPU host plain
# "cuda" is present (and would start real training), so they name an index no host has
ABSENT_CUDA = "cuda:99" if torch.cuda.is_available() else "cuda"


def pick_device(prefer: str | None = None) -> torch.device:
    """`prefer` ("cpu", "cuda", "cuda:1", "mps") if this machine has it, else cuda -> mps -> cpu when not given.

    An unknown or absent device raises ValueError with one line saying what this machine offers.
    """
    if not prefer:
        return torch.device(next(name for name in ("cuda", "mps", "cpu") if AVAILABLE[name]()))
    kind = prefer.split(":")[0]
    offered = ", ".join(name for name, present in AVAILABLE.items() if present())
    if kind not in AVAILABLE:
        raise ValueError(f"--device {prefer!r} is not a device; this machine offers: {offered}")
    if not AVAILABLE[kind]():
        raise ValueError(f"--device {prefer}: not available on this machine (it offers: {offered})")
    device = torch.device(prefer)
    if kind == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {prefer}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device
