"""recipes/dpo.py and recipes/kto.py: preference data from questions (the gold answer against a
distractor, or a model's own right answer against its own wrong one; paired or unpaired), DPO and
KTO through TRL's trainers on a tiny chat model (one process and two under accelerate), the memory
plan counting the reference model, and bad rows refused in one line."""

import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import LAUNCH, ROOT, card_record, log_history, run_recipe

from medrecipes import cli, usmle
from medrecipes.config import parse_recipe, recipe_method
from medrecipes.data.preference import chosen_account, on_policy_pairs, unpaired
from medrecipes.errors import UserError

TINY = "recipes/tiny_dpo.yaml"
TINY_KTO = "recipes/tiny_kto.yaml"
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


def test_pairs_ask_pubmedqa_questions_in_the_setting_given(tmp_path, capsys):
    row = {"QUESTION": "Does it work?", "CONTEXTS": ["Methods."], "final_decision": "yes", "LONG_ANSWER": "It worked."}
    questions = tmp_path / "pqal.json"
    questions.write_text(json.dumps({"1": row}))
    for setting, context in ((None, "Methods."), ("reasoning_free", "Conclusion: It worked.")):
        out = tmp_path / f"{setting}.jsonl"
        cli.main(
            [
                "pairs",
                "--mcq",
                str(questions),
                "--out",
                str(out),
                *(["--pubmedqa-setting", setting] if setting else []),
            ]
        )
        (pair,) = [json.loads(line) for line in out.read_text().splitlines()]
        assert pair["prompt"][-1]["content"].startswith(f"Context: {context}\n\nDoes it work?")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["pairs", "--mcq", str(ROOT / "data/usmle_sample/train.jsonl"), "--out", str(tmp_path / "m.jsonl"),
                  "--pubmedqa-setting", "reasoning_free"])  # fmt: skip
    assert exit_info.value.code == 2 and "pubmedqa_setting reasoning_free" in capsys.readouterr().err


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


@pytest.mark.parametrize(
    "script, recipe",
    [pytest.param(*case, marks=pytest.mark.long) for case in (("recipes/dpo.py", TINY), ("recipes/kto.py", TINY_KTO))],
    ids=["dpo", "kto"],
)
def test_lora_trains_the_adapter_under_two_processes(chat_model, tmp_path, script, recipe):
    out = tmp_path / "lora"
    launcher = (*LAUNCH, "--config_file", "accelerate_configs/ddp.yaml", "--mixed_precision", "no",
                "--num_processes", "2")  # fmt: skip
    run_recipe(script, recipe, "--model_name_or_path", chat_model, "--output_dir", str(out),
               "--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
               "--max_steps", "2", "--eval_strategy", "no", "--eval_on_start", "false", launcher=launcher)  # fmt: skip
    assert (out / "final" / "adapter_model.safetensors").is_file()
    assert json.loads((out / "final" / "adapter_config.json").read_text())["base_model_name_or_path"] == chat_model


PROMPT = {"prompt": [{"role": "user", "content": "What lowers preload?"}]}
A, B = [{"role": "assistant", "content": "A"}], [{"role": "assistant", "content": "B"}]
USER = [{"role": "user", "content": "A"}]
GOOD = {"preference": {**PROMPT, "chosen": A, "rejected": B}, "unpaired": {**PROMPT, "completion": B, "label": False}}
RECIPES = {"preference": ("recipes/dpo.py", TINY), "unpaired": ("recipes/kto.py", TINY_KTO)}


