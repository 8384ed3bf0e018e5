"""The plan of a recipe before anything is launched (`medrecipes plan`): its training math (tokens,
steps, accumulation), the memory per device of each strategy and which fit, and its table."""

import math
from dataclasses import asdict

from medrecipes.config import method_of_args
from medrecipes.config.schema import zero_stage
from medrecipes.errors import UserError, did_you_mean
from medrecipes.plan.hardware import GIB, GPUS
from medrecipes.plan.launch import for_world_size
from medrecipes.plan.memory import (
    CARD_SIZES,
    checkpointing_on,
    fused_loss_on,
    memory_per_device,
    needs_checkpointing,
    training_method,
)
from medrecipes.plan.shape import meta_model, model_config, model_shape


def plan(
    recipe,
    training_args,
    model_args,
    path: str,
    num_gpus: int = 1,
    gpu: str = "h100-80gb",
    dataset_sequences: int | None = None,
    prompt_tokens: int | None = None,
) -> dict:
    """Sequences and tokens per step, steps, tokens seen, parameters and memory for `num_gpus`
    devices; for GRPO, prompts of `prompt_tokens` tokens."""
    if gpu not in GPUS:
        raise UserError(f"plan: unknown --gpu '{gpu}'{did_you_mean(gpu, GPUS)}; one of {', '.join(GPUS)}")
    trains = method_of_args(training_args)
    grpo = trains.generates
    if prompt_tokens is not None and (not grpo or prompt_tokens < 0):
        raise UserError(
            f"plan: --prompt-tokens {prompt_tokens}: "
            + ("must be 0 or more" if grpo else "is for GRPO recipes; a CPT or SFT sequence is max_length")
        )
    for_world_size(recipe, training_args, path, num_gpus)
    seq = (prompt_tokens or 0) + training_args.max_completion_length if grpo else training_args.max_length
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
    shape, method = shape_and_method(recipe, training_args, model_args, path)
    capacity, _ = GPUS[gpu]
    planned = planned_checkpointing(shape, method, training_args, model_args, num_gpus, seq, "ddp", capacity)
    chosen = planned[0] if planned else None
    checkpointing = checkpointing_on(training_args) if chosen is None else chosen
    fused = fused_loss_on(training_args)
    grpo_generation = generation_batch(training_args, num_gpus, seq)
    memory = run_memory(shape, method, training_args, model_args, num_gpus, seq, checkpointing)
    reference = reference_held(method, training_args)
    return {
        "recipe": path,
        "num_gpus": num_gpus,
        "gpu": gpu,
        "sequence_length": seq,
        "grpo": grpo,
        "preference": trains.preference,
        "prompt_tokens": prompt_tokens,
        "reference_model": reference,
        "generation_sequences": grpo_generation[0] if grpo_generation else None,
        "per_device_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "sequences_per_step": sequences_per_step,
        "tokens_per_step": tokens_per_step,
        "dataset_sequences": dataset_sequences,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "total_tokens": total_steps * tokens_per_step if total_steps else None,
        "activation_checkpointing": checkpointing,
        # "plan": the recipe left it to the memory plan, which chose it for one device of this GPU
        "activation_checkpointing_by": "recipe" if chosen is None else "plan",
        "fused_loss": fused,
        "num_parameters": shape.num_parameters,
        "method": method.name,
        "adapter_parameters": method.adapter_parameters,
        "base_weight_bits": method.base_weight_bits,
        "model": asdict(shape),
        "memory_gb": {s: m["total"] for s, m in memory.items()},
        "memory_breakdown_gb": memory,
        "fits": {s: m["total"] <= capacity for s, m in memory.items()},
        "fits_by_gpu": {str(size): memory["ddp"]["total"] <= size for size in CARD_SIZES},
    }


