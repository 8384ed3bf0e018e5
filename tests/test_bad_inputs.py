"""A tired user's mistakes, across every command: each is one line on stderr that names the
file, key or row and what to do, exit code 2, and nothing written. The same table, with the line
a user sees, is in docs/bad-inputs.md (`python tests/test_bad_inputs.py` prints it).

Each case runs in-process, as `medrecipes ...` or as the recipe script's parse, so the table stays
fast; the commands' own subprocess tests cover the scripts end to end.
"""

import contextlib
import io
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

TEST_SET = "data/usmle_sample/test.jsonl"
NO_EVAL = ["--eval_strategy", "no", "--eval_on_start", "false"]  # a run with no eval sets
EVAL_SETS_CPT = """eval_sets:
  medical_text: {path: json, data_files: data/medical_text/eval.jsonl, text_field: text}
  usmle: {path: json, data_files: data/usmle_sample/test.jsonl, format: usmle}
"""
EVAL_SETS_SFT = """eval_sets:
  usmle_train: {path: data/usmle_sample/train.jsonl, format: usmle}
  usmle_test: {path: data/usmle_sample/test.jsonl, format: usmle}
"""


class Case(NamedTuple):
    name: str
    argv: list[str]  # `medrecipes` arguments, or ["recipes/<method>.py", RECIPE, ...] for a script
    expect: str  # words the error line must hold


def _recipe(files: Path, base: str, replace: tuple[str, str] = ("", ""), append: str = "") -> str:
    text = (ROOT / base).read_text(encoding="utf-8")
    if replace[0]:
        assert replace[0] in text, (base, replace)
        text = text.replace(*replace)
    path = files / f"recipe-{abs(hash((base, replace, append)))}.yaml"
    path.write_text(text + append, encoding="utf-8")
    return str(path)


def run_in(files: Path, model: str) -> list[str]:
    """A run's own model and a new output_dir among the test's files (the rows that get past the
    recipe's parse)."""
    return ["--model_name_or_path", model, "--output_dir", str(files / "runs" / Path(model).name)]


