"""The curriculum's error cheat sheet, row by row: code that raises the real message, and the code that fixes it.

Each `Entry` pairs a broken snippet, which must raise (or warn) with a message matching `pattern`, with a fixed
snippet, which must run without error or warning and returns one line saying what it computed. `gallery.py` runs
them, `test_gallery.py` asserts them, and `README.md` is generated from them: the page shows the code that ran and
the message it gave. Rows that exist only on CUDA have a `gpu` entry and, where one exists, a CPU analogue.
"""
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, TensorDataset

from sprint.device import pick_device

# How an entry reproduces its row.
SAME = "same message on CPU"
CPU_FORM = "same cause on CPU, CPU's message"
ANALOGUE = "CPU analogue of a CUDA-only error"
CUDA = "on CUDA (pytest -m gpu)"
ON_CPU = (SAME, CPU_FORM)  # the kinds that count as "reproduced on CPU"


@dataclass(frozen=True)
class Entry:
    row: int | None  # number in the cheat sheet; None: an error the issue asked for that the sheet does not list
    title: str  # the sheet's message, short
    how: str  # SAME, CPU_FORM, ANALOGUE or CUDA
    pattern: str  # regular expression the caught message must contain
    cause: str
    fix: str
    broken: Callable[[], object]
    fixed: Callable[[], str]
    helpers: tuple = ()  # classes or functions the snippets use, shown with them
    needs: str = ""  # "cuda", "no-cuda" or "fork": skipped with the reason where absent
    fresh_process: bool = False  # errors that poison the CUDA context run in a child interpreter

    @property
    def key(self) -> str:
        return self.broken.__name__.removesuffix("_broken")


ENTRIES: list[Entry] = []  # in cheat-sheet order; each appended after its snippets


# --- 1. out of memory -------------------------------------------------------------------------------------------

def oom_broken():
    batch, heads, seq = 8, 16, 2**20  # attention scores for 1M-token sequences: batch x heads x seq x seq floats
    return torch.empty(batch, heads, seq, seq)  # 2**49 bytes


def oom_fixed():
    heads, seq, budget = 16, 512, 64 * 2**20  # the bytes this step may spend on scores
    batch = budget // (heads * seq * seq * 4)  # size the batch from the estimate, before allocating
    scores = torch.empty(batch, heads, seq, seq)
    return f"batch {batch}: scores take {scores.nbytes // 2**20} MiB"


ENTRIES.append(Entry(
    row=1, how=CPU_FORM,
    title="CUDA out of memory. Tried to allocate X GiB",
    pattern=r"DefaultCPUAllocator: can't allocate memory: you tried to allocate 562949953421312 bytes",
    cause="Activations, parameters and optimizer state of one step need more memory than the device has. The CPU "
          "allocator reports it like CUDA's caching allocator, in its own words.",
    fix="Estimate before allocating (Day 10's calculator), then: smaller batch, bf16, gradient checkpointing, "
        "LoRA. `torch.cuda.max_memory_allocated()` finds the peak; `empty_cache()` only while investigating.",
    broken=oom_broken, fixed=oom_fixed))


def cuda_oom_broken():
    return torch.empty(2**40, device="cuda")  # 4 TiB of float32: torch writes sizes in GiB at most (4096.00 GiB)


def cuda_oom_fixed():
    x = torch.empty(2**28, device="cuda")
    return f"{x.nbytes // 2**30} GiB allocated, peak {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB"


ENTRIES.append(Entry(
    row=1, how=CUDA,
    title="CUDA out of memory. Tried to allocate X GiB",
    pattern=r"CUDA out of memory\. Tried to allocate 4096\.00 GiB",
    cause="The request exceeds what the caching allocator can get from the GPU.",
    fix="As above.",
    broken=cuda_oom_broken, fixed=cuda_oom_fixed, needs="cuda"))


# --- 2. tensors on different devices ----------------------------------------------------------------------------

def device_broken():
    with torch.device("meta"):  # built without memory, e.g. to count parameters of a big model
        model = nn.Linear(784, 10)
    return model(torch.randn(2, 784))  # the batch is on the CPU


def device_fixed():
    with torch.device("meta"):
        model = nn.Linear(784, 10)
    x = torch.randn(2, 784)
    model.to_empty(device=x.device)  # real (uninitialised) storage on the batch's device...
    model.reset_parameters()  # ...then initialise it, or load_state_dict
    return f"logits {tuple(model(x).shape)} on {model.weight.device}"


ENTRIES.append(Entry(
    row=2, how=CPU_FORM,
    title="Expected all tensors to be on the same device",
    pattern=r"Tensor on device meta is not on the expected device cpu!",
    cause="The model's parameters live on one device and the input on another. Here the model was built on "
          "`meta` (shapes only, no memory); on a GPU machine it is a model on `cuda` and a batch left on `cpu`.",
    fix="Move model and data with the same `.to(device)`; create new tensors with `device=`; a `meta` model "
        "needs `to_empty(device=...)` and then real weights.",
    broken=device_broken, fixed=device_fixed))


