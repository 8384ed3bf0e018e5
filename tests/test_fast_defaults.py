"""The recipes' speed settings leave the training maths alone: the chunked LM head gives the
model's own loss, and packed examples attend only to themselves with every attention."""

import pytest
import torch
from conftest import NO_EVAL
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from medrecipes.config import MedSFTConfig, parse_recipe
from medrecipes.trainer import CausalLMTrainer


def cpt_trainer(tiny_model, tmp_path, *overrides):
    _, args, _ = parse_recipe(
        "cpt",
        [
            "recipes/tiny_cpt.yaml",
            "--model_name_or_path",
            tiny_model,
            "--output_dir",
            str(tmp_path),
            *NO_EVAL,
            "--report_to",
            "none",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    return CausalLMTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": [[5, 6, 7]]}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        data_collator=DataCollatorForLanguageModeling(pad_token_id=0),
    )


def test_recipe_defaults_are_the_fast_ones(tmp_path):
    _, cpt, _ = parse_recipe("cpt", ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    _, sft, _ = parse_recipe("sft", ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert cpt.fused_lm_head and not cpt.logging_nan_inf_filter
    assert cpt.use_liger_kernel is False  # Liger needs a GPU
    assert sft.packing and sft.packing_strategy == "bfd" and not sft.logging_nan_inf_filter
    _, off, _ = parse_recipe(
        "cpt",
        ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--use_cpu", "true", "--fused_lm_head", "false"],
    )
    assert not off.fused_lm_head


def test_chunked_lm_head_gives_the_models_own_loss(tiny_model, tmp_path):
    generator = torch.Generator().manual_seed(0)
    batch = DataCollatorForLanguageModeling(pad_token_id=0)(
        [{"input_ids": torch.randint(5, 1000, (n,), generator=generator).tolist()} for n in (24, 17)]
    )
    losses = {}
    for fused in ("true", "false"):
        trainer = cpt_trainer(tiny_model, tmp_path / fused, "--fused_lm_head", fused)
        loss, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
        loss.backward()
        grad = trainer.model.lm_head.weight.grad.clone()
        losses[fused] = (loss.item(), grad, getattr(outputs, "logits", None))
    assert losses["true"][2] is None  # no (batch, length, vocabulary) tensor was made
    assert losses["false"][2] is not None
    assert losses["true"][0] == pytest.approx(losses["false"][0], rel=1e-5)
    torch.testing.assert_close(losses["true"][1], losses["false"][1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_examples_attend_only_to_themselves(chat_model, tmp_path, attention):
    """A padding-free row (TRL's collator: restarting position_ids, no attention mask) gives
    each example the loss it has alone: transformers builds the block-diagonal mask, as long
    as no KV cache is made, and TRL's SFT loss asks for none."""
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    model = AutoModelForCausalLM.from_pretrained(chat_model, attn_implementation=attention)
    generator = torch.Generator().manual_seed(0)
    examples = [{"input_ids": torch.randint(5, 1000, (n,), generator=generator).tolist()} for n in (23, 9, 31)]
    args = MedSFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_length=64)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer)
    packed = trainer.data_collator(examples)
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, 63)

    with torch.no_grad():
        alone = [trainer.compute_loss(model, trainer.data_collator([e])).item() for e in examples]
        together = trainer.compute_loss(model, dict(packed)).item()
        # The same row with a mask of ones lets each example see the ones before it.
        leaking = trainer.compute_loss(model, {**packed, "attention_mask": torch.ones_like(packed["input_ids"])})
    targets = [len(e["input_ids"]) - 1 for e in examples]  # each example's first token has no label
    expected = sum(loss * n for loss, n in zip(alone, targets, strict=True)) / sum(targets)
    # A random model's predictions barely depend on context, so the leak is small, but far above rounding.
    assert abs(together - expected) < 1e-6 * expected
    assert abs(leaking.item() - expected) > 2e-5 * expected
