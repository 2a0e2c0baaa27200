#!/usr/bin/env bash
# The regression benchmark's matrix (sweeps/te_regression.yaml): one sweep per model x cp,
# every layout 5 times (search.repeats in the preset), all under the env tag you give. Run it
# before and after an upgrade:
#   scripts/te_regression.sh env_tag=te-2.9 [executor.container_image=... other overrides]
#   scripts/te_regression.sh env_tag=te-2.10 [...]
#   python -m hcp_tune regress baseline=te-2.9 candidate=te-2.10
# Uses $PYTHON, else the checkout's .venv, else python3. Exits non-zero if any sweep did.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}
[[ " $* " == *" env_tag="* ]] || { echo "usage: $0 env_tag=NAME [overrides...]" >&2; exit 2; }
MODELS=(llama3-8b llama2-7b)  # GQA, MHA
CPS=(4 16)
rc=0
for model in "${MODELS[@]}"; do
    for cp in "${CPS[@]}"; do
        echo "== te_regression: model=$model cp=$cp"
        "$PY" -m hcp_tune sweep sweeps=te_regression "model=$model" "cp=$cp" "$@" || rc=$?
    done
done
exit $rc
