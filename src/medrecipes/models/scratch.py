"""Models built from scratch: named architecture presets and the architectures shipped as JSON.

Scratch presets follow the "Pure Transformer" table. They are Llama-style decoders
(RMSNorm, SwiGLU MLP, RoPE, full multi-head attention with 64-dimensional heads) with tied
input/output embeddings and a 49,152-token vocabulary (the SmolLM2 tokenizer's size, a
common choice for small English models). The MLP width of each preset is the multiple of
128 that brings the total closest to the table's stated size; `medrecipes plan` prints the
exact counts, and docs/architectures.md lists them beside the stated totals."""

import json
import os
from importlib import resources

from transformers import AutoConfig, LlamaConfig

from medrecipes.errors import UserError, did_you_mean

PRESET_VOCAB_SIZE = 49152


# name: (layers, hidden size, MLP width, stated total in the table)
PRESETS = {
    "tiny": (12, 512, 2560, "85M"),
    "small": (16, 768, 2816, "178M"),
    "medium": (24, 1024, 3072, "374M"),
    "medium-large": (20, 1152, 3456, "401M"),
    "large": (24, 1536, 4096, "763M"),
    "xlarge": (32, 1920, 4864, "1.46B"),
}


def packaged_config(name: str):
    """A config shipped in medrecipes/architectures (a Hub id with '/' as '--', or a name), or None."""
    path = resources.files("medrecipes") / "architectures" / (name.replace("/", "--") + ".json")
    if not path.is_file():
        return None
    values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(values.pop("model_type"), **values)


def scratch_config(name: str, vocab_size: int | None = None, **ids):
    """The config of a scratch architecture: a preset, a packaged config (e.g. gpt2-1b) or a
    config.json path; the tokenizer's `vocab_size` and bos/eos/pad `ids` are set on it when given."""
    if name in PRESETS:
        return preset_config(name, vocab_size or PRESET_VOCAB_SIZE, **ids)
    config = packaged_config(name)
    if config is None and os.path.exists(name):
        try:
            config = AutoConfig.from_pretrained(name)
        except (OSError, ValueError, KeyError) as err:  # not JSON, no model_type, an unknown one
            raise UserError(
                f"architecture: {name} is not a model config ({str(err).splitlines()[0]}); name a config.json of "
                "a transformers model, a preset or a packaged config"
            ) from None
    if config is None:
        choices = [
            *PRESETS,
            *(p.name.removesuffix(".json") for p in (resources.files("medrecipes") / "architectures").iterdir()),
        ]
        raise UserError(
            f"architecture: unknown architecture '{name}'{did_you_mean(name, choices)}; "
            f"a preset ({', '.join(PRESETS)}), a packaged config or a config.json path"
        )
    for key, value in {"vocab_size": vocab_size, **ids}.items():
        if value is not None:
            setattr(config, key, value)
    return config


def preset_config(name: str, vocab_size: int = PRESET_VOCAB_SIZE, max_position_embeddings: int = 2048, **ids):
    """The LlamaConfig of a scratch preset; `ids` are the tokenizer's bos/eos/pad token ids."""
    if name not in PRESETS:
        raise UserError(
            f"architecture: unknown preset '{name}'{did_you_mean(name, PRESETS)}; one of {', '.join(PRESETS)}"
        )
    layers, hidden, mlp, _ = PRESETS[name]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        **{k: v for k, v in ids.items() if v is not None},
    )
