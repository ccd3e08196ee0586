#!/usr/bin/env bash
# What CI runs (.github/workflows/ci.yml), and what to run before a push: install this folder as a package with its
# test extra, check that its command works, run its tests. pip's own settings apply (PIP_INDEX_URL, PIP_NO_INDEX...).
set -euo pipefail
cd "$(dirname "$0")"
python -m pip install -e ".[test]"
template-train --help > /dev/null
python -m pytest
