#!/usr/bin/env bash
# The GPU machine's side of the calls tools/gpu_stage.py prints, run from the checkout root there:
#
#   bash tools/gpu_run.sh --keep   a call that carries a part of onnxruntime-gpu alone: keeps it in /tmp,
#                                  outside the checkout, for the last call (the machine stays warm 30 s)
#   bash tools/gpu_run.sh [ARGS]   the last call: installs the carried wheels, and runs tools/gpu_check.py
#                                  with everything .gpu/ holds (ARGS after it), its log and
#                                  gpu_check.json in $OUT
set -euo pipefail
parts=/tmp/sparse_lower_ort_gpu
mkdir -p "$parts"
cp .gpu/ort-gpu/* "$parts"/ 2>/dev/null || true  # the part (and SHA256SUMS) this call carried
if [[ "${1:-}" == --keep ]]; then
    ls -l "$parts"
    exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
anchor=()
[[ -f .gpu/libspconv/lib/libspconv.so ]] && anchor=(--libspconv .gpu/libspconv)
python3 tools/gpu_check.py --ort-include .gpu/ort --data .gpu/data --ort-gpu "$parts" "${anchor[@]}" "$@" 2>&1 \
    | tee "${OUT:-/tmp}/gpu_check.log"