def cuda_device_broken():
    model = nn.Linear(784, 10).to("cuda")
    return model(torch.randn(2, 784))  # the batch stayed on the CPU


def cuda_device_fixed():
    device = torch.device("cuda")
    model = nn.Linear(784, 10).to(device)
    return f"logits on {model(torch.randn(2, 784, device=device)).device}"


ENTRIES.append(Entry(
    row=2, how=CUDA,
    title="Expected all tensors to be on the same device",
    pattern=r"Expected all tensors to be on the same device",
    cause="The model is on `cuda`, the batch on `cpu`.",
    fix="`x = x.to(device)` next to `model.to(device)`.",
    broken=cuda_device_broken, fixed=cuda_device_fixed, needs="cuda"))


# --- 3. expected scalar type Half but found Float ---------------------------------------------------------------

class QueryPool(nn.Module):
    """Attention pooling with a learned query: one vector per sequence."""

    def __init__(self, dim: int):
        super().__init__()
        self.query = nn.Parameter(torch.randn(1, 1, dim))

    def forward(self, x):  # x: (batch, tokens, dim)
        scores = torch.bmm(self.query.expand(x.size(0), -1, -1), x.transpose(1, 2))
        return (scores.softmax(-1) @ x).squeeze(1)


def half_broken():
    model = QueryPool(8).half()  # weights made fp16 by hand...
    return model(torch.randn(2, 5, 8))  # ...the input is still fp32


def half_fixed():
    model = QueryPool(8)  # fp32 weights; autocast chooses the precision op by op
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pooled = model(torch.randn(2, 5, 8))
    return f"pooled {tuple(pooled.shape)} in {pooled.dtype}"


ENTRIES.append(Entry(
    row=3, how=SAME,
    title="expected scalar type Half but found Float",
    pattern=r"expected scalar type Half but found Float",
    cause="The model was converted with `.half()` by hand but its input is still float32; `torch.bmm` needs both "
          "operands in one dtype.",
    fix="Keep fp32 weights and use `torch.autocast` (it casts per op), or convert both sides.",
    broken=half_broken, fixed=half_fixed, helpers=(QueryPool,)))


# --- 4. element 0 of tensors does not require grad --------------------------------------------------------------

def no_grad_fn_broken():
    model, x, y = nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)
    with torch.no_grad():  # e.g. a validation helper reused for the training loss
        loss = F.mse_loss(model(x), y)
    loss.backward()


def no_grad_fn_fixed():
    model, x, y = nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)
    loss = F.mse_loss(model(x), y)
    assert loss.requires_grad, "the loss must come from the model's output, with autograd on"
    loss.backward()
    return f"weight.grad has shape {tuple(model.weight.grad.shape)}"


ENTRIES.append(Entry(
    row=4, how=SAME,
    title="element 0 of tensors does not require grad and does not have a grad_fn",
    pattern=r"element 0 of tensors does not require grad and does not have a grad_fn",
    cause="The chain from parameters to loss is cut: computed under `no_grad`, through `.detach()`, or rebuilt "
          "from NumPy.",
    fix="Check `loss.requires_grad` and that the loss really comes from the model's output.",
    broken=no_grad_fn_broken, fixed=no_grad_fn_fixed))


# --- 5. backward through the graph a second time ----------------------------------------------------------------

def backward_twice_broken():
    encoder, heads = nn.Linear(4, 8), [nn.Linear(8, 1), nn.Linear(8, 1)]
    features = torch.tanh(encoder(torch.randn(16, 4)))  # shared by two task heads
    for head in heads:
        head(features).mean().backward()  # the second backward runs through the encoder's freed graph again


def backward_twice_fixed():
    encoder, heads = nn.Linear(4, 8), [nn.Linear(8, 1), nn.Linear(8, 1)]
    features = torch.tanh(encoder(torch.randn(16, 4)))
    loss = sum(head(features).mean() for head in heads)  # one loss, one backward
    loss.backward()
    return f"encoder grad from both heads: norm {encoder.weight.grad.norm():.3f}"


ENTRIES.append(Entry(
    row=5, how=SAME,
    title="Trying to backward through the graph a second time",
    pattern=r"Trying to backward through the graph a second time",
    cause="Backward frees the tensors the graph saved; a second backward through the same part of the graph has "
          "nothing to use. Here two losses share the encoder's graph.",
    fix="Add the losses and call backward once; `retain_graph=True` only where a second pass is really needed "
        "(GANs, second-order gradients).",
    broken=backward_twice_broken, fixed=backward_twice_fixed))


# --- 6. modified by an inplace operation ------------------------------------------------------------------------

def inplace_broken():
    x = torch.randn(4, 8, requires_grad=True)
    h = torch.sigmoid(x)  # sigmoid keeps its output for backward
    h += x  # a residual added in place overwrites it
    h.sum().backward()


def inplace_fixed():
    x = torch.randn(4, 8, requires_grad=True)
    h = torch.sigmoid(x)
    h = h + x  # a new tensor: sigmoid's output stays intact
    h.sum().backward()
    return f"x.grad has shape {tuple(x.grad.shape)}"