def cases(files: Path, model: str) -> list[Case]:
    """The table. `files` holds the bad files below; `model` is a whole tiny model."""
    f = {
        name.split("/")[0]: str(files / name.split("/")[0]) for name in [*FILES, *BROKEN_MODELS, "device.jsonl"]
    }  # files, folders
    cpt = "recipes/tiny_cpt.yaml"
    sft = "recipes/tiny_sft.yaml"
    grpo = "recipes/tiny_grpo.yaml"
    dpo = "recipes/tiny_dpo.yaml"

    kto = "recipes/tiny_kto.yaml"

    def pairs(file: str, layout: str = "preference") -> list[str]:  # a DPO or KTO run on this file alone
        return [
            "--dataset_mixture",
            f"{{sources: [{{path: {file}, format: {layout}}}]}}",
            "--eval_sets",
            "null",
            *NO_EVAL,
        ]

    def script(method: str, recipe: str, *extra: str) -> list[str]:
        return [f"recipes/{method}.py", recipe, *extra]

    def key(method: str, base: str, line: str, new: str) -> list[str]:
        return script(method, _recipe(files, base, (line, new)))

    def src(source: str) -> str:  # a CPT recipe whose only source is this
        return _recipe(files, cpt, ("sources:\n", f"sources:\n    - {source}\n"), "")

    table = [
        # --- the recipe file itself
        Case("recipe file missing", script("cpt", f"{files}/nope.yaml"), "no such recipe file"),
        Case("recipe is a folder", script("cpt", str(files)), "is a folder"),
        Case("recipe empty", script("cpt", f["empty.yaml"]), "empty"),
        Case("recipe not a mapping", script("cpt", f["list.yaml"]), "mapping"),
        Case("recipe YAML syntax error", script("cpt", f["syntax.yaml"]), "line 4, column 1"),
        Case("recipe not UTF-8", script("cpt", f["latin1.yaml"]), "UTF-8"),
        Case("unknown key", key("cpt", cpt, "learning_rate:", "learning_rat:"), "did you mean 'learning_rate'"),
        Case("unknown key in a source", script("cpt", src("{path: data/medical_text/train.jsonl, wieght: 1}")), "wieght"),
        Case("unknown key in eval_sets", key("cpt", cpt, EVAL_SETS_CPT, "eval_sets:\n  x: {path: a.jsonl, fromat: usmle}\n"), "fromat"),
        # --- numbers out of range, in the YAML and on the command line
        Case("learning_rate negative", script("cpt", cpt, "--learning_rate", "-1e-3"), "learning_rate must be 0 or more"),
        Case("learning_rate not a number", script("cpt", cpt, "--learning_rate", "fast"), "learning_rate"),
        Case("batch size 0", script("cpt", cpt, "--per_device_train_batch_size", "0"), "at least 1"),
        Case("batch size negative", script("sft", sft, "--per_device_train_batch_size", "-2"), "at least 1"),
        Case("accumulation 0", script("sft", sft, "--gradient_accumulation_steps", "0"), "at least 1"),
        Case("max_length 0", script("cpt", cpt, "--max_length", "0"), "max_length must be at least 1"),
        Case("max_steps 0", script("cpt", cpt, "--max_steps", "0"), "max_steps must be at least 1"),
        Case("eval: a task's Hub copy offline, no data given", ["eval", "--model", model, "--tasks", "medqa_4opt"], "medqa_4opt: with no file or folder of its questions given, they come from the Hub (GBaker/MedQA-USMLE-4-options-hf), which cannot be loaded here"),
        Case("eval: a CSV header with a space after each comma", ["eval", "--model", model, "--data", f["spacedheader.csv"]], "spacedheader.csv line 1: the column names ' A', ' B', ' answer' begin or end with spaces"),
        Case("eval: a MedQA row whose letter and answer text disagree", ["eval", "--model", model, "--data", f["disagree.jsonl"]], "disagree.jsonl line 1: answer_idx A is option \"vitamin C lack\", and answer is \"iron lack\": they disagree"),
        Case("eval: a later row's question null", ["eval", "--model", model, "--data", f["nullquestion.jsonl"]], "nullquestion.jsonl line 2: 'question' has no value (null, or left out of this row)"),
        Case("eval: the first row's answer null", ["eval", "--model", model, "--data", f["nullanswer.jsonl"]], "nullanswer.jsonl line 1: 'answer' has no value (null, or left out of this row); give every row its value"),
        Case("eval: a CSV whose header has other names", ["eval", "--model", model, "--data", f["otherheader.csv"]], "line 1: Question, Option A, Option B, ... reads as a header ('Correct' is no answer letter)"),
        Case("a DPO recipe run by the KTO script", script("kto", dpo), "a recipe for recipes/dpo.py, which reads it whole (recipes/kto.py does not: loss_type must be text"),
        Case("a CPT recipe run by the SFT script", script("sft", cpt), "dataset_mixture mixes documents (format: text) with conversations (format: usmle)"),
        Case("an SFT recipe run by the evaluation script", script("evaluate", sft), "a recipe for recipes/sft.py (activation_checkpointing is a key of sft recipes, which recipes/evaluate.py does not take); run it with recipes/sft.py"),
        Case("eval: a GRPO recipe", ["eval", grpo], "a recipe for recipes/grpo.py ("),
        Case("an SFT recipe run by the DPO script", script("dpo", sft), "a recipe for recipes/sft.py (assistant_only_loss is a key of sft recipes, which recipes/dpo.py does not take); run it with recipes/sft.py"),
        Case("the best model kept with no saving", ["validate", cpt, "--model_name_or_path", model, "--save_strategy", "no"], "but found Evaluation strategy: steps, Save strategy: no: it keeps the best of the saved checkpoints"),
        Case("an output folder ending in a space", ["validate", sft, "--output_dir", f"{files}/run "], "starts or ends with a space, which a folder or file name keeps"),
        Case("SAPO's gate temperature 0", ["validate", grpo, "--loss_type", "sapo", "--sapo_temperature_neg", "0"], "sapo_temperature_neg must be above 0, got 0"),
        Case("accelerate config: a ZeRO stage in quotes", ["validate", cpt, "--accelerate-config", f["stageaccel.yaml"]], "zero_stage is the text '3'; write 3 without quotes"),
        Case("warm-up steps neither whole nor a fraction", ["validate", sft, "--warmup_steps", "2.5"], "warmup_steps 2.5 would warm up for 2 step(s)"),
        Case("a best-checkpoint metric no evaluation logs", script("cpt", cpt, "--model_name_or_path", model, "--output_dir", f"{files}/best", "--metric_for_best_model", "eval_accuracyx"), "metric_for_best_model 'eval_accuracyx' is none of the metrics this run's evaluation logs (eval_medical_text_loss"),
        Case("max_steps -5", script("sft", sft, "--max_steps", "-5"), "max_steps must be at least 1"),
        Case("epochs 0", script("sft", sft, "--num_train_epochs", "0"), "num_train_epochs must be positive"),
        Case("save_steps 0", script("cpt", cpt, "--save_steps", "0"), "save_steps must be positive"),
        Case("logging_steps 0", script("cpt", cpt, "--logging_steps", "0"), "logging_steps must be positive"),
        Case("eval_steps 0", script("cpt", cpt, "--eval_steps", "0"), "eval_steps must be positive"),
        Case("weight_decay negative", script("cpt", cpt, "--weight_decay", "-0.1"), "weight_decay must be 0 or more"),
        Case("max_steps not a number", script("cpt", cpt, "--max_steps", "ten"), "max_steps"),
        Case("unknown command-line key", script("cpt", cpt, "--learnin_rate", "1e-4"), "unknown argument '--learnin_rate' (did you mean '--learning_rate'"),
        Case("stray command-line value", script("cpt", cpt, "extra.txt"), "unknown argument 'extra.txt'"),
        Case("unknown scheduler", script("cpt", cpt, "--lr_scheduler_type", "cosinus"), "lr_scheduler_type"),
        Case("unknown optimizer", script("cpt", cpt, "--optim", "adamw_fast"), "optim"),
        Case("unknown logger", script("cpt", cpt, "--report_to", "tensorbord"), "did you mean 'tensorboard'"),
        Case("unknown eval_strategy", script("cpt", cpt, "--eval_strategy", "sometimes"), "eval_strategy"),
        Case("unknown attention", script("cpt", cpt, "--attn_implementation", "flash"), "attn_implementation 'flash'"),
        Case("unknown dtype", script("cpt", cpt, "--dtype", "float8"), "dtype"),
        Case("lora_r 0", script("sft", sft, "--use_peft", "true", "--lora_r", "0"), "lora_r must be at least 1"),
        Case("lora_r without use_peft", script("sft", sft, "--lora_r", "8"), "use_peft"),
        Case("a list key with an empty entry", script("sft", sft, "--use_peft", "true", "--lora_target_modules", "q_proj", " "), "lora_target_modules has an empty entry (['q_proj', ' ']); give each entry a value"),
        Case("lora_dropout of 1 or more", script("sft", sft, "--use_peft", "true", "--lora_dropout", "1.5"), "lora_dropout must be at least 0 and below 1, got 1.5"),
        Case("lora_dropout negative", script("sft", sft, "--use_peft", "true", "--lora_dropout", "-0.1"), "lora_dropout must be at least 0"),
        Case("LoRA target module misspelt", script("sft", sft, *run_in(files, model), "--use_peft", "true", "--lora_target_modules", "q_proj", "v_prj"), "lora_target_modules: v_prj names no module of llama (did you mean 'v_proj'"),
        Case("LoRA adapter on the output layer of a TRL trainer", ["validate", kto, "--model_name_or_path", model, "--use_peft", "true", "--lora_target_modules", "[lm_head, q_proj]"], "lm_head is the output layer, and TRL's trainer computes log-probabilities"),
        Case("validate: a source folder with no train split", ["validate", sft, "--dataset_mixture", f"{{sources: [{{path: {f['testonly']}, format: usmle}}]}}"], "testonly: no 'train' split: its files make test"),
        Case("validate: a text folder with no train split", ["validate", cpt, "--dataset_mixture", f"{{sources: [{{path: {f['notestrain']}}}]}}"], "notestrain: no 'train' split: its files make test"),
        Case("a recipe's dtype no weights are loaded in", ["validate", _recipe(files, sft, ("dtype: float32", "dtype: int8"))], "dtype 'int8' is unknown; use auto, bfloat16, float16, float32"),
        Case("an eval recipe's dtype no weights are loaded in", ["validate", _recipe(files, "recipes/tiny_eval.yaml", append="dtype: int8\n")], "dtype 'int8' is unknown; use auto, bfloat16, float16, float32"),
        Case("a recipe's choice from a library's list, in the recipe", ["validate", _recipe(files, sft, append="truncation_mode: middle\n")], "truncation_mode 'middle' is unknown; use keep_end or keep_start"),
        Case("tiny-model: a JSON document over many lines, cut", ["tiny-model", f"{files}/t13", "--corpus", f["cutdocument.json"]], "cutdocument.json line 3: not JSON (Expecting ',' delimiter at column 32); fix the document there"),
        Case("perplexity: a text field of lists", ["perplexity", "--model", model, "--data", f["listtext.jsonl"], "--text-field", "contexts"], "column 'contexts' holds no text in any row; pass --text-field with a column of text (here: question)"),
        Case("CPT: a text field of numbers", ["preview", cpt, "--model_name_or_path", model, "--examples", "1", "--dataset_mixture", f"{{sources: [{{path: {f['listtext.jsonl']}, text_field: year}}]}}"], "column 'year' holds int64 values in every row, not text; set text_field to a column of text (here: question)"),
        Case("serve: a served name with a space at its end", ["serve", model, "--served-model-name", "my model "], "--served-model-name 'my model ' is empty or has whitespace at an end"),
        Case("LoRA target parameter of no parameter", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_target_parameters", "[mlp.experts.gate_up_proj]"], "lora_target_parameters: mlp.experts.gate_up_proj names no parameter of llama"),
        Case("LoRA module to save misspelt", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_modules_to_save", "lm_haed"], "lora_modules_to_save: lm_haed names no module of llama (did you mean 'lm_head'"),
        Case("LoRA target module as one text", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_target_modules", "self_attn.q_proj"], "PEFT reads as a regular expression"),
        Case("lora_alpha 0", script("sft", sft, "--use_peft", "true", "--lora_alpha", "0"), "lora_alpha must be above 0, got 0"),
        Case("hub_model_id with spaces", script("sft", sft, "--hub_model_id", "my org/model x"), "hub_model_id: Repo id must use alphanumeric"),
        Case("hub_model_id with three parts", script("cpt", cpt, "--hub_model_id", "a/b/c"), "hub_model_id:"),
        Case("DPO loss_type misspelt", script("dpo", dpo, "--loss_type", "sigmiod"), "loss_type 'sigmiod' is none of the values TRL's DPOTrainer acts on (did you mean 'sigmoid'"),
        Case("total_tokens negative", script("cpt", "recipes/tiny_pretrain.yaml", "--total_tokens", "-5"), "total_tokens must be at least 1, got -5"),
        Case("global_batch_tokens 0", script("cpt", "recipes/tiny_pretrain.yaml", "--global_batch_tokens", "0"), "global_batch_tokens must be at least 1"),
        Case("output_dir is a file", script("cpt", cpt, "--output_dir", TEST_SET), "is a file"),
        Case("best metric of a set the recipe does not score", script("sft", sft, "--metric_for_best_model", "eval_usmle_tset_acc"), "did you mean 'eval_usmle_test_acc'"),
        Case("best loss of a set the recipe does not have", script("cpt", cpt, "--metric_for_best_model", "eval_pubmed_loss"), "metrics of this kind it logs: eval_medical_text_loss, eval_usmle_loss"),
        Case("eval_strategy with no eval sets", script("sft", _recipe(files, sft, (EVAL_SETS_SFT, "")), "--eval_strategy", "steps"), "there are no eval_sets"),
        # --- data sources
        Case("no sources", key("cpt", cpt, "  sources:\n    - {path: json, data_files: data/medical_text/train.jsonl, text_field: text, weight: 0.8}\n    - {path: json, data_files: data/usmle_sample/train.jsonl, format: usmle, weight: 0.2}\n", "  sources: []\n"), "sources"),
        Case("source weight 0", script("cpt", src("{path: data/medical_text/train.jsonl, weight: 0}")), "weight must be positive"),
        Case("source weight negative", script("cpt", src("{path: data/medical_text/train.jsonl, weight: -1}")), "weight must be positive"),
        Case("source weight text", script("cpt", src("{path: data/medical_text/train.jsonl, weight: abc}")), "weight must be a number"),
        Case("source without path", script("cpt", src("{weight: 1}")), "path"),
        Case("source format unknown", script("cpt", src("{path: data/usmle_sample/train.jsonl, format: medqa}")), "format"),
        Case("source split not text", script("cpt", src("{path: data/medical_text/train.jsonl, split: 5}")), "split"),
        Case("mixture seed text", script("cpt", _recipe(files, cpt, ("seed: 42\n  sources", "seed: abc\n  sources"))), "seed"),
        Case("total_tokens that does not divide", script("cpt", cpt, "--total_tokens", "1000"), "total_tokens"),
        Case("unknown eval task", script("cpt", cpt, "--eval_tasks", "medqa_4op"), "did you mean 'medqa_4opt'"),
        Case("eval_tasks_limit 0", script("cpt", cpt, "--eval_tasks", "usmle", "--eval_tasks_limit", "0"), "at least 1"),
        # --- long-run settings
        Case("nonfinite_policy unknown", script("cpt", cpt, "--nonfinite_policy", "ignore"), "nonfinite_policy"),
        Case("max_nonfinite_skips negative", script("cpt", cpt, "--max_nonfinite_skips", "-1"), "max_nonfinite_skips"),
        Case("preemption grace 0", script("cpt", cpt, "--preemption_grace_seconds", "0"), "preemption_grace_seconds"),
        Case("keep_last_checkpoints 0", script("cpt", cpt, "--keep_last_checkpoints", "0"), "keep_last_checkpoints"),
        Case("keep_best_checkpoints 0", script("cpt", cpt, "--keep_best_checkpoints", "0"), "keep_best_checkpoints"),
        Case("gpu_hour_price negative", script("cpt", cpt, "--gpu_hour_price", "-2"), "gpu_hour_price"),
        Case("scratch without architecture", script("cpt", cpt, "--init_from_scratch", "true"), "init_from_scratch"),
        # --- GRPO
        Case("GRPO temperature 0", script("grpo", grpo, "--temperature", "0"), "temperature must be above 0"),
        Case("GRPO beta negative", script("grpo", grpo, "--beta", "-0.1"), "beta"),
        Case("GRPO reward weight NaN", script("grpo", grpo, "--rewards", "[{name: usmle_accuracy, weight: .nan}]"), "rewards[0].weight must be a finite number"),
        # --- values only the library would refuse, after loading (or never)
        Case("adam_beta1 above 1", script("sft", sft, "--adam_beta1", "1.5"), "adam_beta1 1.5 is refused by the adamw_torch"),
        Case("adam_epsilon negative", script("cpt", cpt, "--adam_epsilon", "-1e-8"), "adam_epsilon must be above 0, got -1e-08"),
        Case("dataloader workers negative", script("sft", sft, "--dataloader_num_workers", "-1"), "dataloader_num_workers -1 is refused by torch's DataLoader"),
        Case("persistent workers without workers", script("cpt", cpt, "--dataloader_persistent_workers", "true"), "dataloader_persistent_workers True is refused"),
        Case("push to the Hub while offline", script("sft", sft, "--push_to_hub", "true", "--hub_model_id", "med/x"), "push_to_hub is true but the Hub is offline here"),
        Case("scheduler argument unknown", script("cpt", cpt, "--lr_scheduler_kwargs", "{\"warmup\": 3}"), "lr_scheduler_kwargs"),
        Case("scheduler argument past the peak rate", script("cpt", cpt, "--lr_scheduler_type", "polynomial", "--lr_scheduler_kwargs", "{power: -1.0}"), "outside 0 to learning_rate"),
        Case("checkpointing argument of the wrong kind", ["validate", sft, "--activation_checkpointing", "true", "--activation_checkpointing_kwargs", "{use_reentrant: maybe}"], "activation_checkpointing_kwargs.use_reentrant must be true or false"),
        Case("checkpointing argument under its deprecated name", ["validate", sft, "--activation_checkpointing", "true", "--gradient_checkpointing_kwargs", "{use_reentrant: maybe}"], "gradient_checkpointing_kwargs.use_reentrant must be true or false"),
        Case("deepspeed given an accelerate config", ["validate", sft, "--deepspeed", "accelerate_configs/zero3.yaml"], "accelerate_configs/zero3.yaml is an accelerate config, which `accelerate launch --config_file"),
        Case("deepspeed given a file that is no JSON", ["validate", sft, "--deepspeed", "README.md"], "README.md is not JSON (line 1, column 1"),
        Case("Hub id with an @revision", ["validate", sft, "--model_name_or_path", "google/gemma-3-270m@main"], "a Hub id takes no @revision; write model_name_or_path: google/gemma-3-270m and model_revision: main"),
        Case("model that is neither a path nor a Hub id", ["validate", sft, "--model_name_or_path", "my model"], "'my model' is no local path, and not a Hub id either"),
        Case("a shell variable in a path key", ["validate", sft, "--output_dir", "$HOME/runs/sft"], "output_dir '$HOME/runs/sft' holds $HOME, which a shell expands and a recipe does not; write the path itself"),
        Case("a shell variable in a source's path", ["validate", sft, "--dataset_mixture", "{sources: [{path: $DATA/train.jsonl, format: usmle}]}"], "holds $DATA, which a shell expands and a recipe does not"),
        Case("float16 weights trained whole", ["validate", sft, "--dtype", "float16"], "dtype float16 trains the weights themselves in half precision"),
        Case("a streaming mixture counted in epochs", ["validate", cpt, "--dataset_mixture", "{streaming: true, sources: [{path: data/medical_text/train.jsonl}]}", "--max_steps", "-1"], "a streaming mixture has no length; set max_steps or total_tokens"),
        Case("DeepSpeed's clipping unlike the recipe's", ["validate", cpt, "--accelerate-config", f["clip03accel.yaml"]], "deepspeed_config.gradient_clipping 0.3 and the recipe's max_grad_norm"),
        Case("ZeRO-3 saving no whole weights", ["validate", cpt, "--accelerate-config", f["no16accel.yaml"]], "zero3_save_16bit_model false saves final/ as DeepSpeed's shards"),
        Case("FSDP's activation checkpointing beside the recipe's", ["validate", cpt, "--activation_checkpointing", "true", "--accelerate-config", f["fsdpacaccel.yaml"]], "fsdp_config.fsdp_activation_checkpointing and the recipe's activation_checkpointing are both on"),
        Case("GRPO: a reasoning reward beside a letter-only prompt", ["validate", grpo, "--rewards", "[{name: usmle_accuracy}, {name: reasoning_present, min_words: 5}]"], "reasoning_present rewards another form than the prompt asks for (final_answer_line, where chain_of_thought false asks for letter)"),
        Case("GRPO: an answer form the prompt does not ask for", ["validate", grpo, "--rewards", "[{name: usmle_accuracy}, {name: answer_format, style: final_answer_line}]"], "answer_format style final_answer_line rewards another form than the prompt asks for"),
        Case("a value that starts with a dash", ["validate", sft, "--run_name", "-ablation"], "expected one argument; give it one, and a value that starts with '-' as --run_name=VALUE"),
        Case("another command's option given to plan", ["plan", sft, "--accelerate-config", "accelerate_configs/zero3.yaml"], "--accelerate-config is an option of medrecipes validate and medrecipes launch-plan, not of plan"),
        Case("checkpointing argument TRL's SFT reads, with checkpointing off", ["validate", sft, "--activation_checkpointing_kwargs", "{selective: true}"], "selective is read by TRL's SFTTrainer only with activation checkpointing on"),
        Case("checkpointing argument TRL's SFT reads, given to DPO", ["validate", "recipes/tiny_dpo.yaml", "--activation_checkpointing_kwargs", "{selective: true}"], "selective is not a setting of torch's checkpoint or of TRL's DPOTrainer"),
        Case("checkpointing argument misspelt", ["validate", sft, "--activation_checkpointing", "true", "--activation_checkpointing_kwargs", "{reentrant: false}"], "not a setting of torch's checkpoint or of TRL's SFTTrainer (did you mean 'use_reentrant'?)"),
        Case("accelerator_config value of the wrong kind", ["validate", cpt, "--accelerator_config", "{split_batches: maybe}"], "accelerator_config.split_batches must be true or false"),
        Case("accelerator_config accumulation beside the recipe's", ["validate", cpt, "--accelerator_config", "{gradient_accumulation_kwargs: {num_steps: 4}}"], "would replace gradient_accumulation_steps"),
        Case("accelerator_config accumulation key unknown", ["validate", cpt, "--accelerator_config", "{gradient_accumulation_kwargs: {sync_each: true}}"], "unknown key 'sync_each'"),
        Case("parallelism_config key unknown", ["validate", cpt, "--parallelism_config", "{tp: 2}"], "parallelism_config: unknown key 'tp'"),
        Case("parallelism_config for other processes", ["validate", cpt, "--parallelism_config", "{dp_shard_size: 4}", "--accelerate-config", "accelerate_configs/ddp.yaml"], "parallelism_config's groups multiply to 4"),
        Case("model_init_kwargs for a model the recipe loads", ["validate", sft, "--model_init_kwargs", "{torch_dtype: float16}"], "model_init_kwargs is read by TRL only when it loads the model itself"),
        Case("label_names the batches do not hold", ["validate", cpt, "--label_names", "[answer]"], "the batches hold their labels as 'labels'"),
        Case("output_dir empty", ["validate", cpt, "--output_dir", ""], "output_dir is not set, and the run would write into ./trainer_output"),
        Case("output_dir null", ["validate", cpt, "--output_dir", "null"], "output_dir is not set, and the run would write into ./trainer_output"),
        Case("eval: the model given as empty text", ["eval", "--model", ""], "model_name_or_path is empty; give it a value"),
        Case("report: an empty title", ["report", "data", "--title", ""], "medrecipes report: --title is empty; give it a value, or leave it out"),
        Case("a text key left empty", ["validate", sft, "--dataset_text_field", ""], "dataset_text_field is empty; give it a value"),
        Case("no model to start from", ["validate", sft, "--model_name_or_path", "null"], "model_name_or_path is not set; name the model this recipe starts from"),
        Case("GRPO with one answer a question", ["validate", grpo, "--num_generations", "1"], "num_generations must be at least 2, got 1"),
        Case("eval: a task with no path", ["eval", "--model", model, "--data", "mytask="], "--data mytask=: no path after '='"),
        Case("accelerate config: precision no unquoted", ["validate", cpt, "--accelerate-config", f["unquotedno.yaml"]], "mixed_precision is False to YAML; write 'no' in quotes"),
        Case("accelerator_config a file that is not there", ["validate", cpt, "--accelerator_config", "nope.json"], "no such file 'nope.json'; give the path of a JSON file"),
        Case("scheduler arguments as a word", ["validate", cpt, "--lr_scheduler_kwargs", "cosine"], "expected a mapping such as"),
        Case("a DDP backend outside a launch", ["validate", cpt, "--ddp_backend", "gloo"], "ddp_backend set up a process group, which a launch"),
        Case("accelerate config: a rendezvous backend misspelt", ["validate", cpt, "--accelerate-config", f["rdzvaccel.yaml"]], "rdzv_backend 'etcdd' is none of"),
        Case("accelerate config: a state dict type of another name", ["validate", cpt, "--accelerate-config", f["sdtaccel.yaml"]], "fsdp_state_dict_type 'FULL' is none of FULL_STATE_DICT"),
        Case("accelerate config: a DeepSpeed switch in words", ["validate", cpt, "--accelerate-config", f["initaccel.yaml"]], "deepspeed_config.zero3_init_flag must be true or false, got 'sometimes'"),
        Case("accelerate config: a clipping norm in words", ["validate", cpt, "--accelerate-config", f["clipaccel.yaml"]], "deepspeed_config.gradient_clipping must be a number (or auto), got 'high'"),
        Case("accelerate config: an FSDP version accelerate lacks", ["validate", cpt, "--accelerate-config", f["fsdp3accel.yaml"]], "fsdp_version 3 is none of accelerate's FSDP versions"),
        Case("accelerate config: no machine", ["validate", cpt, "--accelerate-config", f["nomachineaccel.yaml"]], "num_machines must be at least 1, got 0"),
        Case("accelerate config: a layer class to wrap misspelt", ["validate", cpt, "--model_name_or_path", model, "--accelerate-config", f["wrapaccel.yaml"]], "LlamaDecoderLayr is no class of"),
        Case("pass-rate: one id for two questions", ["pass-rate", grpo, "--model_name_or_path", model, "--output", f"{files}/rates.jsonl", "--dataset_mixture", f"{{sources: [{{path: {f['sharedid.jsonl']}, format: usmle}}]}}"], "have the id of another question (the first: 'q2'"),
        Case("pass_rate on documents", ["validate", cpt, "--dataset_mixture", "{sources: [{path: data/medical_text/train.jsonl, pass_rate: {file: nope.jsonl}}]}"], "whose rows are no questions to measure"),
        Case("a pass rate bound as a percent", ["validate", grpo, "--model_name_or_path", model, "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle, pass_rate: {file: r.jsonl, below: 80}}]}"], "pass_rate.below 80 is no pass rate"),
        Case("a source URL of a protocol fsspec lacks", ["validate", cpt, "--dataset_mixture", "{sources: [{path: 'ftpx://bucket/notes.jsonl'}]}"], "path ftpx://bucket/notes.jsonl: ftpx:// is no filesystem fsspec knows"),
        Case("a checkpoint mirror whose package is missing", ["validate", cpt, "--checkpoint_mirror_url", "oci://bucket/run"], "oci:// needs a package not installed here (Install ocifs to access OCI Object Storage); pip install the package it names"),
        Case("sample_by on a JSON Lines source", ["validate", cpt, "--dataset_mixture", "{sources: [{path: data/medical_text/train.jsonl, sample_by: paragraph}]}"], "sample_by chooses what one document of a .txt file is, and path data/medical_text/train.jsonl names no .txt file; leave sample_by out"),
        Case("sample_by on questions", ["validate", sft, "--eval_sets", "{usmle: {path: data/usmle_sample/test.jsonl, format: usmle, sample_by: line}}"], "sample_by chooses what one document of a .txt file is, and this source is format usmle"),
        Case("sample_by on a folder of JSON Lines", ["build-data", cpt, "--model_name_or_path", model, "--dataset_mixture", "{sources: [{path: data/medical_text, sample_by: document}]}", "--out", str(files / "built")], "source 'data/medical_text': sample_by chooses what one document of a .txt file is, and its files are read by another builder"),
        Case("perplexity: --sample-by of a JSON Lines file", ["perplexity", "--model", model, "--data", "data/medical_text/eval.jsonl", "--sample-by", "paragraph"], "perplexity --sample-by chooses what one document of a .txt file is, and --data data/medical_text/eval.jsonl is not one"),
        Case("one source twice in a mixture", ["validate", sft, "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle}, {path: data/usmle_sample/train.jsonl, format: usmle}]}"], "sources[1] is sources[0] again"),
        Case("an eval set with an empty name", ["validate", sft, "--eval_sets", "{'': {path: data/usmle_sample/test.jsonl, format: usmle}}"], "eval_sets has a set with an empty name"),
        Case("a loss weight fewer than the losses, as a YAML list", ["validate", dpo, "--loss_type", "[sigmoid, sft]", "--loss_weights", "[1.0]"], "Got 1 weights for 2 loss types"),
        Case("two recipes on one command line", script("sft", sft, cpt), "a second recipe, recipes/tiny_cpt.yaml, after recipes/tiny_sft.yaml; a script reads one recipe"),
        Case("a misspelt key without its dashes", ["validate", sft, "learnin_rate", "1e-5"], "command line: unknown argument 'learnin_rate'; keys after the recipe take two dashes (did you mean '--learning_rate'"),
        Case("a checkpoint mirror's port past 65535", ["validate", cpt, "--checkpoint_mirror_url", "ftp://127.0.0.1:99999/run"], "checkpoint_mirror_url ftp://127.0.0.1:99999/run: its address cannot be read (Port out of range 0-65535); fix the URL"),
        Case("a checkpoint mirror server URL without its host", ["validate", cpt, "--checkpoint_mirror_url", "ftp:///run"], "ftp:// names no host; write ftp://HOST/PATH"),
        Case("a checkpoint mirror file URL without its folder", ["validate", cpt, "--checkpoint_mirror_url", "file://"], "checkpoint_mirror_url file:// names no folder; write file:///PATH/TO/FOLDER"),
        Case("a data URL whose address cannot be read", ["validate", cpt, "--dataset_mixture", "{sources: [{path: 'http://[::1/corpus.jsonl'}]}"], "path http://[::1/corpus.jsonl: its address cannot be read (Invalid IPv6 URL)"),
        Case("a data URL of an object store without its bucket", ["validate", cpt, "--dataset_mixture", "{sources: [{path: 'gs:///corpus.jsonl'}]}"], "gs:// names no bucket; write gs://BUCKET/PATH"),
        Case("eval: a task named twice", ["eval", "--model", model, "--tasks", "medqa_4opt,medqa_4opt", "--data", TEST_SET], "tasks: medqa_4opt is named twice"),
        Case("a key without its dashes", ["validate", sft, "learning_rate", "1e-5"], "command line: 'learning_rate' is a recipe key written without its dashes, which the command line reads as no key at all; write --learning_rate VALUE"),
        Case("validate: a key before the recipe", ["validate", "--model_name_or_path", model, sft], "the recipe recipes/tiny_sft.yaml comes first, before its keys: medrecipes validate recipes/tiny_sft.yaml [--key value ...]"),
        Case("a script: a key before the recipe", ["recipes/sft.py", "--max_steps", "1", sft], "the recipe recipes/tiny_sft.yaml comes first, before the keys"),
        Case("a key YAML's null cannot stand for", ["validate", _recipe(files, sft, ("\nseed: 42", "\nseed: null"))], "seed: null, and it takes a whole number; give one, or leave the key out"),
        Case("validate: no dataset_mixture", ["validate", sft, "--dataset_mixture", "null"], "tiny_sft.yaml: no 'dataset_mixture'; add one with at least one source"),
        Case("eval_tasks_mode with no eval_tasks", ["validate", sft, "--eval_tasks_mode", "generate"], "eval_tasks_mode sets up eval_tasks, and the recipe names none"),
        Case("SFT: padding_free without packing", ["validate", sft, "--padding_free", "true"], "padding_free: true without packing holds no row to max_length 384 (TRL refuses it)"),
        Case("SFT: sources weighed by their tokens", ["validate", sft, "--dataset_mixture", "{weight_unit: tokens, sources: [{path: data/usmle_sample/train.jsonl, format: usmle}]}"], "weight_unit tokens shares a pretraining run's tokens among its sources"),
        Case("eval_tasks with no eval sets", ["validate", sft, "--eval_tasks", "medqa_4opt", "--eval_sets", "null"], "eval_tasks are scored at each evaluation, which runs on eval_sets, and there are none"),
        Case("every loss weighs 0", ["validate", dpo, "--loss_type", "[sigmoid, sft]", "--loss_weights", "[0, 0]"], "loss_weights [0.0, 0.0]: each loss_type's weight must be 0 or more, and one above 0"),
        Case("a loss weighs below 0", ["validate", dpo, "--loss_type", "[sigmoid, sft]", "--loss_weights", "[1, -1]"], "(below 0 trains that loss backwards"),
        Case("a loss weight fewer than the losses, as one word", ["validate", dpo, "--loss_type", "[sigmoid, sft]", "--loss_weights", "1.0"], "Got 1 weights for 2 loss types"),
        Case("a loss named twice", ["validate", dpo, "--loss_type", "[sigmoid, sigmoid]"], "loss_type names 'sigmoid' twice"),
        Case("a name YAML reads as a date", ["validate", _recipe(files, cpt, append="run_name: 2024-01-01\n")], "run_name 2024-01-01 is read by YAML as a date; quote it"),
        Case("GRPO answers per eval question that split no batch", ["validate", grpo, "--num_generations_eval", "3"], "num_generations_eval 3 does not divide the eval batch"),
        Case("questions from a URL", ["validate", sft, "--dataset_mixture", "{sources: [{path: 'https://example.com/q.jsonl', format: usmle}]}"], "is a URL, and questions (format usmle) are read from local files"),
        Case("dataset_kwargs key misspelt", ["validate", sft, "--dataset_kwargs", "{skip_prepare: true}"], "dataset_kwargs.skip_prepare is not read by TRL's trainer (did you mean 'skip_prepare_dataset'?)"),
        Case("plan: prompts of no token", ["plan", grpo, "--prompt-tokens", "0"], "--prompt-tokens: must be at least 1"),
        Case("router loss on a dense model", ["validate", sft, "--model_name_or_path", model, "--router_aux_loss_coef", "0.5"], "llama has no router"),
        Case("length past the model's positions", ["validate", sft, "--model_name_or_path", model, "--max_length", "100000"], "is past the 2048 positions"),
        Case("LoRA rank past the layers' width", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_r", "100000"], "is not below the width of the layers"),
        Case("batch of 1e20", script("sft", sft, "--per_device_train_batch_size", "100000000000000000000"), "beyond the largest whole number"),
        Case("DPO beta negative", script("dpo", dpo, "--beta", "-0.1"), "a negative beta prefers the rejected answers"),
        Case("DPO label_smoothing 0.5", script("dpo", dpo, "--label_smoothing", "0.5"), "label_smoothing must be at least 0 and below 0.5"),
        Case("KTO desirable_weight 0", script("kto", kto, "--desirable_weight", "0"), "desirable_weight must be above 0"),
        Case("GRPO one generation", script("grpo", grpo, "--num_generations", "1"), "num_generations"),
        Case("GRPO unknown reward", script("grpo", grpo, "--rewards", "[{name: usmle_acuracy}]"), "did you mean 'usmle_accuracy'"),
        Case("GRPO reward weight text", script("grpo", grpo, "--rewards", "[{name: usmle_accuracy, weight: high}]"), "weight"),
        Case("GRPO reward unknown key", script("grpo", grpo, "--rewards", "[{name: answer_format, stlye: letter}]"), "stlye"),
        Case("GRPO vllm_mode unknown", script("grpo", grpo, "--vllm_mode", "remote"), "vllm_mode"),
        Case("GRPO prompt_format unknown", script("grpo", grpo, "--prompt_format", "markdown"), "prompt_format"),
        Case("GRPO token budget", script("grpo", grpo, "--total_tokens", "100000"), "token budgets are for pretraining"),
        Case("GRPO completion length 0", script("grpo", grpo, "--max_completion_length", "0"), "at least 1"),
        Case("GRPO prompts_per_step 0", script("grpo", grpo, "--prompts_per_step", "0"), "prompts_per_step"),
        Case("GRPO reward_weights flat", script("grpo", grpo, "--reward_weights", "1.0"), "reward_weights"),
        Case("GRPO top_k negative", script("grpo", grpo, "--top_k", "-3"), "top_k -3 is refused by transformers' generation"),
        Case("GRPO min_p above 1", script("grpo", grpo, "--min_p", "2.0"), "min_p 2.0 is refused by transformers' generation"),
        Case("GRPO repetition_penalty 0", script("grpo", grpo, "--repetition_penalty", "0"), "repetition_penalty 0.0 is refused"),
        Case("GRPO num_iterations 0", script("grpo", grpo, "--num_iterations", "0"), "num_iterations must be at least 1"),
        Case("eval accumulation 0", script("cpt", cpt, "--eval_accumulation_steps", "0"), "eval_accumulation_steps must be at least 1"),
        Case("NEFTune alpha negative", script("sft", sft, "--neftune_noise_alpha", "-5"), "neftune_noise_alpha must be above 0"),
        Case("LoRA task not a causal LM", script("sft", sft, "--use_peft", "true", "--lora_task_type", "SEQ_CLS"), "every recipe trains a causal language model"),
        Case("compile mode unknown", script("cpt", cpt, "--torch_compile", "true", "--torch_compile_mode", "fastest"), "torch_compile_mode 'fastest' is not one of torch's"),
        Case("DPO reference sync every 0 steps", script("dpo", dpo, "--sync_ref_model", "true", "--ref_model_sync_steps", "0"), "ref_model_sync_steps must be at least 1"),
        Case("DPO f-divergence unknown", script("dpo", dpo, "--f_divergence_type", "kl"), "f_divergence_type 'kl' is none of the values TRL's DPOTrainer acts on"),
        Case("eval set with a weight", script("sft", sft, "--eval_sets", "{u: {path: data/usmle_sample/test.jsonl, format: usmle, weight: 5}}"), "weight is a training source's share of the mixture"),
        Case("text_field on questions", script("sft", sft, "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle, text_field: body}]}"), "text_field names the column of a format text source"),
        Case("revision of a local file", script("sft", sft, "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle, revision: v2}]}"), "revision picks a version of a Hub dataset"),
        Case("revision of a builder", script("cpt", cpt, "--eval_sets", "{notes: {path: json, data_files: data/medical_text/eval.jsonl, revision: main}}"), "the packaged builder json, which has none"),
        Case("data_files beside a file path", script("sft", sft, "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, data_files: data/usmle_sample/test.jsonl, format: usmle}]}"), "names the one file read, so data_files is not used"),
        Case("config name of a local file", script("sft", sft, "--eval_sets", "{u: {path: data/usmle_sample/test.jsonl, name: medqa, format: usmle}}"), "names the one file read, so name is not used"),
        Case("config name of a builder", script("cpt", cpt, "--dataset_mixture", "{sources: [{path: json, name: en, data_files: data/medical_text/train.jsonl}]}"), "name chooses among a Hub dataset's configs"),
        Case("eval_tasks given a file", script("sft", sft, "--eval_tasks", TEST_SET), "to score a file of questions name it in eval_sets"),
        Case("best checkpoint by the highest loss", script("sft", sft, "--greater_is_better", "true"), "would keep the checkpoint with the highest eval_usmle_train_loss"),
        Case("best checkpoint by the lowest accuracy", script("grpo", grpo, "--metric_for_best_model", "eval_usmle_test_acc", "--greater_is_better", "false"), "the lowest eval_usmle_test_acc, the worst one"),
        Case("save_total_limit 0", script("cpt", cpt, "--save_total_limit", "0"), "save_total_limit must be at least 1"),
        Case("optim_args the optimizer drops", script("cpt", cpt, "--optim", "sgd", "--optim_args", "momentum=0.9,dampening_typo=0.1"), "optim_args dampening_typo is not read for the sgd optimizer"),
        Case("optim_args not key=value", script("cpt", cpt, "--optim_args", "momentum"), "not key=value"),
        Case("GRPO num_generations_eval 0", script("grpo", grpo, "--num_generations_eval", "0"), "num_generations_eval must be at least 1"),
        Case("logger not installed", script("sft", sft, "--report_to", "wandb"), "report_to wandb: its package is not installed here"),
        Case("Liger kernels not installed", script("cpt", cpt, "--use_liger_kernel", "true"), "the liger-kernel package is not installed"),
        Case("optimizer's package not installed", script("sft", sft, "--optim", "galore_adamw"), "optim galore_adamw: You need to install `galore_torch`"),
        Case("flash attention on a CPU machine", script("sft", sft, "--attn_implementation", "flash_attention_2"), "needs the flash-attn package for flash_attention_2"),
        Case("4-bit settings without 4-bit loading", script("sft", sft, "--bnb_4bit_quant_type", "fp4"), "bnb_4bit_quant_type sets up 4-bit loading, and load_in_4bit is false"),
        Case("model_revision of a local model", script("sft", sft, "--model_revision", "v2"), "model_revision picks a version of a Hub model"),
        Case("min_lr under another schedule", script("cpt", cpt, "--lr_scheduler_type", "constant", "--min_lr", "1e-5"), "lr_scheduler_type constant would be replaced by it"),
        Case("warm-up tokens beyond the run", script("cpt", "recipes/tiny_pretrain.yaml", "--warmup_tokens", "100000000000"), "beyond the run's 8"),
        Case("eval_tasks_limit without eval_tasks", script("sft", sft, "--eval_tasks_limit", "5"), "eval_tasks_limit sets up eval_tasks, and the recipe names none"),
        Case("eval_tasks_data_dir missing", script("sft", sft, "--eval_tasks", "medqa_4opt", "--eval_tasks_data_dir", "/nope", "--eval_strategy", "steps", "--eval_steps", "5"), "eval_tasks_data_dir /nope: no such file or folder"),
        Case("reference sync with LoRA", script("kto", kto, "--use_peft", "true", "--sync_ref_model", "true"), "which TRL cannot sync"),
        Case("reference sync without a reference", script("grpo", grpo, "--beta", "0", "--sync_ref_model", "true"), "beta 0 loads none"),
        Case("checkpoint revisions pushed while offline", script("cpt", cpt, "--push_checkpoint_revisions", "true"), "push_checkpoint_revisions is true but the Hub is offline here"),
        Case("DPO mixup alpha above 1", script("dpo", dpo, "--ref_model_mixup_alpha", "2"), "ref_model_mixup_alpha must be at least 0 and at most 1"),
        Case("label smoothing above 1", script("sft", sft, "--label_smoothing_factor", "1.5"), "label_smoothing_factor must be at least 0 and below 1"),
        Case("GRPO top_p above 1", script("grpo", grpo, "--top_p", "1.5"), "top_p must be above 0 and at most 1"),
        Case("eval_delay negative", script("cpt", cpt, "--eval_delay", "-3"), "eval_delay must be 0 or more"),
        Case("seed negative", script("sft", sft, "--seed", "-1"), "seed -1 is refused by the generators set_seed seeds"),
        Case("GRPO eval set of documents", script("grpo", grpo, "--eval_sets", "{notes: {path: data/medical_text/eval.jsonl}}"), "format text is not what GRPO trains on"),
        Case("CPT eval set of conversations", script("cpt", cpt, "--eval_sets", "{talk: {path: data/medical_text/eval.jsonl, format: chat}}"), "format chat is not what CPT trains on"),
        # --- SFT
        Case("SFT training row without an answer", ["decontaminate", "--train", _recipe(files, sft, ("- {path: data/usmle_sample/train.jsonl, format: usmle}", f"- {{path: {f['noanswer.jsonl']}, format: usmle}}")), "--eval", TEST_SET], "noanswer.jsonl line 3: has no gold answer"),
        Case("SFT text source with assistant loss", script("sft", _recipe(files, sft, ("format: usmle", "format: text"))), "assistant_only_loss"),
        Case("SFT chat template missing", script("sft", sft, "--chat_template_path", "recipes/templates/nope.jinja"), "nope.jinja"),
        # --- medrecipes validate / plan / launch-plan
        Case("validate: file missing", ["validate", f"{files}/nope.yaml"], "no such recipe file"),
        Case("validate: unknown method", ["validate", cpt, "--method", "ppo"], "unknown method 'ppo'; one of cpt, sft, grpo, dpo, kto"),
        Case("validate: an SFT recipe as GRPO", ["validate", sft, "--method", "grpo"], "a recipe for recipes/sft.py (assistant_only_loss is a key of sft recipes, which --method grpo does not take)"),
        Case("build-data: a data line not JSON", ["build-data", _recipe(files, src(f"{{path: {f['notjson.jsonl']}}}"), ("outputs/demo/tiny-model", model)), "--out", f"{files}/built"], "notjson.jsonl line 2: not JSON"),
        Case("decontaminate: a streamed line not JSON", ["decontaminate", "--train", _recipe(files, cpt, ("sources:\n", f"streaming: true\n  sources:\n    - {{path: {f['notjson.jsonl']}}}\n")), "--eval", TEST_SET], "line 2: not JSON"),
        Case("validate: a data file missing", ["validate", src("{path: json, data_files: data/medical_text/trian.jsonl}")], "trian.jsonl does not exist"),
        Case("validate: an unknown architecture", ["validate", "recipes/tiny_pretrain.yaml", "--architecture", "tiniest"], "unknown architecture 'tiniest'"),
        Case("validate: a data file empty", ["validate", src(f"{{path: {f['empty.jsonl']}}}")], "empty"),
        Case("validate: a DeepSpeed config that is not there", ["validate", cpt, "--deepspeed", "nope.json"], "argument --deepspeed: no such file 'nope.json'"),
        Case("a library's mapping key not a mapping", ["validate", grpo, "--transformers_continuous_batching_config", "{page_size: ["], "--transformers_continuous_batching_config"),
        Case("plan: 0 GPUs", ["plan", cpt, "--num-gpus", "0"], "--num-gpus: must be at least 1"),
        Case("plan: unknown GPU", ["plan", "recipes/gemma3_4b.yaml", "--gpu", "h100-40gb"], "gpu"),
        Case("plan: negative dataset sequences", ["plan", cpt, "--dataset-sequences", "-5"], "dataset-sequences"),
        Case("plan: negative prompt tokens", ["plan", grpo, "--prompt-tokens", "-1"], "prompt-tokens"),
        Case("plan: an evaluation recipe", ["plan", "recipes/tiny_eval.yaml"], "a recipe for recipes/evaluate.py"),
        Case("decontaminate: an unknown flag after a training file", ["decontaminate", "--train", "data/medical_text/train.jsonl", "--eval", TEST_SET, "--bogus", "1"], "decontaminate: unknown argument '--bogus'"),
        Case("launch-plan: a GPU count plan refuses", ["launch-plan", grpo, "--nodes", "1", "--gpus-per-node", "3"], "do not divide into per_device_train_batch_size 8 x 3 processes"),
        Case("accelerate config not YAML", ["validate", cpt, "--accelerate-config", f["brokenaccel.yaml"]], "brokenaccel.yaml: not valid YAML (line 2, column 1"),
        Case("accelerate config: distributed type misspelt", ["validate", cpt, "--accelerate-config", f["typoaccel.yaml"]], "accelerate refuses it ('FSPD' is not a valid DistributedType)"),
        Case("accelerate config: processes as words", ["launch-plan", cpt, "--nodes", "2", "--accelerate-config", f["wordsaccel.yaml"]], "num_processes must be a whole number, got 'eight'"),
        Case("accelerate config: precision unknown", ["validate", sft, "--accelerate-config", f["fp32accel.yaml"]], "mixed_precision 'fp32' is none of"),
        Case("accelerate config: fewer gpu_ids than processes", ["validate", sft, "--accelerate-config", f["gpuidsaccel.yaml"]], "gpu_ids 0,1 lists 2 GPU(s) and each machine starts 4 processes"),
        Case("accelerate config: fp8 precision", ["validate", sft, "--accelerate-config", f["fp8accel.yaml"]], "the launch's mixed_precision fp8 (accelerate's, for Transformer Engine"),
        Case("a recipe as the accelerate config", ["validate", sft, "--accelerate-config", cpt], "recipes/tiny_cpt.yaml: not an accelerate config (no distributed_type"),
        Case("an accelerate config as the recipe", script("sft", "accelerate_configs/zero3.yaml"), "an accelerate config (compute_environment, distributed_type), not a recipe"),
        Case("eval recipe: a task's data replaced on the command line", ["recipes/evaluate.py", "recipes/tiny_eval.yaml", "--model_name_or_path", model, "--data", f"usmle_test={TEST_SET}"], "task 'usmle_train' has its questions in the recipe's data, which --data on the command line replaces"),
        Case("accelerate config for an eval recipe", ["validate", "recipes/tiny_eval.yaml", "--accelerate-config", "accelerate_configs/ddp.yaml"], "an eval recipe is not launched"),
        Case("launch-plan: 0 nodes", ["launch-plan", cpt, "--nodes", "0"], "--nodes: must be at least 1"),
        Case("launch-plan: 0 GPUs a node", ["launch-plan", cpt, "--nodes", "2", "--gpus-per-node", "0"], "--gpus-per-node: must be at least 1"),
        Case("build-data: 0 GPUs", ["build-data", "recipes/tiny_pretrain.yaml", "--num-gpus", "0"], "--num-gpus: must be at least 1"),
        Case("build-data: an SFT recipe", ["build-data", sft], "a recipe for recipes/sft.py; this command takes a cpt recipe (the token blocks"),
        # --- medrecipes eval
        Case("eval: unknown task", ["eval", "--model", model, "--tasks", "medqa"], "did you mean"),
        Case("eval: a device torch does not know", ["eval", "--model", model, "--tasks", "medqa_4opt", "--device", "tpu"], "device 'tpu' is not a device torch knows"),
        Case("eval: a device with a word for its index", ["eval", "--model", model, "--tasks", "medqa_4opt", "--device", "cpu:x"], "device 'cpu:x' is not a device torch knows"),
        Case("eval: a benchmark folder whose file has another name", ["eval", "--model", model, "--tasks", "medmcqa", "--data-dir", f"{files}/benchmarks"], "medmcqa holds dev_questions.jsonl); put the file there or pass --data medmcqa=FILE"),
        Case("eval: limit 0", ["eval", "--model", model, "--data", TEST_SET, "--limit", "0"], "limit must be at least 1"),
        Case("eval: no task", ["eval", "--model", model, "--tasks", "", "--data", TEST_SET], "tasks is empty; name at least one"),
        Case("eval: a task's data twice", ["eval", "--model", model, "--data", f"medqa_4opt={TEST_SET}", "medqa_4opt=data/usmle_sample/train.jsonl"], "task 'medqa_4opt' is given twice"),
        Case("eval: batch size 0", ["eval", "--model", model, "--data", TEST_SET, "--batch_size", "0"], "batch_size"),
        Case("eval: few-shot -1", ["eval", "--model", model, "--data", TEST_SET, "--num_fewshot", "-1"], "num_fewshot"),
        Case("eval: unknown mode", ["eval", "--model", model, "--data", TEST_SET, "--mode", "logprob"], "mode"),
        Case("eval: max_new_tokens 0", ["eval", "--model", model, "--data", TEST_SET, "--max_new_tokens", "0"], "max_new_tokens"),
        Case("eval: temperature negative", ["eval", "--model", model, "--data", TEST_SET, "--mode", "generate", "--temperature", "-1"], "temperature"),
        Case("eval: data file missing", ["eval", "--model", model, "--data", "nope.jsonl"], "nope.jsonl"),
        Case("eval: data empty", ["eval", "--model", model, "--data", f["empty.jsonl"]], "empty.jsonl"),
        Case("eval: data not UTF-8", ["eval", "--model", model, "--data", f["latin1.jsonl"]], "UTF-8"),
        Case("eval: data not JSON", ["eval", "--model", model, "--data", f["notjson.jsonl"]], "notjson.jsonl line 2: not JSON"),
        Case("eval: rows without options", ["eval", "--model", model, "--data", f["nooptions.jsonl"]], "options"),
        Case("eval: MMLU's task on one subject's file", ["eval", "--model", model, "--tasks", "mmlu_medical", "--data", f"mmlu_medical={f['anatomy_dev.csv']}"], "mmlu_medical scores its 6 subjects; give the questions of all of them, or score these under a name of their own (--tasks NAME --data NAME="),
        Case("eval: MedMCQA cop numbers that read as 0-3 and as 1-4", ["eval", "--model", model, "--tasks", "medmcqa", "--data", f"medmcqa={f['medmcqa123.jsonl']}"], "every numbered 'cop' is 1, 2 or 3"),
        Case("eval: answer not an option", ["eval", "--model", model, "--data", f["badanswer.jsonl"]], "answer"),
        Case("eval: a CSV separated by semicolons", ["eval", "--model", model, "--data", f["semicolons.csv"]], "semicolons.csv: its fields are separated by ';'"),
        Case("eval: CSV row of the wrong width", ["eval", "--model", model, "--data", f["ragged.csv"]], "ragged.csv line 3: 6 cells where the header has 4"),
        Case("eval: two JSON objects on one line", ["eval", "--model", model, "--data", f["glued.jsonl"]], "glued.jsonl line 2: holds more than one JSON object, and JSON Lines takes one a line"),
        Case("eval: output '-' for standard output", ["eval", "--model", model, "--data", TEST_SET, "--output", "-"], "output: '-' is standard output to many tools, and this writes a file"),
        Case("eval: output is a folder", ["eval", "--model", model, "--data", TEST_SET, "--output", str(files)], "is a folder"),
        Case("eval: output over a user's file", ["eval", "--model", model, "--data", TEST_SET, "--output", f["existing.json"]], "medrecipes did not write"),
        Case("eval: output is the data", ["eval", "--model", model, "--data", TEST_SET, "--output", TEST_SET], "also what"),
        Case("eval: model folder missing", ["eval", "--model", f"{files}/no-model", "--data", TEST_SET], "no such file or folder; pass a model's folder"),
        Case("eval: model folder empty", ["eval", "--model", f["emptydir"], "--data", TEST_SET], "not a complete model"),
        Case("eval: model is an adapter", ["eval", "--model", f["adapter"], "--data", TEST_SET], "LoRA adapter"),
        Case("eval: more samples a question than any vote needs", ["eval", "--model", model, "--data", TEST_SET, "--mode", "generate", "--temperature", "1", "--samples", "100000000"], "samples 100000000 is more than the 1024"),
        Case("pass-rate: more samples a question than any filter needs", ["pass-rate", grpo, "--model_name_or_path", model, "--samples", "100000000", "--output", f"{files}/pr.jsonl"], "--samples: must be at least 2 and at most 1024"),
        Case("eval: samples without sampling", ["eval", "--model", model, "--data", TEST_SET, "--samples", "4"], "samples 4 draws several answers"),
        Case("eval: a saved temperature that is not one", ["eval", "--model", f["badtemperature"], "--data", TEST_SET], "calibration.json: no positive temperature"),
        # --- medrecipes calibrate
        Case("calibrate: the same questions fitted and measured", ["calibrate", "--model", model, "--task", "usmle", "--dev", "data/usmle_sample/train.jsonl", "--held-out", "data/usmle_sample/train.jsonl"], "share questions"),
        Case("calibrate: a model that is not a local folder", ["calibrate", "--model", "google/gemma-3-270m", "--task", "medqa_4opt", "--dev", TEST_SET], "not a local model folder"),
        Case("calibrate: limit 0", ["calibrate", "--model", model, "--task", "usmle", "--dev", TEST_SET, "--limit", "0"], "--limit: must be at least 1"),
        Case("calibrate: fitted on too few questions", ["calibrate", "--model", model, "--task", "usmle", "--dev", "data/usmle_sample/train.jsonl", "--held-out", TEST_SET, "--limit", "1"], "has 1 questions to fit on (with --limit 1)"),
        Case("calibrate: a dev file of too few questions", ["calibrate", "--model", model, "--task", "usmle", "--dev", TEST_SET, "--held-out", "data/usmle_sample/train.jsonl"], "has 20 questions to fit on, fewer than 50"),
        # --- medrecipes pairs
        Case("eval: --output named as another format", ["eval", "--model", model, "--data", TEST_SET, "--output", f"{files}/scores.csv"], "scores.csv is named as CSV, and eval writes JSON; name it scores.json"),
        Case("pairs: --out named as another format", ["pairs", "--mcq", TEST_SET, "--out", f"{files}/pairs.parquet"], "pairs.parquet is named as Parquet, and pairs writes JSON Lines; name it pairs.jsonl"),
        Case("decontaminate: multiple-choice rows kept as CSV", ["decontaminate", "--train", "data/usmle_sample/train.jsonl", "--eval", TEST_SET, "--drop", f"{files}/kept.csv"], "a CSV cell cannot hold as a list"),
        Case("pairs: one sample a question", ["pairs", "--mcq", TEST_SET, "--model", model, "--samples", "1", "--out", f"{files}/p.jsonl"], "--samples: must be at least 2"),
        Case("pairs: greedy answers", ["pairs", "--mcq", TEST_SET, "--model", model, "--temperature", "0", "--out", f"{files}/p.jsonl"], "--temperature: must be a finite number above 0"),
        # --- medrecipes decontaminate
        Case("decontaminate: n 0", ["decontaminate", "--train", TEST_SET, "--eval", TEST_SET, "--n", "0"], "--n: must be at least 1"),
        Case("decontaminate: a task's name as an eval set", ["decontaminate", "--train", TEST_SET, "--eval", "medqa_4opt"], "decontaminate --eval medqa_4opt: a task's name"),
        Case("decontaminate: no eval sets", ["decontaminate", "--train", "data/medical_text/train.jsonl"], "pass --eval"),
        Case("decontaminate: train missing", ["decontaminate", "--train", "nope.jsonl", "--eval", TEST_SET], "nope.jsonl"),
        Case("decontaminate: train empty", ["decontaminate", "--train", f["empty.jsonl"], "--eval", TEST_SET], "empty.jsonl"),
        Case("decontaminate: train not UTF-8", ["decontaminate", "--train", f["latin1.jsonl"], "--eval", TEST_SET], "UTF-8"),
        Case("decontaminate: eval missing", ["decontaminate", "--train", TEST_SET, "--eval", "nope.jsonl"], "nope.jsonl"),
        Case("decontaminate: drop over the input", ["decontaminate", "--train", f["notes.jsonl"], "--eval", TEST_SET, "--drop", f["notes.jsonl"]], "also what"),
        Case("decontaminate: drop over a user's file", ["decontaminate", "--train", f["notes.jsonl"], "--eval", TEST_SET, "--drop", f["existing.json"]], "medrecipes did not write"),
        Case("decontaminate: drop over a folder", ["decontaminate", "--train", f["notes.jsonl"], "--eval", TEST_SET, "--drop", f["emptydir"]], "is a folder; name the file to write"),
        Case("convert-gguf: a folder named .gguf", ["convert-gguf", f["folder.gguf"], f"{files}/cg1"], "is a folder, and a .gguf model is one file"),
        Case("preview: a template whose turn tokens the tokenizer lacks", ["preview", sft, "--model_name_or_path", model, "--examples", "1", "--eval_sets", "null", "--chat_template_path", "gemma"], "which this tokenizer does not have as tokens"),
        Case("JSON Lines object with a key twice", ["preview", cpt, "--model_name_or_path", model, "--tokenizer_name_or_path", model, "--eval_sets", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", *NO_EVAL, "--dataset_mixture", f"{{sources: [{{path: {f['twice.jsonl']}, format: text}}]}}"], "twice.jsonl line 2: a key 'text' appears twice"),
        Case("a JSON line nested past what a reader follows", ["preview", cpt, "--model_name_or_path", model, "--eval_sets", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", *NO_EVAL, "--dataset_mixture", f"{{sources: [{{path: {f['deep.jsonl']}}}]}}"], "deep.jsonl line 2: its JSON nests arrays or objects deeper than a reader follows"),
        Case("a CSV naming a column twice", ["preview", cpt, "--model_name_or_path", model, "--eval_sets", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", *NO_EVAL, "--dataset_mixture", f"{{sources: [{{path: {f['twocols.csv']}}}]}}"], "twocols.csv line 1: the header names column 'text' twice"),
        Case("a weight that leaves a source undrawn", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle}, {path: data/usmle_sample/test.jsonl, format: usmle, weight: 1.0e-9}]}"], "source usmle_sample/test (20 rows) is drawn with probability 1e-09"),
        Case("a mixture cut short on the command line", ["validate", sft, "--dataset_mixture", "{sources: [{path: x}"], "not valid YAML (column 21: expected ',' or ']'"),
        Case("a chat template path of a folder with no tokenizer", ["validate", sft, "--chat_template_path", f["emptydir"]], "is a folder with no tokenizer in it (no tokenizer_config.json); name a .jinja file"),
        Case("a chat template path of a tokenizer with no template", ["validate", sft, "--chat_template_path", f["notemplate"]], "is a tokenizer with no chat template (none in tokenizer_config.json, no chat_template.jinja)"),
        Case("a chat template that does not compile", ["preview", sft, "--model_name_or_path", model, "--assistant_only_loss", "false", "--chat_template_path", f["badsyntax.jinja"]], "badsyntax.jinja line 1: unexpected '}'; fix the template"),
        Case("eval: a number beyond 64 bits in a row", ["eval", "--model", model, "--data", f["bignumber.jsonl"]], "bignumber.jsonl line 2: the number 1e400 is beyond what pyarrow stores in 64 bits"),
        Case("generate: a system prompt the template refuses", ["generate", f["nosystem"], "--prompt", "hi", "--system", "be brief"], "the model's chat template refuses the turns it was given (System role not supported); leave the system prompt out"),
        Case("eval: a system prompt the template refuses", ["eval", "--model", f["nosystem"], "--data", TEST_SET, "--mode", "generate", "--system_prompt", "be brief", "--limit", "2"], "(System role not supported); leave the system prompt out (system_prompt in a recipe or eval"),
        Case("generate: a config.json with no model_type", ["generate", f["notype"], "--prompt", "hi"], "notype/config.json: no model_type, which transformers builds the model by"),
        Case("generate: a tokenizer.json linked to a device", ["generate", f["devicetokenizer"], "--prompt", "hi"], "devicetokenizer/tokenizer.json: not a file or folder but a device"),
        Case("perplexity: data linked to a device", ["perplexity", "--model", model, "--data", f["device.jsonl"]], "device.jsonl': not a file or folder but a device"),
        Case("eval: a Parquet file cut short", ["eval", "--model", model, "--data", f["cut.parquet"]], "cut.parquet: not a whole Parquet file (Parquet magic bytes not found in footer"),
        Case("CPT: a folder of two kinds of file", script("cpt", src(f"{{path: {f['twokinds']}}}"), *run_in(files, model)), "holds files of more than one kind (.csv, .jsonl), and datasets reads one kind of a folder"),
        Case("a checkpoint mirror whose server is not there", script("cpt", cpt, *run_in(files, model), "--max_steps", "2", "--checkpoint_mirror_url", "ftp://127.0.0.1:1/run"), "checkpoint_mirror_url ftp://127.0.0.1:1/run: cannot reach it ("),
        Case("CPT: a URL no host answers", script("cpt", src("{path: 'https://host.invalid/notes.jsonl'}"), *run_in(files, model)), "source 'https://host.invalid/notes.jsonl': cannot reach it ("),
        Case("CPT: JSON Lines named .parquet", script("cpt", src(f"{{path: {f['lines.parquet']}}}"), *run_in(files, model)), "lines.parquet: holds JSON, not Parquet; name it .jsonl"),
        Case("eval: a Parquet file of no rows", ["eval", "--model", model, "--data", f["norows.parquet"]], "norows.parquet: the Parquet file holds no rows"),
        Case("decontaminate: one set given twice", ["decontaminate", "--train", f["notes.jsonl"], "--eval", TEST_SET, "--eval", TEST_SET], "--eval data/usmle_sample/test.jsonl is given twice"),
        Case("decontaminate: a recipe's script for a file", ["decontaminate", "--train", f["notes.jsonl"], "--eval", TEST_SET, "--method", "sft"], "--method sft names a recipe's script"),
        Case("a CSV of its header alone", ["preview", cpt, "--model_name_or_path", model, "--tokenizer_name_or_path", model, "--eval_sets", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", *NO_EVAL, "--dataset_mixture", f"{{sources: [{{path: {f['header.csv']}}}]}}"], "header.csv': holds no rows"),
        Case("a text split slice of no rows", ["preview", cpt, "--model_name_or_path", model, "--tokenizer_name_or_path", model, "--eval_sets", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", *NO_EVAL, "--dataset_mixture", "{sources: [{path: data/medical_text/train.jsonl, split: 'train[:0]'}]}"], "split 'train[:0]' selects no rows"),
        Case("a question split slice of no rows", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--dataset_mixture", "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle, split: 'train[:0]'}]}"], "selects none of its 60 rows"),
        Case("a folder's split its files do not make", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--dataset_mixture", f"{{sources: [{{path: {f['splits']}, format: usmle, split: validation}}]}}"], "no 'validation' split: its files make train, test"),
        Case("checkpoint mirror into a folder of one's own files", ["validate", cpt, "--checkpoint_mirror_url", f["mirror"]], "holds own-notes.txt, which is not a checkpoint a mirror copied"),
        Case("checkpoint mirror inside output_dir", ["validate", cpt, "--output_dir", f"{files}/mrun", "--checkpoint_mirror_url", f"file://{files}/mrun/copies"], "lies inside output_dir"),
        Case("chat turn of spaces", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--dataset_mixture", f"{{sources: [{{path: {f['blankturn.jsonl']}, format: chat}}]}}"], "blankturn.jsonl line 2: turn 1 (user) is empty"),
        Case("chat row in both layouts", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--dataset_mixture", f"{{sources: [{{path: {f['twolayouts.jsonl']}, format: chat}}]}}"], "two layouts of a chat row"),
        Case("preference prompt of a system turn alone", ["preview", dpo, "--model_name_or_path", model, *pairs(f["systemprompt.jsonl"])], "the last turn of prompt is not the user's"),
        Case("preferred answer holding the question", ["preview", dpo, "--model_name_or_path", model, *pairs(f["questionchosen.jsonl"])], "chosen holds a user turn"),
        Case("preferred answer a list of texts", ["preview", dpo, "--model_name_or_path", model, *pairs(f["textschosen.jsonl"])], "chosen is a list of other things than turns"),
        Case("JSON array with an element not an object", ["preview", cpt, "--model_name_or_path", model, "--tokenizer_name_or_path", model, "--eval_sets", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", *NO_EVAL, "--dataset_mixture", f"{{sources: [{{path: {f['array.json']}, format: text}}]}}"], "array.json line 3: element 2 of its array is a JSON str"),
        Case("decontaminate: drop as .txt", ["decontaminate", "--train", f["notes.jsonl"], "--eval", TEST_SET, "--drop", f"{files}/kept.txt"], "unsupported file type"),
        # --- medrecipes tiny-model
        Case("tiny-model: folder of a user's files", ["tiny-model", f["adapter"]], "medrecipes did not write"),
        Case("tiny-model: over a file", ["tiny-model", TEST_SET], "is a file"),
        Case("tiny-model: vocabulary 0", ["tiny-model", f"{files}/t1", "--vocab-size", "0"], "vocab-size"),
        Case("tiny-model: width 0", ["tiny-model", f"{files}/t2", "--hidden-size", "0"], "hidden-size"),
        Case("tiny-model: heads of an odd width", ["tiny-model", f"{files}/t3", "--hidden-size", "36"], "--hidden-size must be a multiple of 8 (4 attention heads, each of an even width for rotary positions), got 36; use 32 or 40"),
        Case("tiny-model: 0 layers", ["tiny-model", f"{files}/t3", "--layers", "0"], "layers"),
        Case("tiny-model: corpus missing", ["tiny-model", f"{files}/t4", "--corpus", "nope.txt"], "nope.txt"),
        # --- medrecipes merge-lora
        Case("eval: a file for --data_dir", ["eval", "--model", model, "--data_dir", TEST_SET], "--data_dir data/usmle_sample/test.jsonl: a file, not a folder"),
        Case("perplexity: output a pipe or device", ["perplexity", "--model", model, "--data", "data/medical_text/eval.jsonl", "--output", "/dev/null"], "/dev/null is not a file or folder but a device, pipe or socket"),
        Case("decontaminate: a benchmark of no layout", ["decontaminate", "--train", f["notes.jsonl"], "--eval", f["othercolumns.jsonl"]], "neither multiple-choice questions, documents with a 'text' column, conversations nor preference pairs"),
        Case("an MCQ folder of hidden files only", ["preview", sft, "--model_name_or_path", model, "--examples", "1", "--eval_sets", "null", "--dataset_mixture", f"{{sources: [{{path: {f['hiddenonly']}, format: usmle}}]}}"], "holds no .jsonl, .json, .csv, .parquet files that are not hidden"),
        Case("min_lr above the learning rate", ["validate", "recipes/tiny_pretrain.yaml", "--tokenizer_name_or_path", model, "--min_lr", "0.1"], "min_lr 0.1 is above learning_rate 0.001"),
        Case("adam_epsilon 0", ["validate", sft, "--adam_epsilon", "0"], "adam_epsilon must be above 0, got 0"),
        Case("a step count beside the token count that derives it", ["validate", "recipes/tiny_pretrain.yaml", "--tokenizer_name_or_path", model, "--max_steps", "3"], "max_steps 3 and total_tokens are both given"),
        Case("merge-lora: adapter missing", ["merge-lora", f"{files}/nope", f"{files}/m1"], "nope: no such file or folder"),
        Case("merge-lora: a data file for the adapter", ["merge-lora", TEST_SET, f"{files}/m1"], "test.jsonl: a file, not a folder"),
        Case("merge-lora: not an adapter", ["merge-lora", model, f"{files}/m2"], "no adapter_config.json"),
        Case("merge-lora: adapter config not JSON", ["merge-lora", f["badadapter"], f"{files}/m3"], "not valid JSON"),
        Case("merge-lora: an adapter config's rank as text", ["merge-lora", f["eightadapter"], f"{files}/m6"], "r must be a whole number, got \"eight\""),
        Case("merge-lora: an adapter of lora_alpha 0", ["merge-lora", f["alphazero"], f"{files}/m7"], "lora_alpha 0 must be above 0 (the adapter adds its update times lora_alpha / r)"),
        Case("merge-lora: an adapter of another PEFT type", ["merge-lora", f["prefixadapter"], f"{files}/m8"], "peft_type PREFIX_TUNING, and medrecipes loads and merges LoRA adapters only"),
        Case("report: an evaluation without its accuracy", ["report", f["noaccuracy.json"], "--output", f"{files}/r6.html"], "task medqa_4opt: its report has no accuracy"),
        Case("generate: an adapter config's rank as text", ["generate", f["eightadapter"], "--prompt", "hi"], "r must be a whole number"),
        Case("SFT: a template whose answers end with no token", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--chat_template_path", f["noend.jinja"]], "an assistant's answer is followed by no '<|im_end|>'"),
        Case("SFT: explanations trained from rows that hold none", ["preview", sft, "--model_name_or_path", model, "--eval_sets", "null", "--with_explanation", "true", "--chain_of_thought", "true", "--dataset_mixture", f"{{sources: [{{path: {f['noexpl.jsonl']}, format: usmle}}]}}"], "with_explanation trains each question's explanation, and none of the training rows holds one"),
        Case("SFT: activation offloading on a machine without an accelerator", script("sft", sft, *run_in(files, model), "--activation_offloading", "true", "--eval_sets", "null", *NO_EVAL), "activation_offloading moves activations from an accelerator's memory to the CPU's, and this machine has no accelerator"),
        Case("SFT: a template without generation marks", script("sft", sft, *run_in(files, model), "--chat_template_path", f["nogen.jinja"], "--assistant_only_loss", "true", "--eval_sets", "null", *NO_EVAL), "nogen.jinja has no {% generation %} block"),
        Case("merge-lora: an adapter cut short", ["merge-lora", f["cutadapter"], f"{files}/m5"], "cutadapter/adapter_model.safetensors is cut short or corrupt"),
        Case("convert-gguf: a .gguf with no tokenizer", ["convert-gguf", f["bare.gguf"], f"{files}/g2"], "holds no tokenizer (no tokenizer.ggml.* metadata), and transformers builds one from those alone; export the .gguf with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)"),
        Case("convert-gguf: a GGUF file named without its suffix", ["convert-gguf", f["model-q8"], f"{files}/g3"], "model-q8 is a GGUF model named without .gguf, the suffix it is read by; rename it to end in .gguf"),
        Case("convert-gguf: a file of another kind", ["convert-gguf", f["notes.jsonl"], f"{files}/g4"], "notes.jsonl is not a .gguf file; pass the model file itself"),
        Case("convert-gguf: a .gguf cut short", ["convert-gguf", f["cut.gguf"], f"{files}/g1"], "cut.gguf is cut short or corrupt"),
        Case("generate: a Hub id not in the cache, offline", ["generate", "medrecipes-tests/not-cached", "--prompt", "hi"], "'medrecipes-tests/not-cached' is not in the Hugging Face cache"),
        Case("plan: a Hub model whose config is not cached, offline", ["plan", "recipes/tiny_sft.yaml", "--model_name_or_path", "medrecipes-tests/not-cached"], "model config: 'medrecipes-tests/not-cached' is not in the Hugging Face cache"),
        Case("generate: a config of other sizes than its weights", ["generate", f["othervocab"], "--prompt", "hi"], "model.safetensors holds model.embed_tokens.weight of shape [1024, 64], and its config.json builds [500, 64]"),
        Case("generate: a model type this transformers lacks", ["generate", f["unknowntype"], "--prompt", "hi"], "config.json: model_type 'medllama9' is no architecture this transformers knows"),
        Case("generate: a model's end token past its vocabulary", ["generate", f["badeos"], "--prompt", "hi"], "generation_config.json's eos_token_id 999999 is not one of its"),
        Case("eval: a classifier's checkpoint as the model", ["eval", "--model", f["classifier"], "--data", TEST_SET], "architectures LlamaForSequenceClassification is no language model"),
        Case("generate: a model's chat template that is empty", ["generate", f["emptytemplate"], "--prompt", "hi"], "renders a question's turn without the question"),
        Case("eval: a model's chat template that is empty", ["eval", "--model", f["emptytemplate"], "--data", TEST_SET, "--mode", "generate"], "renders a question's turn without the question"),
        Case("serve: a model's chat template that is empty", ["serve", f["emptytemplate"]], "renders a question's turn without the question"),
        Case("generate: a model's chat template that does not compile", ["generate", f["badtemplate"], "--prompt", "hi"], "chat_template.jinja: its chat template does not compile (line"),
        Case("perplexity: a model's tokenizer config cut short", ["perplexity", "--model", f["badtokconfig"], "--data", "data/medical_text/eval.jsonl"], "tokenizer_config.json is not valid JSON"),
        Case("generate: a model without tokenizer files", ["generate", f["notokenizer"], "--prompt", "Which drug?"], "has no tokenizer files"),
        Case("merge-lora: output is the adapter", ["merge-lora", f["adapter"], f["adapter"]], "also what"),
        Case("merge-lora: output holds a user's file", ["merge-lora", f["adapter"], f["emptyish"]], "medrecipes did not write"),
        Case("merge-lora: a model folder named .gguf", ["merge-lora", f["adapter"], f"{files}/merged.gguf"], "merged.gguf ends in .gguf, and every command reads a path so named as one GGUF file, not a model folder; name the folder without .gguf"),
        Case("convert-gguf: a model folder named .gguf", ["convert-gguf", f["bare.gguf"], f"{files}/g3.gguf/"], "g3.gguf/ ends in .gguf, and every command reads a path so named as one GGUF file"),
        Case("tiny-model: a model folder named .gguf", ["tiny-model", f"{files}/t14.gguf"], "t14.gguf ends in .gguf"),
        # --- medrecipes generate / serve
        Case("generate: a prompt past the model's positions", ["generate", model, "--prompt", "fever " * 2100], "positions for the prompt and the answer together; shorten the prompt"),
        Case("generate: model missing", ["generate", f"{files}/no-model", "--prompt", "hi"], "no such file or folder; pass a trained model's folder"),
        Case("generate: empty prompt", ["generate", model, "--prompt", ""], "prompt"),
        Case("generate: max-new-tokens 0", ["generate", model, "--prompt", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
        Case("serve: port out of range", ["serve", model, "--port", "70000"], "port"),
        Case("serve: model incomplete", ["serve", f["emptydir"]], "not a complete model"),
        Case("no command", [], "the following arguments are required"),
        Case("unknown command", ["trian", cpt], "invalid choice: 'trian'"),
        Case("serve: port not a number", ["serve", model, "--port", "http"], "--port: must be a whole number"),
        Case("serve: a limit beyond its range", ["serve", model, "--max-body-bytes", "0"], f"--max-body-bytes: must be at least 1024 and at most {2**30}, got 0"),
        Case("merge-lora: unknown dtype", ["merge-lora", f["adapter"], f"{files}/m4", "--dtype", "fp8"], "invalid choice"),
        Case("tiny-model: corpus without text", ["tiny-model", f"{files}/t6", "--corpus", f["notext.jsonl"]], "holds no text to learn a tokenizer from"),
        Case("tiny-model: an empty corpus file", ["tiny-model", f"{files}/t6", "--corpus", f["empty.jsonl"]], "empty.jsonl: the file is empty"),
        Case("pairs: sampling without a model", ["pairs", "--mcq", TEST_SET, "--out", f"{files}/p9.jsonl", "--samples", "6"], "--samples is for sampling a model's own answers, and no --model"),
        Case("card: repo id the Hub refuses", ["card", f["staterun"], "--output", f"{files}/c9", "--repo-id", "my org/x y"], "is not a Hub repository id"),
        Case("report: a page not named .html", ["report", f["existing.json"], "--output", f"{files}/r9.png"], "is not an .html file"),
        Case("GRPO rewards all weigh 0", script("grpo", grpo, "--rewards", "[{name: usmle_accuracy, weight: 0}]"), "every reward weighs 0"),
        Case("GRPO reward given twice", script("grpo", grpo, "--rewards", "[{name: usmle_accuracy}, {name: usmle_accuracy}]"), "the same reward as rewards[0], counted twice"),
        Case("GRPO overlong penalty that never fires", script("grpo", grpo, "--rewards", "[{name: usmle_accuracy}, {name: overlong_penalty, max_tokens: 500}]"), "so it never fires"),
        Case("GRPO importance level unknown", script("grpo", grpo, "--importance_sampling_level", "tokens"), "importance_sampling_level 'tokens' is none of the values TRL's GRPOTrainer acts on"),
        Case("GRPO steps per generation 0", script("grpo", grpo, "--steps_per_generation", "0"), "steps_per_generation must be at least 1"),
        Case("GRPO delta below 1", script("grpo", grpo, "--delta", "-1"), "delta must be above 1"),
        Case("DPO label smoothing its loss ignores", script("dpo", dpo, "--loss_type", "ipo", "--label_smoothing", "0.2"), "loss_type ipo does not read it"),
        Case("DPO alpha coefficient under another divergence", script("dpo", dpo, "--f_alpha_divergence_coef", "0.3"), "set f_divergence_type to alpha_divergence"),
        Case("checkpointing by both names, disagreeing", script("sft", sft, "--activation_checkpointing", "true", "--gradient_checkpointing", "false"), "(its old name) disagree"),
        Case("min_lr beside a linear schedule written", script("cpt", cpt, "--lr_scheduler_type", "linear", "--min_lr", "1e-5"), "lr_scheduler_type linear would be replaced"),
        Case("DPO synced and precomputed reference", script("dpo", dpo, "--precompute_ref_log_probs", "true", "--sync_ref_model", "true"), "set one of them to false"),
        Case("tiny-model: corpus of weights", ["tiny-model", f"{files}/t7", "--corpus", f["latin1.jsonl"]], "not UTF-8 text"),
        Case("tiny-model: corpus with a line that is not JSON", ["tiny-model", f"{files}/t9", "--corpus", f["notjson.jsonl"]], "notjson.jsonl line 2: not JSON"),
        Case("tiny-model: a CSV corpus with a quote left open", ["tiny-model", f"{files}/t10", "--corpus", f["openquote.csv"]], "openquote.csv line 3: a quote opened on this line is never closed"),
        Case("tiny-model: a Parquet corpus cut short", ["tiny-model", f"{files}/t11", "--corpus", f["cut.parquet"]], "cut.parquet: not a whole Parquet file"),
        Case("tiny-model: a text corpus with a byte that is not UTF-8", ["tiny-model", f"{files}/t12", "--corpus", f["latin1line3.txt"]], "not UTF-8 text (invalid continuation byte at line 3"),
        Case("eval: a dtype of whole numbers", ["eval", "--model", model, "--data", TEST_SET, "--dtype", "int8"], "argument --dtype: invalid choice: 'int8' (choose from 'auto', 'bfloat16', 'float16', 'float32')"),
        Case("perplexity: a dtype of booleans", ["perplexity", "--model", model, "--data", f["notes.jsonl"], "--dtype", "bool"], "argument --dtype: invalid choice: 'bool'"),
        Case("eval: an option of no text before others", ["eval", "--model", model, "--data", f["nulloption.jsonl"]], "nulloption.jsonl line 1: option B has no text (null, or no such key) while D follows; give B its text"),
        Case("eval: options keyed by lower-case letters", ["eval", "--model", model, "--data", f["lowerkeys.jsonl"]], "lowerkeys.jsonl line 1: option keys ['a', 'b'] are not consecutive letters from A"),
        Case("eval: a CSV with a quote left open", ["eval", "--model", model, "--data", f["openquote.csv"]], "openquote.csv line 3: a quote opened on this line is never closed"),
        Case("tiny-model: corpus a folder", ["tiny-model", f"{files}/t8", "--corpus", f["emptydir"]], "is a folder; pass --corpus FILE"),
        Case("eval: few-shot examples never shown", ["eval", "--model", model, "--data", TEST_SET, "--fewshot_data", "data/usmle_sample/train.jsonl"], "num_fewshot is 0, so none is shown"),
        Case("eval: few-shot examples from the scored file", ["eval", "--model", model, "--data", TEST_SET, "--num_fewshot", "2", "--fewshot_data", TEST_SET], "is the file it scores"),
        Case("eval: few-shot examples from a copy of the scored file", ["eval", "--model", model, "--data", TEST_SET, "--num_fewshot", "2", "--fewshot_data", f["testcopy.jsonl"]], "of the few-shot examples in"),
        Case("calibrate: task unknown without held-out questions", ["calibrate", "--model", model, "--task", "medqa", "--dev", TEST_SET], "unknown task 'medqa'"),
        Case("build-data: processes the budget cannot be split over", ["build-data", _recipe(files, "recipes/tiny_pretrain.yaml", ("outputs/demo/tiny-model", model)), "--num-gpus", "3", "--out", f"{files}/built3"], "global_batch_tokens 512 is not a multiple of"),
        Case("accelerate config: machine rank past its machines", ["validate", cpt, "--accelerate-config", f["rank5accel.yaml"]], "machine_rank 5 of num_machines 2"),
        Case("accelerate config: DeepSpeed file missing", ["validate", cpt, "--accelerate-config", f["dsfileaccel.yaml"]], "deepspeed_config.deepspeed_config_file nope-ds.json: no such file"),
        Case("accelerate config: its accumulation against the recipe's", ["validate", cpt, "--accelerate-config", f["gasaccel.yaml"]], "deepspeed_config.gradient_accumulation_steps 16 and the recipe's"),
        Case("accelerate config: another compute environment", ["validate", cpt, "--accelerate-config", f["sagemakeraccel.yaml"]], "compute_environment AMAZON_SAGEMAKER, a config for accelerate to start a job there"),
        Case("accelerate config: a port past 65535", ["validate", cpt, "--accelerate-config", f["portaccel.yaml"]], "main_process_port 99999 is no TCP port"),
        Case("accelerate config: a dynamo backend misspelt", ["validate", cpt, "--accelerate-config", f["dynamoaccel.yaml"]], "dynamo_backend 'INDUCTR' is none of"),
        Case("accelerate config: an FSDP sharding unknown", ["validate", cpt, "--accelerate-config", f["shardaccel.yaml"]], "fsdp_sharding_strategy 'HALF_SHARD' is none of"),
        Case("accelerate config: DeepSpeed offload to a GPU", ["validate", cpt, "--accelerate-config", f["offloadaccel.yaml"]], "offload_optimizer_device 'gpu' is none of none, cpu, nvme"),
        Case("accelerate config: ZeRO stage 4", ["validate", cpt, "--accelerate-config", f["zero4accel.yaml"]], "zero_stage 4 is none of DeepSpeed's stages 0-3"),
        Case("tiny-model: unknown architecture", ["tiny-model", f"{files}/t5", "--arch", "gpt5"], "invalid choice"),
        Case("generate: a weights file for the model", ["generate", f"{model}/model.safetensors", "--prompt", "hi"], "is one file of the model in"),
        Case("SFT: a data file for the model", script("sft", sft, "--model_name_or_path", TEST_SET), "model_name_or_path: data/usmle_sample/test.jsonl is a file, not a model"),
        Case("serve: a data file for the model", ["serve", TEST_SET], "model: data/usmle_sample/test.jsonl is a file, not a model"),
        Case("generate: an empty system turn", ["generate", model, "--prompt", "hi", "--system", " "], "--system is empty"),
        Case("decontaminate: a folder of files of two layouts", ["decontaminate", "--train", "data/usmle_sample", "--eval", TEST_SET], "its files do not share their columns"),
        Case("eval: a context of 0 tokens", ["eval", "--model", model, "--data", TEST_SET, "--max_length", "0"], "max_length must be at least 1"),
        Case("eval: a revision of a local model", ["eval", "--model", model, "--data", TEST_SET, "--model_revision", "v2"], "is a local folder, which has none"),
        Case("eval: top_p 0", ["eval", "--model", model, "--data", TEST_SET, "--top_p", "0"], "top_p"),
        # --- medrecipes report
        Case("report: a run whose trainer state was cut short", ["report", f["cutrun"], "--output", f"{files}/r2.html"], "trainer_state.json: not a JSON trainer state (Unterminated string starting at: line 1 column 45 (char 44)); it was cut short or edited: put back the one in the run's newest checkpoint-N/"),
        Case("report: path missing", ["report", f"{files}/no-run", "--output", f"{files}/r1.html"], "no such file or folder"),
        Case("report: a device", ["report", "/dev/null", "--output", f"{files}/r0.html"], "not a file or folder but a device"),
        Case("report: a run's model folder", ["report", model, "--output", f"{files}/r8.html"], "a model folder (config.json)"),
        Case("report: folder with no run", ["report", f["emptydir"], "--output", f"{files}/r2.html"], "holds no run"),
        Case("report: eval file not JSON", ["report", f["notjson.jsonl"], "--output", f"{files}/r3.html"], "not a JSON evaluation"),
        Case("calibrate: questions of another option count", ["calibrate", "--model", model, "--task", "pubmedqa", "--dev", "data/usmle_sample/train.jsonl", "--held-out", TEST_SET], "score them as questions of their own (--task NAME (a name of its own) with the file as --dev or --held-out) as they are"),
        Case("eval: an output name holding a line break", ["eval", "--model", model, "--data", TEST_SET, "--output", f"{files}/a\nb.json"], "holds a control character ('\\n'), which splits or hides the name in logs"),
        Case("report: an evaluation of no task", ["report", f["notasks.json"], "--output", f"{files}/r5.html"], "its 'tasks' is empty, so it holds no result to report"),
        Case("generate: a required option given as spaces", ["generate", model, "--prompt", "   "], "medrecipes generate: --prompt is empty; give it a value"),
        Case("eval: a negative seed", ["eval", "--model", model, "--data", TEST_SET, "--seed", "-1"], "seed -1: Seed must be between 0 and 2**32 - 1"),
        Case("eval: answers longer than the model's positions", ["eval", "--model", model, "--data", TEST_SET, "--mode", "generate", "--max_new_tokens", "100000"], "max_new_tokens 100000 is past the model's 2048 positions"),
        Case("eval: data as a YAML mapping", ["eval", "--model", model, "--data", "{usmle: data/usmle_sample/test.jsonl}"], "--data {usmle: data/usmle_sample/test.jsonl}: a mapping, where --data takes TASK=PATH entries"),
        Case("eval: a data entry of spaces", ["eval", "--model", model, "--data", " "], "--data is empty (' '); give --data PATH, or TASK=PATH"),
        Case("report: JSON that is no evaluation", ["report", f["existing.json"], "--output", f"{files}/r4.html"], "no 'tasks' in it"),
        Case("report: one run given twice", ["report", f["existing.json"], f["existing.json"], "--output", str(files / "twice.html")], "existing.json is given twice; name each run folder or eval file once"),
        Case("report: output over an input", ["report", f["existing.json"], "--output", f["existing.json"]], "also what"),
        Case("report: output over a user's file", ["report", f["existing.json"], "--output", f["notes.jsonl"]], "medrecipes did not write"),
        Case("report: output is a folder", ["report", f["existing.json"], "--output", str(files)], "is a folder"),
        Case("card: run missing", ["card", f"{files}/no-run", "--output", f"{files}/c1"], "no such file or folder"),
        Case("card: folder with no run", ["card", f["emptydir"], "--output", f"{files}/c2"], "no trainer_state.json"),
        Case("validate of a run written into its starting model", ["validate", sft, "--model_name_or_path", model, "--output_dir", f"{model}/more"], "more lies inside"),
        Case("validate of a run inside another run's checkpoint", ["validate", sft, "--output_dir", f"{files}/ckptrun/checkpoint-2/mine"], "mine is inside where the run in"),
        Case("a run into another run's checkpoint", script("sft", sft, "--model_name_or_path", model, "--output_dir", f"{files}/ckptrun/checkpoint-2", *NO_EVAL, "--eval_sets", "null"), "keeps its checkpoint-2; write it elsewhere (a run resumes from its checkpoints when its recipe is run again with output_dir"),
        Case("card: run that never finished", ["card", f["staterun"], "--output", f"{files}/c3"], "no finished run there"),
        Case("card: eval file missing", ["card", f["staterun"], f"{files}/no.json", "--output", f"{files}/c4"], "no such file or folder"),
        Case("card: no --output", ["card", f["staterun"]], "--output"),
        # --- values the schema's types and relations refuse, in the YAML and on the command line
        Case("key written twice", script("cpt", _recipe(files, cpt, append="\nmax_steps: 5\n")), "key 'max_steps' is written twice"),
        Case("key YAML reads as a number", script("cpt", _recipe(files, cpt, append="\n1: 5\n")), "the key 1 is not a name (YAML reads it as a number)"),
        Case("key written as a list", ["validate", _recipe(files, sft, append="\n[a, b]: 5\n")], 'the key ["a", "b"] is not a name'),
        Case("learning_rate NaN in the YAML", key("cpt", cpt, "learning_rate: 3.0e-3", "learning_rate: .nan"), "learning_rate must be a finite number"),
        Case("learning_rate inf on the command line", script("cpt", cpt, "--learning_rate", "inf"), "must be a finite number"),
        Case("whole number given a fraction", key("cpt", cpt, "max_steps: 60", "max_steps: 2.7"), "max_steps must be a whole number"),
        Case("whole number given true", key("cpt", cpt, "max_steps: 60", "max_steps: true"), "max_steps must be a whole number"),
        Case("true/false given a number", key("cpt", cpt, "use_cpu: true", "use_cpu: 1"), "use_cpu must be true or false"),
        Case("warmup beyond the run", script("cpt", cpt, "--warmup_steps", "90"), "warmup_steps 90 is beyond max_steps 60"),
        Case("eval_sets given a list", script("cpt", cpt, "--eval_sets", "[a, b]"), "expected a YAML dict"),
        Case("eval_sets a list in the YAML", key("cpt", cpt, EVAL_SETS_CPT, "eval_sets: [a, b]\n"), "eval_sets must be a mapping"),
        Case("reward weight NaN", script("grpo", grpo, "--reward_weights", "1", "nan"), "must be a finite number"),
        Case("eval: a file of blank lines", ["eval", "--model", model, "--data", f["blank.jsonl"]], "blank.jsonl: the file holds only blank lines and spaces"),
        Case("eval: a question with one option", ["eval", "--model", model, "--data", f["oneoption.jsonl"]], "oneoption.jsonl line 1: 1 option(s); a question has 2 to 10 options"),
        Case("eval: an empty question", ["eval", "--model", model, "--data", f["emptyq.jsonl"]], "emptyq.jsonl line 1: the question is empty"),
        Case("SFT chat: assistant speaks first", script("sft", sft, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['asstfirst.jsonl']}, format: chat}}]}}", "--eval_sets", "null"), "the first turn after any system turn is not the user's"),
        Case("SFT chat: unknown role", script("sft", sft, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['badrole.jsonl']}, format: chat}}]}}", "--eval_sets", "null"), "turn 1 has role 'doctor'"),
        Case("GRPO: fewer questions than a generation batch", script("grpo", grpo, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['twoquestions.jsonl']}, format: usmle}}]}}", "--eval_sets", "null", *NO_EVAL), "the 2 training questions fill no generation batch of 4 prompts"),
        Case("SFT: dropped last batches leave none", script("sft", sft, *run_in(files, model), "--dataloader_drop_last", "true", "--per_device_train_batch_size", "500", "--eval_sets", "null", *NO_EVAL), "dataloader_drop_last drops every batch: the 60 training rows"),
        Case("SFT: max_length that leaves no row", script("sft", sft, *run_in(files, model), "--max_length", "1", "--eval_sets", "null", *NO_EVAL), "no training rows are left of 60 once MedSFTTrainer prepared them"),
        Case("abbreviated flag", ["plan", cpt, "--num-gpu", "2"], "unknown argument '--num-gpu'"),
        Case("flag a command does not have", ["report", f["existing.json"], "--outpt", "r.html"], "medrecipes report: unknown argument '--outpt'"),
        # --- boundaries: models, tokenizers, adapters, places to write
        Case("model weights cut short", ["eval", "--model", f["truncated"], "--data", TEST_SET], "is cut short or corrupt"),
        Case("model without tokenizer files", ["eval", "--model", f["notokenizer"], "--data", TEST_SET], "has no tokenizer files"),
        Case("adapter whose base is missing", script("sft", sft, *run_in(files, f["nobase"])), "nobase/adapter_config.json: base_model_name_or_path"),
        Case("eval: output under a read-only place", ["eval", "--model", model, "--data", TEST_SET, "--output", "/sys/medrecipes/eval.json"], "is not writable"),
        Case("eval: output below a file", ["eval", "--model", model, "--data", TEST_SET, "--output", f"{f['existing.json']}/eval.json"], "is a file"),
        # --- the write guard: nothing that medrecipes did not write is replaced
        Case("build-data into a user's folder", ["build-data", cpt, "--out", f["emptyish"], "--model_name_or_path", model], "medrecipes did not write"),
        Case("build-data inside its source folder", ["build-data", src(f"{{path: {f['textdir']}}}"), "--out", f"{f['textdir']}/built", "--model_name_or_path", model], "lies inside"),
        Case("run into a user's model folder", script("cpt", cpt, "--model_name_or_path", model, "--output_dir", f["emptyish"]), "medrecipes did not write"),
        Case("run whose output_dir holds its data", script("cpt", src(f"{{path: {f['textdir']}}}"), "--model_name_or_path", model, "--output_dir", str(files)), "which this command reads"),
        # --- DPO's preference pairs
        Case("DPO: an empty chosen answer", script("dpo", dpo, *run_in(files, model), *pairs(f["emptychosen.jsonl"])), "emptychosen.jsonl line 2: chosen is empty"),
        Case("DPO: an empty prompt", script("dpo", dpo, *run_in(files, model), *pairs(f["emptyprompt.jsonl"])), "emptyprompt.jsonl line 1: prompt is empty"),
        Case("CPT: a data_files pattern that matches nothing", script("cpt", src("{path: json, data_files: nothing-here-*.jsonl}"), *run_in(files, model)), "data_files pattern nothing-here-*.jsonl matches no file"),
        Case("CPT: a document whose text is a number", script("cpt", src(f"{{path: {f['numbertext.jsonl']}}}"), *run_in(files, model)), "numbertext.jsonl line 2: 'text' is 42, not text"),
        Case("perplexity: questions, with no text column", ["perplexity", "--model", model, "--data", TEST_SET], "no column 'text' (columns: id, question, options, answer, explanation, subject); pass --text-field"),
        Case("perplexity: a folder of several files", ["perplexity", "--model", model, "--data", "data/medical_text"], "is a folder of 2 files (eval.jsonl, train.jsonl)"),
        Case("perplexity: a document whose text is a number", ["perplexity", "--model", model, "--data", f["numbertext.jsonl"]], "numbertext.jsonl line 2: 'text' is 42, not text"),
        Case("pretraining: an architecture file that is not JSON", script("cpt", "recipes/tiny_pretrain.yaml", "--tokenizer_name_or_path", model, "--architecture", f"{f['notjson-config']}/config.json", "--output_dir", str(files / "runs" / "notjson")), "is not a model config"),
        Case("SFT chat: an empty answer", script("sft", sft, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['emptyanswer.jsonl']}, format: chat}}]}}", "--eval_sets", "null"), "emptyanswer.jsonl line 1: the assistant's answer is empty"),
        Case("KTO: desirable answers only", script("kto", kto, *run_in(files, model), *pairs(f["alldesirable.jsonl"], "unpaired")), "every one of the 2 answers is desirable (label true); KTO needs both kinds"),
        Case("SFT chat: a turn of parts, not text", script("sft", sft, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['partscontent.jsonl']}, format: chat}}]}}", "--eval_sets", "null"), "partscontent.jsonl line 2: turn 1's content is a list of parts, not text"),
        Case("DPO: a row of another layout", script("dpo", dpo, *run_in(files, model), *pairs(f["layoutpairs.jsonl"])), "layoutpairs.jsonl line 2: it is plain text and line 1 is conversation turns"),
        Case("DPO: plain answers to a conversation", script("dpo", dpo, *run_in(files, model), *pairs(f["halfpairs.jsonl"])), "halfpairs.jsonl line 1: its prompt and answers mix plain text and conversation turns"),
        Case("SFT: completion-only loss on questions", script("sft", sft, "--completion_only_loss", "true"), "format usmle gives conversations (messages)"),
        Case("SFT: completion-only loss on chat turns", script("sft", sft, *run_in(files, model), "--completion_only_loss", "true", "--dataset_mixture", f"{{sources: [{{path: {f['chatrows.jsonl']}, format: chat}}]}}", "--eval_sets", "null"), "dataset_mixture: completion_only_loss trains the completions of prompt/completion rows, and these rows are conversations"),
        Case("SFT: chat template a data file", script("sft", sft, "--chat_template_path", TEST_SET), "is a file that is no template (.jinja or .j2)"),
        Case("SFT: pad token not a token", script("sft", sft, *run_in(files, model), "--pad_token", "<|nope|>", *NO_EVAL, "--eval_sets", "null"), "pad_token: '<|nope|>' is not a token of"),
        Case("GRPO reward scaling unknown", script("grpo", grpo, "--scale_rewards", "sometimes"), "scale_rewards 'sometimes' is none of the values TRL's GRPOTrainer acts on"),
        Case("GRPO generation cache unknown", script("grpo", grpo, "--cache_implementation", "weird"), "cache_implementation: transformers' generation refuses it"),
        Case("GRPO sampling from the one most likely token", ["validate", grpo, "--top_k", "1"], "top_k 1 samples from the single most likely token"),
        Case("a key of another method's recipes on the command line", ["preview", dpo, "--chat_template_path", "recipes/templates/smollm2.jinja"], "chat_template_path is a key of recipes/sft.py recipes, which recipes/dpo.py does not take; drop it, or run recipes/sft.py"),
        Case("a key of several other methods' recipes", script("cpt", cpt, "--beta", "0.1"), "beta is a key of recipes/grpo.py, recipes/dpo.py and recipes/kto.py recipes, which recipes/cpt.py does not take"),
        Case("GRPO sampling only tokens as likely as the likeliest", ["validate", grpo, "--min_p", "1.0"], "min_p 1.0 keeps only the tokens as likely as the most likely one"),
        Case("GRPO generation by beam search", ["validate", grpo, "--generation_kwargs", "{num_beams: 4}"], "generation_kwargs num_beams: transformers generates by beam_sample with them, not by plain sampling"),
        Case("GRPO generation greedy", ["validate", grpo, "--generation_kwargs", "{do_sample: false}"], "generation_kwargs.do_sample False: GRPO learns from the differences between a group's sampled answers"),
        Case("GRPO generation settings over the recipe's", ["validate", grpo, "--generation_kwargs", "{max_new_tokens: 5}"], "generation_kwargs.max_new_tokens overrides the recipe's max_completion_length"),
        Case("GRPO generation settings a list", script("grpo", grpo, "--generation_kwargs", "[1, 2]"), "--generation_kwargs/--generation-kwargs: expected a mapping such as"),
        Case("GRPO entropy bounds swapped", script("grpo", grpo, "--use_adaptive_entropy", "true", "--entropy_coef_min", "1", "--entropy_coef_max", "0.1"), "entropy_coef_min 1 is above entropy_coef_max 0.1"),
        Case("loader prefetch 0 with workers", script("cpt", cpt, "--dataloader_num_workers", "2", "--dataloader_prefetch_factor", "0"), "dataloader_prefetch_factor must be at least 1"),
        Case("compile backend misspelt", script("cpt", cpt, "--torch_compile", "true", "--torch_compile_backend", "inductr"), "torch_compile_backend 'inductr' is not one of torch's (did you mean 'inductor'"),
        Case("GRPO reward only below 0", script("grpo", grpo, "--rewards", "[{name: usmle_accuracy, weight: -1}]"), "no reward weighs above 0 (-1)"),
        Case("loggers and none", script("sft", sft, "--report_to", "[tensorboard, none]"), "'none' stands alone"),
        Case("SFT pad to a multiple of 0", script("sft", sft, "--pad_to_multiple_of", "0"), "pad_to_multiple_of must be at least 1"),
        Case("data processes 0", script("sft", sft, "--dataset_num_proc", "0"), "dataset_num_proc must be at least 1"),
        Case("LoRA targets an empty list", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_target_modules", "[]"], "lora_target_modules is an empty list"),
        Case("LoRA targets no regular expression", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_target_modules", "q_proj["], "and it is not one (unterminated character set"),
        Case("LoRA targets a list written in one text", ["validate", sft, "--model_name_or_path", model, "--use_peft", "true", "--lora_target_modules", "[q_proj, v_prj]"], "lora_target_modules: v_prj names no module of llama"),
        Case("hub strategy unknown", script("sft", sft, "--hub_strategy", "sometimes"), "hub_strategy: sometimes is not a valid HubStrategy"),
        Case("debug option unknown", script("cpt", cpt, "--debug", "nonsense"), "'nonsense' is none of underflow_overflow, tpu_metrics_debug"),
        Case("Adam's epsilon for SGD", script("cpt", cpt, "--optim", "sgd", "--adam_epsilon", "1e-3"), "adam_epsilon is not read by the sgd optimizer"),
        Case("DPO subjects on pairs", script("dpo", dpo, "--subjects", "[cardiology]"), "no training source is format usmle (preference)"),
        Case("subjects an empty list", script("sft", sft, "--subjects", "[]"), "subjects is an empty list"),
        Case("scratch model beside a model to load", script("cpt", "recipes/tiny_pretrain.yaml", "--model_name_or_path", model), "would not be loaded; drop one of them"),
        Case("SFT text field of TRL's", script("sft", sft, "--dataset_text_field", "body"), "name your column with the source's text_field"),
        Case("save the best without a metric", script("cpt", cpt, "--save_strategy", "best", "--metric_for_best_model", "null", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null", "--eval_sets", "null", "--eval_strategy", "no", "--eval_on_start", "false"), "save_strategy best saves when metric_for_best_model improves, and none is set"),
        Case("SFT: end of turn not a token", script("sft", sft, *run_in(files, model), "--eos_token", "<|nope|>", *NO_EVAL, "--eval_sets", "null"), "eos_token: '<|nope|>' is not a token of"),
        Case("SFT: packing that cuts every answer", script("sft", sft, *run_in(files, model), "--packing", "true", "--max_length", "16", *NO_EVAL, "--eval_sets", "null"), "no token of the 60 training examples is left to train on once MedSFTTrainer packed them: each is cut to max_length 16"),
        Case("validate: a registry task's file missing under eval_tasks_data_dir", ["validate", sft, "--eval_tasks", "medmcqa", "--eval_tasks_data_dir", f"{files}/benchmarks", "--eval_strategy", "steps", "--eval_steps", "5"], "medmcqa holds dev_questions.jsonl); put the file there or pass an eval_sets entry of format usmle"),
        Case("eval_tasks_data_dir naming a file", ["validate", sft, "--eval_tasks", "medqa_4opt", "--eval_tasks_data_dir", TEST_SET, "--eval_strategy", "steps", "--eval_steps", "5"], "test.jsonl: a file, not a folder; name the folder that holds the benchmark files"),
        Case("GRPO: vLLM's share of GPU memory above 1", ["validate", grpo, "--use_vllm", "true", "--vllm_gpu_memory_utilization", "1.5"], "vllm_gpu_memory_utilization must be above 0 and at most 1, got 1.5"),
        Case("validate: a checkpoint to resume that is not there", ["validate", sft, "--resume_from_checkpoint", f"{files}/nope/checkpoint-5"], "checkpoint-5 does not exist (a relative path is read from the working directory"),
        Case("validate: a checkpoint to resume that is no checkpoint", ["validate", sft, "--resume_from_checkpoint", f["emptydir"]], "is not a complete checkpoint (no trainer_state.json)"),
        Case("validate: an end of turn not a token of the local tokenizer", ["validate", sft, "--model_name_or_path", model, "--eos_token", "<|nope|>"], "eos_token: '<|nope|>' is not a token of"),
        Case("validate: a pad token not a token of the local tokenizer", ["validate", dpo, "--model_name_or_path", model, "--pad_token", "<|nope|>"], "pad_token: '<|nope|>' is not a token of"),
        Case("DPO: an answer of two assistant turns", script("dpo", dpo, *run_in(files, model), *pairs(f["twoturns.jsonl"])), "twoturns.jsonl line 1: chosen has two assistant turns in a row"),
        Case("DPO: answers the same but for spaces", script("dpo", dpo, *run_in(files, model), *pairs(f["spacepair.jsonl"])), "spacepair.jsonl line 1: chosen and rejected are the same answer (spaces aside)"),
        Case("DPO: a prompt that is a number", script("dpo", dpo, *run_in(files, model), *pairs(f["numberprompt.jsonl"])), "numberprompt.jsonl line 1: prompt is 42, neither text nor conversation turns"),
        Case("SFT chat: a text prompt and a completion of turns", script("sft", sft, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['mixedchat.jsonl']}, format: chat}}]}}", "--eval_sets", "null"), "mixedchat.jsonl line 1: its prompt and answers mix plain text and conversation turns"),
        Case("MCQ: a question written as a list", script("sft", sft, *run_in(files, model), "--dataset_mixture", f"{{sources: [{{path: {f['listquestion.jsonl']}, format: usmle}}]}}", "--eval_sets", "null"), "listquestion.jsonl line 1: [\"Which\", \"drug?\"] is a list, where text belongs"),
        Case("eval on start without eval sets", script("cpt", cpt, "--eval_sets", "null", "--eval_strategy", "no", "--eval_on_start", "true", "--load_best_model_at_end", "false", "--keep_best_checkpoints", "null"), "there are no eval_sets, and eval_on_start: true evaluates or ranks checkpoints by an evaluation; add eval_sets, or turn it off (--eval_on_start false)"),
        Case("DPO: chosen equals rejected", script("dpo", dpo, *run_in(files, model), *pairs(f["samepair.jsonl"])), "samepair.jsonl line 1: chosen and rejected are the same answer"),
        Case("DPO: a row without chosen", script("dpo", dpo, *run_in(files, model), *pairs(f["nochosen.jsonl"])), "nochosen.jsonl line 1: no 'chosen'"),
        Case("DPO: chosen not the assistant's turn", script("dpo", dpo, *run_in(files, model), *pairs(f["userchosen.jsonl"])), "chosen holds a user turn, and an answer is the assistant's turns alone"),
        Case("DPO: sources that are not pairs", script("dpo", dpo, "--eval_sets", f"{{x: {{path: {TEST_SET}, format: usmle}}}}"), "is not what DPO trains on"),
        # --- KTO's unpaired answers
        Case("KTO: a label that is a word", script("kto", kto, *run_in(files, model), *pairs(f["wordlabel.jsonl"], "unpaired")), "wordlabel.jsonl line 2: label \"yes\" is not true or false"),
        Case("KTO: a label that is a number", script("kto", kto, *run_in(files, model), *pairs(f["numberlabel.jsonl"], "unpaired")), "numberlabel.jsonl line 1: label 1 is not true or false"),
        Case("KTO: a row without completion", script("kto", kto, *run_in(files, model), *pairs(f["nocompletion.jsonl"], "unpaired")), "nocompletion.jsonl line 1: no 'completion'"),
        Case("KTO: completion not the assistant's turn", script("kto", kto, *run_in(files, model), *pairs(f["usercompletion.jsonl"], "unpaired")), "completion holds a user turn, and an answer is the assistant's turns alone"),
        Case("KTO: a batch of one answer", script("kto", kto, "--per_device_train_batch_size", "1"), "KTO's KL estimate needs at least 2 answers"),
        Case("KTO: pairs and unpaired answers mixed", script("kto", kto, "--dataset_mixture", f"{{sources: [{{path: {f['nocompletion.jsonl']}, format: unpaired}}, {{path: {f['samepair.jsonl']}, format: preference}}]}}"), "mixes preference and unpaired sources"),
        Case("GRPO negative learning rate", script("grpo", grpo, "--learning_rate", "-5e-6"), "learning_rate must be 0 or more"),
        Case("4-bit and 8-bit at once", script("sft", sft, "--use_peft", "true", "--load_in_4bit", "true", "--load_in_8bit", "true"), "set load_in_4bit or load_in_8bit, not both"),
        Case("4-bit without LoRA", script("sft", sft, "--load_in_4bit", "true"), "trains only through adapters"),
    ]  # fmt: skip
    return table


# name: contents (bytes or text) of the bad files the table names.
def _parquet_of_no_rows() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"question": pa.array([], pa.string())}), sink)
    return sink.getvalue()


