#!/usr/bin/env bash
# The throughput benchmarks on a GPU machine without network, in one call: installs the wheels
# carried in .whl/ (benchmarks/download_wheels.sh), checks the imports and the GPU, then runs
# each case of benchmarks/train_throughput.py in its own process, results and log into $OUT
# (benchmarks/results when unset). Each case writes its file when it ends, so a call cut short
# keeps the cases it finished.
#
#   bash benchmarks/gpu_session.sh                       # the four cases, each against its baseline
#   bash benchmarks/gpu_session.sh ablate                # each speed setting switched in turn (no baseline)
#   bash benchmarks/gpu_session.sh cases pretrain_0p4b   # named cases, against their baselines
#
# CASE_TIMEOUT (seconds, default 420) bounds each case.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/gpu_session.log"

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: installing .whl/ failed" | tee -a "$LOG"; exit 1; }
    export PYTHONPATH="/tmp/site:src"
else
    export PYTHONPATH="src"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

python3 - <<'PY' 2>&1 | tee -a "$LOG" || exit 1
import importlib.metadata as md
import sys

import torch


def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


names = ("torch", "transformers", "trl", "datasets", "accelerate", "peft", "pyarrow", "liger-kernel", "flash-attn")
print("versions:", {name: version(name) for name in names})
if not torch.cuda.is_available():
    sys.exit("error: no GPU visible")
print("device:", torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
import datasets  # noqa: E402,F401  datasets 5.2 needs pyarrow 24 or newer
import trl  # noqa: E402,F401
PY

case "${1:-all}" in
    all) cases="pretrain_0p4b sft_lora_4b grpo_0p4b cpt_gemma3_4b"; extra=() ;;
    ablate) cases="pretrain_0p4b sft_lora_4b cpt_gemma3_4b"; extra=(--ablate --no-baseline) ;;
    cases) shift; cases="$*"; extra=() ;;
    *) echo "usage: $0 [all | ablate | cases NAME...]"; exit 2 ;;
esac
status=0
for name in $cases; do
    timeout "${CASE_TIMEOUT:-420}" python3 benchmarks/train_throughput.py "$name" --out "$OUT" "${extra[@]}" 2>&1 \
        | grep -v -E "it/s\]|examples/s\]" | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "case $name did not finish" | tee -a "$LOG"; status=1; }
done
exit $status