ENTRIES.append(Entry(
    row=6, how=SAME,
    title="one of the variables needed for gradient computation has been modified by an inplace operation",
    pattern=r"one of the variables needed for gradient computation has been modified by an inplace operation",
    cause="An in-place op (`+=`, `relu(inplace=True)`) overwrote a tensor that backward needs (here sigmoid's "
          "output); autograd notices the version counter changed.",
    fix="Write `h = h + x`; be careful with `inplace=True` next to residual connections.",
    broken=inplace_broken, fixed=inplace_fixed))


# --- 7. the size of tensor a must match the size of tensor b ----------------------------------------------------

def size_broken():
    logits, labels = torch.randn(32, 10), torch.randint(0, 10, (32,))
    class_weight = torch.rand(10)
    return (F.cross_entropy(logits, labels, reduction="none") * class_weight).mean()  # (32,) * (10,)


def size_fixed():
    logits, labels = torch.randn(32, 10), torch.randint(0, 10, (32,))
    class_weight = torch.rand(10)
    per_sample = F.cross_entropy(logits, labels, reduction="none")
    loss = (per_sample * class_weight[labels]).mean()  # each sample's own class weight: (32,) * (32,)
    return f"weighted loss {loss:.3f}"


ENTRIES.append(Entry(
    row=7, how=SAME,
    title="The size of tensor a (N) must match the size of tensor b (M)",
    pattern=r"The size of tensor a \(32\) must match the size of tensor b \(10\) at non-singleton dimension 0",
    cause="The shapes cannot broadcast: per-sample losses (32,) times per-class weights (10,).",
    fix="Print both shapes; index the per-class tensor by label (or pass `weight=` to the loss). "
        "Watch `(N,)` against `(N, 1)`.",
    broken=size_broken, fixed=size_fixed))


# --- 8. mat1 and mat2 shapes cannot be multiplied ---------------------------------------------------------------

def mat_shapes_broken():
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.Linear(8 * 28 * 28, 10))  # a 3x3 conv gives 26x26
    return model(torch.randn(2, 1, 28, 28))


def mat_shapes_fixed():
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.Flatten(), nn.Linear(8 * 26 * 26, 10))
    return f"logits {tuple(model(torch.randn(2, 1, 28, 28)).shape)}"


ENTRIES.append(Entry(
    row=8, how=SAME,
    title="mat1 and mat2 shapes cannot be multiplied",
    pattern=r"mat1 and mat2 shapes cannot be multiplied \(2x5408 and 6272x10\)",
    cause="A `Linear` layer's `in_features` differs from what reaches it, most often after `Flatten`.",
    fix="Print shapes layer by layer in `forward`; `in_features` must equal the flattened size "
        "(or use `nn.LazyLinear`).",
    broken=mat_shapes_broken, fixed=mat_shapes_fixed))


# --- 9. conv input channels -------------------------------------------------------------------------------------

def channels_broken():
    stem = nn.Conv2d(3, 16, 3)  # an RGB stem (CIFAR)...
    return stem(torch.randn(2, 1, 28, 28))  # ...fed grey MNIST: 1 channel


def channels_fixed():
    stem = nn.Conv2d(1, 16, 3)  # in_channels = the data's channels: MNIST 1, CIFAR 3
    return f"features {tuple(stem(torch.randn(2, 1, 28, 28)).shape)}"


ENTRIES.append(Entry(
    row=9, how=SAME,
    title="Given groups=1, weight of size [16,3,3,3], expected input to have 3 channels",
    pattern=r"Given groups=1, weight of size \[16, 3, 3, 3\], expected input\[2, 1, 28, 28\] to have 3 channels, "
            r"but got 1 channels instead",
    cause="A grey image went into an RGB convolution (or the reverse).",
    fix="Match `in_channels` to the data: MNIST 1, CIFAR 3; `ToTensor()` does not change the channel count.",
    broken=channels_broken, fixed=channels_fixed))


# --- 10. BatchNorm with one sample ------------------------------------------------------------------------------

def batchnorm_one_broken():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).train()
    data = TensorDataset(torch.randn(9, 4), torch.randint(0, 2, (9,)))
    for x, y in DataLoader(data, batch_size=4):  # batches of 4, 4 and 1
        F.cross_entropy(model(x), y).backward()


def batchnorm_one_fixed():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).train()
    data = TensorDataset(torch.randn(9, 4), torch.randint(0, 2, (9,)))
    sizes = []
    for x, y in DataLoader(data, batch_size=4, drop_last=True):  # the short last batch is skipped
        F.cross_entropy(model(x), y).backward()
        sizes.append(len(x))
    return f"trained on batches of {sizes}"


ENTRIES.append(Entry(
    row=10, how=SAME,
    title="Expected more than 1 value per channel when training",
    pattern=r"Expected more than 1 value per channel when training",
    cause="BatchNorm in training mode got a batch of one sample (9 samples in batches of 4 leave 1), so it has "
          "no variance to normalise with.",
    fix="`drop_last=True` for training, or skip the short batch, or use GroupNorm/LayerNorm.",
    broken=batchnorm_one_broken, fixed=batchnorm_one_fixed))


