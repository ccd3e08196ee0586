#!/usr/bin/env bash
# The CUDA-only gates (marked `gpu`), for a machine with an NVIDIA GPU. Budget: under 8 minutes, enforced: past
# GPU_GATES_LIMIT seconds (default 480) pytest gets SIGINT, prints where each hung test was, and the script exits 124.
# Results: runs/gpu_gates/record.json (every test's outcome and gates, the device, torch and CUDA versions) and
# runs/gpu_gates/gpu_gates.md, its table (scripts/gpu_results.py), written however the run ends.
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
limit="${GPU_GATES_LIMIT:-480}"
record=runs/gpu_gates/record.json
rm -f "$record"
timeout --signal=INT --kill-after=30 "$limit" pytest -m gpu --session-record "$record" "$@" || status=$?
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "gpu_gates: stopped after $limit s (the 8-minute budget): the traceback above shows the test that hung" >&2
fi
python scripts/gpu_results.py "$record" || true
exit "$status"
