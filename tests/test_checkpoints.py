"""Which checkpoints a run resumes from and which it keeps."""

from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainingArguments

from medrecipes.errors import UserError
from medrecipes.runs.resume import checkpoint_to_resume, last_checkpoint
from medrecipes.training.callbacks import KeepBestCheckpoints, checkpoint_steps
from medrecipes.training.resume import check_resumable, checkpoint_mismatch


def _weights(folder: Path) -> None:
    """A weights file a checkpoint's check reads as whole (safetensors with no tensors)."""
    from safetensors.torch import save_file

    save_file({}, str(folder / "model.safetensors"))


def test_last_checkpoint_skips_a_folder_without_trainer_state(tmp_path):
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    _weights(tmp_path / "checkpoint-2")
    (tmp_path / "checkpoint-4" / "model.safetensors").write_text("")  # a save that never finished
    assert last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert last_checkpoint(str(tmp_path / "absent")) is None


def test_resume_from_checkpoint_names_where_to_start(tmp_path):
    run, other = tmp_path / "run", tmp_path / "other"
    for folder in (run / "checkpoint-2", other / "checkpoint-8", other / "checkpoint-9"):
        folder.mkdir(parents=True)
    for folder in (run / "checkpoint-2", other / "checkpoint-8"):
        (folder / "trainer_state.json").write_text(f'{{"global_step": {folder.name.split("-")[1]}}}')
        _weights(folder)

    def start(named):
        args = TrainingArguments(output_dir=str(run), resume_from_checkpoint=named, use_cpu=True, report_to="none")
        return checkpoint_to_resume(args)

    assert start(None) == start(True) == start("true") == str(run / "checkpoint-2")  # the newest here
    assert start(str(other / "checkpoint-8")) == str(other / "checkpoint-8")
    with pytest.raises(UserError, match=f"resume_from_checkpoint: {other}/checkpoint-9 is not a complete checkpoint"):
        start(str(other / "checkpoint-9"))
    with pytest.raises(UserError, match=f"resume_from_checkpoint: {tmp_path}/absent does not exist"):
        start(str(tmp_path / "absent"))
    # A checkpoint's folder name alone is read from the working directory, not output_dir: the line offers output_dir's.
    with pytest.raises(
        UserError, match=f"checkpoint-2 does not exist .*; output_dir's is {run}/checkpoint-2: name it so"
    ):
        start("checkpoint-2")


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


def _whole_checkpoint(folder: Path, step: int) -> Path:
    """A checkpoint with every kind of file the trainer writes and reads back: the weights
    (safetensors), the trainer state (JSON), the optimizer, scheduler, RNG states and arguments
    (torch.save), each in its library's own format."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerState

    path = folder / f"checkpoint-{step}"
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, vocab_size=128))
    model.save_pretrained(path)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    torch.save(optimizer.state_dict(), path / "optimizer.pt")
    torch.save(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0).state_dict(), path / "scheduler.pt")
    torch.save({"python": 1, "cpu": torch.get_rng_state()}, path / "rng_state.pth")
    torch.save({"output_dir": str(folder)}, path / "training_args.bin")
    TrainerState(global_step=step).save_to_json(str(path / "trainer_state.json"))
    return path


def _damages(data: bytes) -> dict[str, bytes]:
    """Ways a file is damaged: emptied, cut to half, its last byte lost (a text file's trailing
    newline is no loss), overwritten."""
    import random

    noise = random.Random(len(data)).randbytes(len(data))
    cut = data.rstrip(b"\n")[:-1]
    return {"empty": b"", "half": data[: len(data) // 2], "last byte lost": cut, "random bytes": noise}


def test_every_damaged_file_of_the_newest_checkpoint_is_set_aside_for_the_whole_one_before(tmp_path, caplog):
    """Each file of a checkpoint, damaged each way, as the disk or a copy leaves it: the run
    resumes from the whole checkpoint before it with a warning naming the file; with none whole,
    one line; a named damaged checkpoint, one line. The cases come from the checkpoint's own files."""
    from medrecipes.outputs.checkpoints import checkpoint_damage

    run = tmp_path / "run"
    earlier, newest = _whole_checkpoint(run, 2), _whole_checkpoint(run, 4)
    assert checkpoint_damage(str(earlier)) is None and checkpoint_damage(str(newest)) is None
    files = sorted(p.name for p in newest.iterdir())
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state.pth"} <= set(files)
    for name in files:
        whole = (newest / name).read_bytes()
        for how, data in _damages(whole).items():
            (newest / name).write_bytes(data)
            found = checkpoint_damage(str(newest))
            assert found and found.startswith(name), (name, how, found)
            caplog.clear()
            assert last_checkpoint(str(run)) == str(earlier), (name, how)
            assert f"ignoring {newest}: {name}" in caplog.text
            args = TrainingArguments(output_dir=str(run), resume_from_checkpoint=str(newest), use_cpu=True)
            with pytest.raises(UserError, match=rf"^resume_from_checkpoint: {newest} cannot be resumed: {name}"):
                checkpoint_to_resume(args)
        (newest / name).write_bytes(whole)
    (earlier / "model.safetensors").write_bytes(b"")
    (newest / "optimizer.pt").write_bytes(b"\0" * 64)
    with pytest.raises(UserError, match=r"^output_dir: no checkpoint in .* can be resumed \(checkpoint-4: optimizer"):
        last_checkpoint(str(run))


