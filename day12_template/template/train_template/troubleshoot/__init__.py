"""The troubleshooting toolkit: each tool works on any model of this template (or your own) and a few batches.

    nonfinite.py    first_nonfinite_module: the first module whose output is NaN/inf (forward hooks)
                    backward_nan_op: the backward op that produced a NaN (torch.autograd.set_detect_anomaly)
    overfit.py      overfit_one_batch: can the model memorise 8 samples? flags frozen weights, lr 0, a cut graph
    gradients.py    gradient_norms: per-layer and global gradient norms, the exploding and the gradient-less layers
    lr_range.py     lr_range_test: exponential LR sweep, loss-vs-LR plot, a suggested learning rate
    data_checks.py  check_data: label histogram, NaN/Inf inputs, normalisation, train/test duplicates, imbalance
    text_checks.py  text_hygiene: invalid UTF-8, HTML, control characters, length, exact and near (MinHash)
                    duplicate documents, boilerplate lines, token lengths, passages of val/test also in train
    speed.py        data_vs_step: data time / step time and its band; HostSyncs: host syncs per step in a loop

The doctor (`python doctor.py --config ... --symptom nan|loss|exploding|gpu|data|all`) runs them as the four symptom
checklists and the data checklist: checklists.py (the items, the decision paths), case.py (a config's data and fresh
models), checks.py (one check per tool, each returning findings). train.py uses `NonFinite` and `nonfinite_error` to
stop on a NaN.
"""
from .data_checks import DataReport, check_data
from .gradients import GradientReport, gradient_norms
from .lr_range import LRRange, lr_range_test
from .nonfinite import BackwardNaN, NonFinite, backward_nan_op, first_nonfinite_module, nonfinite_error
from .overfit import OverfitResult, overfit_one_batch
from .speed import HostSyncs, data_vs_step
from .text_checks import TextCheck, text_hygiene

__all__ = ["BackwardNaN", "DataReport", "GradientReport", "HostSyncs", "LRRange", "NonFinite", "OverfitResult",
           "TextCheck", "backward_nan_op", "check_data", "data_vs_step", "first_nonfinite_module", "gradient_norms",
           "lr_range_test", "nonfinite_error", "overfit_one_batch", "text_hygiene"]
