"""Whether the checkpoint a run resumes from (`runs.resume.checkpoint_to_resume`) fits the model
in hand: a checkpoint of another model refused in one line before training."""

import json
import os

from medrecipes.errors import UserError
from medrecipes.runs.resume import resumes_from_output_dir

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
