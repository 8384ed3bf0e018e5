"""Tests for recipe parsing: YAML and overrides, strict keys, the token budget and the CLI's validate."""

import importlib.util
import logging
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import AVX512_BF16_CPU, PYTHON, ROOT, run

from medrecipes import cli
from medrecipes.config import (
    parse_eval_args,
    parse_recipe,
    recipe_method,
    resolve_token_budget,
    resolved_recipe,
    script_of,
)
from medrecipes.config.checks import TASK_METRIC_SUFFIXES
from medrecipes.config.schema import LAUNCH_COUNTS, say_rendezvous
from medrecipes.errors import UserError
from medrecipes.models.loading import recipe_tokenizer

BASE = {"model_name_or_path": "some/model", "use_cpu": True, "report_to": "none"}


def write_recipe(tmp_path: Path, text: str = "", name: str = "recipe.yaml", **keys) -> str:
    """A recipe file in tmp_path: BASE keys, `keys`, then raw YAML `text` (for literals like 2e-5)."""
    data = {**BASE, "output_dir": str(tmp_path / "out"), **keys}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False) + text)
    return str(path)


def parse(path: str, *overrides: str):
    return parse_recipe("cpt", [path, *overrides])


def user_error(*argv: str) -> str:
    with pytest.raises(UserError) as info:
        parse_recipe("cpt", list(argv))
    return str(info.value)


# ---------------------------------------------------------------------------
# YAML, --config and overrides


def test_positional_yaml_and_config_flag_agree(tmp_path):
    path = write_recipe(tmp_path, learning_rate=3e-4, max_length=256, per_device_train_batch_size=2)
    recipe_a, args_a, model_a = parse_recipe("cpt", [path])
    recipe_b, args_b, model_b = parse_recipe("cpt", ["--config", path])
    assert args_a.to_dict() == args_b.to_dict()
    assert model_a == model_b
    assert (args_a.learning_rate, args_a.max_length, args_a.per_device_train_batch_size) == (3e-4, 256, 2)
    assert model_a.model_name_or_path == "some/model"


def test_command_line_override_wins_over_yaml(tmp_path):
    path = write_recipe(tmp_path, learning_rate=3e-4)
    _, args, _ = parse(path, "--learning_rate", "1e-4")
    assert args.learning_rate == 1e-4
    _, args, _ = parse_recipe("cpt", ["--config", path, "--learning_rate", "1e-4"])
    assert args.learning_rate == 1e-4


def test_exponent_without_dot_in_yaml_is_a_float(tmp_path):
    # YAML 1.1 reads 2e-5 (no dot) as a string; the learning rate must still be the number.
    path = write_recipe(tmp_path, "learning_rate: 2e-5\n")
    assert yaml.safe_load(Path(path).read_text())["learning_rate"] == "2e-5"
    _, args, _ = parse(path)
    assert isinstance(args.learning_rate, float)
    assert args.learning_rate == 2e-5


def test_integer_budget_in_exponent_notation(tmp_path):
    # Token budgets are naturally written 11e9; the int field must accept it like 2e-5 above.
    path = write_recipe(
        tmp_path,
        "total_tokens: 11e9\n",
        per_device_train_batch_size=16,
        max_length=2048,
        global_batch_tokens=131072,
    )
    recipe, args, _ = parse(path)
    assert recipe.total_tokens == 11_000_000_000
    assert args.max_steps == 83924


# ---------------------------------------------------------------------------
# Strict keys


def test_unknown_top_level_key_names_file_key_and_suggestion(tmp_path):
    path = write_recipe(tmp_path, learning_rte=1e-4)
    message = user_error(path)
    assert path in message
    assert "'learning_rte'" in message
    assert "did you mean 'learning_rate'" in message


def test_unknown_key_in_mixture_source(tmp_path):
    path = write_recipe(
        tmp_path, dataset_mixture={"sources": [{"path": "json", "data_files": "a.jsonl", "weigth": 0.5}]}
    )
    message = user_error(path)
    assert path in message
    assert "dataset_mixture.sources[0]" in message
    assert "'weigth'" in message
    assert "did you mean 'weight'" in message


def test_unknown_key_in_second_mixture_source_points_at_it(tmp_path):
    sources = [{"path": "json", "data_files": "a.jsonl"}, {"path": "json", "data_files": "b.jsonl", "sed": 1}]
    message = user_error(write_recipe(tmp_path, dataset_mixture={"sources": sources}))
    assert "dataset_mixture.sources[1]" in message
    assert "'sed'" in message


def test_unknown_key_in_eval_set(tmp_path):
    path = write_recipe(tmp_path, eval_sets={"medqa": {"path": "json", "text_feild": "body"}})
    message = user_error(path)
    assert path in message
    assert "eval_sets.medqa" in message
    assert "did you mean 'text_field'" in message


def test_source_without_path(tmp_path):
    message = user_error(write_recipe(tmp_path, dataset_mixture={"sources": [{"data_files": "a.jsonl"}]}))
    assert "dataset_mixture.sources[0]" in message
    assert "missing key 'path'" in message


def test_mixture_without_sources(tmp_path):
    message = user_error(write_recipe(tmp_path, dataset_mixture={"seed": 1}))
    assert "sources" in message


@pytest.mark.parametrize(
    "source, words",
    [
        ({"path": "json", "weight": 0}, ["sources[0]", "weight must be positive"]),
        ({"path": "json", "format": "markdown"}, ["format", "'markdown'"]),
        ({"path": "json", "weight": "abc"}, ["sources[0]: weight must be a number, got 'abc'"]),
        ({"path": "json", "data_files": 5}, ["data_files must be text or a list or null, got 5"]),
        ({"path": "json", "split": True}, ["split must be text, got true (YAML's reading of an unquoted"]),
        ({"path": "json", "format": "usmle", "pubmedqa_setting": "free"}, ["pubmedqa_setting 'free' is unknown"]),
        ({"path": "json", "pubmedqa_setting": "reasoning_free"}, ["sources[0]: pubmedqa_setting", "format text"]),
        ({"path": "json", "format": "chat", "pubmedqa_setting": "reasoning_free"}, ["format chat; set format: usmle"]),
    ],
)
def test_bad_source_values(tmp_path, source, words):
    message = user_error(write_recipe(tmp_path, dataset_mixture={"sources": [source]}))
    for word in words:
        assert word in message