# --- 11. DataLoader worker killed / crashed ---------------------------------------------------------------------

class OOMKilled(Dataset):
    """A dataset whose worker dies the way the kernel's OOM killer ends it: SIGKILL, no Python traceback."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer sends when the worker's memory runs out


class Lazy(Dataset):
    """Holds no data: reads one sample per call (from disk in real code), so each worker stays small."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i))


def worker_killed_broken():
    # fork: workers start in milliseconds (Python 3.14 defaults to forkserver on Linux)
    return list(DataLoader(OOMKilled(), batch_size=4, num_workers=1, multiprocessing_context="fork"))


def worker_killed_fixed():
    batches = list(DataLoader(Lazy(), batch_size=4, num_workers=1, multiprocessing_context="fork"))
    return f"{len(batches)} batches from a lazily read dataset"


ENTRIES.append(Entry(
    row=11, how=SAME,
    title="DataLoader worker (pid xxx) is killed by signal: Killed",
    pattern=r"DataLoader worker \(pid \d+\) is killed by signal: Killed",
    cause="The kernel's OOM killer (or a too-small /dev/shm) killed a worker; SIGKILL leaves no traceback. Here "
          "the worker sends itself the same signal, so the machine's memory is not really exhausted.",
    fix="Fewer workers; read samples in `__getitem__` instead of preloading in the parent (every worker "
        "inherits the parent's memory); in Docker `--shm-size=8g`.",
    broken=worker_killed_broken, fixed=worker_killed_fixed, helpers=(OOMKilled, Lazy), needs="fork"))


class CsvRows(Dataset):
    """Rows of "label,value"; one label is corrupt."""

    rows = ["3,0.5", "7,0.25", "n/a,0.75", "1,1.0"]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        label, value = self.rows[i].split(",")
        return int(label), float(value)


def worker_exception_broken():
    return list(DataLoader(CsvRows(), batch_size=2, num_workers=1, multiprocessing_context="fork"))


def worker_exception_fixed():
    data = CsvRows()
    bad = [row for row in data.rows if not row.split(",")[0].isdigit()]  # validate once, up front, by name
    data.rows = [row for row in data.rows if row not in bad]
    batches = list(DataLoader(data, batch_size=2, num_workers=1, multiprocessing_context="fork"))
    return f"{len(batches)} batches; dropped {len(bad)} corrupt row(s): {bad}"


ENTRIES.append(Entry(
    row=None, how=SAME,
    title="Caught ValueError in DataLoader worker process 0",
    pattern=r"Caught ValueError in DataLoader worker process 0[\s\S]*invalid literal for int\(\) with base 10: 'n/a'",
    cause="`__getitem__` raised inside a worker; the DataLoader re-raises it in the main process with the "
          "worker's traceback as text.",
    fix="Read the 'Original Traceback'; debug with `num_workers=0` for a direct traceback; validate the data "
        "once, up front, naming the bad records.",
    broken=worker_exception_broken, fixed=worker_exception_fixed, helpers=(CsvRows,), needs="fork"))


# --- 12. Cannot re-initialize CUDA in forked subprocess ---------------------------------------------------------

class OnGpu(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i), device="cuda")  # CUDA work inside a worker


def cuda_fork_broken():
    torch.zeros(1, device="cuda")  # the parent has initialised CUDA (any model.cuda() does)
    return list(DataLoader(OnGpu(), batch_size=2, num_workers=1, multiprocessing_context="fork"))


def cuda_fork_fixed():
    torch.zeros(1, device="cuda")
    loader = DataLoader(Lazy(), batch_size=4, num_workers=1, multiprocessing_context="fork", pin_memory=True)
    batches = [batch.to("cuda", non_blocking=True) for batch in loader]  # workers build CPU batches only
    return f"{len(batches)} batches moved to {batches[0].device} in the main process"


ENTRIES.append(Entry(
    row=12, how=CUDA,
    title="Cannot re-initialize CUDA in forked subprocess",
    pattern=r"Cannot re-initialize CUDA in forked subprocess",
    cause="The parent initialised CUDA, then forked workers that touch CUDA; a CUDA context does not survive fork.",
    fix="Never use CUDA in a `Dataset`; move batches to the GPU in the main process (`pin_memory=True`, "
        "`non_blocking=True`), or start workers with `spawn`.",
    broken=cuda_fork_broken, fixed=cuda_fork_fixed, helpers=(OnGpu, Lazy), needs="cuda"))


def stack_batch(batch):
    return torch.stack(batch)


def spawn_lambda_broken():
    loader = DataLoader(Lazy(), batch_size=4, num_workers=1, multiprocessing_context="spawn",
                        collate_fn=lambda batch: torch.stack(batch))  # spawn pickles it for the new process
    return list(loader)