def _parquet_cut_short() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"text": [f"Document {i} on sepsis." for i in range(50)]}), sink)
    return sink.getvalue()[: len(sink.getvalue()) // 2]


FILES = {
    "empty.yaml": "",
    "cut.parquet": _parquet_cut_short(),
    "bignumber.jsonl": '{"question": "Q?", "options": {"A": "a", "B": "b"}, "answer": "A"}\n'
    '{"question": "R?", "options": {"A": "a", "B": "b"}, "answer": "B", "score": 1e400}\n',
    "lines.parquet": '{"text": "Sepsis is a dysregulated host response."}\n',
    "notasks.json": '{"tasks": {}, "settings": {}}',
    "zero4accel.yaml": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 4\n",
    "sagemakeraccel.yaml": "compute_environment: AMAZON_SAGEMAKER\ndistributed_type: MULTI_GPU\nnum_processes: 2\n",
    "portaccel.yaml": "distributed_type: MULTI_GPU\nmain_process_port: 99999\n",
    "clip03accel.yaml": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  gradient_clipping: 0.3\n",
    "no16accel.yaml": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 3\n  zero3_save_16bit_model: false\n",
    "fsdpacaccel.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_activation_checkpointing: true\n",
    "dynamoaccel.yaml": "distributed_type: MULTI_GPU\ndynamo_config:\n  dynamo_backend: INDUCTR\n",
    "shardaccel.yaml": "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: HALF_SHARD\n",
    "offloadaccel.yaml": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: gpu\n",
    "rank5accel.yaml": "distributed_type: MULTI_GPU\nnum_machines: 2\nmachine_rank: 5\nnum_processes: 4\n",
    "rdzvaccel.yaml": "distributed_type: MULTI_GPU\nnum_processes: 2\nrdzv_backend: etcdd\n",
    "fsdp3accel.yaml": "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_version: 3\n",
    "stageaccel.yaml": "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: '3'\n",
    "sdtaccel.yaml": "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_state_dict_type: FULL\n",
    "initaccel.yaml": "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: sometimes\n",
    "clipaccel.yaml": "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n  gradient_clipping: high\n",
    "nomachineaccel.yaml": "distributed_type: MULTI_GPU\nnum_processes: 2\nnum_machines: 0\n",
    "wrapaccel.yaml": "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayr\n",
    "dsfileaccel.yaml": "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: nope-ds.json\n",
    "gasaccel.yaml": "distributed_type: DEEPSPEED\nmixed_precision: 'no'\ndeepspeed_config:\n  gradient_accumulation_steps: 16\n  zero_stage: 2\n",
    "brokenaccel.yaml": "distributed_type: [FSDP\n",
    "typoaccel.yaml": "distributed_type: FSPD\nnum_processes: 2\n",
    "wordsaccel.yaml": "distributed_type: MULTI_GPU\nnum_processes: eight\n",
    "fp32accel.yaml": "distributed_type: NO\nmixed_precision: fp32\n",
    "fp8accel.yaml": "distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: fp8\n",
    "gpuidsaccel.yaml": "distributed_type: MULTI_GPU\nnum_processes: 4\ngpu_ids: '0,1'\n",
    "list.yaml": "- learning_rate: 1e-4\n",
    "syntax.yaml": "model_name_or_path: x\nlearning_rate: 1e-4\nmax_steps: [10\n",
    "latin1.yaml": "model_name_or_path: caf\xe9\n".encode("latin-1"),
    "empty.jsonl": "",
    "latin1.jsonl": '{"question": "Fi\xe8vre?", "options": {"A": "a", "B": "b"}, "answer": "A"}\n'.encode("latin-1"),
    "notjson.jsonl": '{"question": "x", "options": {"A": "a", "B": "b"}, "answer": "A"}\nnot json\n',
    "noanswer.jsonl": '{"question": "a", "options": {"A": "a", "B": "b"}, "answer": "A"}\n\n{"question": "b", "options": {"A": "a", "B": "b"}, "answer": ""}\n',
    "nooptions.jsonl": '{"question": "What causes scurvy?", "answer": "A"}\n',
    "anatomy_dev.csv": "Which bone is in the thigh?,Femur,Tibia,Ulna,Radius,A\n",
    "medmcqa123.jsonl": '{"question": "Which nerve?", "opa": "Ulnar", "opb": "Radial", "opc": "Median", "opd": "Axillary", "cop": 2}\n{"question": "Which bone?", "opa": "Ulna", "opb": "Radius", "opc": "Femur", "opd": "Tibia", "cop": 3}\n',
    "badanswer.jsonl": '{"question": "What causes scurvy?", "options": {"A": "a", "B": "b"}, "answer": "E"}\n',
    "spacedheader.csv": "question, A, B, answer\nWhat causes scurvy?,vitamin C lack,iron lack,A\n",
    "disagree.jsonl": '{"question": "What causes scurvy?", "options": {"A": "vitamin C lack", "B": "iron lack"}, "answer_idx": "A", "answer": "iron lack"}\n',
    "testcopy.jsonl": (ROOT / TEST_SET).read_text(encoding="utf-8"),
    "twoquestions.jsonl": '{"question": "What causes scurvy?", "options": {"A": "vitamin C lack", "B": "iron lack"}, "answer": "A"}\n{"question": "What causes rickets?", "options": {"A": "vitamin D lack", "B": "iron lack"}, "answer": "A"}\n',
    "nullquestion.jsonl": '{"question": "What causes scurvy?", "options": {"A": "a", "B": "b"}, "answer": "A"}\n{"question": null, "options": {"A": "a", "B": "b"}, "answer": "B"}\n',
    "nullanswer.jsonl": '{"question": "What causes scurvy?", "options": {"A": "a", "B": "b"}, "answer": null}\n',
    "otherheader.csv": "Question,Option A,Option B,Option C,Option D,Correct\nWhich?,a,b,c,d,A\n",
    "ragged.csv": "question,A,B,answer\nWhat causes scurvy?,vitamin C,iron,A\nSecond,row,has,too,many,cells\n",
    "existing.json": "{}\n",
    "notes.jsonl": '{"text": "iron deficiency anemia notes"}\n',
    "benchmarks/medmcqa/dev_questions.jsonl": '{"question": "What causes scurvy?", "options": ["vitamin C lack", "iron lack", "zinc lack", "copper lack"], "answer": "A"}\n',
    "testonly/test.jsonl": '{"question": "What causes scurvy?", "options": {"A": "vitamin C lack", "B": "iron lack"}, "answer": "A"}\n',
    "notestrain/test.jsonl": '{"text": "iron deficiency anemia notes"}\n',
    "cutdocument.json": '{\n "1": {"QUESTION": "Does it help?", "final_decision": "yes"},\n "2": {"QUESTION": "And this?" "final_decision": "no"}\n}\n',
    "listtext.jsonl": '{"question": "Does aspirin help?", "contexts": ["A trial.", "It did."], "year": 2001}\n{"question": "Is coffee harmful?", "contexts": ["A cohort."], "year": 2003}\n',
    "othercolumns.jsonl": '{"title": "Scurvy", "body": "Scurvy is a lack of vitamin C."}\n',
    "emptydir/": None,
    "folder.gguf/": None,
    "blankturn.jsonl": '{"messages": [{"role": "user", "content": "Which drug?"}, {"role": "assistant", "content": "Aspirin."}]}\n{"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "Metformin."}]}\n',
    "twolayouts.jsonl": '{"messages": [{"role": "user", "content": "Which drug?"}, {"role": "assistant", "content": "Aspirin."}], "prompt": "Which drug?", "completion": "Aspirin."}\n',
    "systemprompt.jsonl": '{"prompt": [{"role": "system", "content": "Be brief."}], "chosen": [{"role": "assistant", "content": "A"}], "rejected": [{"role": "assistant", "content": "B"}]}\n',
    "questionchosen.jsonl": '{"prompt": [{"role": "user", "content": "Which?"}], "chosen": [{"role": "user", "content": "Which?"}, {"role": "assistant", "content": "A"}], "rejected": [{"role": "assistant", "content": "B"}]}\n',
    "textschosen.jsonl": '{"prompt": "Which?", "chosen": ["A", "yes"], "rejected": "B"}\n',
    "header.csv": "text\n",
    "deep.jsonl": '{"text": "scurvy"}\n{"text": "rickets", "x": ' + "[" * 3000 + "]" * 3000 + "}\n",
    "twocols.csv": "text,text\nscurvy,rickets\n",
    "twokinds/notes.jsonl": '{"text": "Sepsis is a dysregulated host response."}\n',
    "twokinds/more.csv": "text\nScurvy follows a lack of vitamin C.\n",
    "hiddenonly/.train.jsonl": '{"question": "What causes scurvy?", "options": {"A": "vitamin C lack", "B": "iron lack"}, "answer": "A"}\n',
    "badsyntax.jinja": "{% for m in messages %}{{ m.content }{% endfor %}",
    "norows.parquet": _parquet_of_no_rows(),
    "unquotedno.yaml": "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\nmixed_precision: no\n",
    "nulloption.jsonl": '{"question": "Which vitamin prevents scurvy?", "options": {"A": "C", "B": null, "C": "D", "D": "K"}, "answer_idx": "A"}\n',
    "lowerkeys.jsonl": '{"question": "Which vitamin prevents scurvy?", "options": {"a": "C", "b": "D"}, "answer_idx": "A"}\n',
    "notext.jsonl": '{"id": 1, "answer_idx": 2}\n{"id": 2, "answer_idx": 0}\n',
    "openquote.csv": 'question,A,B,answer\nWhat causes scurvy?,vitamin C lack,iron lack,A\n"Which vitamin,C,D,A\nlast,x,y,B\n',
    "latin1line3.txt": "Scurvy follows a lack of vitamin C.\nRickets follows a lack of vitamin D.\nCaf\xe9 au lait spots.\n".encode(
        "latin-1"
    ),
    "semicolons.csv": "question;A;B;answer\nWhat causes scurvy?;vitamin C lack;iron lack;A\n",
    "sharedid.jsonl": '{"id": "q1", "question": "What causes scurvy?", "options": {"A": "vitamin C lack", "B": "iron lack"}, "answer": "A"}\n'
    '{"id": "q2", "question": "What causes rickets?", "options": {"A": "vitamin D lack", "B": "iron lack"}, "answer": "A"}\n'
    '{"id": "q2", "question": "What causes goitre?", "options": {"A": "iodine lack", "B": "iron lack"}, "answer": "A"}\n',
    "splits/train.jsonl": '{"question": "What causes scurvy?", "options": {"A": "vitamin C lack", "B": "iron lack"}, "answer": "A"}\n',
    "splits/test.jsonl": '{"question": "What causes rickets?", "options": {"A": "vitamin D lack", "B": "iron lack"}, "answer": "A"}\n',
    "mirror/own-notes.txt": "my notes\n",
    "twice.jsonl": '{"text": "scurvy"}\n{"text": "iron", "text": "iron deficiency"}\n',
    "array.json": '[\n  {"text": "iron deficiency anemia"},\n  "a bare string",\n  {"text": "scurvy"}\n]\n',
    "staterun/trainer_state.json": '{"log_history": [], "global_step": 0}\n',
    "cutrun/trainer_state.json": '{"log_history": [{"loss": 2.5, "step": 1}], "global_st',
    "ckptrun/run.json": '{"script": "recipes/cpt.py"}\n',
    "ckptrun/checkpoint-2/run.json": '{"script": "recipes/cpt.py"}\n',
    "ckptrun/checkpoint-2/trainer_state.json": '{"log_history": [], "global_step": 2}\n',
    "adapter/adapter_config.json": '{"base_model_name_or_path": "MODEL"}',
    "adapter/adapter_model.safetensors": b"\x02\x00\x00\x00\x00\x00\x00\x00{}",  # whole, with no tensors
    "badadapter/adapter_config.json": "{not json",
    "cutadapter/adapter_config.json": '{"base_model_name_or_path": "MODEL", "peft_type": "LORA"}',
    # an adapter's weights cut short: the header names 1,024 bytes of a tensor, 100 follow
    "cutadapter/adapter_model.safetensors": len(
        b'{"a.lora_A.weight":{"dtype":"F32","shape":[4,64],"data_offsets":[0,1024]}}'
    ).to_bytes(8, "little")
    + b'{"a.lora_A.weight":{"dtype":"F32","shape":[4,64],"data_offsets":[0,1024]}}'
    + bytes(100),
    "nogen.jinja": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
    "glued.jsonl": '{"question": "Which {x}{y} organ pumps blood?", "options": ["Heart", "Lung", "Liver", "Skin"], '
    '"answer": "A"}\n{"question": "Q2?", "options": ["a", "b", "c", "d"], "answer": "B"} {"question": "Q3?", '
    '"options": ["a", "b", "c", "d"], "answer": "C"}\n',
    "noexpl.jsonl": '{"question": "Which organ pumps blood?", "options": ["Heart", "Lung", "Liver", "Skin"], '
    '"answer": "A"}\n',
    "noend.jinja": "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
    "bare.gguf": b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (0).to_bytes(8, "little"),
    "model-q8": b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (0).to_bytes(8, "little"),
    "cut.gguf": b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little") + (3).to_bytes(8, "little") + b"\x05",
    "emptyish/keep.txt": "an earlier result",
    "emptyq.jsonl": '{"question": "  ", "options": {"A": "a", "B": "b"}, "answer": "A"}\n',
    "partscontent.jsonl": '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n'
    '{"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}, {"role": "assistant", "content": "a"}]}\n',
    "layoutpairs.jsonl": '{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "A"}], "rejected": [{"role": "assistant", "content": "B"}]}\n'
    '{"prompt": "q2", "chosen": "A", "rejected": "B"}\n',
    "halfpairs.jsonl": '{"prompt": [{"role": "user", "content": "q"}], "chosen": "A", "rejected": "B"}\n',
    "asstfirst.jsonl": '{"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n',
    "badrole.jsonl": '{"messages": [{"role": "doctor", "content": "q"}, {"role": "assistant", "content": "a"}]}\n',
    "textdir/notes.jsonl": '{"text": "iron deficiency anemia notes"}\n',
    "samepair.jsonl": '{"prompt": "Q?", "chosen": "A. yes", "rejected": "A. yes"}\n',
    "nochosen.jsonl": '{"prompt": "Q?", "rejected": "B. no"}\n{"prompt": "Q?", "chosen": "A. yes", "rejected": "B. no"}\n',
    "wordlabel.jsonl": '{"prompt": "Q?", "completion": "A. yes", "label": true}\n{"prompt": "Q?", "completion": "B. no", "label": "yes"}\n',
    "numberlabel.jsonl": '{"prompt": "Q?", "completion": "A. yes", "label": 1}\n',
    "nocompletion.jsonl": '{"prompt": "Q?", "label": true}\n{"prompt": "Q?", "completion": "A. yes", "label": true}\n',
    "usercompletion.jsonl": '{"prompt": [{"role": "user", "content": "Q?"}], "completion": [{"role": "user", "content": "A"}], "label": false}\n',
    "userchosen.jsonl": '{"prompt": [{"role": "user", "content": "Q?"}], "chosen": [{"role": "user", "content": "A"}], "rejected": [{"role": "assistant", "content": "B"}]}\n',
    "emptychosen.jsonl": '{"prompt": "Q?", "chosen": "A. yes", "rejected": "B. no"}\n{"prompt": "Q?", "chosen": " ", "rejected": "B. no"}\n',
    "twoturns.jsonl": '{"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}], "rejected": [{"role": "assistant", "content": "c"}]}\n',
    "spacepair.jsonl": '{"prompt": "q", "chosen": "Aspirin.", "rejected": "Aspirin.  "}\n',
    "numberprompt.jsonl": '{"prompt": 42, "chosen": "a", "rejected": "b"}\n',
    "mixedchat.jsonl": '{"prompt": "q", "completion": [{"role": "assistant", "content": "a"}]}\n',
    "listquestion.jsonl": '{"question": ["Which", "drug?"], "options": {"A": "a", "B": "b"}, "answer": "A"}\n',
    "chatrows.jsonl": '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n',
    "emptyanswer.jsonl": '{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}\n',
    "alldesirable.jsonl": '{"prompt": "Q?", "completion": "A. yes", "label": true}\n{"prompt": "R?", "completion": "B. no", "label": true}\n',
    "oneoption.jsonl": '{"question": "Which?", "options": {"A": "only"}, "answer": "A"}\n',
    "blank.jsonl": "  \n\n \t\n",
    "numbertext.jsonl": '{"text": "Scurvy follows vitamin C deficiency."}\n{"text": 42}\n',
    "emptyprompt.jsonl": '{"prompt": [], "chosen": [{"role": "assistant", "content": "A"}], "rejected": [{"role": "assistant", "content": "B"}]}\n',
    "notjson-config/config.json": '{"model_type": "llama",',
    "nobase/adapter_config.json": '{"base_model_name_or_path": "/nonexistent/base-model"}',
    "nobase/adapter_model.safetensors": b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
    "alphazero/adapter_config.json": '{"base_model_name_or_path": "/nonexistent/base-model", "r": 8, "lora_alpha": 0}',
    "alphazero/adapter_model.safetensors": b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
    "prefixadapter/adapter_config.json": '{"base_model_name_or_path": "/nonexistent/base-model", "peft_type": "PREFIX_TUNING"}',
    "prefixadapter/adapter_model.safetensors": b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
    "noaccuracy.json": '{"tasks": {"medqa_4opt": {"n": 10, "ci95": [0.2, 0.8]}}, "settings": {}}',
    "eightadapter/adapter_config.json": '{"base_model_name_or_path": "/nonexistent/base-model", "r": "eight"}',
    "eightadapter/adapter_model.safetensors": b"\x02\x00\x00\x00\x00\x00\x00\x00{}",
}
# Copies of the tiny model, broken one way each (make_files).
BROKEN_MODELS = {"truncated": "model.safetensors", "notokenizer": "tokenizer", "badtemperature": "calibration.json",
                 "unknowntype": "config.json", "badtemplate": "chat_template.jinja",
                 "badtokconfig": "tokenizer_config.json", "othervocab": "config.json", "notype": "config.json",
                 "devicetokenizer": "tokenizer.json", "nosystem": "chat_template.jinja",
                 "emptytemplate": "chat_template.jinja", "badeos": "generation_config.json",
                 "classifier": "config.json", "notemplate": "chat_template.jinja"}  # fmt: skip
# What each of these is spoilt with: a model type transformers lacks, a template that does not
# compile, a JSON file cut short, a vocabulary size its weights are not, no model type, a template
# that refuses a system turn (as Gemma 2's does), an empty template, an end token past the vocabulary,
# a classifier's head.
SPOILT = {"unknowntype": lambda text: text.replace('"llama"', '"medllama9"'), "badtemplate": lambda text: text + "{% if %}",
          "badtokconfig": lambda text: text[: len(text) // 2],
          "othervocab": lambda text: re.sub(r'"vocab_size": \d+', '"vocab_size": 500', text),
          "notype": lambda text: re.sub(r'"model_type": "\w+",', "", text),
          "nosystem": lambda text: "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
          "supported') }}{% endif %}" + text, "emptytemplate": lambda text: "",
          "badeos": lambda text: re.sub(r'"eos_token_id": [^\]]+\],', '"eos_token_id": [2, 999999],', text),
          "classifier": lambda text: text.replace("LlamaForCausalLM", "LlamaForSequenceClassification")}  # fmt: skip


def make_files(folder: Path, model: str) -> Path:
    for name, content in FILES.items():
        path = folder / name
        if content is None:
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content.replace("MODEL", model), encoding="utf-8")
    (folder / "device.jsonl").symlink_to("/dev/zero")
    for name, broken in BROKEN_MODELS.items():
        copy = folder / name
        shutil.copytree(model, copy, dirs_exist_ok=True)
        for file in copy.iterdir():
            if broken == "model.safetensors" and file.name == broken:
                file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
            elif file.name.startswith(broken) and name not in SPOILT:
                file.unlink()
        if broken == "calibration.json":  # what `medrecipes calibrate` saves, spoilt
            (copy / broken).write_text('{"temperature": "warm"}')
        if name == "devicetokenizer":  # a link where the file should be, to what is no file
            (copy / broken).unlink(missing_ok=True)
            (copy / broken).symlink_to("/dev/zero")
        if name in SPOILT:
            file = copy / broken
            file.write_text(SPOILT[name](file.read_text(encoding="utf-8") if file.exists() else ""), encoding="utf-8")
    return folder


def outcome(argv: list[str]) -> tuple[int | str, list[str], str]:
    """(exit code, or 'traceback'/'silent', the lines on stderr, the first line of a traceback)."""
    import runpy

    from medrecipes import cli

    err = io.StringIO()
    if argv and argv[0].startswith("recipes/"):

        def call():  # the script itself, in this process: most rows stop at the recipe's parse
            saved, sys.argv = sys.argv, list(argv)
            try:
                runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
            finally:
                sys.argv = saved
    else:

        def call():
            return cli.main(argv)

    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            call()
        except SystemExit as exit:
            return exit.code, err.getvalue().splitlines(), ""
        except Exception as exc:  # noqa: BLE001 - a traceback is what the table looks for
            return "traceback", err.getvalue().splitlines(), f"{type(exc).__name__}: {str(exc).splitlines()[:1]}"
    return "silent", err.getvalue().splitlines(), ""


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model) -> Path:
    return make_files(tmp_path_factory.mktemp("bad-inputs"), tiny_model)


