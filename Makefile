# medrecipes: `make demo` runs the main job on CPU; `make test` runs the tests. Both install first.
.PHONY: install demo test quality style cpt pretrain sft eval clean

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
RECIPE ?=
CONFIG ?=
# make eval MODEL=outputs/demo/sft/final TASKS=medqa_4opt,mmlu_medical [DATA_DIR=../shared/data] [EVAL_ARGS="--limit 100"]
MODEL ?= outputs/demo/sft/final
TASKS ?= medqa_4opt
DATA_DIR ?= $(wildcard ../shared/data)
EVAL_ARGS ?=
LAUNCH = $(if $(CONFIG),$(VENV)/bin/accelerate launch --config_file $(CONFIG),$(PY))

install: $(STAMP)

# Re-runs only when the dependency files change. torch is installed first and pinned: a bare
# `torch` requirement would pull a multi-GB CUDA build on a machine without a GPU.
$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints.txt -e '.[dev,deepspeed,quant]'
	touch $(STAMP)

demo: install
	rm -rf outputs/demo
	$(MEDRECIPES) tiny-model outputs/demo/tiny-model --corpus data/medical_text/train.jsonl --hidden-size 128
	$(PY) recipes/cpt.py recipes/tiny_cpt.yaml
	$(PY) recipes/sft.py recipes/tiny_sft.yaml
	@echo "demo: CPT model in outputs/demo/cpt/final, SFT model in outputs/demo/sft/final"
	$(PY) recipes/evaluate.py recipes/tiny_eval.yaml

test: install
	$(PY) -m pytest tests -q

quality: install
	$(VENV)/bin/ruff check src recipes tests benchmarks
	$(VENV)/bin/ruff format --check src recipes tests benchmarks

style: install
	$(VENV)/bin/ruff check --fix src recipes tests benchmarks
	$(VENV)/bin/ruff format src recipes tests benchmarks

cpt: install
	$(LAUNCH) recipes/cpt.py $(or $(RECIPE),recipes/tiny_cpt.yaml)

pretrain: install
	$(LAUNCH) recipes/cpt.py $(or $(RECIPE),recipes/pure_transformer_0p4b.yaml)

sft: install
	$(LAUNCH) recipes/sft.py $(or $(RECIPE),recipes/tiny_sft.yaml)

eval: install
	$(PY) recipes/evaluate.py --model $(MODEL) --tasks $(TASKS) $(if $(DATA_DIR),--data_dir $(DATA_DIR)) $(EVAL_ARGS)

clean:
	rm -rf outputs .pytest_cache .ruff_cache