@pytest.mark.parametrize(
    "layout, row, words",
    [
        ("preference", {**PROMPT, "chosen": A, "rejected": A}, "chosen and rejected are the same answer"),
        ("preference", {**PROMPT, "rejected": B}, "no 'chosen'"),
        ("preference", {**PROMPT, "chosen": USER, "rejected": B}, "chosen holds a user turn"),
        ("unpaired", {**PROMPT, "completion": A, "label": "yes"}, 'label "yes" is not true or false'),
        ("unpaired", {**PROMPT, "completion": A, "label": 1}, "label 1 is not true or false"),
        ("unpaired", {**PROMPT, "completion": USER, "label": True}, "completion holds a user turn"),
        ("unpaired", {**PROMPT, "label": True}, "no 'completion'"),
    ],
    ids=["chosen equals rejected", "no chosen", "chosen not the assistant's", "label a word", "label a number",
         "completion not the assistant's", "no completion"],
)  # fmt: skip
def test_a_bad_preference_row_is_one_line_naming_its_file_and_line(chat_model, tmp_path, layout, row, words):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(GOOD[layout]) + "\n" + json.dumps(row) + "\n")
    script, recipe = RECIPES[layout]
    from test_bad_inputs import outcome  # the script run in this process, as a user's command line

    code, lines, traceback = outcome([script, recipe, "--model_name_or_path", chat_model, "--output_dir",
                                      str(tmp_path / "o"), "--dataset_mixture",
                                      f"{{sources: [{{path: {data}, format: {layout}}}]}}", "--eval_sets", "null",
                                      "--eval_strategy", "no", "--eval_on_start", "false"])  # fmt: skip
    errors = [line for line in lines if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, (lines[-20:], traceback)
    assert errors[0].startswith(f"error: {data} line 2: {words}"), errors
    assert not Path(tmp_path / "o" / "final").exists()


def test_a_dpo_recipe_refuses_sources_that_are_not_pairs(tmp_path):
    with pytest.raises(UserError, match="format usmle is not what DPO trains on"):
        parse_recipe("dpo", [TINY, "--eval_sets", "{x: {path: data/usmle_sample/test.jsonl, format: usmle}}"])


def test_unpaired_answers_follow_their_pairs_chosen_first(tmp_path, capsys):
    out = tmp_path / "unpaired.jsonl"
    cli.main(["pairs", "--mcq", str(ROOT / "data/usmle_sample/train.jsonl"), "--out", str(out), "--layout", "unpaired",
              "--system-prompt", SYSTEM])  # fmt: skip
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    pairs = [json.loads(line) for line in (ROOT / "data/usmle_sample/pairs_train.jsonl").read_text().splitlines()]
    assert len(answers) == 2 * len(pairs)
    for pair, chosen, rejected in zip(pairs, answers[::2], answers[1::2], strict=True):
        assert chosen == {"id": pair["id"], "prompt": pair["prompt"], "completion": pair["chosen"], "label": True}
        assert rejected == {**chosen, "completion": pair["rejected"], "label": False}
    assert out.read_text() == (ROOT / "data/usmle_sample/unpaired_train.jsonl").read_text()
    assert "120 answers (60 pairs split)" in capsys.readouterr().out
    assert unpaired([]) == []


ROWS = usmle.load_mcq(ROOT / "data/usmle_sample/test.jsonl", answered=True).to_list()[:5]


def _answer(row, letter: str) -> str:
    return f"{letter}. {usmle.option_map(row)[letter]}"


def test_on_policy_pairs_set_a_right_sample_against_a_wrong_one_and_count_the_rest():
    wrong = [next(x for x in usmle.letters_for(row) if x != row["answer"]) for row in ROWS]
    samples = [
        [_answer(ROWS[0], ROWS[0]["answer"])] * 3,  # every sample right: left out
        [_answer(ROWS[1], wrong[1]), "I cannot tell."],  # every sample wrong (one names no letter): left out
        [_answer(ROWS[2], wrong[2]), _answer(ROWS[2], ROWS[2]["answer"]), _answer(ROWS[2], wrong[2])],
        ["no letter here", f" {_answer(ROWS[3], ROWS[3]['answer'])} "],  # an answer naming none is wrong
        [_answer(ROWS[4], ROWS[4]["answer"]), _answer(ROWS[4], wrong[4])],
    ]
    pairs, left_out = on_policy_pairs(ROWS, samples, system_prompt=SYSTEM, seed=1)
    assert left_out == {"all right": 1, "all wrong": 1}
    assert [p["id"] for p in pairs] == [ROWS[i]["id"] for i in (2, 3, 4)]
    for pair, i in zip(pairs, (2, 3, 4), strict=True):
        row = ROWS[i]
        assert pair["prompt"] == usmle.chat_messages(row, system_prompt=SYSTEM)
        chosen, rejected = pair["chosen"][0]["content"], pair["rejected"][0]["content"]
        assert chosen == _answer(row, row["answer"]) and chosen.strip() == chosen  # the sample, stripped
        assert usmle.extract_answer(rejected, usmle.letters_for(row)) != row["answer"]
        assert rejected in [s.strip() for s in samples[i]]
    assert on_policy_pairs(ROWS, samples, system_prompt=SYSTEM, seed=1) == (pairs, left_out)  # seeded
    assert [row["answer"] for row in ROWS] == list("CADCD")
    assert chosen_account(ROWS, pairs) == "the pairs choose C 1, D 2"
    assert chosen_account(ROWS, []) == "the pairs choose nothing"
    one = chosen_account(ROWS, [pairs[0], pairs[2]])  # D only, where the questions' letters vary
    assert one.startswith("the pairs choose D 2: one letter, which preference training on them teaches")
    assert chosen_account([ROWS[2], ROWS[4]], [pairs[0], pairs[2]]) == "the pairs choose D 2"  # every answer D


def test_on_policy_pairs_from_a_model_record_how_they_were_made(chat_model, tmp_path, capsys):
    from medrecipes.outputs.records import written_about

    out = tmp_path / "pairs.jsonl"
    argv = ["pairs", "--mcq", str(ROOT / "data/usmle_sample/test.jsonl"), "--model", chat_model, "--samples", "3",
            "--max-new-tokens", "4", "--out", str(out)]  # fmt: skip
    cli.main(argv)
    printed = capsys.readouterr().out
    pairs = [json.loads(line) for line in out.read_text().splitlines()]
    rows = {row["id"]: row for row in usmle.load_mcq(ROOT / "data/usmle_sample/test.jsonl", answered=True)}
    about = written_about(str(out))  # the card's account of how the pairs were made
    left_out = re.search(
        r"(\d+) questions left out where every sample was right, (\d+) where every one was wrong", about
    )
    assert len(pairs) + int(left_out[1]) + int(left_out[2]) == len(rows) and f"{len(pairs)} pairs written" in printed
    assert about.startswith(f"on-policy: {chat_model}'s own answers to 20 questions") and about in printed
    chosen = Counter(rows[pair["id"]]["answer"] for pair in pairs)
    assert "; the pairs choose " + (", ".join(f"{k} {chosen[k]}" for k in sorted(chosen)) or "nothing") in about
    for pair in pairs:
        row = rows[pair["id"]]
        assert usmle.extract_answer(pair["chosen"][0]["content"], usmle.letters_for(row)) == row["answer"]
        assert pair["chosen"] != pair["rejected"]
    with pytest.raises(SystemExit) as info:
        cli.main([*argv[:-2], "--out", str(tmp_path / "again.jsonl"), "--temperature", "0"])
    assert info.value.code == 2 and "--temperature: must be a finite number above 0" in capsys.readouterr().err


def test_kto_recipes_are_told_apart_by_their_data_and_keys(tmp_path):
    assert recipe_method(TINY_KTO) == "kto"
    recipe, args, _ = parse_recipe("kto", [TINY_KTO])
    assert args.loss_type == "kto" and recipe.mixture.sources[0].format == "unpaired"
    pairs_with_kto_keys = tmp_path / "kto.yaml"
    pairs_with_kto_keys.write_text(Path(TINY).read_text() + "desirable_weight: 1.33\n")
    assert recipe_method(str(pairs_with_kto_keys)) == "kto" and recipe_method(TINY) == "dpo"


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["--per_device_train_batch_size", "1"], "KTO's KL estimate needs at least 2 answers per device batch"),
        (["--train_sampling_strategy", "random"], "train_sampling_strategy random: KTO's KL estimate pairs"),
        (["--dataset_mixture", "{sources: [{path: data/usmle_sample/unpaired_train.jsonl, format: unpaired}, "
          "{path: data/usmle_sample/pairs_train.jsonl, format: preference}]}"], "mixes preference and unpaired"),
        (["--eval_sets", "{x: {path: data/usmle_sample/test.jsonl, format: usmle}}"],
         "format usmle is not what KTO trains on; give format: preference or format: unpaired rows"),
    ],
    ids=["batch of one", "random order", "two layouts", "questions"],
)  # fmt: skip
def test_a_kto_recipe_refuses_what_its_trainer_would_fail_on_later(overrides, words):
    with pytest.raises(UserError, match=words):
        parse_recipe("kto", [TINY_KTO, *overrides])


