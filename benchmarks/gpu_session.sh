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
#   bash benchmarks/gpu_session.sh grpo-usmle            # `make grpo-usmle` for a few steps (below)
#   bash benchmarks/gpu_session.sh tests                 # the tests marked gpu (pytest -m gpu)
#   bash benchmarks/gpu_session.sh generation            # GRPO's generation paths side by side (grpo_generation.py)
#   bash benchmarks/gpu_session.sh levers                # the speed levers' run, most telling first: the
#                                                        # generation paths, LoRA SFT (c) and CPT (a) ablated
#                                                        # and profiled, then grpo-usmle to its end
#
# CASE_TIMEOUT (seconds, default 420) bounds each case, SESSION_SECONDS (default 570) the whole call.
# GEN_ARGS: more options of grpo_generation.py (a CPU run: --preset tiny --completion 16 ...).
#
# grpo-usmle runs `make grpo-usmle` as a user would, from a checkpoint of the pretraining recipe's
# 0.4B preset: a few steps of recipes/tiny_pretrain.yaml with `--architecture medium-large` on the
# bundled text, with a tokenizer trained there (no hub). The recipe's Hub dataset is out of reach,
# so a copy of grpo_usmle.yaml reads the MedQA file `make wheels` puts in .whl/ (MEDQA= another)
# and evaluates on its first EVAL_QUESTIONS (default 32). STEPS (default 5) GRPO steps; ARCH
# (default medium-large) and GRPO_ARGS (more overrides) size it down for a CPU run, REQUIRE_GPU=0.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/gpu_session.log"

WHEELS=${WHEELS:-.whl}  # the folder of wheels to install first; a missing one installs none
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        || { echo "error: installing $WHEELS/ failed" | tee -a "$LOG"; exit 1; }
    export PYTHONPATH="/tmp/site:src"
else
    export PYTHONPATH="src"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

python3 - <<'PY' 2>&1 | tee -a "$LOG" || exit 1
import importlib.metadata as md
import os
import sys

import torch


def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