def test_explained_targets_need_the_prompt_that_asks_for_them(tmp_path):
    path = write_recipe(
        tmp_path, dataset_mixture={"sources": [{"path": "json", "format": "usmle"}]}, with_explanation=True
    )
    with pytest.raises(UserError, match="with_explanation trains answers that explain.*set chain_of_thought: true"):
        parse_recipe("sft", [path])
    recipe, _, _ = parse_recipe("sft", [path, "--chain_of_thought", "true"])
    assert recipe.with_explanation and recipe.chain_of_thought


def test_nested_values_of_the_wrong_type_are_one_line(tmp_path):
    mixture = {"seed": "x", "sources": [{"path": "json"}]}
    assert user_error(write_recipe(tmp_path, dataset_mixture=mixture)).endswith(
        "dataset_mixture: seed must be a whole number, got 'x'"
    )
    # YAML reads 1e-2 as text; a number is meant.
    recipe, _, _ = parse(write_recipe(tmp_path, "", dataset_mixture={"sources": [{"path": "json", "weight": "1e-2"}]}))
    assert recipe.mixture.sources[0].weight == 0.01


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--attn_implementation", "flash"], "attn_implementation 'flash' is unknown; use eager, flash_attention_4"),
        (["--use_peft", "true", "--lora_r", "0"], "lora_r must be at least 1, got 0"),
        (["--report_to", "wandbb"], "report_to 'wandbb' is unknown (did you mean 'wandb'"),
    ],
)
def test_settings_that_would_fail_once_loaded_are_one_line_at_parse(tmp_path, overrides, message):
    assert message in user_error(write_recipe(tmp_path), *overrides)
    # A Hub kernel is a name the recipe takes; to train here it needs the kernels package.
    hub_kernel = [write_recipe(tmp_path), "--attn_implementation", "kernels-community/flash-attn"]
    assert parse_recipe("cpt", hub_kernel, to_train=False)
    if importlib.util.find_spec("kernels") is None:
        assert "needs the kernels package to fetch a Hub kernel" in user_error(*hub_kernel)


def test_unknown_stopping_strategy(tmp_path):
    mixture = {"stopping_strategy": "never", "sources": [{"path": "json"}]}
    assert "stopping_strategy" in user_error(write_recipe(tmp_path, dataset_mixture=mixture))


def test_unknown_command_line_key_suggests_the_right_one(tmp_path):
    path = write_recipe(tmp_path)
    message = user_error(path, "--learning_rte", "1")
    assert "unknown argument '--learning_rte' (did you mean '--learning_rate'" in message  # as it is written


def test_truncated_command_line_key_is_an_error(tmp_path):
    # A key missing its last letter must not be taken as an abbreviation: `--learning_rat 1`
    # would otherwise train with a learning rate of 1.0, while the same key in YAML is refused.
    path = write_recipe(tmp_path, learning_rate=3e-4)
    message = user_error(path, "--learning_rat", "1")
    assert "learning_rat" in message
    assert "did you mean '--learning_rate'" in message


def test_a_mixture_on_the_command_line_is_one_yaml_value(tmp_path):
    mixture = {"sources": [{"path": "json", "data_files": "b.jsonl", "weight": 2}], "seed": 7}
    from_yaml, _, _ = parse(write_recipe(tmp_path, dataset_mixture=mixture))
    from_command_line, _, _ = parse(
        write_recipe(tmp_path, name="other.yaml"),
        "--dataset_mixture",
        yaml.safe_dump(mixture, default_flow_style=True),
    )
    assert from_command_line.dataset_mixture == from_yaml.dataset_mixture
    assert from_command_line.mixture == from_yaml.mixture and from_yaml.mixture.sources[0].weight == 2
    message = user_error(write_recipe(tmp_path), "--dataset_mixture", "b.jsonl")
    assert "argument --dataset_mixture/--dataset-mixture: expected a YAML dict such as '{key: value, ...}'" in message


@pytest.mark.parametrize(
    "words",
    [["[sigmoid, sft]", "--loss_weights", "[1.0, 0.5]"], ["[sigmoid,", "sft]", "--loss_weights", "[1.0,", "0.5]"],
     ["sigmoid", "sft", "--loss_weights=[1.0,0.5]"], ["sigmoid", "sft", "--loss_weights", "1.0", "0.5"]],
)  # fmt: skip
def test_a_list_on_the_command_line_is_read_as_the_recipe_writes_it(words):
    """A list key's YAML flow list, in one word or several, is its items before the library's own
    checks see it (TRL's DPOConfig compares the weights with the losses)."""
    _, training, _ = parse_recipe("dpo", [str(ROOT / "recipes/tiny_dpo.yaml"), "--loss_type", *words])
    assert training.loss_type == ["sigmoid", "sft"] and training.loss_weights == [1.0, 0.5]


@pytest.mark.parametrize(
    "words", [["[a=x.jsonl, b=y.jsonl]"], ["[a=x.jsonl,", "b=y.jsonl]"], ["a=x.jsonl", "b=y.jsonl"]]
)
def test_a_list_of_items_that_hold_an_equals_sign_is_read_whole(words):
    """Items written TASK=PATH (eval's --data) in a flow list: each item's '=' is its own text,
    not a --key=value split."""
    from medrecipes.config import parse_eval_args

    args = parse_eval_args(["--model_name_or_path", "m", "--tasks", "a", "b", "--data", *words])
    assert args.data == ["a=x.jsonl", "b=y.jsonl"] and args.data_by_task == {"a": "x.jsonl", "b": "y.jsonl"}


@pytest.mark.parametrize("method", ["sft", "grpo"])
def test_activation_checkpointing_defaults_on_without_a_deprecation_warning(tmp_path, method, recwarn):
    path = write_recipe(tmp_path)
    args = parse_recipe(method, [path])[1]
    assert args.activation_checkpointing is True  # TRL's default, under its current name
    assert not [w for w in recwarn if "gradient_checkpointing" in str(w.message)]
    assert parse_recipe(method, [path, "--activation_checkpointing", "false"])[1].activation_checkpointing is False
    recipe, args, _ = parse_recipe(method, [path, "--gradient_checkpointing", "false"])
    assert args.activation_checkpointing is False  # the old name is still honoured, its deprecation a note
    assert any(n.startswith("gradient_checkpointing is deprecated") for n in recipe.notes), recipe.notes


def test_a_recipes_notes_are_said_by_the_main_process_only(tmp_path, caplog, monkeypatch):
    """Every process of a launch reads the same recipe: its notes are said once, not once a process."""
    from types import SimpleNamespace

    from medrecipes.logs import setup_logging

    recipe, args, _ = parse_recipe("sft", [write_recipe(tmp_path), "--gradient_checkpointing", "false"])
    for stream in ("stdout", "stderr"):  # a run's set-up wraps them: put back after
        monkeypatch.setattr(sys, stream, getattr(sys, stream))
    said = {}
    for main in (True, False):
        caplog.clear()
        with caplog.at_level("WARNING"):
            setup_logging(SimpleNamespace(get_process_log_level=lambda: logging.WARNING, should_log=main), recipe)
        said[main] = [r.getMessage() for r in caplog.records if r.name == "medrecipes"]
    assert said == {True: recipe.notes, False: []} and recipe.notes