def spawn_lambda_fixed():
    loader = DataLoader(Lazy(), batch_size=4, num_workers=1, multiprocessing_context="spawn",
                        collate_fn=stack_batch)  # a module-level function pickles by name
    return f"{len(list(loader))} batches from a spawned worker"


ENTRIES.append(Entry(
    row=12, how=ANALOGUE,
    title="Cannot re-initialize CUDA in forked subprocess",
    pattern=r"Can't pickle local object",
    cause="The `spawn` start method (the fix for row 12, and the default on macOS and Windows) starts a fresh "
          "interpreter and sends it the dataset and `collate_fn` by pickle; a lambda or a local function cannot "
          "be pickled.",
    fix="Module-level functions and classes (and the `if __name__ == \"__main__\":` guard).",
    broken=spawn_lambda_broken, fixed=spawn_lambda_fixed, helpers=(Lazy, stack_batch)))


# --- 13. stack expects each tensor to be equal size -------------------------------------------------------------

def stack_broken():
    sentences = [torch.tensor([5, 8, 2]), torch.tensor([7, 1, 9, 4, 6])]  # token ids of different lengths
    return next(iter(DataLoader(sentences, batch_size=2)))


def pad_collate(batch):
    return pad_sequence(batch, batch_first=True), torch.tensor([len(s) for s in batch])


def stack_fixed():
    sentences = [torch.tensor([5, 8, 2]), torch.tensor([7, 1, 9, 4, 6])]
    padded, lengths = next(iter(DataLoader(sentences, batch_size=2, collate_fn=pad_collate)))
    return f"padded {tuple(padded.shape)}, lengths {lengths.tolist()}"


ENTRIES.append(Entry(
    row=13, how=SAME,
    title="stack expects each tensor to be equal size",
    pattern=r"stack expects each tensor to be equal size, but got \[3\] at entry 0 and \[5\] at entry 1",
    cause="Sequences of different lengths reached the default `collate_fn`, which stacks.",
    fix="A `collate_fn` that pads (`pad_sequence`) and returns the lengths.",
    broken=stack_broken, fixed=stack_fixed, helpers=(pad_collate,)))


# --- 14. cuDNN error --------------------------------------------------------------------------------------------

def fill_gpu_memory():
    """Take every free byte of the GPU, as another job or a leak does; returns the tensors that hold it."""
    hog = []
    for size in (2**30, 2**26, 2**20):  # the last, 1 MiB, fills torch's small-block pool too
        while True:
            try:
                hog.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                break
    return hog


def cudnn_broken():
    conv, x = nn.Conv2d(3, 16, 3).cuda(), torch.randn(8, 3, 32, 32, device="cuda")
    room = torch.empty(2**18, device="cuda")  # 1 MiB that torch keeps cached for the conv's output...
    hog = fill_gpu_memory()
    del room  # ...but cuDNN allocates its own handle and kernels outside torch's cache
    return conv(x), hog


def cudnn_fixed():
    conv, x = nn.Conv2d(3, 16, 3).cuda(), torch.randn(8, 3, 32, 32, device="cuda")
    out = conv(x)
    with torch.backends.cudnn.flags(enabled=False):  # the sheet's test: same result without cuDNN?
        reference = conv(x)
    return f"conv runs; max difference with cuDNN off: {(out - reference).abs().max():.1e}"


ENTRIES.append(Entry(
    row=14, how=CUDA,
    title="cuDNN error: CUDNN_STATUS_NOT_INITIALIZED / CUDNN_STATUS_INTERNAL_ERROR",
    pattern=r"CUDNN_STATUS_\w+",
    cause="cuDNN could not set itself up: GPU memory already full (here), or driver, CUDA and cuDNN versions "
          "that do not match, or a GPU in a bad state.",
    fix="`nvidia-smi` for memory; restart the process; check driver against the wheel; "
        "`torch.backends.cudnn.flags(enabled=False)` tells a cuDNN problem from a model problem.",
    broken=cudnn_broken, fixed=cudnn_fixed, helpers=(fill_gpu_memory,), needs="cuda", fresh_process=True))


# --- 15. an illegal memory access -------------------------------------------------------------------------------

def illegal_access_broken():
    # A kernel writing where no memory is: the storage of `bad` points at address 0x1000, as an index far past the
    # end of a buffer does in a custom kernel.
    storage = torch._C._construct_storage_from_data_pointer(0x1000, torch.device("cuda"), 4 * 1024)
    bad = torch.empty(0, device="cuda").set_(storage, 0, (1024,), (1,))
    bad.fill_(1.0)
    torch.cuda.synchronize()  # kernels run asynchronously: the error surfaces at a later sync


def illegal_access_fixed():
    buffer = torch.empty(1024, device="cuda")  # memory the tensor owns
    buffer.fill_(1.0)
    torch.cuda.synchronize()
    return f"sum {buffer.sum().item():.0f}"


