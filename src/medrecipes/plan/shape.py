"""A model's shape as the plan counts it (parameters, widths, layers, vocabulary), read from its
config without loading weights, the FLOPs per token of training it, and the linear layers LoRA
adapts."""

import re
from dataclasses import dataclass

import torch

from medrecipes.config import (
    RecipeArguments,
)
from medrecipes.errors import UserError
from medrecipes.locations import absent
from medrecipes.models.files import missing_local_model
from medrecipes.models.loading import load_config
from medrecipes.models.scratch import PRESETS, scratch_config

# The attention and MLP projections of Llama-style decoders (Llama, Gemma, Qwen, Mistral).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class ModelShape:
    num_parameters: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    vocab_size: int
    # The input token embedding when it is not also the output layer: a lookup, no matmul.
    embedding_parameters: int = 0
    attention_width: int = 0  # heads x head dimension, the width of q and of the attention output
    kv_width: int = 0  # key/value heads x head dimension, the width of each of k and v (the KV cache)


def model_config(recipe: RecipeArguments, model_name_or_path: str | None):
    """The config of the recipe's model: a scratch architecture, or the pretrained model's. A
    recipe that starts from a checkpoint not trained yet (grpo_usmle.yaml starts from the 0.4B
    pretraining run) is planned with `--architecture`, the architecture that checkpoint will have."""
    if recipe.init_from_scratch or recipe.architecture:
        return scratch_config(recipe.architecture)
    if not model_name_or_path:
        raise UserError("plan: the recipe names no model_name_or_path")
    if missing_local_model(model_name_or_path):
        raise UserError(
            f"plan: {model_name_or_path}: {absent(model_name_or_path)}; train it first, or plan with the architecture it "
            f"will have: --architecture NAME (a preset: {', '.join(PRESETS)}; a packaged config; a config.json)"
        )
    return load_config(model_name_or_path)


def meta_model(config):
    """The causal LM of `config` on the meta device: exact shapes, no memory."""
    from transformers import AutoModelForCausalLM

    config = getattr(config, "text_config", None) or config
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def full_numel(parameter) -> int:
    """Elements of a parameter as the model defines it, also when DeepSpeed ZeRO-3 holds only a
    shard of it here or bitsandbytes packs it into 4 bits."""
    if hasattr(parameter, "ds_numel"):
        return parameter.ds_numel
    quant_state = getattr(parameter, "quant_state", None)
    return quant_state.shape.numel() if quant_state is not None else parameter.numel()


def model_shape(config, model=None) -> ModelShape:
    """Exact parameter count and the shapes the estimates need, of `model` (a live one, sharded
    or quantised or not) or of a model built on the meta device from `config`."""
    config = getattr(config, "text_config", None) or config
    model = model if model is not None else meta_model(config)
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    untied = output is None or output.weight is not embedding.weight
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return ModelShape(
        num_parameters=sum(full_numel(p) for p in model.parameters()),
        hidden_size=config.hidden_size,
        # GPT-2 names its MLP width n_inner, None meaning 4 x hidden.
        intermediate_size=getattr(config, "intermediate_size", None)
        or getattr(config, "n_inner", None)
        or 4 * config.hidden_size,
        num_layers=config.num_hidden_layers,
        vocab_size=config.vocab_size,
        embedding_parameters=full_numel(embedding.weight) if untied else 0,
        attention_width=heads * head_dim,
        kv_width=(getattr(config, "num_key_value_heads", None) or heads) * head_dim,
    )


def flops_per_token(shape: ModelShape, seq_len: float, trains_base: bool = True) -> float:
    """Training FLOPs per token, forward and backward, in the PaLM paper's form (appendix B):

        6 N + 12 L d S

    N parameters that multiply activations (the input token embedding is a lookup and is left
    out unless it doubles as the output layer), L layers, d attention width (heads x head
    dimension), S tokens per sequence. 6N: 2N in the forward pass, 4N in the backward (input and
    weight gradients); 12LdS: the score and value matmuls, forward and backward, counted over
    the whole S x S matrix as the standard form does, although causal masking skips half of it.
    A frozen base (LoRA) computes no weight gradients: 4N. Recomputation under activation
    checkpointing is not counted, so MFU stays comparable across settings.
    """
    dense = (6 if trains_base else 4) * (shape.num_parameters - shape.embedding_parameters)
    return dense + 12 * shape.num_layers * shape.attention_width * seq_len


def linear_layers(model) -> dict[str, tuple[int, int]]:
    """(in, out) features by module name of the layers that LoRA targets and bitsandbytes
    quantises: torch Linear and GPT-2's Conv1D, the output layer excluded."""
    from transformers.pytorch_utils import Conv1D

    output = model.get_output_embeddings()
    layers = {}
    for name, module in model.named_modules():
        if module is output:
            continue
        # Exact type: subclasses of Linear (e.g. quantised ones) are not plain linear layers.
        if type(module) is torch.nn.Linear:
            layers[name] = (module.in_features, module.out_features)
        elif isinstance(module, Conv1D):
            layers[name] = tuple(module.weight.shape)  # Conv1D stores its weight as in x out
    return layers


def _matches(name: str, targets: list[str]) -> bool:
    # PEFT's rule for a list of names: the full module name, or its last dotted components.
    return any(name == t or name.endswith("." + t) for t in targets)


def lora_targets(layers: dict[str, tuple[int, int]], targets, path: str) -> list[str]:
    """The names of the linear layers a LoRA with `lora_target_modules` = `targets` adapts."""
    if targets is None:
        targets = list(DEFAULT_LORA_TARGETS)
    if isinstance(targets, str) and targets != "all-linear":
        chosen = [n for n in layers if re.fullmatch(targets, n)]  # PEFT reads a single string as a regex
    elif targets in ("all-linear", ["all-linear"]):
        chosen = list(layers)
    else:
        chosen = [n for n in layers if _matches(n, targets)]
    if not chosen:
        suffixes = sorted({n.rsplit(".", 1)[-1] for n in layers})
        shown = targets if isinstance(targets, str) else ", ".join(targets)
        raise UserError(
            f"{path}: lora_target_modules ({shown}) match no linear layer of the model; "
            f"its layers are named {', '.join(suffixes)}, or use all-linear"
        )
    return chosen
