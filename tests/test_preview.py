"""`medrecipes preview`: a recipe's first training examples as the model will see them."""

import json

import pytest
from conftest import write_jsonl
from transformers import AutoModelForCausalLM

from medrecipes import cli
from medrecipes.config import parse_recipe
from medrecipes.preview import TRAINED_CLOSE, TRAINED_OPEN, training_examples


@pytest.mark.parametrize("template", ["own", "cloned"])
def test_sft_preview_marks_exactly_what_the_trainer_trains(chat_model, tmp_path, template):
    """With the model's own template, and with one chat_template_path clones from another tokenizer
    (a folder whose template differs, which TRL's trainer clones; the preview shows the same)."""
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    argv = ["recipes/tiny_sft.yaml", "--model_name_or_path", chat_model, "--output_dir", str(tmp_path / "run"),
            "--packing", "false"]  # fmt: skip
    if template == "cloned":
        other = AutoTokenizer.from_pretrained(chat_model)
        other.chat_template = other.chat_template.replace("message['role'] + '\\n'", "message['role'] + ' said:\\n'")
        other.save_pretrained(tmp_path / "other")
        argv += ["--chat_template_path", str(tmp_path / "other")]
    recipe, args, model_args = parse_recipe("sft", argv)
    _, tokenizer, end_of_turn, examples = training_examples("sft", recipe, args, model_args, count=4)
    from medrecipes.data.sft import sft_data

    train, _, _ = sft_data(recipe)
    model = AutoModelForCausalLM.from_pretrained(chat_model)
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    for i, example in enumerate(examples):
        labels = trainer.train_dataset[i]["labels"]
        assert example.input_ids == trainer.train_dataset[i]["input_ids"]
        assert example.trained == [label != -100 for label in labels]
    assert end_of_turn == "<|im_end|>"
    assert (" said:" in tokenizer.decode(examples[0].input_ids)) == (template == "cloned")


def test_preview_prints_each_example_with_its_counts_and_markers(chat_model, tmp_path, capsys):
    cli.main(["preview", "recipes/tiny_sft.yaml", "--model_name_or_path", chat_model, "--examples", "2"])
    out = capsys.readouterr().out
    assert out.count("--- example") == 2
    assert "BOS <|bos|> at [0]" in out and "end of turn <|im_end|> at [" in out
    # Each answer and its end of turn marked as trained; the question is not.
    body = out.split("\n", 1)[1]  # after the title, which shows the markers
    marked = [part.split(TRAINED_CLOSE)[0] for part in body.split(TRAINED_OPEN)[1:]]
    assert len(marked) == 2 and all(m.endswith("<|im_end|>") and m[0] in "ABCD" for m in marked)
    assert "2 examples," in out.splitlines()[-1] and "asked" not in out.splitlines()[-1]
    assert "packing" not in out.splitlines()[0]  # tiny_sft.yaml trains its examples one by one
    cli.main(["preview", "recipes/tiny_sft.yaml", "--model_name_or_path", chat_model, "--examples", "500"])
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("60 examples,") and last.endswith("; all the training data holds, of the 500 asked")
    cli.main(["preview", "recipes/tiny_sft.yaml", "--model_name_or_path", chat_model, "--examples", "1",
              "--packing", "true", "--max_length", "512"])  # fmt: skip
    title = capsys.readouterr().out.splitlines()[0]
    assert title.endswith("packing: the run packs them into sequences of up to max_length 512 tokens "
                          "(packing_strategy bfd)")  # fmt: skip


def test_preview_says_when_nothing_is_trained(chat_model, tmp_path, capsys):
    # An answer that max_length cuts off: the row would train on nothing.
    rows = [{"question": "Which vitamin deficiency causes scurvy? " * 20, "options": ["C", "D"], "answer": "A"}]
    data = write_jsonl(tmp_path / "q.jsonl", rows)
    argv = ["recipes/tiny_sft.yaml", "--model_name_or_path", chat_model, "--max_length", "40"]
    recipe, args, model_args = parse_recipe("sft", argv)
    recipe.mixture.sources[0].path = data
    _, _, _, examples = training_examples("sft", recipe, args, model_args, count=1)
    assert len(examples[0].input_ids) == 40 and not any(examples[0].trained)
    assert any("NOTHING TRAINED" in note for note in examples[0].notes)