ENTRIES.append(Entry(
    row=15, how=CUDA,
    title="CUDA error: an illegal memory access was encountered",
    pattern=r"an illegal memory access was encountered",
    cause="A kernel read or wrote outside its memory (a wrong index or shape). The CUDA context is then "
          "corrupted: every later CUDA call fails.",
    fix="Restart the process; rerun with `CUDA_LAUNCH_BLOCKING=1` so the error points at the launching line; "
        "or run the same code on CPU, where the bad index fails at once (next entry).",
    broken=illegal_access_broken, fixed=illegal_access_fixed, needs="cuda", fresh_process=True))


def last_token_broken():
    hidden = torch.randn(3, 5, 8)  # (batch, padded length, dim)
    lengths = torch.tensor([5, 2, 4])
    return hidden[torch.arange(3), lengths]  # off by one: the last token sits at length - 1


def last_token_fixed():
    hidden = torch.randn(3, 5, 8)
    lengths = torch.tensor([5, 2, 4])
    last = hidden[torch.arange(3), lengths - 1]
    return f"last tokens {tuple(last.shape)}"


ENTRIES.append(Entry(
    row=15, how=ANALOGUE,
    title="CUDA error: an illegal memory access was encountered",
    pattern=r"index 5 is out of bounds for dimension 1 with size 5",
    cause="The same kind of bug on CPU: an index one past the end. CPU ops check bounds and fail on the line "
          "that did it; on CUDA an unchecked kernel faults later, somewhere else.",
    fix="Fix the index (`lengths - 1`); on CUDA, reproduce on CPU or with `CUDA_LAUNCH_BLOCKING=1`.",
    broken=last_token_broken, fixed=last_token_fixed))


# --- 16. device-side assert (class index out of range) ----------------------------------------------------------

def class_index_broken():
    logits = torch.randn(4, 10)  # classes 0..9
    labels = torch.tensor([3, 9, 10, 1])  # labels read as 1..10
    return F.cross_entropy(logits, labels)


def class_index_fixed():
    logits = torch.randn(4, 10)
    labels = torch.tensor([3, 9, 10, 1]) - 1  # map 1..10 to 0..9
    assert 0 <= labels.min() and labels.max() < logits.size(1), (labels.min(), labels.max())
    return f"loss {F.cross_entropy(logits, labels):.3f}"


ENTRIES.append(Entry(
    row=16, how=CPU_FORM,
    title="CUDA error: device-side assert triggered",
    pattern=r"Target 10 is out of bounds",
    cause="A class index outside `[0, num_classes)`: label 10 for 10 classes (labels 1-based). CPU raises at "
          "once; CUDA trips an assert inside the kernel.",
    fix="Compare `labels.min()`, `labels.max()` with the number of classes (or vocabulary size) before training.",
    broken=class_index_broken, fixed=class_index_fixed))


def cuda_class_index_broken():
    logits = torch.randn(4, 10, device="cuda")
    labels = torch.tensor([3, 9, 10, 1], device="cuda")
    return F.cross_entropy(logits, labels).item()  # .item() syncs: the assert of the kernel surfaces here


def cuda_class_index_fixed():
    logits = torch.randn(4, 10, device="cuda")
    labels = torch.tensor([3, 9, 10, 1], device="cuda") - 1
    return f"loss {F.cross_entropy(logits, labels).item():.3f}"


ENTRIES.append(Entry(
    row=16, how=CUDA,
    title="CUDA error: device-side assert triggered",
    pattern=r"device-side assert triggered",
    cause="The same label 10 on CUDA; the context is unusable afterwards.",
    fix="As above, then restart the process.",
    broken=cuda_class_index_broken, fixed=cuda_class_index_fixed, needs="cuda", fresh_process=True))


# --- 17. out of memory only in backward -------------------------------------------------------------------------

def oom_backward(numel: int):
    GiB = 2**30
    torch.cuda.set_per_process_memory_fraction(2.5 * GiB / torch.cuda.get_device_properties(0).total_memory)
    x = torch.ones(numel, device="cuda", requires_grad=True)
    y = x.exp()  # forward: x and the saved y are live
    forward = torch.cuda.memory_allocated()
    y.sum().backward()  # backward adds x.grad while y is still held
    return forward, torch.cuda.max_memory_allocated()


def cuda_oom_backward_broken():
    return oom_backward(2**28)  # 1 GiB each: forward 2 GiB fits under 2.5 GiB, backward needs 3


def cuda_oom_backward_fixed():
    forward, peak = oom_backward(2**27)  # half the batch: peak 1.5 GiB
    return f"forward {forward / 2**30:.1f} GiB, peak in backward {peak / 2**30:.1f} GiB"


ENTRIES.append(Entry(
    row=17, how=CUDA,
    title="torch.cuda.OutOfMemoryError only in backward",
    pattern=r"CUDA out of memory\. Tried to allocate 1024\.00 MiB[\s\S]*Of the allocated memory 2\.00 GiB is allocated",
    cause="Forward keeps activations; backward holds them together with the gradients it creates, so the peak "
          "is in backward. (CPU counterpart: Day 10 measures saved-for-backward bytes and the true peak.)",
    fix="Gradient checkpointing or a smaller batch; `torch.cuda.memory_summary()` shows fragmentation.",
    broken=cuda_oom_backward_broken, fixed=cuda_oom_backward_fixed, helpers=(oom_backward,), needs="cuda",
    fresh_process=True))


