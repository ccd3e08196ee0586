#!/usr/bin/env bash
# The CUDA-only gates (marked `gpu`), for a machine with an NVIDIA GPU. Budget: under 8 minutes.
# On a machine without CUDA every one of them is reported as skipped, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; print('CUDA:', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
exec pytest -m gpu "$@"
