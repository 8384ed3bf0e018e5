#!/usr/bin/env bash
# Downloads into .whl/ (ignored by git) the wheels that benchmarks/gpu_session.sh installs on a
# GPU machine that has no network: Python 3.12 on x86-64 Linux, as on the 'cuda' image of the
# machines this project is lent.
#
# That image holds torch 2.11, transformers 5.17, accelerate, peft, pandas, pyarrow, fsspec,
# xxhash and aiohttp, but not trl, datasets (nor its dill and multiprocess) or liger-kernel; and
# its transformers predates TrainingArguments.activation_checkpointing, which the recipes use.
# The wheels bring the versions constraints.txt pins (transformers, trl, datasets, peft), the two
# libraries datasets needs beyond the image, and liger-kernel; and a copy of the MedQA test file
# from ../shared/data (2 MB, never committed), and PubMedQA's labelled questions (1 MB). About 19 MB; the device takes at most 64 MiB of
# working tree and carried files together.
#
#   bash benchmarks/download_wheels.sh          # or: make wheels
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
pinned=$(grep -E '^(transformers|trl|datasets|peft)==' constraints.txt)
rm -rf .whl
mkdir -p .whl
# shellcheck disable=SC2086  # one requirement per word
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $pinned dill==0.4.1 multiprocess==0.70.19 liger-kernel==0.8.5
# The MedQA questions `gpu_session.sh grpo-usmle` trains on, the recipe's Hub dataset being out of reach.
medqa=../shared/data/medqa/medqa_us_4opt_test.jsonl
if [ -f "$medqa" ]; then cp "$medqa" .whl/; else echo "no $medqa: gpu_session.sh grpo-usmle will need MEDQA=FILE"; fi
# The PubMedQA questions `gpu_session.sh learn` trains and evaluates on (1 MB).
pubmedqa=../shared/data/pubmedqa/pqal_trainval_500.json
if [ -f "$pubmedqa" ]; then cp "$pubmedqa" .whl/; else echo "no $pubmedqa: gpu_session.sh learn will need MEDRECIPES_PUBMEDQA=FILE"; fi
ls -1 .whl
du -ch .whl/* | tail -1
