"""The GPU-memory estimate of a recipe's training, per device and ZeRO strategy.

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

from dataclasses import dataclass

from medrecipes.plan.hardware import GIB
from medrecipes.plan.shape import ModelShape, _matches, linear_layers, lora_targets

STRATEGIES = ("ddp", "zero2", "zero3")


# The card sizes `fits_by_gpu` answers for (GiB).
CARD_SIZES = (24, 48, 80)


# Bytes per 4-bit parameter: packed weights plus fp32 absmax per 64, or its nested 8-bit form.
NF4_BYTES = 0.5 + 4 / 64


NF4_NESTED_BYTES = 0.5 + (8 / 64 + 32 / (64 * 256)) / 8


@dataclass
class Method:
    """What is trained and what the frozen part costs: full fine-tuning, LoRA or QLoRA."""

    name: str  # "full", "lora" or "qlora"
    trainable_parameters: int
    adapter_parameters: int = 0
    frozen_weight_bytes: float = 0.0
    base_weight_bits: int = 16
    optimizer_bytes: int = 12  # per trainable parameter


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


# What the estimate leaves out (CUDA context, allocator fragmentation, communication buffers): a
# run is planned to fit when its estimate and this share of it, and the context, fit the device.
UNCOUNTED_SHARE, CONTEXT_GIB = 0.15, 1.5


def needs_checkpointing(without_gib: float, capacity_gib: float) -> bool:
    """Whether a run that would take `without_gib` a device without activation checkpointing needs
    it to fit a device of `capacity_gib`, with room for what the estimate leaves out."""
    return without_gib * (1 + UNCOUNTED_SHARE) + CONTEXT_GIB > capacity_gib


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