@pytest.mark.parametrize("command", ["validate", "plan", "preview", "launch-plan", "build-data"])
def test_every_command_that_reads_a_recipe_to_train_says_its_notes_once(command, tmp_path, capsys, tiny_model):
    """A value that does nothing is said where the recipe is checked or planned, as the run would log it."""
    extra = {
        "launch-plan": ["--nodes", "1"],
        "build-data": ["--out", str(tmp_path / "built")],
        "preview": ["--examples", "1"],
    }
    recipe = ["recipes/tiny_cpt.yaml", "--model_name_or_path", tiny_model, "--max_grad_norm", "-1"]
    cli.main([command, *recipe, *extra.get(command, [])])
    assert capsys.readouterr().err.count("warning: max_grad_norm -1 turns gradient clipping off") == 1


def test_a_loggers_settings_in_the_environment_are_a_note_where_report_to_leaves_it_out(tmp_path, monkeypatch):
    """WANDB_PROJECT beside report_to tensorboard does nothing: said, naming the logger to add. Its
    credentials (keys, tokens) live in shells for every project and are not said."""
    for name in ("WANDB_PROJECT", "WANDB_API_KEY", "COMET_PROJECT_NAME", "AZURE_REGION", "TENSORBOARD_X"):
        monkeypatch.setenv(name, "x")
    path = write_recipe(tmp_path)
    for report_to, said in (("tensorboard", ["comet_ml", "wandb"]), ("none", ["comet_ml", "tensorboard", "wandb"])):
        notes = [n for n in parse(path, "--report_to", report_to)[0].notes if "in the environment" in n]
        assert [n.split(" logger")[0].rsplit(" ", 1)[-1] for n in notes] == said, notes
        assert not any("API_KEY" in n or "AZURE" in n for n in notes)
    assert (
        "WANDB_PROJECT in the environment is read by the wandb logger, and report_to is none: nothing reads it; add "
        "wandb to report_to to log there"
    ) in notes


@pytest.mark.parametrize(
    "method, key, value, words",
    [
        ("cpt", "per_device_train_batch_size", "0", "at least 1, got 0"),
        ("cpt", "gradient_accumulation_steps", "0", "at least 1, got 0"),
        ("cpt", "max_length", "0", "at least 1, got 0"),
        ("sft", "per_device_eval_batch_size", "0", "at least 1, got 0"),
        ("sft", "learning_rate", "-0.5", "0 or more, got -0.5"),
        ("grpo", "per_device_train_batch_size", "0", "at least 1, got 0"),  # GRPOConfig divides by it
        ("grpo", "max_completion_length", "0", "at least 1, got 0"),
        ("grpo", "embedding_learning_rate", "-1", "0 or more, got -1.0"),
    ],
)
def test_settings_out_of_range_are_one_line_at_parse(tmp_path, method, key, value, words):
    path = write_recipe(tmp_path)
    with pytest.raises(UserError) as info:
        parse_recipe(method, [path, f"--{key}", value])
    assert str(info.value) == f"{path}: {key} must be {words}"