def _wrong_kind(value):
    """A JSON value of another kind than `value`'s: text for a number, a number for text or a list."""
    return "3" if isinstance(value, int | float) and not isinstance(value, bool) else 3


def test_a_trainer_state_field_of_the_wrong_kind_or_no_weights_sets_the_checkpoint_aside(tmp_path, caplog):
    """Every field of the trainer state whose kind TrainerState declares (the cases come from its
    annotations), given a value of another kind, and each weights file removed: the checkpoint is
    set aside for the one before with a warning naming why, as a cut file is."""
    import json
    import typing

    from transformers import TrainerState

    from medrecipes.outputs.checkpoints import checkpoint_damage

    run = tmp_path / "run"
    earlier, newest = _whole_checkpoint(run, 2), _whole_checkpoint(run, 4)
    state_file = newest / "trainer_state.json"
    whole = json.loads(state_file.read_text())
    simple = {int, float, bool, str, list}
    checked = [
        name
        for name, hint in typing.get_type_hints(TrainerState).items()
        if name in whole and whole[name] is not None and (typing.get_origin(hint) or hint) in simple
    ]
    assert {"global_step", "max_steps", "epoch", "log_history", "num_input_tokens_seen"} <= set(checked)
    for name in checked:
        state_file.write_text(json.dumps({**whole, name: _wrong_kind(whole[name])}))
        found = checkpoint_damage(str(newest))
        assert found and found.startswith(f"trainer_state.json: {name} is "), (name, found)
        caplog.clear()
        assert last_checkpoint(str(run)) == str(earlier), name
        assert f"ignoring {newest}: trainer_state.json: {name} is " in caplog.text
    for step in (3, 5, None):  # a state edited or copied from another checkpoint: the trainer would redo steps
        state_file.write_text(json.dumps({k: v for k, v in {**whole, "global_step": step}.items() if v is not None}))
        assert checkpoint_damage(str(newest)) == (
            f"trainer_state.json: global_step {'null' if step is None else step} is not this checkpoint-4's step"
        )
        assert last_checkpoint(str(run)) == str(earlier), step
    state_file.write_text(json.dumps(whole))
    (newest / "model.safetensors").unlink()
    assert checkpoint_damage(str(newest)).startswith("holds no model weights")
    assert last_checkpoint(str(run)) == str(earlier)


