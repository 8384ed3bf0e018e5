"""Which checkpoints a run resumes from and which it keeps."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainingArguments

from medrecipes.errors import UserError
from medrecipes.training.callbacks import KeepBestCheckpoints, checkpoint_steps
from medrecipes.training.resume import check_resumable, checkpoint_mismatch, checkpoint_to_resume, last_checkpoint


def test_last_checkpoint_skips_a_folder_without_trainer_state(tmp_path):
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-4" / "model.safetensors").write_text("")  # a save that never finished
    assert last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert last_checkpoint(str(tmp_path / "absent")) is None


def test_resume_from_checkpoint_names_where_to_start(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    for folder in (run / "checkpoint-2", other / "checkpoint-8", other / "checkpoint-9"):
        folder.mkdir(parents=True)
    for folder in (run / "checkpoint-2", other / "checkpoint-8"):
        (folder / "trainer_state.json").write_text("{}")

    def start(named):
        args = TrainingArguments(output_dir=str(run), resume_from_checkpoint=named, use_cpu=True, report_to="none")
        return checkpoint_to_resume(args)

    assert start(None) == start(True) == start("true") == str(run / "checkpoint-2")  # the newest here
    assert start(str(other / "checkpoint-8")) == str(other / "checkpoint-8")
    for incomplete in (other / "checkpoint-9", tmp_path / "absent"):
        with pytest.raises(UserError, match=f"resume_from_checkpoint: {incomplete} is not a complete checkpoint"):
            start(str(incomplete))


def test_a_checkpoint_of_another_model_is_named_before_training(tmp_path):
    from peft import LoraConfig
    from transformers import LlamaConfig

    def model(hidden: int, r: int | None = None):
        config = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2, vocab_size=1024)
        adapters = {"default": LoraConfig(r=r, target_modules=["q_proj", "v_proj"])} if r else {}
        return SimpleNamespace(config=config, peft_config=adapters)

    full, lora = tmp_path / "checkpoint-4", tmp_path / "lora" / "checkpoint-4"
    model(64).config.save_pretrained(full)
    model(64, r=4).peft_config["default"].save_pretrained(lora)
    assert checkpoint_mismatch(str(full), model(64)) is None
    assert checkpoint_mismatch(str(full), model(128)) == (
        "hidden_size 64, here 128; intermediate_size 128, here 256; head_dim 2, here 4"
    )
    assert checkpoint_mismatch(str(lora), model(64, r=4)) is None  # target modules in another order
    assert checkpoint_mismatch(str(lora), model(64, r=8)) == "r 4, here 8"
    assert checkpoint_mismatch(str(lora), model(64)) == "a LoRA adapter, here full fine-tuning"
    assert checkpoint_mismatch(str(full), model(64, r=4)) == "full fine-tuning, here a LoRA adapter"
    with pytest.raises(UserError, match=r"^output_dir: .*checkpoint-4, the checkpoint this run would resume from, "):
        check_resumable(str(full), model(128), SimpleNamespace(resume_from_checkpoint=None))
    with pytest.raises(UserError, match=r"^resume_from_checkpoint: .*checkpoint-4 does not fit this run's model"):
        check_resumable(str(full), model(128), SimpleNamespace(resume_from_checkpoint=str(full)))


def saved(tmp_path, steps, losses, keep_best, keep_last, best=None):
    for step in steps:
        (tmp_path / f"checkpoint-{step}").mkdir()
    args = SimpleNamespace(
        should_save=True, output_dir=str(tmp_path), metric_for_best_model="loss", greater_is_better=False
    )
    state = SimpleNamespace(
        log_history=[{"step": s, "eval_loss": loss} for s, loss in losses.items()],
        best_model_checkpoint=str(tmp_path / f"checkpoint-{best}") if best else None,
    )
    KeepBestCheckpoints(keep_best, keep_last).on_save(args, state, None)
    return checkpoint_steps(str(tmp_path))


def test_keeps_the_last_k_and_the_best_m(tmp_path):
    losses = {10: 2.0, 20: 1.5, 30: 1.7, 40: 1.9, 50: 1.8, 60: 1.95}
    assert saved(tmp_path, losses, losses, keep_best=2, keep_last=2) == [20, 30, 50, 60]


def test_keeps_the_last_k_without_scores_and_the_trainers_best(tmp_path):
    assert saved(tmp_path, [5, 10, 15, 20], {}, keep_best=None, keep_last=2, best=5) == [5, 15, 20]


def test_save_total_limit_rotates_the_published_checkpoints(tiny_model, tmp_path):
    """Checkpoints are written in a staging folder and renamed; the trainer's own rotation
    (save_total_limit) still applies to them once they have their names."""
    import torch
    from conftest import NO_EVAL
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from medrecipes.config import parse_recipe
    from medrecipes.training.callbacks import recipe_callbacks
    from medrecipes.training.trainers import CausalLMTrainer

    # The tiny recipe's own retention (keep_best_checkpoints) left out: save_total_limit instead.
    lines = Path("recipes/tiny_cpt.yaml").read_text().splitlines()
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("\n".join(line for line in lines if not line.startswith("keep_")))
    overrides = ["--max_steps", "4", "--save_steps", "1", "--save_total_limit", "2", "--report_to", "none"]
    out = tmp_path / "run"
    recipe, args, _ = parse_recipe(
        "cpt", [str(recipe_file), "--model_name_or_path", tiny_model, "--output_dir", str(out), *NO_EVAL, *overrides]
    )
    blocks = torch.randint(5, 1000, (32, 32), generator=torch.Generator().manual_seed(0)).tolist()
    trainer = CausalLMTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": blocks}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        data_collator=DataCollatorForLanguageModeling(pad_token_id=0),
        callbacks=recipe_callbacks(recipe, args),
    )
    trainer.train()
    assert checkpoint_steps(str(out)) == [3, 4]
    assert not (out / "_staging").exists()


def test_the_recipe_mixin_comes_first_in_the_bases():
    from transformers import Trainer

    from medrecipes.training.mixins import PerplexityMixin, RecipeTrainerMixin

    with pytest.raises(TypeError, match="put RecipeTrainerMixin first"):

        class WrongOrder(PerplexityMixin, RecipeTrainerMixin, Trainer):
            pass

    class RightOrder(RecipeTrainerMixin, PerplexityMixin, Trainer):
        pass

    class Subclass(RightOrder):  # a subclass of a recipe trainer keeps its order
        pass