# --- 18. distributed: port in use, a rank that never joins, NCCL ------------------------------------------------

def port_in_use_broken():
    busy = socket.create_server(("127.0.0.1", 0))  # another job already listens on this MASTER_PORT
    port = busy.getsockname()[1]
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                                timeout=timedelta(seconds=5))
    finally:
        busy.close()


def port_in_use_fixed():
    with socket.socket() as probe:  # ask the OS for a free port (torchrun --standalone does the same)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        total = torch.ones(2)
        dist.all_reduce(total)
        return f"all_reduce over 1 rank: {total.tolist()}"
    finally:
        dist.destroy_process_group()


ENTRIES.append(Entry(
    row=18, how=SAME,
    title="NCCL error: unhandled system error / Address already in use",
    pattern=r"EADDRINUSE, message: address already in use",
    cause="The rendezvous port (`MASTER_PORT`) is taken by another job or a previous run that has not exited.",
    fix="Another `MASTER_PORT`, or let the OS choose (`torchrun --standalone`).",
    broken=port_in_use_broken, fixed=port_in_use_fixed))


def run_two_ranks(step, make_group):
    """Ranks 0 and 1 as two threads sharing an in-memory store (torchrun starts one process per rank); each runs
    `step(rank, group)`. Rank 0's error, if any, is raised here."""
    store, groups, errors = dist.HashStore(), {}, {}

    def rank_main(rank):
        try:
            groups[rank] = make_group(store, rank)
            step(rank, groups[rank])
        except Exception as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[min(errors)]


def gloo_group(store, rank):
    return dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=1))  # a timeout turns a hang into an error


def rank_missing_broken():
    def step(rank, group):
        loss = torch.tensor([float(rank)])
        if rank == 0:  # "only rank 0 logs the mean loss"...
            group.allreduce([loss]).wait()  # ...but all-reduce is collective: rank 1 never arrives

    run_two_ranks(step, gloo_group)


def rank_missing_fixed():
    logged = []

    def step(rank, group):
        loss = torch.tensor([float(rank)])
        group.allreduce([loss]).wait()  # every rank reaches the collective...
        if rank == 0:
            logged.append(loss.item() / 2)  # ...and only the logging is rank 0's

    run_two_ranks(step, gloo_group)
    return f"mean loss over 2 ranks: {logged[0]}"


ENTRIES.append(Entry(
    row=18, how=ANALOGUE,
    title="NCCL error / hang: a rank that never reaches the collective",
    pattern=r"Timed out waiting 1000ms for recv operation to complete",
    cause="A collective needs every rank; one skipped it (a rank-dependent branch), so the others wait. With "
          "NCCL that is a hang until the watchdog timeout; gloo on CPU fails the same way.",
    fix="Every rank calls every collective; make only the logging rank-dependent. Set a timeout in "
        "`init_process_group` so a hang becomes an error; `NCCL_DEBUG=INFO` shows the handshake.",
    broken=rank_missing_broken, fixed=rank_missing_fixed, helpers=(run_two_ranks, gloo_group)))


def nccl_same_gpu_broken():
    def step(rank, group):
        torch.cuda.set_device(0)  # both ranks on GPU 0
        group.allreduce([torch.ones(1, device="cuda")]).wait()

    run_two_ranks(step, lambda store, rank: dist.ProcessGroupNCCL(store, rank, 2))


def nccl_same_gpu_fixed():
    group = dist.ProcessGroupNCCL(dist.HashStore(), 0, 1)  # one rank per GPU
    total = torch.ones(1, device="cuda")
    group.allreduce([total]).wait()
    return f"all_reduce over 1 rank: {total.item()}"


ENTRIES.append(Entry(
    row=18, how=CUDA,
    title="NCCL error",
    pattern=r"NCCL error",
    cause="NCCL refuses two ranks on one GPU (a wrong `LOCAL_RANK` → device mapping).",
    fix="One rank per GPU: `torch.cuda.set_device(local_rank)`.",
    broken=nccl_same_gpu_broken, fixed=nccl_same_gpu_fixed, helpers=(run_two_ranks,), needs="cuda", fresh_process=True))


# --- 19. MSELoss target size ------------------------------------------------------------------------------------

def mse_broadcast_broken():
    model = nn.Linear(4, 1)
    x, y = torch.randn(32, 4), torch.randn(32)  # targets as a flat vector
    return F.mse_loss(model(x), y)  # (32, 1) against (32,): broadcast to (32, 32)


def mse_broadcast_fixed():
    model = nn.Linear(4, 1)
    x, y = torch.randn(32, 4), torch.randn(32)
    pred = model(x).squeeze(1)
    assert pred.shape == y.shape, (pred.shape, y.shape)
    return f"loss over {pred.numel()} pairs: {F.mse_loss(pred, y):.3f}"