@pytest.mark.long  # a learning run
def test_kto_starts_at_one_half_and_learns_its_answers(chat_model, tmp_path):
    out = tmp_path / "run"
    run_recipe("recipes/kto.py", TINY_KTO, "--model_name_or_path", chat_model, "--output_dir", str(out),
               "--max_steps", "20", "--eval_steps", "20", "--logging_steps", "4")  # fmt: skip
    history = log_history(out)
    evals = [e for e in history if "eval_rewards/margins" in e]
    # Before a step the policy is its own reference: every reward is 0 and KTO's loss 1 - sigmoid(0).
    assert evals[0]["step"] == 0 and evals[0]["eval_pairs_test_loss"] == pytest.approx(0.5, abs=1e-4)
    assert evals[0]["eval_rewards/chosen"] == pytest.approx(0, abs=1e-4)
    # The eval pairs were split with each chosen answer beside its rejected one: every batch has both.
    assert len(evals) == 2 and "eval_rewards/margins" in evals[-1]
    train = [e for e in history if "rewards/margins" in e and "loss" in e]
    assert train[-1]["loss"] < train[0]["loss"] and train[-1]["rewards/margins"] > train[0]["rewards/margins"]
    assert (out / "final" / "model.safetensors").is_file()


def test_the_card_names_the_preference_data_and_how_it_was_made(tmp_path, capsys):
    from medrecipes.hub.card import model_card

    made = tmp_path / "pairs.jsonl"
    cli.main(["pairs", "--mcq", str(ROOT / "data/usmle_sample/train.jsonl"), "--out", str(made), "--seed", "7"])
    capsys.readouterr()
    copied = tmp_path / "copied.jsonl"
    copied.write_text(made.read_text())  # the same rows, but not a file `pairs` wrote
    cards = {}
    for path in (made, copied):
        parsed = parse_recipe(
            "dpo", [TINY, "--dataset_mixture", f"{{sources: [{{path: {path}, format: preference}}]}}"]
        )
        summary = {"steps": 1, "tokens_seen": 1024, "training_time": "0:01:00", "final_train_loss": 0.6}
        card = model_card("med/x", card_record("dpo", parsed), summary, {})
        cards[path] = str(card)
    assert f"| `{made}` |" in cards[made] and "| preference |" in cards[made]
    assert (
        f"- `{made}`: the gold answer of each of 60 questions of {ROOT / 'data/usmle_sample/train.jsonl'} chosen "
        "against a wrong option drawn with seed 7"
    ) in cards[made]
    assert f"- `{copied}`: not recorded (not written by `medrecipes pairs`)" in cards[copied]