def test_outputs_inside_a_file_or_onto_a_folder_are_refused_before_running(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(UserError, match=f"output: cannot create {taken}/deeper/results.json: {taken} is a file"):
        parse_eval_args(["--model", "m", "--output", str(taken / "deeper" / "results.json")])
    with pytest.raises(UserError, match=f"output: {tmp_path} is a folder; name the file to write"):
        parse_eval_args(["--model", "m", "--output", str(tmp_path)])
    with pytest.raises(SystemExit) as info:
        cli.main(["tiny-model", str(taken / "model")])
    assert info.value.code == 2


def test_stray_positional_argument(tmp_path):
    assert "unknown argument 'extra'" in user_error(write_recipe(tmp_path), "extra")


def test_a_recipe_needs_a_model_to_start_from(tmp_path):
    path = write_recipe(tmp_path)
    data = yaml.safe_load(Path(path).read_text())
    del data["model_name_or_path"]
    Path(path).write_text(yaml.safe_dump(data))
    recipe, _, model_args = parse_recipe("cpt", [path], to_train=False)  # read for its data (decontaminate)
    with pytest.raises(UserError, match="recipe: no 'model_name_or_path'; name the model to start from"):
        recipe_tokenizer(recipe, model_args)
    assert "model_name_or_path is not set; name the model this recipe starts from" in user_error(path)
    assert "init_from_scratch needs 'architecture'" in user_error(path, "--init_from_scratch", "true")


@pytest.mark.parametrize("script", ["cpt", "sft", "grpo"])
def test_a_recipe_script_without_a_recipe_says_how_to_run_it(script):
    result = run(PYTHON, f"recipes/{script}.py", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: no recipe: run `python recipes/{script}.py RECIPE.yaml [--key value ...]` (see recipes/)"
    )
    assert "Traceback" not in result.stderr


def test_bad_value_type_is_a_user_error_not_an_exit(tmp_path):
    path = write_recipe(tmp_path)
    try:
        parse(path, "--max_steps", "abc")
    except UserError as err:
        assert "max_steps" in str(err)
        assert "abc" in str(err)
    else:
        pytest.fail("--max_steps abc was accepted")


@pytest.mark.parametrize(
    "content, words", [(None, ["no such recipe file"]), ("- a\n- b\n", ["mapping"]), ("a: [1\n", ["not valid YAML"])]
)
def test_unreadable_recipe_files(tmp_path, content, words):
    path = tmp_path / "broken.yaml"
    if content is not None:
        path.write_text(content)
    message = user_error(str(path))
    assert str(path) in message
    for word in words:
        assert word in message


# ---------------------------------------------------------------------------
# Token budget


def budget_recipe(tmp_path, **keys):
    keys = {
        "per_device_train_batch_size": 4,
        "max_length": 128,
        "global_batch_tokens": 2048,
        "total_tokens": 10000,
        "warmup_tokens": 4096,
        **keys,
    }
    return write_recipe(tmp_path, **keys)


def test_token_budget_becomes_steps_on_one_process(tmp_path):
    recipe, args, _ = parse(budget_recipe(tmp_path))
    assert args.gradient_accumulation_steps == 4  # 2048 / (4 x 128)
    assert args.max_steps == math.ceil(10000 / 2048) == 5
    assert args.warmup_steps == 2  # 4096 / 2048
    assert recipe.derived["max_steps"] == 5
    # The rounded-up budget is reported so the user sees the tokens actually trained.
    assert recipe.derived["tokens_trained"] == 5 * 2048


def test_token_budget_for_more_processes(tmp_path):
    recipe, args, _ = parse(budget_recipe(tmp_path))
    derived = resolve_token_budget(recipe, args, "recipe.yaml", world_size=2)
    assert args.gradient_accumulation_steps == derived["gradient_accumulation_steps"] == 2
    assert args.max_steps == 5  # steps depend on the global batch, not on the process count


def test_budget_that_does_not_divide_suggests_multiples(tmp_path):
    path = budget_recipe(tmp_path, global_batch_tokens=3000)
    message = user_error(path)
    assert path in message
    assert "3000" in message
    assert "512" in message  # 4 x 128 x 1 tokens per micro-step
    assert "1024" in message and "2048" in message


def test_budget_that_fits_fewer_processes_says_so(tmp_path):
    # 512 tokens per device divides 1536 only on 1 or 3 processes; planning for 2 must say that.
    recipe, args, _ = parse(budget_recipe(tmp_path, global_batch_tokens=1536))
    with pytest.raises(UserError, match=r"or run on 1, 3 processes"):
        resolve_token_budget(recipe, args, "recipe.yaml", world_size=2)


def test_total_tokens_without_global_batch_tokens(tmp_path):
    path = write_recipe(tmp_path, total_tokens=10000)
    assert "global_batch_tokens" in user_error(path)


def test_min_lr_selects_cosine_with_floor(tmp_path):
    _, args, _ = parse(write_recipe(tmp_path, min_lr=1e-6))
    assert args.lr_scheduler_type == "cosine_with_min_lr"
    assert args.lr_scheduler_kwargs == {"min_lr": 1e-6}


def test_without_min_lr_the_schedule_is_left_alone(tmp_path):
    _, args, _ = parse(write_recipe(tmp_path, lr_scheduler_type="linear"))
    assert args.lr_scheduler_type == "linear"
    assert not args.lr_scheduler_kwargs


def test_pretraining_budget_numbers(tmp_path):
    path = budget_recipe(
        tmp_path,
        per_device_train_batch_size=16,
        max_length=2048,
        global_batch_tokens=131072,
        total_tokens=11_000_000_000,
        warmup_tokens=None,
    )
    recipe, args, _ = parse(path)
    assert args.gradient_accumulation_steps == 4
    # 11e9 / 131072 = 83923.3: rounded up, so the whole budget is trained.
    assert args.max_steps == 83924
    assert recipe.derived["tokens_trained"] >= 11_000_000_000
    resolve_token_budget(recipe, args, path, world_size=4)
    assert args.gradient_accumulation_steps == 1


# ---------------------------------------------------------------------------
# Best checkpoint and scratch


def eval_recipe(tmp_path, **keys):
    return write_recipe(
        tmp_path,
        eval_sets={
            "medical_text": {"path": "json", "data_files": "a.jsonl"},
            "usmle": {"path": "json", "data_files": "b.jsonl", "format": "usmle"},
        },
        eval_strategy="steps",
        save_strategy="steps",
        load_best_model_at_end=True,
        **keys,
    )


def test_best_model_is_ranked_by_first_eval_set(tmp_path):
    recipe, args, _ = parse(eval_recipe(tmp_path))
    assert list(recipe.eval_sources) == ["medical_text", "usmle"]
    assert recipe.eval_sources["usmle"].format == "usmle"
    assert args.metric_for_best_model == "eval_medical_text_loss"
    assert args.greater_is_better is False


def test_explicit_best_metric_is_kept(tmp_path):
    _, args, _ = parse(eval_recipe(tmp_path, metric_for_best_model="eval_usmle_loss"))
    assert args.metric_for_best_model == "eval_usmle_loss"


@pytest.mark.parametrize("suffix", TASK_METRIC_SUFFIXES)
def test_a_best_metric_of_a_scored_task_is_kept_and_of_another_name_fails_before_training(tmp_path, suffix):
    # CPT scores the usmle eval set only where eval_tasks names it; with or without "eval_", as the
    # trainer reads the name
    for metric in (f"eval_usmle_{suffix}", f"usmle_{suffix}"):
        _, args, _ = parse(eval_recipe(tmp_path, eval_tasks=["usmle"], metric_for_best_model=metric))
        assert args.metric_for_best_model == metric
    message = user_error(eval_recipe(tmp_path, eval_tasks=["usmle"], metric_for_best_model=f"eval_usmel_{suffix}"))
    assert "\n" not in message and "metric_for_best_model 'eval_usmel_" in message
    assert f"did you mean 'eval_usmle_{suffix}'" in message
    message = user_error(eval_recipe(tmp_path, metric_for_best_model=f"eval_usmle_{suffix}"))
    assert (
        "'usmle', which this recipe does not evaluate; it scores no task at evaluation: list one in eval_tasks"
        in message
    )


def test_sft_scores_its_multiple_choice_eval_sets_without_eval_tasks(tmp_path):
    keys = {"eval_sets": {"validation": {"path": "json", "data_files": "b.jsonl", "format": "usmle"}},
            "eval_strategy": "epoch", "save_strategy": "epoch", "load_best_model_at_end": True}  # fmt: skip
    _, args, _ = parse_recipe("sft", [write_recipe(tmp_path, metric_for_best_model="eval_validation_acc", **keys)])
    assert args.metric_for_best_model == "eval_validation_acc"
    with pytest.raises(UserError, match="names 'validaton'.*did you mean 'eval_validation_acc'"):
        parse_recipe("sft", [write_recipe(tmp_path, metric_for_best_model="eval_validaton_acc", **keys)])


def test_a_best_loss_names_an_eval_set_and_other_metrics_are_the_trainers(tmp_path):
    message = user_error(eval_recipe(tmp_path, metric_for_best_model="eval_medical_txt_loss"))
    assert "metrics of this kind it logs: eval_medical_text_loss, eval_usmle_loss" in message
    for metric in ("eval_loss", "loss", "eval_mean_token_accuracy", "eval_usmle_runtime"):
        assert parse(eval_recipe(tmp_path, metric_for_best_model=metric))[1].metric_for_best_model


def test_keep_best_checkpoints_conflicts_with_save_total_limit(tmp_path):
    message = user_error(eval_recipe(tmp_path, keep_best_checkpoints=2, save_total_limit=3))
    assert "keep_best_checkpoints" in message and "save_total_limit" in message


def test_keep_best_checkpoints_needs_eval_sets(tmp_path):
    assert "eval_sets" in user_error(write_recipe(tmp_path, keep_best_checkpoints=2))


def test_init_from_scratch_needs_architecture(tmp_path):
    path = write_recipe(tmp_path, init_from_scratch=True, tokenizer_name_or_path="tok")
    message = user_error(path)
    assert path in message
    assert "architecture" in message


def test_init_from_scratch_with_architecture_parses(tmp_path):
    recipe, _, _ = parse(
        write_recipe(
            tmp_path,
            init_from_scratch=True,
            architecture="tiny",
            tokenizer_name_or_path="tok",
            model_name_or_path=None,
        )
    )
    assert recipe.architecture == "tiny"


# ---------------------------------------------------------------------------
# medrecipes validate


def test_validate_prints_resolved_recipe(tmp_path, capsys):
    mixture = {"sources": [{"path": "data/medical_text/train.jsonl", "format": "text"}]}
    path = budget_recipe(tmp_path, learning_rate=5e-4, dataset_mixture=mixture)
    cli.main(["validate", path, "--learning_rate", "7e-4"])
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    assert resolved["learning_rate"] == 7e-4
    assert resolved["model_name_or_path"] == "some/model"
    assert resolved["gradient_accumulation_steps"] == 4
    assert resolved["max_steps"] == 5
    assert "# derived: max_steps = 5" in out
    assert out.rstrip().endswith(f"# {path}: valid cpt recipe (recipes/cpt.py)")


def test_validate_bad_key_exits_2_with_one_line(tmp_path, capsys):
    path = write_recipe(tmp_path, learning_rte=1e-4)
    with pytest.raises(SystemExit) as info:
        cli.main(["validate", path])
    assert info.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error:")
    assert "did you mean 'learning_rate'" in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_validate_as_a_command_is_one_line_on_any_cpu(tmp_path):
    path = write_recipe(tmp_path, learning_rte=1e-4)
    result = run(PYTHON, "-m", "medrecipes.cli", "validate", path, timeout=120, env=AVX512_BF16_CPU)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    assert path in lines[0]


def test_commands_that_only_read_recipes_import_no_training_back_end():
    # A GPU recipe (torch_compile, bf16, 4-bit) read on this CPU: the imports are listed by -X importtime.
    for command in (["validate"], ["plan", "--num-gpus", "8"]):
        recipe = str(ROOT / "recipes/medgemma_4b_qlora.yaml")
        result = run(PYTHON, "-X", "importtime", "-m", "medrecipes.cli", *command, recipe, env=AVX512_BF16_CPU)
        assert result.returncode == 0, result.stderr[-2000:]
        imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
        assert "transformers" in imported  # the recipe schema is read with it
        assert not imported & {"peft", "bitsandbytes", "deepspeed"}, command
        noise = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
        assert noise == [], noise


def test_validate_takes_sft_grpo_and_evaluation_recipes_without_method(capsys):
    for name, method in (("tiny_sft.yaml", "sft"), ("tiny_grpo.yaml", "grpo"), ("tiny_eval.yaml", "eval")):
        cli.main(["validate", str(ROOT / "recipes" / name)])
        out = capsys.readouterr().out
        assert out.rstrip().endswith(f"valid {method} recipe ({script_of(method)})"), out
    cli.main(["validate", str(ROOT / "recipes/tiny_eval.yaml"), "--limit", "3"])
    assert yaml.safe_load(capsys.readouterr().out)["limit"] == 3


def test_plan_refuses_an_evaluation_recipe(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["plan", str(ROOT / "recipes/tiny_eval.yaml")])
    err = capsys.readouterr().err
    assert (
        info.value.code == 2
        and "a recipe for recipes/evaluate.py; this command takes a cpt, sft, grpo, dpo or kto recipe" in err
    )


def _recipe_table() -> dict[str, str]:
    """{recipe YAML: the script that runs it} from the table in recipes/README.md."""
    scripts = {}
    for line in (ROOT / "recipes" / "README.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:3]] if line.startswith("| `") else []
        if cells:
            names, runners = (re.findall(r"`([^`]+)`", cell) for cell in cells)
            scripts.update(zip(names, runners * len(names) if len(runners) == 1 else runners, strict=True))
    return scripts


def test_every_shipped_recipe_is_documented_and_parses_for_its_script(tmp_path):
    scripts = _recipe_table()
    shipped = sorted(path.name for path in (ROOT / "recipes").glob("*.yaml"))
    assert sorted(scripts) == shipped  # recipes/README.md lists every recipe, and no other
    for name, script in scripts.items():
        path = str(ROOT / "recipes" / name)
        assert script_of(recipe_method(path)) == f"recipes/{script}", name  # what validate and plan infer
        if script == "evaluate.py":
            assert parse_eval_args([path]).model_name_or_path
            continue
        method = script.removesuffix(".py")
        # As plan reads it: a GPU recipe asks for packages this machine need not have (bitsandbytes).
        resolved = resolved_recipe(*parse_recipe(method, [path], to_train=False))
        # What validate prints and the model card records gives the same run when parsed again.
        again = tmp_path / name
        again.write_text(yaml.safe_dump(resolved))
        assert resolved_recipe(*parse_recipe(method, [str(again)], to_train=False)) == resolved, name


@pytest.mark.long  # launches under accelerate
def test_a_recipe_follows_the_launchers_mixed_precision_or_refuses_in_one_line():
    validate = (PYTHON, "-m", "medrecipes.cli", "validate", "recipes/tiny_cpt.yaml")
    for launcher, bf16 in (("bf16", True), ("no", False)):  # the recipe leaves bf16 to the machine
        result = run(*validate, env={"ACCELERATE_MIXED_PRECISION": launcher}, timeout=120)
        assert result.returncode == 0 and yaml.safe_load(result.stdout)["bf16"] is bf16, result.stderr[-2000:]
        # This CPU would train without bf16: the variable that chose it is named (a shell may have left it).
        assert ("because ACCELERATE_MIXED_PRECISION is bf16" in result.stderr) is bf16, result.stderr[-2000:]
    result = run(*validate, "--bf16", "false", env={"ACCELERATE_MIXED_PRECISION": "bf16"}, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == (
        "error: recipes/tiny_cpt.yaml: ACCELERATE_MIXED_PRECISION is bf16 (accelerate launch's mixed_precision, or "
        "left in this shell's environment) but the recipe trains with no; pass --mixed_precision no to accelerate "
        "launch or unset the variable where no launch runs this, or set bf16/fp16 in the recipe to match"
    )


def test_a_librarys_mapping_key_takes_yaml_on_the_command_line_and_a_path_stays_text(tmp_path):
    """TRL and transformers read a `dict | str` key's text as JSON only, and fail without naming
    the key; the recipe reads a mapping written as YAML or JSON, and other text (a path) as text."""
    path = write_recipe(tmp_path)
    for text in ("{page_size: 16, num_blocks: 64}", '{"page_size": 16, "num_blocks": 64}'):
        args = parse_recipe("grpo", [path, "--transformers_continuous_batching_config", text])[1]
        assert args.transformers_continuous_batching_config == {"page_size": 16, "num_blocks": 64}
    with pytest.raises(UserError) as info:
        parse_recipe("grpo", [path, "--transformers_continuous_batching_config", "{page_size: ["])
    assert "--transformers_continuous_batching_config" in str(info.value) and "not a valid mapping" in str(info.value)
    cosine = [path, "--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", "{num_cycles: 0.25}"]
    assert parse_recipe("sft", cosine)[1].lr_scheduler_kwargs == {"num_cycles": 0.25}


def test_a_librarys_refusal_reads_as_one_line_in_a_recipes_words():
    from medrecipes.config.parse import library_words

    err = ValueError(
        "needs them to match, but found\n- Evaluation strategy: IntervalStrategy.STEPS\n- Save strategy: SaveStrategy.NO"
    )
    assert library_words(err) == "needs them to match, but found Evaluation strategy: steps, Save strategy: no"
    assert library_words(ValueError("a - b\nc")) == "a - b c"


def test_yaml_words_a_key_would_misread_are_said_or_read_as_the_command_line_reads_them(tmp_path):
    path = write_recipe(tmp_path, "eval_strategy: no\n")  # YAML 1.1: false
    assert "eval_strategy must be one of no, steps, epoch, got false" in user_error(path)  # not "or text"
    assert "got false (YAML's reading of an unquoted yes, no, on, off, true or false); write the word in quotes" in (
        user_error(path)
    )
    quoted = user_error(write_recipe(tmp_path, name="quoted.yaml", use_cpu="true"))
    assert "use_cpu must be true or false, got the text 'true' (in quotes); write true without them" in quoted


def test_a_world_size_that_is_no_count_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert user_error(write_recipe(tmp_path)) == (
        "WORLD_SIZE='abc' in the environment is not a whole number; unset it (a launcher sets it)"
    )


def test_counts_of_several_processes_with_no_launcher_say_the_process_waits(monkeypatch, caplog):
    """WORLD_SIZE and its fellows left in a shell: torch waits for the others, silent, for
    ddp_timeout; the line says so. Under a launcher (its marks) nothing is said."""
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555"}.items():
        monkeypatch.setenv(name, value)
    with caplog.at_level("WARNING"):
        say_rendezvous()
    assert [r.getMessage() for r in caplog.records] == [
        "WORLD_SIZE=2 with no launcher's marks: this process (RANK 0) now waits for the other 1 to join at "
        "127.0.0.1:29555, up to ddp_timeout; start them, or unset WORLD_SIZE and its fellows to run alone"
    ]
    caplog.clear()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    with caplog.at_level("WARNING"):
        say_rendezvous()
    assert caplog.records == []


@pytest.mark.parametrize(
    "flags",
    [
        ["--cpu", "--num_processes", "2"],
        [
            "--num_machines",
            "2",
            "--machine_rank",
            "1",
            "--main_process_ip",
            "10.0.0.1",
            "--main_process_port",
            "29501",
            "--cpu",
        ],
    ],
)
def test_a_launch_of_several_processes_that_starts_one_says_so(monkeypatch, caplog, flags):
    """accelerate launch's plain launcher (CPUs without mpirun, or distributed_type NO) asked for
    several processes starts one: the environment it builds, from accelerate's own functions, says so."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_simple_launcher_cmd_env

    args, _, _ = _validate_launch_command(launch_command_parser().parse_args([*flags, "recipes/sft.py"]))
    _, env = prepare_simple_launcher_cmd_env(args)
    for name in LAUNCH_COUNTS + ("MASTER_ADDR", "MASTER_PORT", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.delenv(name, raising=False)
    for name in ("MASTER_ADDR", "MASTER_PORT", "ACCELERATE_MIXED_PRECISION"):
        monkeypatch.setenv(name, env[name])
    caplog.clear()  # accelerate's own warning of defaults used
    with caplog.at_level("WARNING"):
        say_rendezvous()
    assert [r.getMessage() for r in caplog.records] == [
        "accelerate launch was asked for several processes or machines and started this one alone (on CPUs it "
        "starts several only under mpirun: mpirun_config.mpirun_hostfile): this run trains in one process; "
        "medrecipes validate --accelerate-config FILE says what a config starts"
    ]
    caplog.clear()
    monkeypatch.delenv("MASTER_ADDR")  # one process asked for: nothing to say
    with caplog.at_level("WARNING"):
        say_rendezvous()
    assert caplog.records == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="TF32 is refused only where no GPU has it")
def test_tf32_asked_of_a_machine_with_no_ampere_gpu_is_one_line_with_its_fix(tmp_path):
    assert user_error(write_recipe(tmp_path, tf32=True)) == f"{tmp_path / 'recipe.yaml'}: " + (
        "tf32: true needs an NVIDIA GPU of Ampere or newer (TF32 is its matmul format), and this machine has none; "
        "drop it (a recipe turns tf32 on where the GPU has it)"
    )


def test_a_launch_environment_no_launcher_writes_is_one_line(tmp_path, monkeypatch):
    """The counts torch, accelerate and transformers read from a launcher, set by hand: each is one
    line naming the variable, before a library's int() refusal or its multi-node setup."""
    recipe = write_recipe(tmp_path)
    for name in LAUNCH_COUNTS:
        with monkeypatch.context() as env:
            env.setenv(name, "two")
            assert (
                user_error(recipe)
                == f"{name}='two' in the environment is not a whole number; unset it (a launcher sets it)"
            )
    with monkeypatch.context() as env:
        env.setenv("WORLD_SIZE", "2")
        env.setenv("MASTER_ADDR", "127.0.0.1")
        env.setenv("MASTER_PORT", "29500")
        env.setenv("RANK", "2")
        assert user_error(recipe).startswith("RANK=2 in the environment is not below the 2 processes started")
        env.delenv("RANK")
        env.delenv("MASTER_PORT")
        assert "with no MASTER_PORT for the processes to meet at" in user_error(recipe)
    with monkeypatch.context() as env:
        env.setenv("LOCAL_RANK", "0")  # transformers sets up torch.distributed for one process too
        assert "LOCAL_RANK=0 in the environment, with no MASTER_ADDR or MASTER_PORT" in user_error(recipe)
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):  # a count of no processes, with or without a rank
        with monkeypatch.context() as env:
            env.setenv(name, "0")
            assert (
                user_error(recipe)
                == f"{name}='0' in the environment is no count of processes; unset it (a launcher sets it)"
            )
    for port in ("0", "65536", "99999"):
        with monkeypatch.context() as env:
            env.setenv("MASTER_PORT", port)
            assert user_error(recipe).startswith(f"MASTER_PORT={port} in the environment is no port (1 to 65535)")


def test_a_data_path_whose_name_holds_an_equals_sign_is_a_path(tmp_path, monkeypatch):
    """--data TASK=PATH, and a bare PATH for the one task: a file named fold=1.jsonl is a path,
    written as it is or with a folder before it, and TASK=fold=1.jsonl names the task."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fold=1.jsonl").write_text((ROOT / "data/usmle_sample/test.jsonl").read_text())
    for given in ("fold=1.jsonl", str(tmp_path / "fold=1.jsonl")):
        assert parse_eval_args(["--model", "m", "--data", given]).data_by_task == {"medqa_4opt": given}
    named = parse_eval_args(["--model", "m", "--tasks", "medqa_4opt", "--data", "medqa_4opt=fold=1.jsonl"])
    assert named.data_by_task == {"medqa_4opt": "fold=1.jsonl"}


def test_an_evaluation_under_a_launch_of_several_processes_is_refused(monkeypatch):
    """Each process would score every question and write the one output: one line, before any loads."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(UserError, match="an evaluation runs in one process, and this launch started 2"):
        parse_eval_args(["--model", "m"])
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert parse_eval_args(["--model", "m"]).model_name_or_path == "m"


def test_a_local_model_not_there_yet_is_a_note_where_the_recipe_is_read_to_train_elsewhere(tmp_path):
    """validate reads a stage's recipe before the stage before it has run: its model, an earlier
    output, is said to be missing, not refused; a Hub id is not a local path and is not said."""
    missing = str(tmp_path / "cpt" / "final")
    recipe = parse_recipe("cpt", [write_recipe(tmp_path, model_name_or_path=missing)], here=False)[0]
    assert any(n.startswith(f"model_name_or_path {missing}: no such file or folder here yet") for n in recipe.notes)
    hub = parse_recipe("cpt", [write_recipe(tmp_path, model_name_or_path="org/model")], here=False)[0]
    assert not any("here yet" in n for n in hub.notes)


def test_a_source_path_under_home_is_read_as_the_shell_reads_it(tmp_path, monkeypatch):
    """~ in a source's path or data_files is the user's home, as in output_dir; datasets would look
    for a folder named ~."""
    monkeypatch.setenv("HOME", str(tmp_path))
    recipe = parse_recipe("sft", [str(ROOT / "recipes/tiny_sft.yaml"), "--dataset_mixture",
                                  "{sources: [{path: ~/a.jsonl, format: usmle}, {path: json, data_files: [~/b.jsonl], format: usmle}]}"],
                          to_train=False)[0]  # fmt: skip
    paths = [(s.path, s.data_files) for s in recipe.mixture.sources]
    assert paths == [(str(tmp_path / "a.jsonl"), None), ("json", [str(tmp_path / "b.jsonl")])]


@pytest.mark.parametrize(
    "written, read", [("010", 10), ("1_000", 1000), ("1:30", None), ("0x10", None), ("0o17", None)]
)
def test_a_whole_number_in_yaml_is_read_as_on_the_command_line(tmp_path, written, read):
    """YAML 1.1 reads 010 as octal 8 and 1:30 as 90 (base 60); a recipe's number is read as the
    command line reads the same text: 10, or refused in one line."""
    path = write_recipe(tmp_path, text=f"logging_steps: {written}\n")
    if read is None:
        assert user_error(path).endswith(f"logging_steps must be a number, got '{written}'")
    else:
        assert (
            parse(path)[1].logging_steps
            == read
            == parse(write_recipe(tmp_path, name="plain.yaml"), "--logging_steps", written)[1].logging_steps
        )


def test_the_keys_that_share_draws_among_sources_are_said_on_a_mixture_of_one():
    """A weight (or stopping_strategy, weight_unit) on a mixture of one source draws all of it: a
    user who meant 'train on 30% of this file' is told; two sources, no word."""
    one = "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle, weight: 0.3}], stopping_strategy: first_exhausted}"
    notes = parse_recipe("sft", ["recipes/tiny_sft.yaml", "--dataset_mixture", one])[0].notes
    said = [n for n in notes if n.startswith("dataset_mixture has one source")]
    assert len(said) == 1 and "stopping_strategy, sources[0].weight share draws among sources" in said[0], notes
    two = "{sources: [{path: data/usmle_sample/train.jsonl, format: usmle, weight: 0.3}, {path: data/usmle_sample/test.jsonl, format: usmle}]}"
    assert not [
        n
        for n in parse_recipe("sft", ["recipes/tiny_sft.yaml", "--dataset_mixture", two])[0].notes
        if "one source" in n
    ]


def test_a_run_name_with_no_logger_is_said():
    notes = parse_recipe("sft", ["recipes/tiny_sft.yaml", "--run_name", "my run", "--report_to", "none"])[0].notes
    assert any(n.startswith("run_name names the run in a logger's records, and report_to is none") for n in notes)
    notes = parse_recipe("sft", ["recipes/tiny_sft.yaml", "--run_name", "my run", "--report_to", "tensorboard"])[
        0
    ].notes
    assert not any(n.startswith("run_name") for n in notes)


def test_pad_token_is_kept_without_the_librarys_deprecation_notice():
    """TRL deprecates SFT's pad_token in favour of the tokenizer's, which the run sets from it:
    the notice's fix cannot be followed from a recipe, so it is not passed on."""
    notes = parse_recipe("sft", ["recipes/tiny_sft.yaml", "--pad_token", "<|im_end|>"])[0].notes
    assert not [n for n in notes if "pad_token" in n], notes


def test_a_checkpointing_key_trls_trainer_reads_itself_is_taken_where_it_reads_it():
    """SFT's `selective` (TRL's selective activation checkpointing) is none of torch's checkpoint
    keywords: taken for SFT with checkpointing on, as TRL's SFTTrainer reads it there."""
    from medrecipes.config import parse_recipe

    _, args, _ = parse_recipe(
        "sft",
        ["recipes/tiny_sft.yaml", "--activation_checkpointing", "true", "--activation_checkpointing_kwargs",
         "{selective: true, use_reentrant: false}"],
        to_train=False,
    )  # fmt: skip
    assert args.gradient_checkpointing_kwargs == {"selective": True, "use_reentrant": False}


def test_a_mirror_in_the_processs_memory_is_a_note(tmp_path):
    """memory:// takes the copies, and they go with the process: said, not refused (a test's mirror)."""
    path = write_recipe(tmp_path, checkpoint_mirror_url="memory://bucket/run")
    recipe = parse_recipe("cpt", [path], to_train=False)[0]
    assert any(
        n.startswith("checkpoint_mirror_url memory://bucket/run copies into this process's memory")
        for n in recipe.notes
    )
    recipe = parse_recipe("cpt", [path, "--checkpoint_mirror_url", str(tmp_path / "copies")], to_train=False)[0]
    assert not any("checkpoint_mirror_url" in n for n in recipe.notes)


def test_an_eval_key_given_twice_is_said(capsys):
    """argparse keeps the last of a key given twice; eval's --tasks twice ran the last tasks alone."""
    args = parse_eval_args(["--model", "m", "--tasks", "medmcqa", "--tasks=medqa_4opt", "--limit", "2"])
    assert args.tasks == ["medqa_4opt"]
    assert "# note: --tasks is given twice on the command line; the last is used" in capsys.readouterr().err
    parse_eval_args(["--model", "m", "--tasks", "medmcqa,medqa_4opt"])
    assert "given twice" not in capsys.readouterr().err


@pytest.mark.parametrize("key", ["bf16", "bf16_full_eval"])
def test_bf16_without_a_gpu_that_takes_it_names_the_key_and_the_fix(tmp_path, monkeypatch, key):
    import transformers.training_args

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: False)
    path = write_recipe(tmp_path, use_cpu=False, **{key: True})
    with pytest.raises(UserError) as refused:
        parse_recipe("cpt", [path], to_train=False)
    assert str(refused.value) == (
        f"{path}: {key}: true computes in bfloat16 on a GPU, and this machine has none that does (use_cpu is false); "
        f"set use_cpu: true to compute in bfloat16 on the CPU, or {key}: false"
    )


def test_a_run_that_asks_for_an_accelerator_where_none_is_is_told_it_trains_on_the_cpu(tmp_path, monkeypatch):
    from transformers import TrainingArguments

    from medrecipes.config.library_checks import accelerator_note

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert "the run trains on the CPU" in accelerator_note(TrainingArguments(output_dir=str(tmp_path)))
    assert accelerator_note(TrainingArguments(output_dir=str(tmp_path), use_cpu=True)) is None
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    assert accelerator_note(TrainingArguments(output_dir=str(tmp_path))) is None


def test_a_quoted_home_in_a_commands_paths_is_the_home(tmp_path, monkeypatch):
    """'~/x' reaches a command unexpanded when quoted (or from a YAML file): it is the user's home,
    as in a recipe's output_dir, not a folder named ~ in the working folder."""
    from medrecipes.cli.arguments import input_path, output_path

    monkeypatch.setenv("HOME", str(tmp_path))
    args = parse_eval_args(
        ["--model", "~/model", "--tasks", "mine", "--data", "mine=~/q.jsonl", "--output", "~/e.json"]
    )
    assert (args.model_name_or_path, args.output) == (str(tmp_path / "model"), str(tmp_path / "e.json"))
    assert input_path("~/final") == output_path("~/final") == str(tmp_path / "final")
    assert input_path("org/model") == "org/model"  # a Hub id is left as it is


def test_the_dtypes_a_command_loads_in_are_trls(tmp_path):
    """eval's and perplexity's --dtype take what a recipe's dtype takes: TRL's ModelConfig choices."""
    import dataclasses

    from trl import ModelConfig

    from medrecipes.models.loading import resolve_dtype
    from medrecipes.names import DTYPES

    field = next(f for f in dataclasses.fields(ModelConfig) if f.name == "dtype")
    assert DTYPES == tuple(field.metadata["choices"])
    assert resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(UserError, match="'int8' is no dtype a model loads in"):
        resolve_dtype("int8")


@pytest.mark.parametrize(
    "given, said",
    [
        ((), None),
        (("--temperature", "0.6", "--top_p", "0.9"), None),
        (("--temperature", "0.00001"), "temperature 1e-05"),
        (("--top_p", "0.0001"), "top_p 0.0001"),
        (("--temperature", "0.1", "--top_p", "0.15"), "temperature 0.1 and top_p 0.15"),
        (("--min_p", "0.1"), None),
        (("--min_p", "0.999"), "min_p 0.999"),
    ],
)
def test_grpo_sampling_too_narrow_for_a_group_to_differ_is_a_note(given, said):
    """GRPO learns from the differences between a group's answers: a temperature or top_p below
    library_checks.NEAR_GREEDY makes them nearly one answer, said in one note naming the keys."""
    recipe = parse_recipe("grpo", [str(ROOT / "recipes/tiny_grpo.yaml"), *given], to_train=False)[0]
    notes = [n for n in recipe.notes if "nearly all the one greedy answer" in n]
    assert notes == ([] if said is None else notes[:1]) and (said is None or notes[0].startswith(f"{said}: ")), notes


def test_lora_target_parameters_that_name_a_parameter_by_its_end_are_taken(tiny_model, capsys):
    """PEFT's rule for target_parameters: a parameter's full name, or its end after a dot (a name
    that matches none is refused: tests/test_bad_inputs.py)."""
    for name in ("mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight", "nope.weight"):
        argv = ["validate", "recipes/tiny_sft.yaml", "--model_name_or_path", tiny_model, "--use_peft", "true",
                "--lora_target_parameters", f"[{name}]"]  # fmt: skip
        if name == "nope.weight":
            with pytest.raises(SystemExit):
                cli.main(argv)
            assert "nope.weight names no parameter of llama" in capsys.readouterr().err
        else:
            cli.main(argv)


@pytest.mark.parametrize("bounds, said", [(("0.2", "0.1"), True), (("0.2", "0.28"), False), (("0.2", "0.2"), False)])
def test_grpo_epsilon_high_below_epsilon_is_a_note(bounds, said):
    """epsilon_high is the upper clip DAPO raises above epsilon; below it, most likely the two swapped."""
    argv = ["recipes/tiny_grpo.yaml", "--epsilon", bounds[0], "--epsilon_high", bounds[1]]
    recipe = parse_recipe("grpo", argv, to_train=False)[0]
    assert any(n.startswith(f"epsilon_high {bounds[1]} is below epsilon {bounds[0]}") for n in recipe.notes) == said
