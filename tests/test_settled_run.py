"""A run settled once (`runs.settle.settle_run`): one frozen object says what the run is, what it
writes back for the trainers is what it says, run.json records it whole, and the card and the
push read the method from run.json, never from the process that happens to run them."""

import dataclasses
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT
from safetensors.torch import save_file

from medrecipes.config import parse_recipe
from medrecipes.config.methods import METHODS
from medrecipes.errors import UserError
from medrecipes.models.loading import positions, recipe_tokenizer
from medrecipes.models.templates import turn_end
from medrecipes.runs.record import SettledRun, read_record, record_finished
from medrecipes.runs.settle import settle_run
from medrecipes.training.run_folder import claim_run_folder

RECIPES = {method: str(ROOT / "recipes" / f"tiny_{method}.yaml") for method in METHODS}


def settled(method: str, tiny_model: str, out, *overrides: str):
    recipe, args, model_args = parse_recipe(
        method, [RECIPES[method], "--model_name_or_path", tiny_model, "--output_dir", str(out), *overrides]
    )
    assert not claim_run_folder(method, recipe, args, model_args)
    tokenizer = recipe_tokenizer(recipe, model_args)
    return settle_run(method, recipe, args, model_args, tokenizer), args, tokenizer


@pytest.mark.parametrize("method", list(METHODS))
def test_run_json_records_the_settled_run_whole(method, tiny_model, tmp_path):
    run, args, tokenizer = settled(method, tiny_model, tmp_path / "run")
    record = read_record(str(tmp_path / "run"))
    assert record["settled"] == run.record()
    assert SettledRun.from_record(json.loads(json.dumps(record))) == run  # through JSON and back
    assert run.method == method and record["script"] == run.script == f"recipes/{method}.py"
    assert run.output_dir == args.output_dir and run.resume_from is None
    # What the trainers read is what the object says.
    assert run.activation_checkpointing == bool(args.activation_checkpointing)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.method = "sft"
    if method == "cpt":
        assert run.chat_template is None and run.end_of_turn is None
    else:
        assert run.chat_template == tokenizer.chat_template and run.end_of_turn == turn_end(run.chat_template)


def test_sft_trains_answers_to_the_settled_end_of_turn(tiny_model, tmp_path):
    run, args, _ = settled("sft", tiny_model, tmp_path / "a", "--eos_token", "")
    assert run.end_of_turn == "<|im_end|>" == args.eos_token  # the shipped ChatML template's
    named, args, _ = settled("sft", tiny_model, tmp_path / "b", "--eos_token", "<|im_end|>")
    assert named.end_of_turn == "<|im_end|>" == args.eos_token  # the recipe's own, kept
    with pytest.raises(UserError, match=re.escape("an assistant's answer is followed by no '<|endoftext|>'")):
        settled("sft", tiny_model, tmp_path / "d", "--eos_token", "<|endoftext|>")  # a token no answer ends with
    with pytest.raises(UserError, match="eos_token: '</s>' is not a token of"):  # one the tokenizer lacks
        settled("sft", tiny_model, tmp_path / "c", "--eos_token", "</s>")


def test_checkpointing_left_to_the_plan_is_decided_once_and_recorded(tiny_model, tmp_path, monkeypatch):
    text = open(RECIPES["sft"]).read()
    left = tmp_path / "sft.yaml"  # the recipe without the key: the memory plan decides
    left.write_text(text.replace("activation_checkpointing: false\n", ""))
    monkeypatch.setitem(RECIPES, "sft", str(left))
    run, args, _ = settled("sft", tiny_model, tmp_path / "plan")
    assert run.checkpointing_by == "plan" and run.activation_checkpointing is False  # a tiny model fits
    assert args.activation_checkpointing is False
    monkeypatch.undo()
    run, args, _ = settled("sft", tiny_model, tmp_path / "recipe", "--activation_checkpointing", "true")
    assert run.checkpointing_by == "recipe" and run.activation_checkpointing is True


def test_grpo_prompt_room_and_rewards_are_settled_with_their_weights(tiny_model, tmp_path):
    from transformers import AutoConfig

    run, args, _ = settled("grpo", tiny_model, tmp_path / "run")
    assert run.prompt_room == positions(AutoConfig.from_pretrained(tiny_model)) - args.max_completion_length
    written = yaml.safe_load(open(RECIPES["grpo"]))["rewards"]  # {name, weight, <settings>} each
    assert [dict(r) for r in run.rewards] == [{**entry, "weight": float(entry["weight"])} for entry in written]
    assert [r["weight"] for r in run.rewards] == args.reward_weights
    assert [f.__name__ for f in run.reward_funcs] == [entry["name"] for entry in written]
    assert "reward_funcs" not in read_record(str(tmp_path / "run"))["settled"]  # code, not data


