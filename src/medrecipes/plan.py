"""Training math and a GPU-memory estimate for a recipe, before anything is launched.

Memory per device, in GiB, with P parameters, G devices, micro-batch b, sequence s:

- model states (mixed precision with AdamW, as in the ZeRO paper): bf16 weights 2P, bf16
  gradients 2P, fp32 master weights and two moments 12P. DDP holds all of them on every
  device; ZeRO-2 shards gradients and optimizer states; ZeRO-3 shards everything. An 8-bit
  optimizer (an `optim` containing "8bit") keeps 8-bit moments: 2 + 4 bytes instead of 12.
- with `use_peft: true` (LoRA) only adapters are trained: a linear layer of in x out
  features gains matrices A (r x in) and B (out x r), r*(in + out) parameters. The adapter
  count n sums that over the targeted layers (`lora_target_modules`; by default
  q/k/v/o/gate/up/down_proj of every layer; "all-linear" is every linear layer but the
  output one), plus `out` per layer with DoRA and whole copies of `lora_modules_to_save`.
  Model states are then the frozen base plus 2n weights, 2n gradients and 12n (or 6n)
  optimizer states. The frozen base takes 2P in bf16. With `load_in_4bit` (QLoRA)
  bitsandbytes packs the weight matrices of the linear layers, L parameters, into 4 bits
  with one fp32 absmax constant per block of 64: 0.5 + 4/64 = 0.5625 bytes per parameter.
  `use_bnb_nested_quant` quantises those constants to 8 bits, with one fp32 constant per
  256 of them: 8/64 + 32/(64*256) = 0.127 bits per parameter, 0.5 + 0.127/8 = 0.516 bytes.
  Embeddings, norms, biases and the output layer stay in bf16, so the base takes
  L*(0.5625 or 0.516) + 2*(P - L). `load_in_8bit` stores L at 1 byte plus one fp32 scale per
  output row. Each strategy shards as for full fine-tuning, ZeRO-3 the frozen base too.
- activations kept for backward, per layer, in bf16: 2*s*b*(6h + 4f) bytes (norm inputs and
  outputs, q/k/v, attention output, MLP gate, up, activation and product; flash/sdpa
  attention keeps no s*s matrix). With activation checkpointing only each layer's input,
  2*s*b*h bytes, is kept, plus one layer's full activations during recomputation. LoRA's
  own r-wide activations are small beside these and left out.
- logits: s*b*V*10 bytes (bf16 logits, their fp32 copy in the loss and its gradient); for a
  262k vocabulary this term dominates, which is why fused or chunked cross-entropy matters.
  Through TRL's chunked LM head (TRL's SFT and GRPO trainers always; CPT with `fused_lm_head`,
  the default) only a tile of them exists at a time, and the term is left out.

- GRPO: a sequence is a prompt (`--prompt-tokens`, the data's length, which the recipe does not
  fix) and its completion (`max_completion_length`). With `beta > 0` and no LoRA, TRL loads a
  reference model in the policy's dtype (4P bytes for float32, else 2P), sharded by ZeRO-3 only.
  Generation with transformers (not vLLM, whose share is `vllm_gpu_memory_utilization`) runs
  on the whole generation batch of a process at once, per_device_train_batch_size x
  steps_per_generation sequences (the accumulation, unless the recipe sets steps_per_generation
  or generation_batch_size), and keeps their KV cache: 2 (keys, values) x layers x kv_width x
  tokens x sequences x 2 bytes (bf16), kv_width being key/value heads x head dimension. ZeRO-3
  gathers the whole model's weights for it (TRL's `ds3_gather_for_generation`). Gradients are
  freed between steps, so the peak is weights + optimizer + reference + the larger of
  (gradients + activations) and (the generation's share).

It is an estimate for choosing a strategy and batch size: allocator fragmentation, CUDA
context (~1 GiB) and communication buffers come on top.
"""

import math
import re
from dataclasses import asdict, dataclass

import torch