def test_pairs_says_questions_two_files_share_and_refuses_a_file_given_twice(tmp_path, caplog):
    """`medrecipes pairs` of two files that hold the same questions: counted and named, each would be
    paired twice (said, the pairs are written); the same file given twice is one line."""
    import shutil

    from medrecipes import cli

    copy = tmp_path / "copy.jsonl"
    shutil.copy(ROOT / "data/usmle_sample/test.jsonl", copy)
    with caplog.at_level("WARNING"):
        cli.main(
            [
                "pairs",
                "--mcq",
                str(ROOT / "data/usmle_sample/test.jsonl"),
                str(copy),
                "--out",
                str(tmp_path / "p.jsonl"),
            ]
        )
    said = [r.getMessage() for r in caplog.records if "paired twice" in r.getMessage()]
    questions = sum(1 for line in copy.read_text().splitlines() if line.strip())
    assert len(said) == 1 and said[0].startswith(f"{copy}: {questions} question(s) are also in "), said
    with pytest.raises(SystemExit) as exit:
        cli.main(["pairs", "--mcq", str(copy), str(copy), "--out", str(tmp_path / "q.jsonl")])
    assert exit.value.code == 2 and not (tmp_path / "q.jsonl").exists()


def test_kto_weights_out_of_the_papers_range_for_their_counts_are_said_with_the_weight_that_fits(caplog):
    """KTO's Eq. 8: desirable_weight x desirable answers against undesirable_weight x undesirable
    ones from 1 to 4/3, for balanced and unbalanced data alike (TRL advises only the unbalanced);
    the desirable_weight the line advises, at either end, is in range."""
    import logging
    import types

    from datasets import Dataset

    from medrecipes.data.preference import _check_balance

    def said(desirable: int, undesirable: int, dw: float, uw: float) -> list[str]:
        rows = Dataset.from_dict({"label": [True] * desirable + [False] * undesirable})
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="medrecipes.data.preference"):
            _check_balance(rows, types.SimpleNamespace(desirable_weight=dw, undesirable_weight=uw))
        return [r.getMessage() for r in caplog.records]

    for desirable, undesirable in ((60, 60), (30, 90), (90, 30), (1, 7)):
        for dw, uw in ((1.0, 1.0), (1.0, 100.0), (100.0, 1.0), (1.2, 1.0), (3.0, 1.0), (0.5, 1.0)):
            ratio = dw * desirable / (uw * undesirable)
            lines = said(desirable, undesirable, dw, uw)
            assert bool(lines) == (not 1 <= ratio <= 4 / 3), (desirable, undesirable, dw, uw, lines)
            if lines:
                low, high = map(float, re.search(r"desirable_weight from (\S+) to (\S+)$", lines[0]).groups())
                for advised in (low, high):  # as printed, to 3 figures
                    assert not said(desirable, undesirable, advised * (1.01 if advised == low else 0.99), uw)


