#!/usr/bin/env bash
# The test command, shared by the README and CI (.ci/run): run from the repository root.
# Slurm tests start the local cluster (scripts/slurm-local.sh) when it is not up, and skip
# if it cannot come up, unless HCP_TUNE_REQUIRE_SLURM=1 (CI), which makes them fail.
# HCP_TUNE_VENV names another venv (CI's Python 3.12 lane: .venv312).
#
#   scripts/test.sh quick [pytest args]: the tests that need no root, no apt and no SLURM
#   (not the slurm, wheel, readme and multiproc marks; under 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == quick ]]; then
    shift
    export HCP_TUNE_QUICK=1  # a test that still asks for the SLURM cluster skips
    set -- -m "not slurm and not wheel and not readme and not multiproc" "$@"
fi
# HCP_TUNE_WORKERS=2: two worker processes (pytest-xdist, --dist loadgroup), filling the
# time a test waits on SLURM, process start-up and subprocesses; tests/conftest.py keeps
# the tests that share the SLURM node, the PostgreSQL server or a session's batches in one
# worker each. Default 0 (one process); CI's 3.11 lane runs two (751 s, against 978-1012 s).
WORKERS=${HCP_TUNE_WORKERS:-0}
XDIST=()
[[ $WORKERS == 0 ]] || XDIST=(-n "$WORKERS" --dist loadgroup)
"${HCP_TUNE_VENV:-.venv}/bin/python" -m pytest -q "${XDIST[@]}" "$@"
