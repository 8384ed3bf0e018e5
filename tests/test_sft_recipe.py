"""recipes/sft.py: full, LoRA and QLoRA runs as a user types them, and what the trainer is fed."""

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import LAUNCH, log_history, run_recipe
from transformers import AutoModelForCausalLM, AutoTokenizer

from medrecipes import cli
from medrecipes.config import parse_recipe
from medrecipes.data.sft import sft_data
from medrecipes.errors import UserError

TINY = "recipes/tiny_sft.yaml"


sft = partial(run_recipe, "recipes/sft.py")


@pytest.mark.parametrize(
    "device",
    [
        pytest.param([], id="cpu", marks=pytest.mark.long),
        # On a GPU: bf16, TF32, fused AdamW and Liger by default, and padding-free packing.
        pytest.param(["--use_cpu", "false", "--packing", "true"], id="cuda-packed", marks=pytest.mark.gpu),
    ],
)
def test_full_sft_lifts_accuracy_on_its_training_questions(chat_model, tmp_path, device):
    result = sft(
        TINY,
        "--model_name_or_path",
        chat_model,
        "--output_dir",
        tmp_path,
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "10000",
        "--eval_on_start",
        "true",
        *device,
    )
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    before = next(e["eval_usmle_train_acc"] for e in state["log_history"] if "eval_usmle_train_acc" in e)
    after = json.loads((tmp_path / "eval_results.json").read_text())["eval_usmle_train_acc"]
    # 60 four-option questions: chance is 25%; the fine-tuned model should have learnt most answers.
    assert before <= 0.45 and after >= 0.75, (before, after)
    # The monitoring of every recipe: padded rows counted, throughput in every training log.
    logs = [e for e in state["log_history"] if "loss" in e and "learning_rate" in e]
    assert logs and all(e["tokens_per_second"] > 0 and "eta_hours" in e for e in logs)
    assert logs[-1]["num_input_tokens_seen"] > logs[0]["num_input_tokens_seen"] > 0
    assert "usmle_train: accuracy" in result.stdout and "cardiology" in result.stdout  # per-subject report
    generation = json.loads((tmp_path / "final" / "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "final")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation["eos_token_id"]


def test_assistant_only_loss_trains_on_the_answer_alone(chat_model, tmp_path):
    from trl import SFTTrainer

    recipe, args, _ = parse_recipe("sft", [TINY, "--output_dir", str(tmp_path), "--model_name_or_path", chat_model])
    train, _, _ = sft_data(recipe)
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    model = AutoModelForCausalLM.from_pretrained(chat_model)
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    for i, labels in enumerate(batch["labels"]):
        # What the chat template itself marks as the assistant's turn, computed apart from TRL.
        marked = tokenizer.apply_chat_template(
            train[i]["messages"], return_dict=True, return_assistant_tokens_mask=True
        )["assistant_masks"]
        trained = labels[labels != -100]
        assert len(trained) == sum(marked) > 0
        text = tokenizer.decode(trained)
        assert text.endswith("<|im_end|>") and "Question" not in text and text[0] in "ABCD"


def test_subjects_select_the_training_rows(tmp_path):
    recipe, _, _ = parse_recipe("sft", [TINY, "--output_dir", str(tmp_path), "--subjects", "cardiology", "neurology"])
    train, evals, mcq = sft_data(recipe)
    rows = [json.loads(line) for line in Path("data/usmle_sample/train.jsonl").read_text().splitlines()]
    assert len(train) == sum(r["subject"] in ("cardiology", "neurology") for r in rows)
    assert len(mcq["usmle_train"]) == len(rows)  # evaluation still covers every subject


def test_plain_documents_with_assistant_only_loss_are_one_line_at_parse(tmp_path):
    text = "{sources: [{path: data/medical_text/train.jsonl}]}"
    with pytest.raises(UserError, match=r"dataset_mixture.sources\[0\]: format text has no assistant turns"):
        parse_recipe("sft", [TINY, "--output_dir", str(tmp_path), "--dataset_mixture", text])
    with pytest.raises(UserError, match=r"eval_sets.notes: format text has no assistant turns"):
        parse_recipe(
            "sft",
            [TINY, "--output_dir", str(tmp_path), "--eval_sets", "{notes: {path: data/medical_text/eval.jsonl}}"],
        )
    recipe, args, _ = parse_recipe(
        "sft", [TINY, "--output_dir", str(tmp_path), "--dataset_mixture", text, "--assistant_only_loss", "false"]
    )
    assert not args.assistant_only_loss and recipe.mixture.sources[0].format == "text"


@pytest.mark.parametrize("quantized", [False, True], ids=["lora", "qlora"])
def test_lora_and_qlora_adapters_merge_into_a_plain_model(chat_model, tmp_path, quantized):
    extra = ["--load_in_4bit", "true", "--bnb_4bit_quant_type", "nf4", "--use_bnb_nested_quant", "true"]
    sft(
        TINY,
        "--model_name_or_path",
        chat_model,
        "--output_dir",
        tmp_path / "run",
        "--max_steps",
        "4",
        "--use_peft",
        "true",
        "--lora_r",
        "8",
        "--lora_alpha",
        "16",
        "--lora_target_modules",
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        *(extra if quantized else []),
    )
    adapter = tmp_path / "run" / "final"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["r"] == 8 and Path(config["base_model_name_or_path"]).resolve() == Path(chat_model).resolve()
    cli.main(["merge-lora", str(adapter), str(tmp_path / "merged")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = AutoTokenizer.from_pretrained(tmp_path / "merged")("The heart", return_tensors="pt").input_ids
    assert torch.isfinite(merged(ids).logits).all()


def test_padding_free_packing(chat_model, tmp_path):
    result = sft(
        TINY,
        "--model_name_or_path",
        chat_model,
        "--output_dir",
        tmp_path,
        "--max_steps",
        "3",
        "--packing",
        "true",
        "--packing_strategy",
        "bfd",
        "--per_device_train_batch_size",
        "2",
        "--logging_steps",
        "1",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
    )
    losses = [e["loss"] for e in log_history(tmp_path) if "loss" in e]
    assert losses and all(loss > 0 for loss in losses)
    assert (tmp_path / "checkpoint-2").is_dir()  # where TRL's trainer writes its generic card
    assert "training rows" not in result.stderr  # packing fills fewer rows; it drops no example
    assert not (tmp_path / "README.md").exists()  # one model card per run, ours (TRL's generic one is not written)


def test_packed_rows_count_the_examples_in_them():
    """The check of rows a trainer dropped counts the examples of packed rows, not the rows."""
    from datasets import Dataset
    from trl import pack_dataset

    from medrecipes.training.mixins import _rows

    examples = Dataset.from_dict({"input_ids": [[1] * n for n in (3, 5, 2, 7, 1, 4)]})
    packed = pack_dataset(examples, seq_length=8, strategy="bfd")
    assert len(packed) < len(examples) and _rows(packed) == len(examples) == _rows(examples)
    assert _rows(packed.select([0])) == len(packed[0]["seq_lengths"])


@pytest.mark.long
def test_zero3_sft_on_two_processes(chat_model, tmp_path):
    sft(
        TINY,
        "--model_name_or_path",
        chat_model,
        "--output_dir",
        tmp_path,
        "--max_steps",
        "2",
        "--logging_steps",
        "1",
        launcher=(
            *LAUNCH,
            "--config_file",
            "accelerate_configs/zero3.yaml",
            "--mixed_precision",
            "no",
            "--num_processes",
            "2",
        ),
    )
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "final").num_parameters() > 0


def test_chat_sources_are_used_as_they_are(tmp_path):
    conversations = tmp_path / "chat.jsonl"
    messages = [{"role": "user", "content": "What lowers preload?"}, {"role": "assistant", "content": "Nitrates."}]
    conversations.write_text(json.dumps({"messages": messages}) + "\n")
    recipe = tmp_path / "chat.yaml"
    recipe.write_text(
        f"dataset_mixture:\n  sources:\n    - {{path: {conversations}, format: chat}}\n"
        f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\n"
    )
    recipe_args, _, _ = parse_recipe("sft", [str(recipe)], to_train=False)
    train, evals, mcq = sft_data(recipe_args)
    assert list(train) == [{"messages": messages}] and evals == {} and mcq == {}


@pytest.mark.long  # a run with evaluations at every save
def test_the_run_keeps_the_checkpoint_with_the_best_validation_accuracy(chat_model, tmp_path):
    """A recipe that scores a held-out set in generate mode after every pass and names its accuracy
    in `metric_for_best_model`: final/ is the checkpoint with the best accuracy (the first, on a
    tie), the record names it, and the run's last evaluation is of that model."""
    from safetensors.torch import load_file

    sft(
        TINY,
        *("--model_name_or_path", chat_model, "--output_dir", tmp_path, "--num_train_epochs", "3"),
        *("--learning_rate", "1e-2", "--eval_strategy", "epoch", "--save_strategy", "epoch"),
        *("--load_best_model_at_end", "true", "--metric_for_best_model", "eval_usmle_test_acc"),
        *("--greater_is_better", "true", "--save_total_limit", "1"),
    )
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    scored = {}
    for entry in state["log_history"]:
        if "eval_usmle_test_acc" in entry:
            scored.setdefault(entry["step"], entry["eval_usmle_test_acc"])  # each pass's, before the last evaluation
    assert len(scored) == 3
    best = max(scored.values())
    step = next(s for s, acc in sorted(scored.items()) if acc == best)
    assert state["best_metric"] == best and state["best_global_step"] == step
    assert state["best_model_checkpoint"] == str(tmp_path / f"checkpoint-{step}")
    kept, final = (
        load_file(tmp_path / f"checkpoint-{step}" / "model.safetensors"),
        load_file(tmp_path / "final" / "model.safetensors"),
    )
    assert kept.keys() == final.keys() and all(torch.equal(kept[k], final[k]) for k in kept)
    assert json.loads((tmp_path / "eval_results.json").read_text())["eval_usmle_test_acc"] == best