ENTRIES.append(Entry(
    row=19, how=SAME,
    title="UserWarning: Using a target size that is different to the input size",
    pattern=r"Using a target size \(torch\.Size\(\[32\]\)\) that is different to the input size "
            r"\(torch\.Size\(\[32, 1\]\)\)",
    cause="`(32, 1)` predictions against `(32,)` targets broadcast to a `(32, 32)` loss: it runs, and it is wrong.",
    fix="Never ignore this warning: `squeeze`/`unsqueeze` in the right place and assert the shapes match.",
    broken=mse_broadcast_broken, fixed=mse_broadcast_fixed))


# --- 20. Torch not compiled with CUDA enabled -------------------------------------------------------------------

def no_cuda_broken():
    return torch.zeros(1, device="cuda")  # device hard-coded


def no_cuda_fixed():
    device = pick_device()  # cuda -> mps -> cpu, whatever this machine has
    return f"tensor on {torch.zeros(1, device=device).device}"


ENTRIES.append(Entry(
    row=20, how=CPU_FORM,
    title="AssertionError: Torch not compiled with CUDA enabled",
    pattern=r"Torch not compiled with CUDA enabled|Found no NVIDIA driver|No CUDA GPUs are available",
    cause="CUDA was asked for where torch cannot use it. A CPU-only wheel says 'Torch not compiled with CUDA "
          "enabled'; the CUDA wheel on a machine without a driver (this CI) says 'Found no NVIDIA driver'.",
    fix="Choose the device (`sprint.device.pick_device`: cuda → mps → cpu); for a GPU, install the CUDA wheel "
        "from the official index and check the driver (Day 1's diagnosis).",
    broken=no_cuda_broken, fixed=no_cuda_fixed, needs="no-cuda"))


# --- 21. low GPU utilisation: the loop waits for data -----------------------------------------------------------

class SlowDecode(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.002)  # decoding an image or parsing a file: 2 ms a sample
        return torch.randn(64), i % 10


def data_share(batches) -> float:
    """Share of a training loop's time spent waiting for the next batch (Day 11 measures it the same way)."""
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    waiting, start, it = 0.0, time.perf_counter(), iter(batches)
    while True:
        t0 = time.perf_counter()
        batch = next(it, None)
        waiting += time.perf_counter() - t0
        if batch is None:
            return waiting / (time.perf_counter() - start)
        x, y = batch
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def require_compute_bound(share: float) -> str:
    if share > 0.2:  # the curriculum's line: > 20% is data-bound, < 5% compute-bound
        raise RuntimeError(f"data-bound: {share:.0%} of the loop waits for data (over 20%: the GPU would idle)")
    return f"compute-bound: {share:.0%} of the loop waits for data"


def data_bound_broken():
    return require_compute_bound(data_share(DataLoader(SlowDecode(), batch_size=16)))


def data_bound_fixed():
    x, y = torch.randn(64, 64), torch.arange(64) % 10  # decoded once, kept in memory
    return require_compute_bound(data_share([(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)]))


ENTRIES.append(Entry(
    row=21, how=CPU_FORM,
    title="GPU utilisation only 20-40%",
    pattern=r"data-bound: \d+% of the loop waits for data",
    cause="The loop waits for data (here 2 ms of decoding per sample); the GPU would idle meanwhile. Measured "
          "as the share of the loop spent waiting for the next batch.",
    fix="Measure first (data wait vs step, `torch.profiler`); then decode once or in workers, bigger batches, "
        "no `.item()` syncs in the loop (Day 11).",
    broken=data_bound_broken, fixed=data_bound_fixed, helpers=(SlowDecode, data_share, require_compute_bound)))


# --- not in the sheet: a state_dict saved from a wrapped model --------------------------------------------------

def module_prefix_broken():
    state = nn.DataParallel(nn.Linear(4, 2)).state_dict()  # saved from a DDP/DataParallel wrapper
    nn.Linear(4, 2).load_state_dict(state)  # keys are "module.weight", "module.bias"


def module_prefix_fixed():
    state = nn.DataParallel(nn.Linear(4, 2)).state_dict()
    consume_prefix_in_state_dict_if_present(state, "module.")  # or save model.module.state_dict()
    result = nn.Linear(4, 2).load_state_dict(state)
    return f"loaded; missing {result.missing_keys}, unexpected {result.unexpected_keys}"


ENTRIES.append(Entry(
    row=None, how=SAME,
    title="Error(s) in loading state_dict: Missing key(s) / Unexpected key(s) \"module.\"",
    pattern=r"Missing key\(s\) in state_dict: \"weight\", \"bias\"\.\s+"
            r"Unexpected key\(s\) in state_dict: \"module\.weight\", \"module\.bias\"",
    cause="The checkpoint was saved from a DDP/DataParallel wrapper, whose keys carry `module.`.",
    fix="Save `model.module.state_dict()`, or strip the prefix on load "
        "(`consume_prefix_in_state_dict_if_present`).",
    broken=module_prefix_broken, fixed=module_prefix_fixed))
