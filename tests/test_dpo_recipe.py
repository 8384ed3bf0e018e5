"""recipes/dpo.py: preference pairs from questions, DPO through TRL's DPOTrainer on a tiny chat
model (one process and two under accelerate), and bad pairs refused in one line."""

import json
import math
from pathlib import Path

import pytest
from conftest import ACCELERATE, PYTHON, ROOT, log_history, run, run_recipe

from medrecipes import cli, usmle
from medrecipes.config import parse_recipe, recipe_method

TINY = "recipes/tiny_dpo.yaml"
SYSTEM = "You are a careful medical expert. Answer the multiple-choice question."


def test_pairs_prefer_the_gold_answer_to_a_wrong_option_in_the_sft_answer_style(tmp_path, capsys):
    out = tmp_path / "pairs.jsonl"
    cli.main(
        ["pairs", "--mcq", str(ROOT / "data/usmle_sample/train.jsonl"), "--out", str(out), "--system-prompt", SYSTEM]
    )
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    rows = {row["id"]: row for row in usmle.load_mcq(ROOT / "data/usmle_sample/train.jsonl", answered=True)}
    assert len(pairs) == len(rows) == 60
    for pair in pairs:
        row = rows[pair["id"]]
        assert pair["prompt"] == usmle.chat_messages(row, system_prompt=SYSTEM)
        assert pair["chosen"] == [{"role": "assistant", "content": usmle.sft_target(row)}]
        wrong = pair["rejected"][0]["content"]
        assert pair["rejected"][0]["role"] == "assistant" and wrong != pair["chosen"][0]["content"]
        assert usmle.extract_answer(wrong, usmle.letters_for(row)) in set(usmle.letters_for(row)) - {row["answer"]}
    # The bundled pairs are this command's output for the bundled questions.
    assert out.read_text() == (ROOT / "data/usmle_sample/pairs_train.jsonl").read_text()


def test_a_dpo_recipe_is_told_apart_from_grpo_by_its_data():
    assert recipe_method(TINY) == "dpo"
    recipe, args, _ = parse_recipe("dpo", [TINY])
    assert args.beta == 0.1 and args.loss_type == ["sigmoid"] and recipe.mixture.sources[0].format == "preference"


def test_dpo_starts_at_ln2_learns_its_pairs_and_logs_reward_accuracy(chat_model, tmp_path):
    out = tmp_path / "run"
    run_recipe("recipes/dpo.py", TINY, "--model_name_or_path", chat_model, "--output_dir", str(out),
               "--max_steps", "12", "--eval_steps", "12", "--logging_steps", "4")  # fmt: skip
    history = log_history(out)
    evals = [e for e in history if "eval_rewards/accuracies" in e]
    # Before a step the policy is its own reference: every pair's reward is 0, the loss ln 2.
    assert evals[0]["step"] == 0 and evals[0]["eval_pairs_test_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert evals[0]["eval_rewards/margins"] == pytest.approx(0, abs=1e-4)
    train = [e for e in history if "rewards/margins" in e and "loss" in e]
    assert train[-1]["loss"] < train[0]["loss"] and train[-1]["rewards/margins"] > train[0]["rewards/margins"]
    assert (out / "final" / "model.safetensors").is_file() and "eval_rewards/margins" in evals[-1]


def test_dpo_with_lora_trains_the_adapter_under_two_processes(chat_model, tmp_path):
    out = tmp_path / "lora"
    launcher = (ACCELERATE, "launch", "--config_file", "accelerate_configs/ddp.yaml", "--mixed_precision", "no",
                "--num_processes", "2")  # fmt: skip
    run_recipe("recipes/dpo.py", TINY, "--model_name_or_path", chat_model, "--output_dir", str(out),
               "--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
               "--max_steps", "2", "--eval_strategy", "no", "--eval_on_start", "false", launcher=launcher)  # fmt: skip
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "final" / "adapter_config.json").read_text())["base_model_name_or_path"] == chat_model


PAIR = {"prompt": [{"role": "user", "content": "What lowers preload?"}]}


@pytest.mark.parametrize(
    "row, words",
    [
        ({**PAIR, "chosen": [{"role": "assistant", "content": "A"}], "rejected": [{"role": "assistant", "content": "A"}]},
         "chosen and rejected are the same answer"),
        ({**PAIR, "rejected": [{"role": "assistant", "content": "B"}]}, "no 'chosen'"),
        ({**PAIR, "chosen": [{"role": "user", "content": "A"}], "rejected": [{"role": "assistant", "content": "B"}]},
         "the last turn of chosen is not the assistant's"),
    ],
    ids=["chosen equals rejected", "no chosen", "chosen not the assistant's"],
)  # fmt: skip
def test_a_bad_pair_is_one_line_naming_its_file_and_line(chat_model, tmp_path, row, words):
    good = {
        **PAIR,
        "chosen": [{"role": "assistant", "content": "A"}],
        "rejected": [{"role": "assistant", "content": "B"}],
    }
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    result = run(PYTHON, "recipes/dpo.py", TINY, "--model_name_or_path", chat_model, "--output_dir", str(tmp_path / "o"),
                 "--dataset_mixture", f"{{sources: [{{path: {data}, format: preference}}]}}", "--eval_sets", "null",
                 "--eval_strategy", "no", "--eval_on_start", "false", timeout=300)  # fmt: skip
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-1500:]
    assert errors[0].startswith(f"error: {data} line 2: {words}"), errors
    assert not Path(tmp_path / "o" / "final").exists()


def test_a_dpo_recipe_refuses_sources_that_are_not_pairs(tmp_path):
    from medrecipes.errors import UserError

    with pytest.raises(UserError, match="format usmle is not preference pairs"):
        parse_recipe("dpo", [TINY, "--eval_sets", "{x: {path: data/usmle_sample/test.jsonl, format: usmle}}"])