def test_pairs_asked_otherwise_than_the_starting_models_run_are_said(tmp_path, caplog):
    """Pairs written without the system prompt the SFT run trained with (medrecipes pairs without
    --system-prompt), then DPO from that run's final/: said, as the run's run.json records it."""
    from datasets import Dataset

    from medrecipes.data.preference import mcq_pairs, say_prompts_unlike_start

    rows = usmle.load_mcq(ROOT / "data/usmle_sample/train.jsonl").select(range(4))
    system = "You are a careful medical expert."
    run = tmp_path / "sft"
    (run / "final").mkdir(parents=True)
    for trained, written, said in ((system, None, 4), (system, system, 0), (None, system, 4), (None, None, 0)):
        (run / "run.json").write_text(json.dumps({"recipe": {"system_prompt": trained}}))
        pairs = Dataset.from_list(mcq_pairs(rows, system_prompt=written))
        caplog.clear()
        with caplog.at_level("WARNING", logger="medrecipes.data.preference"):
            say_prompts_unlike_start(pairs, str(run / "final"))
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == (1 if said else 0), (trained, written, lines)
        if said:
            assert lines[0].startswith(
                f"{said} of 4 preference rows ask their question with another system turn"
            ) and ("medrecipes pairs --system-prompt" in lines[0])
    caplog.clear()  # a Hub id or a folder without a run record: nothing to compare with
    with caplog.at_level("WARNING", logger="medrecipes.data.preference"):
        say_prompts_unlike_start(pairs, str(tmp_path / "elsewhere" / "final"))
        say_prompts_unlike_start(pairs, "google/gemma-3-270m-it")
    assert not caplog.records