names = ("torch", "transformers", "trl", "datasets", "accelerate", "peft", "pyarrow", "liger-kernel", "flash-attn")
print("versions:", {name: version(name) for name in names})
if torch.cuda.is_available():
    print("device:", torch.cuda.get_device_name(), f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
elif os.environ.get("REQUIRE_GPU", "1") != "0":
    sys.exit("error: no GPU visible")
import datasets  # noqa: E402,F401  datasets 5.2 needs pyarrow 24 or newer
import trl  # noqa: E402,F401
PY

# The log without progress-bar lines, line by line as they come.
quiet() { grep --line-buffered -v -E "it/s\]|s/it\]|examples/s\]" | tee -a "$LOG"; }

grpo_usmle_check() {
    local medqa=${MEDQA:-.whl/medqa_us_4opt_test.jsonl} work=/tmp/grpo-usmle-check
    [ -f "$medqa" ] || { echo "error: no $medqa; make wheels copies it from ../shared/data"; return 1; }
    rm -rf "$work" && mkdir -p "$work"
    python3 -m medrecipes.cli tiny-model "$work/tokenizer" || return 1
    python3 recipes/cpt.py recipes/tiny_pretrain.yaml --architecture "${ARCH:-medium-large}" --use_cpu false \
        --tokenizer_name_or_path "$work/tokenizer" --output_dir "$work/pretrain" --save_strategy no --report_to none \
        || return 1
    sed -e "s|path: GBaker/MedQA-USMLE-4-options-hf, split: train|path: $medqa, split: train|" \
        -e "s|path: GBaker/MedQA-USMLE-4-options-hf, split: \"test\[:256\]\"|path: $medqa, split: \"train[:${EVAL_QUESTIONS:-32}]\"|" \
        recipes/grpo_usmle.yaml >"$work/grpo_usmle.yaml"
    if grep -q GBaker "$work/grpo_usmle.yaml"; then
        echo "error: recipes/grpo_usmle.yaml no longer names its data as this check expects"
        return 1
    fi
    local steps=${STEPS:-5}
    # -o: the venv's install stamp (the Makefile's STAMP, grpo-usmle's prerequisite) counts as made;
    # the image's python3 and the wheels above are the install, and there is no network to make one.
    make -o .venv/.install-stamp grpo-usmle PY=python3 MODEL="$work/pretrain/final" RECIPE="$work/grpo_usmle.yaml" \
        ARGS="--max_steps $steps --eval_steps $steps --save_steps $steps --output_dir $work/grpo --report_to none ${GRPO_ARGS:-}" \
        || return 1
    cp "$work/grpo/checkpoint-$steps/trainer_state.json" "$OUT/grpo-usmle-trainer_state.json"
    ls "$work/grpo/final"
}

# The tests marked gpu, from the files that have some (the others may import what is not carried).
gpu_tests() {
    # shellcheck disable=SC2046  # one file per word
    timeout "$(( ${SESSION_SECONDS:-570} - SECONDS ))" python3 -m pytest -m gpu -q -rs -p no:cacheprovider \
        --junitxml "$OUT/gpu-tests.xml" $(grep -l "mark.gpu" tests/test_*.py)
}

# GRPO's generation paths in one process: HF generate, continuous batching, a static cache.
generation() {
    # shellcheck disable=SC2086  # GEN_ARGS: words
    timeout "$(( ${SESSION_SECONDS:-570} - SECONDS ))" python3 benchmarks/grpo_generation.py \
        --out "$OUT/grpo_generation-$(device_kind).json" ${GEN_ARGS:-}
}

device_kind() { python3 -c "import torch; print('gpu' if torch.cuda.is_available() else 'cpu')"; }

# Cases of train_throughput.py, each in its own process, none started with under a minute of
# SESSION_SECONDS left nor run past its end; extra options (--ablate, --profile ...) after "--".
run_cases() {
    local names=() extra=() seen=0 status=0
    for word in "$@"; do
        if [ "$word" = "--" ]; then seen=1; elif [ $seen = 1 ]; then extra+=("$word"); else names+=("$word"); fi
    done
    for name in "${names[@]}"; do
        left=$(( ${SESSION_SECONDS:-570} - SECONDS ))
        if [ "$left" -lt 60 ]; then
            echo "case $name not started: ${left}s of the session left; run it with: $0 cases $name" | tee -a "$LOG"
            status=1
            continue
        fi
        limit=${CASE_TIMEOUT:-420}
        [ "$limit" -le "$left" ] || limit=$left
        timeout "$limit" python3 benchmarks/train_throughput.py "$name" --out "$OUT" "${extra[@]}" 2>&1 | quiet
        [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "case $name did not finish within ${limit}s" | tee -a "$LOG"; status=1; }
    done
    return $status
}

case "${1:-all}" in
    generation)
        generation 2>&1 | quiet
        exit "${PIPESTATUS[0]}" ;;
    levers)
        # LORA_CASE and CPT_CASE (default sft_lora_4b and cpt_gemma3_4b) name the cases: *_tiny on a CPU.
        status=0
        generation 2>&1 | quiet; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        run_cases "${LORA_CASE:-sft_lora_4b}" -- --ablate --profile || status=1
        run_cases "${CPT_CASE:-cpt_gemma3_4b}" -- --ablate --profile --no-baseline || status=1
        grpo_usmle_check 2>&1 | quiet; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
        exit $status ;;
    grpo-usmle)
        grpo_usmle_check 2>&1 | quiet
        exit "${PIPESTATUS[0]}" ;;
    tests)
        gpu_tests 2>&1 | quiet
        exit "${PIPESTATUS[0]}" ;;
    all) cases="pretrain_0p4b sft_lora_4b grpo_0p4b cpt_gemma3_4b"; extra=() ;;
    ablate) cases="pretrain_0p4b sft_lora_4b cpt_gemma3_4b"; extra=(--ablate --no-baseline) ;;
    cases) shift; cases="$*"; extra=() ;;
    *) echo "usage: $0 [all | ablate | cases NAME... | generation | levers | grpo-usmle | tests]"; exit 2 ;;
esac
# A call of the device tool ends at 600 s: no case starts with less than a minute of SESSION_SECONDS
# (default 570, counted from the script's start) left, and none runs past its end.
run_cases $cases -- "${extra[@]}"
