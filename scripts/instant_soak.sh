#!/usr/bin/env bash
# Programs that end at once, 100 launches under each launcher (50 exiting 0, 50 exiting 1;
# --launcher node on 2 hosts, torchrun on 1): every verdict, exit code and log byte checked,
# as CI's few launches of tests/integration/test_instant.py check them. About 10 minutes idle.
# Usage: bash scripts/instant_soak.sh [PAIRS]   (PAIRS: launches of each exit code, 50;
# in the project's venv, as .ci/run is)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
INSTANT_LAUNCHES=${1:-50} exec python -m pytest -p no:xdist -q tests/integration/test_instant.py