@pytest.mark.parametrize("recipe", ["recipes/tiny_cpt.yaml", "recipes/tiny_grpo.yaml"])
def test_cpt_and_grpo_previews(chat_model, recipe, capsys):
    cli.main(["preview", recipe, "--model_name_or_path", chat_model, "--examples", "1"])
    out = capsys.readouterr().out
    assert "--- example 1:" in out
    if "cpt" in recipe:
        assert "every token trained" in out and "(100.0%)" in out
    else:
        assert "gold answer" in out and "0 trained (0.0%)" in out


def test_a_grpo_preview_shows_the_prompts_the_run_keeps_beside_max_completion_length(chat_model, caplog):
    """The prompts too long for the model's positions less max_completion_length are left out, as the
    run leaves them out; none left is the run's one line."""
    from transformers import AutoConfig

    from medrecipes.errors import UserError

    positions = AutoConfig.from_pretrained(chat_model).max_position_embeddings
    argv = ["recipes/tiny_grpo.yaml", "--model_name_or_path", chat_model]
    recipe, args, model_args = parse_recipe("grpo", argv)
    _, _, _, every = training_examples("grpo", recipe, args, model_args, count=100)
    lengths = sorted(len(e.input_ids) for e in every)
    room = lengths[len(lengths) // 2]  # the shorter half, or so, fits
    recipe, args, model_args = parse_recipe("grpo", [*argv, "--max_completion_length", str(positions - room)])
    _, _, _, kept = training_examples("grpo", recipe, args, model_args, count=100)
    assert [e.input_ids for e in kept] == [e.input_ids for e in every if len(e.input_ids) <= room]
    assert "prompts are longer than the" in caplog.text
    recipe, args, model_args = parse_recipe(
        "grpo", [*argv, "--max_completion_length", str(positions - lengths[0] + 1)]
    )
    with pytest.raises(UserError, match="every one of its 60 prompts is longer than the"):
        training_examples("grpo", recipe, args, model_args, count=1)


def test_dpo_preview_marks_exactly_the_answers_trls_trainer_scores(chat_model, tmp_path, capsys):
    """Each pair's prompt with its chosen, then its rejected answer: the tokens TRL's DPOTrainer
    makes of them (prompt_ids + chosen_ids / rejected_ids), the answer's marked; KTO's answers with
    their labels."""
    from trl import DPOTrainer

    from medrecipes.data.preference import preference_data

    argv = ["recipes/tiny_dpo.yaml", "--model_name_or_path", chat_model, "--output_dir", str(tmp_path),
            "--eval_strategy", "no", "--eval_sets", "null", "--eval_on_start", "false"]  # fmt: skip
    recipe, args, model_args = parse_recipe("dpo", argv)
    _, tokenizer, _, examples = training_examples("dpo", recipe, args, model_args, count=3)
    train, _ = preference_data(recipe)
    model = AutoModelForCausalLM.from_pretrained(chat_model)
    trainer = DPOTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    assert [e.notes for e in examples] == [["chosen"], ["rejected"]] * 3
    for i in range(3):
        row = trainer.train_dataset[i]
        for example, answer in zip(examples[2 * i : 2 * i + 2], ("chosen_ids", "rejected_ids"), strict=True):
            assert example.input_ids == row["prompt_ids"] + row[answer]
            assert example.trained == [False] * len(row["prompt_ids"]) + [True] * len(row[answer])
    # Plain-text pairs: the trainer ends each answer with EOS, and so does the preview.
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"prompt": f"Q{i}?", "chosen": " Right.", "rejected": " Wrong."}) + "\n"
                             for i in range(16)))  # fmt: skip
    mixture = ["--dataset_mixture", f"{{sources: [{{path: {plain}, format: preference}}]}}"]
    recipe, args, model_args = parse_recipe("dpo", [*argv, *mixture])
    _, tokenizer, _, examples = training_examples("dpo", recipe, args, model_args, count=1)
    train, _ = preference_data(recipe)
    trainer = DPOTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    row = trainer.train_dataset[0]
    assert examples[0].input_ids == row["prompt_ids"] + row["chosen_ids"]
    assert row["chosen_ids"][-1] == tokenizer.eos_token_id
    cli.main(["preview", "recipes/tiny_kto.yaml", "--model_name_or_path", chat_model, "--examples", "2"])
    out = capsys.readouterr().out
    assert out.startswith("KTO: ") and out.count("--- example") == 2
    assert {"desirable", "undesirable"} & set(out.replace(";", " ").split()) and TRAINED_OPEN in out


