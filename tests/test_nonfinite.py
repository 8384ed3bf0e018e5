"""The non-finite guard: a model whose hidden states turn NaN at chosen steps, trained by the CPT trainer."""

import json
import logging

import pytest
import torch
from conftest import NO_EVAL
from datasets import Dataset
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from medrecipes.config import parse_recipe
from medrecipes.training.callbacks import recipe_callbacks
from medrecipes.training.run import train_and_save
from medrecipes.training.trainers import CausalLMTrainer


class NaNAtSteps(TrainerCallback):
    """Makes the model's final hidden states NaN during the given (1-based) steps and records
    the weights before and after each step. (The final norm, not the output layer: the CPT
    trainer's chunked LM head reads the output weights without calling that module.)"""

    def __init__(self, model, steps):
        self.steps, self.step = set(steps), 0
        self.before, self.after = {}, {}
        model.model.norm.register_forward_hook(
            lambda module, args, out: out * float("nan") if self.poisoned() else out
        )
        self.model = model

    def poisoned(self):
        return self.model.training and self.step in self.steps

    def weights(self):
        return torch.cat([p.detach().flatten().clone() for p in self.model.parameters()])

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1
        self.before[self.step] = self.weights()

    def on_step_end(self, args, state, control, **kwargs):
        self.after[state.global_step] = self.weights()


def train(tiny_model, output_dir, nan_steps, *overrides):
    recipe, args, _ = parse_recipe(
        "cpt",
        [
            "recipes/tiny_cpt.yaml",
            "--model_name_or_path",
            tiny_model,
            "--output_dir",
            str(output_dir),
            "--max_steps",
            "8",
            "--logging_steps",
            "1",
            "--save_steps",
            "100",
            *NO_EVAL,
            "--report_to",
            "none",
            *overrides,
        ],
    )
    generator = torch.Generator().manual_seed(0)
    blocks = torch.randint(5, 1000, (64, 32), generator=generator).tolist()
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    poison = NaNAtSteps(model, nan_steps)
    trainer = CausalLMTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": blocks}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        data_collator=DataCollatorForLanguageModeling(pad_token_id=0),
        callbacks=[*recipe_callbacks(recipe, args), poison],
    )
    return trainer, poison


def adam_steps(trainer) -> int:
    return int(next(iter(trainer.optimizer.state.values()))["step"])


def test_skip_policy_leaves_the_weights_of_a_nan_step_untouched(tiny_model, tmp_path, caplog):
    trainer, poison = train(tiny_model, tmp_path, {3, 5}, "--nonfinite_policy", "skip", "--max_nonfinite_skips", "2")
    with caplog.at_level(logging.WARNING, logger="medrecipes"):
        train_and_save(trainer, None)
    assert trainer.state.global_step == 8
    for step in (3, 5):
        assert torch.equal(poison.before[step], poison.after[step])
    assert not torch.equal(poison.before[4], poison.after[4])
    assert adam_steps(trainer) == 6  # the optimizer stepped 8 - 2 times: no moment moved on NaN
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert "step 3: gradient norm is nan; step skipped (1 of at most 2)" in caplog.text
    last = [e for e in trainer.state.log_history if "loss" in e][-1]
    assert last["nonfinite_skipped"] == 2


@pytest.mark.parametrize(
    "overrides, stop_step, why",
    [
        (("--nonfinite_policy", "skip", "--max_nonfinite_skips", "1"), 5, "the skips allowed are used up"),
        (("--nonfinite_policy", "stop"), 3, "nonfinite_policy is stop"),
    ],
    ids=["skips-used-up", "stop"],
)
def test_stop_saves_the_last_good_weights_and_exits_1(tiny_model, tmp_path, overrides, stop_step, why):
    trainer, poison = train(tiny_model, tmp_path, {3, 5}, *overrides)
    with pytest.raises(SystemExit) as stopped:
        train_and_save(trainer, None)
    message = str(stopped.value.code)
    assert message.startswith(f"error: step {stop_step}: gradient norm is nan and {why}")
    assert f"checkpoint-{stop_step} holds the weights before it" in message
    checkpoint = tmp_path / f"checkpoint-{stop_step}"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == stop_step
    saved = torch.cat([t.flatten() for t in load_file(checkpoint / "model.safetensors").values()])
    assert torch.isfinite(saved).all()
    assert torch.equal(poison.after[stop_step], poison.before[stop_step])
    assert not (tmp_path / "final").exists()