def shape_and_method(recipe, training_args, model_args, path: str):
    """The model's shape, from its config alone, and what the recipe trains of it."""
    config = model_config(recipe, model_args.model_name_or_path)
    model = meta_model(config)
    shape = model_shape(config, model)
    return shape, training_method(model, shape, model_args, training_args, path)


def reference_held(method, training_args) -> bool:
    """Whether a frozen copy of the model is held: by GRPO with a KL term, and by DPO and KTO unless
    their reference log-probabilities are computed once before training; with LoRA it is the base."""
    trains = method_of_args(training_args)
    return method.name == "full" and (
        (trains.generates and training_args.beta > 0)
        or (trains.preference is not None and not training_args.precompute_ref_log_probs)
    )


def generation_batch(training_args, num_gpus: int, seq: int) -> tuple[int, int] | None:
    """GRPO with transformers' generation: (sequences generated at once per device, tokens each)."""
    if method_of_args(training_args).generates and not training_args.use_vllm:
        return training_args.per_device_train_batch_size * training_args.steps_per_generation_on(num_gpus), seq
    return None


def run_memory(shape, method, training_args, model_args, num_gpus: int, seq: int, checkpointing: bool) -> dict:
    """memory_per_device for a recipe's run on `num_gpus` devices with sequences of `seq` tokens."""
    # DPO runs a pair's chosen and rejected answers through the model together: two sequences
    # with activations for each in the batch (KTO's mismatched answers for its KL estimate run
    # without gradients).
    trained_batch = training_args.per_device_train_batch_size * method_of_args(training_args).sequences_per_example
    reference_bytes = (4 if model_args.dtype == "float32" else 2) * shape.num_parameters
    return memory_per_device(
        shape,
        num_gpus,
        trained_batch,
        seq,
        checkpointing,
        method,
        fused_loss_on(training_args),
        reference_bytes=reference_bytes if reference_held(method, training_args) else 0,
        generation=generation_batch(training_args, num_gpus, seq),
    )


def planned_checkpointing(shape, method, training_args, model_args, world, seq, strategy, capacity_gib):
    """The memory plan's choice of activation checkpointing where the recipe leaves it to the plan
    (`checkpointing_by_plan`): (on, GiB a device without it), on when the run would not fit
    `capacity_gib` without it; None where the recipe chose, or for GRPO, whose prompt lengths are
    the data's, which the plan does not know before loading."""
    if not (
        getattr(training_args, "checkpointing_by_plan", False) and method_of_args(training_args).plans_checkpointing
    ):
        return None
    without = run_memory(shape, method, training_args, model_args, world, seq, False)[strategy]["total"]
    return needs_checkpointing(without, capacity_gib), without


def settle_checkpointing(recipe, training_args, model_args, capacity_gib: float | None = None) -> None:
    """Activation checkpointing for an SFT, DPO or KTO run whose recipe left it to the memory plan
    (`checkpointing_by_plan`), decided once, before the model loads: off where the plan puts the run
    without it within the device's memory (`capacity_gib`, by default the GPU's own, or on a CPU the
    memory the machine has available now), under the run's strategy and number of processes; on
    otherwise. Logged. Recomputing every layer costs a third more arithmetic on a CPU as on a GPU,
    for memory a CPU run at a small model's size does not need."""
    import logging
    import os

    import torch

    if not (
        getattr(training_args, "checkpointing_by_plan", False) and method_of_args(training_args).plans_checkpointing
    ):
        return  # as planned_checkpointing, before the device and the model's shape are read
    if capacity_gib is None:
        if training_args.use_cpu or not torch.cuda.is_available():
            import psutil

            capacity_gib = psutil.virtual_memory().available / GIB
        else:
            capacity_gib = torch.cuda.mem_get_info()[1] / GIB
    stage = zero_stage()
    fsdp = os.environ.get("ACCELERATE_USE_FSDP", "").lower() in ("1", "true")
    strategy = "zero3" if stage == "3" or fsdp else "zero2" if stage == "2" else "ddp"
    shape, method = shape_and_method(recipe, training_args, model_args, "recipe")
    world = max(training_args.world_size, 1)
    seq = training_args.max_length
    needed, without = planned_checkpointing(
        shape, method, training_args, model_args, world, seq, strategy, capacity_gib
    )
    training_args.activation_checkpointing = training_args.gradient_checkpointing = needed
    logging.getLogger(__name__).info(
        "activation checkpointing %s: the memory plan puts this run (%s, %d processes) at %.1f GiB a device "
        "without it, of %.0f GiB",
        "on" if needed else "off",
        strategy,
        world,
        without,
        capacity_gib,
    )