def test_a_checkpoint_another_run_saved_is_set_aside_for_this_runs(tmp_path, caplog):
    """A checkpoint carries the identity of the run that saved it: one copied into another run's
    folder (an SFT run's into a CPT run's, or of another data set) is not resumed, however new."""
    import json

    from medrecipes.runs.record import RECORD, stamp_checkpoint

    run = tmp_path / "run"
    ours = {"script": "recipes/cpt.py", "model": "m", "data": "d1"}
    earlier, newest = _whole_checkpoint(run, 2), _whole_checkpoint(run, 320)
    (run / RECORD).write_text(json.dumps({**ours, "recipe": {}}))
    stamp_checkpoint(str(earlier), str(run))
    assert json.loads((earlier / RECORD).read_text()) == {**ours, "processes": 1}  # the identity, and the processes
    for theirs, named in (({"script": "recipes/sft.py"}, "script recipes/sft.py, here recipes/cpt.py"),
                          ({"data": "d2"}, "dataset_mixture d2, here d1")):  # fmt: skip
        (newest / RECORD).write_text(json.dumps({**ours, **theirs}))
        caplog.clear()
        assert last_checkpoint(str(run)) == str(earlier)
        assert f"ignoring {newest}: another run saved it ({named})" in caplog.text
    (newest / RECORD).unlink()  # saved before runs stamped their checkpoints: nothing tells it apart
    assert last_checkpoint(str(run)) == str(newest)


def test_a_named_checkpoint_of_another_run_is_refused_unless_the_recipe_says_so(tmp_path):
    """Another script, starting model, data or starting weights (the run records of both folders):
    one line, and `resume_from_another_run` lets it through; the same run's checkpoint goes through,
    its model written by another path to the same weights too."""
    import json

    ours = {"script": "recipes/sft.py", "model": "m", "data": "abc", "weights": "0123"}
    for key, other, told in (
        ("script", {"script": "recipes/dpo.py"}, "script recipes/dpo.py, here recipes/sft.py"),
        ("model", {"model": "another", "weights": "89ab"}, "model another, here m"),
        ("data", {"data": "def"}, "dataset_mixture def, here abc"),
        ("weights", {"weights": "4567"}, "the weights of model m changed since that run started from them"),
    ):
        here, there = tmp_path / key / "here", tmp_path / key / "there"
        here.mkdir(parents=True)
        checkpoint = _whole_checkpoint(there, 3)
        (here / "run.json").write_text(json.dumps(ours))
        (there / "run.json").write_text(json.dumps({**ours, **other}))
        args = TrainingArguments(output_dir=str(here), resume_from_checkpoint=str(checkpoint), use_cpu=True)
        with pytest.raises(UserError, match=rf"is another run's \({told}\)"):
            checkpoint_to_resume(args, SimpleNamespace(resume_from_another_run=False))
        assert checkpoint_to_resume(args, SimpleNamespace(resume_from_another_run=True)) == str(checkpoint)
        (there / "run.json").write_text(json.dumps(ours))
        assert checkpoint_to_resume(args, SimpleNamespace(resume_from_another_run=False)) == str(checkpoint)
        (there / "run.json").write_text(json.dumps({**ours, "model": "../m"}))  # the same weights by another path
        assert checkpoint_to_resume(args, SimpleNamespace(resume_from_another_run=False)) == str(checkpoint)


def test_a_tied_output_head_is_not_named_missing_on_resume():
    """A checkpoint keeps one copy of a tied weight, and transformers named the output head
    missing on every resume; the tied copy is left out of the line, a weight really missing is not."""
    from torch.nn.modules.module import _IncompatibleKeys
    from transformers import LlamaConfig, LlamaForCausalLM

    from medrecipes.training.transformers_seams import TrainerSeams

    class Seen:
        def _issue_warnings_after_load(self, load_result):
            self.seen = load_result

    class Trainer(TrainerSeams, Seen):
        pass

    trainer = object.__new__(Trainer)
    config = LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=64, tie_word_embeddings=True)  # fmt: skip
    trainer.model = LlamaForCausalLM(config)
    trainer.accelerator = SimpleNamespace(unwrap_model=lambda model: model)
    for missing, named in ((["lm_head.weight"], []), (["lm_head.weight", "model.norm.weight"], ["model.norm.weight"]),
                           (["model.embed_tokens.weight", "lm_head.weight"], ["model.embed_tokens.weight", "lm_head.weight"])):  # fmt: skip
        trainer._issue_warnings_after_load(_IncompatibleKeys(missing, []))
        assert trainer.seen.missing_keys == named, missing
