#!/usr/bin/env bash
# The CUDA-only gates (marked `gpu`), for a machine with an NVIDIA GPU. Budget: under 8 minutes.
# Exit code: pytest's own where torch sees a CUDA device. Where it sees none, nothing runs and the script exits 77
# (the "skipped" code of automake-style test harnesses), so "nothing ran" never reads as a pass.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
python -c "
import sys, torch
if not torch.cuda.is_available():
    sys.exit(77)
print('CUDA:', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| CUDA runtime', torch.version.cuda)
" || status=$?
if [ "$status" -eq 77 ]; then
    echo "gpu_gates: torch.cuda.is_available() is False on this machine: NOTHING RAN (exit 77)." >&2
    echo "gpu_gates: run it on a machine with an NVIDIA GPU, its driver and the CUDA build of torch." >&2
    exit 77
elif [ "$status" -ne 0 ]; then
    echo "gpu_gates: could not ask torch about CUDA (exit $status)" >&2
    exit "$status"
fi
exec pytest -m gpu "$@"
