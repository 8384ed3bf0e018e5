"""Where a run starts: the checkpoint it resumes from (the newest whole one in output_dir, a
damaged newer one set aside with a warning, or the one `resume_from_checkpoint` names), an
interrupted save completed first, and a checkpoint of another run or model, or one the trainer
could not read back, refused in one line before training."""

import json
import logging
import os

from medrecipes.errors import UserError
from medrecipes.outputs.checkpoints import TRAINER_STATE, checkpoint_damage, checkpoint_steps
from medrecipes.outputs.writes import REPLACED, finish_publish

logger = logging.getLogger(__name__)

STAGING = "_staging"  # under output_dir; the leading underscore keeps HF's Hub push off it


def last_checkpoint(output_dir: str) -> str | None:
    """The newest whole checkpoint in `output_dir`, from which a run resumes automatically.

    Whole means renamed into place by `RecipeTrainerMixin`, holding the trainer state, which the
    trainer writes last, and readable as the trainer will read it (`checkpoint_damage`). A folder
    without the state (a save killed by an older version, or by a process that did not stage its
    checkpoints) or a damaged one (a disk that lost part of a file, a copy cut short) is skipped
    with a warning for the newest whole one before it; damaged folders and none whole is one line.
    """
    damaged = []
    for step in reversed(checkpoint_steps(output_dir)):
        path = os.path.join(output_dir, f"checkpoint-{step}")
        if not os.path.isfile(os.path.join(path, TRAINER_STATE)):
            logger.warning("ignoring %s: it has no %s, so its save did not finish", path, TRAINER_STATE)
            continue
        problem = checkpoint_damage(path)
        if problem is None:
            logger.info("resuming from %s", path)
            return path
        logger.warning("ignoring %s: %s; resuming from an earlier checkpoint", path, problem)
        damaged.append(f"checkpoint-{step}: {problem}")
    if damaged:
        raise UserError(
            f"output_dir: no checkpoint in {output_dir} can be resumed ({'; '.join(damaged)}); move them "
            "aside to start over, or set overwrite_output_dir: true to delete them"
        )
    return None


def finish_interrupted_saves(output_dir: str) -> None:
    """Put in place a checkpoint or final/ whose save was killed as it replaced an older folder
    of the same name (`outputs.writes.finish_publish`); a save killed earlier is discarded by the next."""
    staging = os.path.join(output_dir, STAGING)
    names = os.listdir(staging) if os.path.isdir(staging) else []
    for name in (n.removesuffix(REPLACED) for n in names if n.endswith(REPLACED)):
        if finish_publish(os.path.join(staging, name), os.path.join(output_dir, name)):
            logger.info("%s: completed its save, interrupted as it replaced the older one", name)


def resumes_from_output_dir(args) -> bool:
    """Whether the run resumes from output_dir's newest checkpoint (no checkpoint named)."""
    return args.resume_from_checkpoint is None or str(args.resume_from_checkpoint).lower() == "true"


def checkpoint_to_resume(args, recipe=None) -> str | None:
    """The checkpoint a run starts from: the one `resume_from_checkpoint` names (a checkpoint
    folder of this run, or of another run where the recipe sets `resume_from_another_run`), else
    the newest whole one in output_dir (also with `resume_from_checkpoint: true`)."""
    named = args.resume_from_checkpoint
    if resumes_from_output_dir(args):
        with args.main_process_first(local=args.save_on_each_node, desc="completing an interrupted save"):
            if args.should_save:
                finish_interrupted_saves(args.output_dir)
        return last_checkpoint(args.output_dir)
    if not os.path.isfile(os.path.join(named, TRAINER_STATE)):
        raise UserError(
            f"resume_from_checkpoint: {named} is not a complete checkpoint (no {TRAINER_STATE}); "
            "name a checkpoint-<step> folder, or leave the key out to resume from output_dir's newest"
        )
    problem = checkpoint_damage(named)
    if problem is not None:
        raise UserError(f"resume_from_checkpoint: {named} cannot be resumed: {problem}; name a whole checkpoint")
    if not getattr(recipe, "resume_from_another_run", False):
        _refuse_another_run(named, args.output_dir)
    logger.info("resuming from %s (resume_from_checkpoint)", named)
    return named


def _refuse_another_run(checkpoint: str, output_dir: str) -> None:
    """A named checkpoint whose run (the run.json of its folder's run) is another run than this
    one: another script, starting model or data. Its weights would load into this run's model and
    the result would be saved as this run's: one line, unless the recipe says so."""
    from medrecipes.training.run_folder import IDENTITY, read_record

    theirs = read_record(os.path.dirname(os.path.abspath(checkpoint))) or {}
    ours = read_record(output_dir) or {}
    differs = [
        f"{key} {theirs.get(key)}, here {ours.get(key)}" for key in IDENTITY if theirs.get(key) != ours.get(key)
    ]
    if theirs and ours and differs:
        raise UserError(
            f"resume_from_checkpoint: {checkpoint} is another run's ({'; '.join(differs)}); name a checkpoint "
            "of this run, or set resume_from_another_run: true to start from it on purpose"
        )


# Config keys that fix the shapes of a checkpoint's tensors, for a model and for a LoRA adapter.
SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
ADAPTER_KEYS = ("peft_type", "r", "target_modules")


def _saved_config(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _comparable(config: dict, keys: tuple[str, ...]) -> dict:
    config = {**config, **(config.get("text_config") or {})}  # a multimodal model's language model
    return {k: sorted(v) if isinstance(v, list | set) else v for k, v in config.items() if k in keys}


def checkpoint_mismatch(checkpoint: str, model) -> str | None:
    """How `checkpoint` differs from `model` in what fixes its tensors' shapes ("hidden_size 64,
    here 128"), or None. Resuming another model's checkpoint (a run given an output_dir that an
    earlier run with another model used) would fail deep in loading, a size mismatch per tensor."""
    peft = getattr(model, "peft_config", {}).get("default")
    adapter = _saved_config(os.path.join(checkpoint, "adapter_config.json"))
    if (adapter is None) != (peft is None):
        kinds = ("a LoRA adapter", "full fine-tuning")
        return f"{kinds[adapter is None]}, here {kinds[peft is None]}"
    pairs = [(_saved_config(os.path.join(checkpoint, "config.json")), model.config.to_dict(), SHAPE_KEYS)]
    if peft is not None:
        pairs.append((adapter, peft.to_dict(), ADAPTER_KEYS))
    differences = []
    for saved, ours, keys in pairs:
        if saved is None:
            continue
        saved, ours = _comparable(saved, keys), _comparable(ours, keys)
        differences += [f"{k} {saved.get(k)}, here {ours.get(k)}" for k in keys if saved.get(k) != ours.get(k)]
    return "; ".join(differences) or None


def check_resumable(checkpoint: str, model, args) -> None:
    """One line, before training, for a checkpoint of another model."""
    mismatch = checkpoint_mismatch(checkpoint, model)
    if mismatch is None:
        return
    if resumes_from_output_dir(args):
        raise UserError(
            f"output_dir: {checkpoint}, the checkpoint this run would resume from, does not fit its model "
            f"({mismatch}); give this run its own output_dir, or delete that run's checkpoints to start over"
        )
    raise UserError(
        f"resume_from_checkpoint: {checkpoint} does not fit this run's model ({mismatch}); name a checkpoint of this model"
    )
