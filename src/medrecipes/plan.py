"""Training math and a GPU-memory estimate for a recipe, before anything is launched.

Memory per device, in GiB, with P parameters, G devices, micro-batch b, sequence s:

- model states (mixed precision with AdamW, as in the ZeRO paper): bf16 weights 2P, bf16
  gradients 2P, fp32 master weights and two moments 12P. DDP holds all of them on every
  device; ZeRO-2 shards gradients and optimizer states; ZeRO-3 shards everything.
- activations kept for backward, per layer, in bf16: 2*s*b*(6h + 4f) bytes (norm inputs and
  outputs, q/k/v, attention output, MLP gate, up, activation and product; flash/sdpa
  attention keeps no s*s matrix). With activation checkpointing only each layer's input,
  2*s*b*h bytes, is kept, plus one layer's full activations during recomputation.
- logits: s*b*V*10 bytes (bf16 logits, their fp32 copy in the loss and its gradient); for a
  262k vocabulary this term dominates, which is why fused or chunked cross-entropy matters.

It is an estimate for choosing a strategy and batch size: allocator fragmentation, CUDA
context (~1 GiB) and communication buffers come on top.
"""

import math
from dataclasses import asdict, dataclass

import torch

from medrecipes.config import RecipeArguments, resolve_token_budget
from medrecipes.errors import UserError, did_you_mean
from medrecipes.models import load_config, scratch_config

GIB = 2**30
# Usable memory per device (GiB) and dense bf16 peak (TFLOP/s) by GPU type.
GPUS = {
    "h100-80gb": (80, 989),
    "h200-141gb": (141, 989),
    "a100-80gb": (80, 312),
    "a100-40gb": (40, 312),
    "l40s-48gb": (48, 362),
    "a6000-48gb": (48, 155),
    "a10g-24gb": (24, 70),
    "rtx4090-24gb": (24, 165),
}
STRATEGIES = ("ddp", "zero2", "zero3")


@dataclass
class ModelShape:
    num_parameters: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    vocab_size: int


def model_config(recipe: RecipeArguments, model_name_or_path: str | None):
    """The config of the recipe's model: a scratch architecture, or the pretrained model's."""
    if recipe.init_from_scratch:
        return scratch_config(recipe.architecture)
    if not model_name_or_path:
        raise UserError("plan: the recipe names no model_name_or_path")
    return load_config(model_name_or_path)


def model_shape(config) -> ModelShape:
    """Exact parameter count (a model built on the meta device) and the shapes the estimate needs."""
    from transformers import AutoModelForCausalLM

    config = getattr(config, "text_config", None) or config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return ModelShape(
        num_parameters=model.num_parameters(),
        hidden_size=config.hidden_size,
        # GPT-2 names its MLP width n_inner, None meaning 4 x hidden.
        intermediate_size=getattr(config, "intermediate_size", None)
        or getattr(config, "n_inner", None)
        or 4 * config.hidden_size,
        num_layers=config.num_hidden_layers,
        vocab_size=config.vocab_size,
    )


def memory_per_device(shape: ModelShape, num_devices: int, batch: int, seq: int, checkpointing: bool) -> dict:
    """GiB per device by strategy: {strategy: {weights, gradients, optimizer, activations, total}}."""
    p, h, f, layers = shape.num_parameters, shape.hidden_size, shape.intermediate_size, shape.num_layers
    per_layer = 2 * seq * batch * (6 * h + 4 * f)
    if checkpointing:
        activations = layers * 2 * seq * batch * h + per_layer
    else:
        activations = layers * per_layer
    activations += 10 * seq * batch * shape.vocab_size
    shards = {"ddp": (1, 1, 1), "zero2": (1, num_devices, num_devices), "zero3": (num_devices,) * 3}
    estimate = {}
    for strategy in STRATEGIES:
        w, g, o = shards[strategy]
        parts = {"weights": 2 * p / w, "gradients": 2 * p / g, "optimizer": 12 * p / o, "activations": activations}
        parts = {k: round(v / GIB, 2) for k, v in parts.items()}
        parts["total"] = round(sum(parts.values()), 2)
        estimate[strategy] = parts
    return estimate


def plan(
    recipe,
    training_args,
    model_args,
    path: str,
    num_gpus: int = 1,
    gpu: str = "h100-80gb",
    dataset_sequences: int | None = None,
) -> dict:
    """Sequences and tokens per step, steps, tokens seen, parameters and memory for `num_gpus` devices."""
    if gpu not in GPUS:
        raise UserError(f"plan: unknown --gpu '{gpu}'{did_you_mean(gpu, GPUS)}; one of {', '.join(GPUS)}")
    resolve_token_budget(recipe, training_args, path, world_size=num_gpus)
    seq = training_args.max_length
    sequences_per_step = (
        training_args.per_device_train_batch_size * num_gpus * training_args.gradient_accumulation_steps
    )
    tokens_per_step = sequences_per_step * seq
    steps_per_epoch = dataset_sequences / sequences_per_step if dataset_sequences else None
    if training_args.max_steps > 0:
        total_steps = training_args.max_steps
    elif dataset_sequences:
        total_steps = math.ceil(training_args.num_train_epochs * dataset_sequences / sequences_per_step)
    else:
        total_steps = None
    shape = model_shape(model_config(recipe, model_args.model_name_or_path))
    memory = memory_per_device(
        shape, num_gpus, training_args.per_device_train_batch_size, seq, training_args.activation_checkpointing
    )
    capacity, _ = GPUS[gpu]
    return {
        "recipe": path,
        "num_gpus": num_gpus,
        "gpu": gpu,
        "sequence_length": seq,
        "per_device_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "sequences_per_step": sequences_per_step,
        "tokens_per_step": tokens_per_step,
        "dataset_sequences": dataset_sequences,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "total_tokens": total_steps * tokens_per_step if total_steps else None,
        "activation_checkpointing": training_args.activation_checkpointing,
        "num_parameters": shape.num_parameters,
        "model": asdict(shape),
        "memory_gb": {s: m["total"] for s, m in memory.items()},
        "memory_breakdown_gb": memory,
        "fits": {s: m["total"] <= capacity for s, m in memory.items()},
    }


def format_plan(result: dict) -> str:
    """The plan as the lines `medrecipes plan` prints."""

    def num(value, spec=","):
        return "unknown (pass --dataset-sequences)" if value is None else format(value, spec)

    lines = [
        f"recipe            {result['recipe']}",
        f"devices           {result['num_gpus']} x {result['gpu']}",
        f"per step          {result['per_device_batch_size']} x {result['num_gpus']} x "
        f"{result['gradient_accumulation_steps']} (accumulation) = {result['sequences_per_step']:,} sequences "
        f"of {result['sequence_length']:,} = {result['tokens_per_step']:,} tokens",
        f"steps per epoch   {num(result['steps_per_epoch'], ',.1f')}",
        f"total steps       {num(result['total_steps'])}",
        f"tokens seen       {num(result['total_tokens'])}",
        f"parameters        {result['num_parameters']:,}",
        f"memory per device (GiB; activation checkpointing {'on' if result['activation_checkpointing'] else 'off'}):",
        "  strategy   weights  grads  optim  activ  total  fits",
    ]
    for strategy, m in result["memory_breakdown_gb"].items():
        lines.append(
            f"  {strategy:<9}{m['weights']:>8.1f}{m['gradients']:>7.1f}{m['optimizer']:>7.1f}"
            f"{m['activations']:>7.1f}{m['total']:>7.1f}  {'yes' if result['fits'][strategy] else 'no'}"
        )
    return "\n".join(lines)