def test_the_resume_point_is_settled(tiny_model, tmp_path):
    out = tmp_path / "run"
    run, args, _ = settled("cpt", tiny_model, out)
    checkpoint = out / "checkpoint-2"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    shutil.copy(Path(tiny_model) / "model.safetensors", checkpoint)  # its weights
    again, _, _ = settled("cpt", tiny_model, out)
    assert again.resume_from == str(checkpoint)
    assert read_record(str(out))["settled"]["resume_from"] == str(checkpoint)


def test_a_run_resumed_with_another_chat_template_is_refused(tiny_model, tmp_path):
    """The starting model's template edited (or chat_template_path changed) between a stop and the
    rerun: the rest of the run would train on other turns than its checkpoints. One line; the same
    template resumes."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    out = tmp_path / "run"
    settled("sft", str(model), out, "--chat_template_path", "null")
    checkpoint = out / "checkpoint-1"
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    shutil.copy(model / "model.safetensors", checkpoint)
    assert settled("sft", str(model), out, "--chat_template_path", "null")[0].resume_from == str(checkpoint)
    template = (model / "chat_template.jinja").read_text()
    (model / "chat_template.jinja").write_text(
        template.replace("'<|im_start|>' + message['role']", "'### ' + message['role']")
    )
    assert (model / "chat_template.jinja").read_text() != template
    with pytest.raises(UserError, match="the run resumes with another chat template than it trained with"):
        settled("sft", str(model), out, "--chat_template_path", "null")


def test_card_and_push_read_the_method_from_run_json(tiny_model, tmp_path, monkeypatch):
    """`push_run` names the method of the run it pushes from run.json: run under another script's
    name (a wrapper, a notebook), the card and the commit still say GRPO."""
    from checks.hub_standin import HubStandIn
    from transformers import TrainerState

    from medrecipes.hub.card import run_method
    from medrecipes.hub.push import push_run

    out = tmp_path / "run"
    recipe, args, model_args = parse_recipe(
        "grpo", [RECIPES["grpo"], "--model_name_or_path", tiny_model, "--output_dir", str(out)]
    )
    claim_run_folder("grpo", recipe, args, model_args)
    settle_run("grpo", recipe, args, model_args, recipe_tokenizer(recipe, model_args))
    record = read_record(str(out))
    assert run_method(record) == "grpo"
    final = out / "final"
    final.mkdir()
    shutil.copy(Path(tiny_model) / "config.json", final / "config.json")
    save_file({"w": torch.zeros(2)}, final / "model.safetensors")  # a whole model folder, as far as the card reads
    monkeypatch.setattr(sys, "argv", ["notebook_cell.py"])

    class Trainer:  # what push_run reads of a trainer
        state = TrainerState(global_step=3)
        hub_model_id = "med/tiny-grpo"

        def __init__(self, args):
            self.args = args

        def is_world_process_zero(self):
            return True

    with HubStandIn() as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.url)
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
        record_finished(args, Trainer.state, "1 x CPU, 1 node, one process")  # as train_and_save does
        push_run(Trainer(args), str(final), {})
    pushed = hub.repos["med/tiny-grpo"]["main"]
    card = pushed["README.md"].decode()
    assert "grpo" in card.split("---")[1] and "recipes/grpo.py" in card and "notebook_cell" not in card
    # One commit: final/ as it was published, and the card written whole beside it.
    assert {"config.json", "README.md", "recipe.yaml"} <= set(pushed) and not any("medrecipes" in f for f in pushed)
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors"]
    assert (out / "card" / "README.md").read_text() == card


def test_the_report_shows_what_each_run_settled(tiny_model, tmp_path):
    from medrecipes.report.page import settled_summary

    settled("grpo", tiny_model, tmp_path / "run")
    record = read_record(str(tmp_path / "run"))
    run = SettledRun.from_record(record)
    line = settled_summary(record)
    assert (
        f"activation checkpointing {'on' if run.activation_checkpointing else 'off'} ({run.checkpointing_by})" in line
    )
    assert f"turns end at {run.end_of_turn}" in line and f"prompts up to {run.prompt_room:,} tokens" in line
    assert ", ".join(f"{r['name']} x{r['weight']:g}" for r in run.rewards) in line
    assert settled_summary({"script": "recipes/sft.py"}) == "not recorded"  # a run recorded before settling
