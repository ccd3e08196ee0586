"""Pick the best available device: CUDA, then Apple MPS, then CPU."""
import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """Return `prefer` if given (e.g. "cpu" to force it), else cuda -> mps -> cpu."""
    if prefer:
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
