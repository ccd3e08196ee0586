"""Day 6's data order: a sampler whose whole state is (epoch, seed, position), so a resumed run sees exactly the
samples the uninterrupted run would have seen, in the same order. (The train/validation split is
`sprint.data.mnist_split`.)"""
import torch
from torch.utils.data import Dataset, Sampler


class IndexedTensors(Dataset):
    """In-memory (x, y) pairs that also return their index, so every step can log which samples it saw."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i], i


class ResumableSampler(Sampler[int]):
    """Epoch e visits randperm(n) drawn from its own `Generator().manual_seed(seed + e)` — never the global RNG,
    whose state depends on everything else the run did — starting at `position`, the number of samples already
    trained on. The training loop advances `position` only after a batch is used, so DataLoader prefetching
    cannot make a resumed run skip or replay a sample."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch, self.position = n, seed, 0, 0

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter(order[self.position:].tolist())

    def __len__(self) -> int:
        return self.n - self.position

    def advance(self, k: int) -> None:
        self.position += k

    def next_epoch(self) -> None:
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"n": self.n, "seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        if state["n"] != self.n:
            raise ValueError(f"the checkpoint's sampler ran over {state['n']} samples, this run has {self.n}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