from medrecipes.config import (
    MedDPOConfig,
    MedGRPOConfig,
    MedKTOConfig,
    RecipeArguments,
    prompts_per_step_accumulation,
    resolve_token_budget,
)
from medrecipes.errors import UserError, did_you_mean
from medrecipes.models import PRESETS, load_config, missing_local_model, scratch_config

GIB = 2**30
# Usable memory per device (GiB) and dense bf16 peak (TFLOP/s) by GPU type (vendor data sheets,
# without sparsity; SXM parts where there is a choice).
GPUS = {
    "b200-180gb": (180, 2250),
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
# The card sizes `fits_by_gpu` answers for (GiB).
CARD_SIZES = (24, 48, 80)
# The attention and MLP projections of Llama-style decoders (Llama, Gemma, Qwen, Mistral).
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Bytes per 4-bit parameter: packed weights plus fp32 absmax per 64, or its nested 8-bit form.
NF4_BYTES = 0.5 + 4 / 64
NF4_NESTED_BYTES = 0.5 + (8 / 64 + 32 / (64 * 256)) / 8


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


@dataclass
class Method:
    """What is trained and what the frozen part costs: full fine-tuning, LoRA or QLoRA."""

    name: str  # "full", "lora" or "qlora"
    trainable_parameters: int
    adapter_parameters: int = 0
    frozen_weight_bytes: float = 0.0
    base_weight_bits: int = 16
    optimizer_bytes: int = 12  # per trainable parameter


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
            f"plan: {model_name_or_path}: no such folder; train it first, or plan with the architecture it "
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


# How `torch.cuda.get_device_name()` spells each GPU type of the table, most specific first.
DEVICE_NAMES = (
    ("B200", "b200-180gb"),
    ("H200", "h200-141gb"),
    ("H100", "h100-80gb"),
    ("A100-SXM4-40GB", "a100-40gb"),
    ("A100-PCIE-40GB", "a100-40gb"),
    ("A100", "a100-80gb"),
    ("L40S", "l40s-48gb"),
    ("A6000", "a6000-48gb"),
    ("A10G", "a10g-24gb"),
    ("4090", "rtx4090-24gb"),
)


def gpu_type(device_name: str) -> str | None:
    """The GPUS key of a CUDA device name such as 'NVIDIA H100 80GB HBM3', or None if not listed."""
    for fragment, key in DEVICE_NAMES:
        if fragment.lower() in device_name.lower():
            return key
    return None


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


def optimizer_bytes(optim) -> int:
    """Optimizer bytes per trained parameter: fp32 master weights and two Adam moments."""
    name = str(getattr(optim, "value", optim)).lower()
    if "8bit" in name:
        return 4 + 2
    if "4bit" in name:
        return 4 + 1
    return 4 + 8


def training_method(model, shape: ModelShape, model_args, training_args, path: str) -> Method:
    """Full fine-tuning, or the adapters and frozen base of a LoRA/QLoRA recipe."""
    opt = optimizer_bytes(getattr(training_args, "optim", "adamw_torch"))
    in_4bit = getattr(model_args, "load_in_4bit", False)
    in_8bit = getattr(model_args, "load_in_8bit", False)
    if not getattr(model_args, "use_peft", False):  # config.parse_recipe refuses k-bit without it
        return Method("full", shape.num_parameters, optimizer_bytes=opt)
    r = model_args.lora_r
    layers = linear_layers(model)
    adapted = lora_targets(layers, model_args.lora_target_modules, path)
    adapters = sum(r * (layers[n][0] + layers[n][1]) for n in adapted)
    if getattr(model_args, "use_dora", False):
        adapters += sum(layers[n][1] for n in adapted)  # one magnitude per output feature
    saved = model_args.lora_modules_to_save or []
    # Modules to save are trained as whole copies beside the frozen originals.
    copies = {id(p): p.numel() for n, m in model.named_modules() if _matches(n, saved) for p in m.parameters()}
    adapters += sum(copies.values())
    quantised = sum(i * o for i, o in layers.values())
    if in_4bit:
        per_param = NF4_NESTED_BYTES if getattr(model_args, "use_bnb_nested_quant", False) else NF4_BYTES
        base = quantised * per_param + 2 * (shape.num_parameters - quantised)
        bits = 4
    elif in_8bit:
        base = quantised + 4 * sum(o for _, o in layers.values()) + 2 * (shape.num_parameters - quantised)
        bits = 8
    else:
        base, bits = 2 * shape.num_parameters, 16
    return Method("qlora" if bits < 16 else "lora", adapters, adapters, base, bits, opt)


def memory_per_device(
    shape: ModelShape,
    num_devices: int,
    batch: int,
    seq: int,
    checkpointing: bool,
    method: Method | None = None,
    fused_loss: bool = False,
    reference_bytes: float = 0.0,
    generation: tuple[int, int] | None = None,
) -> dict:
    """GiB per device by strategy: {strategy: {weights, gradients, optimizer, activations,
    reference, generation, total}}.

    `method` defaults to full fine-tuning with AdamW; weights include a frozen base. With
    `fused_loss` the logits are computed in tiles and not counted. GRPO: `reference_bytes`, a
    reference model's weights; `generation`, (sequences, tokens each) generated at once."""
    method = method or Method("full", shape.num_parameters)
    h, f, layers = shape.hidden_size, shape.intermediate_size, shape.num_layers
    per_layer = 2 * seq * batch * (6 * h + 4 * f)
    if checkpointing:
        activations = layers * 2 * seq * batch * h + per_layer
    else:
        activations = layers * per_layer
    if not fused_loss:
        activations += 10 * seq * batch * shape.vocab_size
    shards = {"ddp": (1, 1, 1), "zero2": (1, num_devices, num_devices), "zero3": (num_devices,) * 3}
    t = method.trainable_parameters
    sequences, tokens = generation or (0, 0)
    kv_cache = 2 * layers * shape.kv_width * tokens * sequences * 2
    whole = method.frozen_weight_bytes + 2 * t  # every weight, before sharding
    estimate = {}
    for strategy in STRATEGIES:
        w, g, o = shards[strategy]
        parts = {
            "weights": whole / w,
            "gradients": 2 * t / g,
            "optimizer": method.optimizer_bytes * t / o,
            "activations": activations,
            "reference": reference_bytes / w,
            # ZeRO-3 gathers the whole model to generate: its other shards come on top.
            "generation": kv_cache + (whole - whole / w if generation else 0),
        }
        parts = {k: round(v / GIB, 2) for k, v in parts.items()}
        training = parts["gradients"] + parts["activations"]
        held = parts["weights"] + parts["optimizer"] + parts["reference"]
        parts["total"] = round(held + max(training, parts["generation"]), 2)
        estimate[strategy] = parts
    return estimate


def fused_loss_on(training_args) -> bool:
    """Whether the loss goes through TRL's chunked LM head on the GPUs planned for: the CPT
    recipe's `fused_lm_head` (its default, None, is on where a GPU trains); TRL's SFT and GRPO
    trainers (1.16) always use it and have no such field."""
    return getattr(training_args, "fused_lm_head", True) is not False


def checkpointing_on(training_args) -> bool:
    """Activation checkpointing under either of its names in the trainer's arguments."""
    return bool(
        getattr(training_args, "activation_checkpointing", False)
        or getattr(training_args, "gradient_checkpointing", False)
    )


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
    grpo = isinstance(training_args, MedGRPOConfig)
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
    config = model_config(recipe, model_args.model_name_or_path)
    model = meta_model(config)
    shape = model_shape(config, model)
    method = training_method(model, shape, model_args, training_args, path)
    checkpointing = checkpointing_on(training_args)
    fused = fused_loss_on(training_args)
    # A frozen copy of the model is held by GRPO with a KL term and by DPO and KTO unless their
    # reference log-probabilities are computed once before training; with LoRA it is the base.
    preference = isinstance(training_args, MedDPOConfig | MedKTOConfig)
    reference = method.name == "full" and (
        (grpo and training_args.beta > 0) or (preference and not training_args.precompute_ref_log_probs)
    )
    # DPO runs a pair's chosen and rejected answers through the model together: two sequences
    # with activations for each in the batch (KTO's mismatched answers for its KL estimate run
    # without gradients).
    trained_batch = training_args.per_device_train_batch_size * (2 if isinstance(training_args, MedDPOConfig) else 1)
    generation = None
    if grpo and not training_args.use_vllm:
        per_device = training_args.per_device_train_batch_size * training_args.steps_per_generation_on(num_gpus)
        generation = (per_device, seq)
    memory = memory_per_device(
        shape,
        num_gpus,
        trained_batch,
        seq,
        checkpointing,
        method,
        fused,
        reference_bytes=(4 if model_args.dtype == "float32" else 2) * shape.num_parameters if reference else 0,
        generation=generation,
    )
    capacity, _ = GPUS[gpu]
    return {
        "recipe": path,
        "num_gpus": num_gpus,
        "gpu": gpu,
        "sequence_length": seq,
        "grpo": grpo,
        "preference": "pairs" if isinstance(training_args, MedDPOConfig) else "answers" if preference else None,
        "prompt_tokens": prompt_tokens,
        "reference_model": reference,
        "generation_sequences": generation[0] if generation else None,
        "per_device_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "sequences_per_step": sequences_per_step,
        "tokens_per_step": tokens_per_step,
        "dataset_sequences": dataset_sequences,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "total_tokens": total_steps * tokens_per_step if total_steps else None,
        "activation_checkpointing": checkpointing,
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
        f"memory per device (GiB; activation checkpointing {'on' if result['activation_checkpointing'] else 'off'}, "
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


def for_world_size(recipe, training_args, path: str, world_size: int) -> None:
    """The recipe's settings that depend on how many processes train, derived (or refused in one
    line) for `world_size`, the same for `plan` and `launch-plan`: the token budget's steps and
    accumulation, GRPO's accumulation from its prompts per step and the micro-batches it
    generates at once."""
    resolve_token_budget(recipe, training_args, path, world_size=world_size)
    if getattr(training_args, "prompts_per_step", None) is not None:  # GRPO counts its batch in prompts
        training_args.gradient_accumulation_steps = prompts_per_step_accumulation(training_args, world_size)
    if isinstance(training_args, MedGRPOConfig):
        training_args.steps_per_generation_on(world_size)


def launch_plan(recipe, training_args, path: str, nodes: int, gpus_per_node: int) -> dict:
    """How a multi-node launch starts this recipe: training nodes and processes, the gradient
    accumulation the recipe derives for them, and whether one node serves vLLM (GRPO with
    `vllm_mode: server`, where generation runs on a node of its own)."""
    if nodes < 1 or gpus_per_node < 1:
        raise UserError(f"launch-plan: need at least one node and one GPU per node, got {nodes} x {gpus_per_node}")
    vllm_server = (
        bool(getattr(training_args, "use_vllm", False)) and getattr(training_args, "vllm_mode", "") == "server"
    )
    train_nodes = nodes - int(vllm_server)
    if train_nodes < 1:
        raise UserError(f"{path}: vllm_mode server takes a node of its own; launch on 2 nodes or more")
    processes = train_nodes * gpus_per_node
    for_world_size(recipe, training_args, path, processes)
    return {
        "TRAIN_NODES": train_nodes,
        "NUM_PROCESSES": processes,
        "GRADIENT_ACCUMULATION_STEPS": training_args.gradient_accumulation_steps,
        "OUTPUT_DIR": training_args.output_dir,
        "PREEMPTION_GRACE_SECONDS": math.ceil(recipe.preemption_grace_seconds),
        "VLLM_SERVER": int(vllm_server),
        "VLLM_PORT": getattr(training_args, "vllm_server_port", 8000),
        "VLLM_TENSOR_PARALLEL_SIZE": getattr(training_args, "vllm_tensor_parallel_size", 1),
    }