# The memory table's columns: memory_per_device's part, its heading and width; GRPO adds the last two.
COLUMNS = (
    ("weights", "weights", 8),
    ("gradients", "grads", 7),
    ("optimizer", "optim", 7),
    ("activations", "activ", 7),
    ("reference", "ref", 7),
    ("generation", "gen", 7),
)


def format_plan(result: dict) -> str:
    """The plan as the lines `medrecipes plan` prints."""

    def num(value, spec=","):
        return "unknown (pass --dataset-sequences)" if value is None else format(value, spec)

    if result["method"] == "full":
        method = "full fine-tuning, every parameter trained"
    else:
        share = result["adapter_parameters"] / result["num_parameters"]
        method = (
            f"{result['method']}, {result['adapter_parameters']:,} adapter parameters trained ({share:.2%}) "
            f"on a frozen {result['base_weight_bits']}-bit base"
        )
    fits = ", ".join(f"{size} GB {'yes' if ok else 'no'}" for size, ok in result["fits_by_gpu"].items())
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
        f"method            {method}",
    ]
    columns = COLUMNS if result["grpo"] else COLUMNS[:5] if result["preference"] else COLUMNS[:4]
    if result["preference"]:
        lines += [
            f"preference        each sequence is one of the {result['preference']}"
            + (" (chosen and rejected: 2 sequences of activations each)" if result["preference"] == "pairs" else ""),
            f"reference model   {'yes, in ref' if result['reference_model'] else 'none (precomputed, or LoRA: the base)'}",
        ]
    if result["grpo"]:
        prompts = (
            f"prompts of {result['prompt_tokens']:,} tokens"
            if result["prompt_tokens"] is not None
            else "prompts not counted (pass --prompt-tokens)"
        )
        generated = (
            f"{result['generation_sequences']:,} sequences at once per device (gen: their KV cache)"
            if result["generation_sequences"]
            else "by vLLM, in its own memory share (vllm_gpu_memory_utilization)"
        )
        lines += [
            f"GRPO sequences    {prompts} + completions",
            f"reference model   {'yes, in ref' if result['reference_model'] else 'none (beta 0, or LoRA: the base)'}",
            f"generation        {generated}",
        ]
    lines += [
        f"memory per device (GiB; activation checkpointing {'on' if result['activation_checkpointing'] else 'off'}"
        + (
            " (the plan's choice: ddp without it would not fit)"
            if result["activation_checkpointing_by"] == "plan" and result["activation_checkpointing"]
            else " (the plan's choice: ddp fits without it)"
            if result["activation_checkpointing_by"] == "plan"
            else ""
        )
        + ", "
        f"logits {'in tiles, not counted' if result['fused_loss'] else 'counted'}"
        + ("; total: the larger of grads + activ and gen" if result["grpo"] else "")
        + "):",
        f"  {'strategy':<9}" + "".join(f"{label:>{width}}" for _, label, width in columns) + "  total  fits",
    ]
    for strategy, m in result["memory_breakdown_gb"].items():
        lines.append(
            f"  {strategy:<9}"
            + "".join(f"{m[part]:>{width}.1f}" for part, _, width in columns)
            + f"{m['total']:>7.1f}  {'yes' if result['fits'][strategy] else 'no'}"
        )
    lines.append(f"ddp fits on       {fits}")
    return "\n".join(lines)
