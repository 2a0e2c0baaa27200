#!/usr/bin/env bash
# The test command, shared by the README and CI (.ci/run): run from the repository root.
# Slurm tests start the local cluster (scripts/slurm-local.sh) when it is not up, and skip
# if it cannot come up, unless HCP_TUNE_REQUIRE_SLURM=1 (CI), which makes them fail.
# HCP_TUNE_VENV names another venv (CI's Python 3.12 lane: .venv312).
set -euo pipefail
cd "$(dirname "$0")/.."
"${HCP_TUNE_VENV:-.venv}/bin/python" -m pytest -q "$@"