with tempfile.TemporaryDirectory() as _tmp:  # the names, for the test ids (cases() writes recipes)
    CASE_NAMES = [case.name for case in cases(Path(_tmp), "MODEL")]


@pytest.mark.parametrize("index", range(len(CASE_NAMES)), ids=CASE_NAMES)
def test_a_bad_input_is_one_line_and_exit_2(files, tiny_model, index):
    case = cases(files, tiny_model)[index]
    code, lines, traceback = outcome(case.argv)
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, (case.argv, code, lines, traceback)
    assert case.expect in errors[0], (case.argv, errors[0])


def test_the_table_has_a_hundred_cases():
    assert len(CASE_NAMES) >= 100 and len(set(CASE_NAMES)) == len(CASE_NAMES)


def as_typed(word: str) -> str:
    """A command-line word as a shell user types it: quoted where empty or holding a space or a
    character the shell reads (| < > ...), with $'...' for a control character (a line break would
    split the table's row)."""
    import shlex

    if any(ord(c) < 32 for c in word):
        return "$'" + word.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'"
    special = any(c.isspace() or c in "|&;<>()$`\\\"'*?[]#{}!" for c in word)
    return shlex.quote(word) if not word or special else word


def escaped(cell: str) -> str:
    """A table cell's text with its pipes escaped, code spans included (GitHub's tables split at a bare one)."""
    return cell.replace("|", chr(92) + "|")