def test_dpo_preview_cuts_pairs_at_max_length_as_trls_collator_does(chat_model, tmp_path):
    """A pair longer than max_length is shown as the collator cuts it (its start, or its end under
    keep_end); a pair whose prompt alone fills max_length trains nothing, is said to, and the trainer
    drops it (under keep_start: keep_end keeps its answer's end)."""
    from trl import DPOTrainer
    from trl.trainer.dpo_trainer import DataCollatorForPreference

    from medrecipes.data.preference import preference_data

    rows = [{"prompt": [{"role": "user", "content": "Which vitamin prevents scurvy? " * n}],
             "chosen": [{"role": "assistant", "content": "Vitamin C, ascorbic acid, in citrus fruit."}],
             "rejected": [{"role": "assistant", "content": "Vitamin D."}]} for n in (1, 12)]  # fmt: skip
    data = write_jsonl(tmp_path / "pairs.jsonl", rows * 8)
    argv = ["recipes/tiny_dpo.yaml", "--model_name_or_path", chat_model, "--output_dir", str(tmp_path / "run"),
            "--eval_strategy", "no", "--eval_sets", "null", "--eval_on_start", "false", "--max_length", "30",
            "--dataset_mixture", f"{{sources: [{{path: {data}, format: preference}}]}}"]  # fmt: skip
    recipe, args, model_args = parse_recipe("dpo", argv)
    train, _ = preference_data(recipe)
    model = AutoModelForCausalLM.from_pretrained(chat_model)
    _, tokenizer, _, _ = training_examples("dpo", recipe, args, model_args, count=1)
    trainer = DPOTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    assert len(trainer.train_dataset) == 8  # keep_start: the pairs whose prompt fills max_length dropped
    tokenized = trainer.train_dataset[0]
    for mode in ("keep_start", "keep_end"):
        recipe, args, model_args = parse_recipe("dpo", [*argv, "--truncation_mode", mode])
        _, _, _, examples = training_examples("dpo", recipe, args, model_args, count=2)
        assert all(len(e.input_ids) == 30 for e in examples[::2]) and "cut at max_length 30" in examples[0].notes[1]
        collator = DataCollatorForPreference(tokenizer.pad_token_id, max_length=30, truncation_mode=mode)
        batch = collator([tokenized])
        for k, example in enumerate(examples[:2]):  # the first pair's chosen, then rejected
            kept = batch["attention_mask"][k].bool()
            assert example.input_ids == batch["input_ids"][k][kept].tolist()
            assert example.trained == batch["completion_mask"][k][kept].bool().tolist()
        long_prompt = examples[2]  # the second pair's chosen answer
        assert any("NOTHING TRAINED" in n for n in long_prompt.notes) == (mode == "keep_start")
        assert any(long_prompt.trained) == (mode == "keep_end")


@pytest.mark.parametrize(("strategy", "cut"), [("bfd", True), ("bfd_split", False), ("wrapped", False)])
def test_a_packed_example_past_max_length_is_cut_only_where_its_strategy_cuts(chat_model, strategy, cut):
    """TRL's bfd packing drops what is past max_length; bfd_split and wrapped carry it into another sequence."""
    argv = ["recipes/tiny_sft.yaml", "--model_name_or_path", chat_model, "--packing", "true",
            "--packing_strategy", strategy, "--max_length", "40"]  # fmt: skip
    recipe, args, model_args = parse_recipe("sft", argv)
    (example,) = training_examples("sft", recipe, args, model_args, count=1)[3]
    assert (len(example.input_ids) == 40) == cut
    assert any("NOTHING TRAINED" in note for note in example.notes) == cut  # its answer is past token 40
    assert any("into the next sequence" in note for note in example.notes) != cut