def table_markdown(files: Path, model: str) -> str:
    """docs/bad-inputs.md's table: input, command, the line a user sees (paths shortened)."""
    import os
    import re

    def short(text: str) -> str:  # the test's temporary paths as names a reader can follow
        text = text.replace(model, "MODEL").replace(str(files) + "/", "").replace(str(files), "files/")
        text = text.replace(str(ROOT) + "/", "").replace(str(ROOT), "the working folder")  # this checkout
        text = text.replace(os.path.expanduser("~"), "~") if os.path.expanduser("~") != "/" else text
        return re.sub(r"recipe-\d+\.yaml", "edited.yaml", text)

    rows = ["| input | command | what the user sees |", "|---|---|---|"]
    for case in cases(files, model):
        code, lines, traceback = outcome(case.argv)
        seen = next((line for line in lines if line.startswith("error:")), traceback or f"(exit {code})")
        words = (
            as_typed(word) if len(word) <= 200 else f"'{word[:24]}...' ({len(word):,} characters)"
            for word in case.argv
        )
        shown = short(" ".join(words))
        command = shown if shown.startswith("recipes/") else f"medrecipes {shown}".rstrip()
        rows.append(f"| {case.name} | `{escaped(command)}` | {escaped(short(seen))} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # print the docs table: python tests/test_bad_inputs.py
    import os

    os.chdir(ROOT)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from medrecipes.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(f"{tmp}/model", [str(ROOT / "data/medical_text/train.jsonl")])
        sys.stdout.write(table_markdown(make_files(Path(tmp) / "files", model), model))


def test_the_line_starts_its_own_line_after_an_open_progress_bar(capsys):
    """A run stopped mid-epoch leaves its progress bar's line open on stderr (no newline until the
    bar closes): the error line starts after it, where `error:` begins a line."""
    from tqdm.auto import tqdm

    from medrecipes.errors import UserError, exit_on_user_error

    @exit_on_user_error
    def fails():
        raise UserError("the disk is full")

    bar = tqdm(total=12)
    bar.update(5)
    with pytest.raises(SystemExit):
        fails()
    bar.close()
    with pytest.raises(SystemExit):
        fails()  # no bar open: no empty line before it
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines.count("error: the disk is full") == 2, err
    assert not err.startswith("\n") and "\n\nerror:" not in err.split("error:", 1)[1], err


def test_a_command_into_a_log_or_a_pipe_prints_its_line_without_the_data_bars_above_it(files):
    """datasets' progress bars written to a file or a pipe are lines of carriage-return updates above
    the command's own line: a command whose stderr is no terminal leaves them out."""
    from conftest import PYTHON, run

    result = run(
        PYTHON, "-m", "medrecipes.cli", "eval", "--model", "/nonexistent", "--data", f"{files}/noanswer.jsonl"
    )
    assert result.returncode == 2 and result.stderr.splitlines() == [
        line for line in result.stderr.splitlines() if line.startswith("error: ")
    ], result.stderr[-2000:]
