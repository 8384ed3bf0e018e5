"""The trainer configs with this project's defaults: `CPTConfig` (HF's TrainingArguments),
`MedSFTConfig`, `MedDPOConfig`, `MedKTOConfig` and `MedGRPOConfig` (TRL's), each with bf16/tf32
chosen by the device, activation checkpointing as the recipe or the memory plan says, and the
ranges of its numeric keys (`schema.Bound`)."""

import importlib.util
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from transformers import TrainingArguments
from trl import DPOConfig, GRPOConfig, KTOConfig, ModelConfig, SFTConfig

from medrecipes.config.schema import ANSWER_WEIGHT, POSITIVE_BETA, Bound, check_ranges, world_size
from medrecipes.errors import UserError, first_to_report

_SAID_LAUNCHERS: set[str] = set()  # the launcher precisions said to have chosen bf16 in this process


@dataclass
class DeviceDefaults:
    """Defaults of every recipe's trainer config, chosen for speed where that is safe.

    bf16 follows `accelerate launch`'s mixed_precision where the recipe leaves it out (and a
    recipe that disagrees with the launcher is refused). Otherwise bf16 and tf32 default to on
    wherever the device supports them, and off on CPU: TRL's
    configs default bf16 to True, which fails on a CPU machine even just to validate or plan a
    GPU recipe; HF's TrainingArguments default it to False, which is slow on GPUs.
    `logging_nan_inf_filter` defaults to off: the trainer reads every micro-batch's loss on the
    host to filter it, a device sync per micro-batch, while `NonFiniteGuard` already acts on any
    non-finite step (a non-finite loss always reaches the gradient norm it reads).
    """

    bf16: bool | None = field(default=None, metadata={"help": "bf16 mixed precision (default: when supported)."})
    tf32: bool | None = field(default=None, metadata={"help": "TF32 matmuls (default: on Ampere or newer)."})
    report_to: str | list[str] = field(
        default="tensorboard", metadata={"help": "Loggers: tensorboard, wandb, trackio, none."}
    )
    # The recipes push final/ with a model card at the end (medrecipes.hub) and checkpoints to
    # branches (push_checkpoint_revisions); HF's default, every_save, would also push output_dir.
    hub_strategy: str = field(default="end", metadata={"help": "Trainer pushes during training: end, every_save."})
    logging_nan_inf_filter: bool = field(
        default=False, metadata={"help": "Replace NaN/inf losses in the logs (a host sync per micro-batch)."}
    )

    def __post_init__(self):
        import torch

        check_ranges(self)
        # argparse gives a list-typed key that the recipe leaves out None, not the default above.
        if self.report_to is None:
            self.report_to = "tensorboard"
        gpu = not self.use_cpu and torch.cuda.is_available()
        launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")  # `accelerate launch`'s, from its config or flag
        device_bf16 = gpu and torch.cuda.is_bf16_supported()
        left_out = self.bf16 is None and not self.fp16
        self.bf16 = launch_precision(self.bf16, self.fp16, launcher, device_bf16, ENVIRONMENT_PRECISION)
        said = launcher in _SAID_LAUNCHERS  # once, though parsed twice, and by a node's first process only
        if left_out and self.bf16 != device_bf16 and not said and first_to_report("bf16-note"):
            _SAID_LAUNCHERS.add(launcher)  # a shell's leftover looks the same as a launch's
            logging.getLogger("medrecipes").warning(
                "bf16 is %s because ACCELERATE_MIXED_PRECISION is %s (accelerate launch's mixed_precision, or left "
                "in this shell's environment), where this device would train with bf16 %s; set bf16 in the recipe, "
                "or unset the variable where no accelerate launch runs this",
                str(self.bf16).lower(), launcher, str(device_bf16).lower(),
            )  # fmt: skip
        if self.tf32 is None:
            self.tf32 = gpu and torch.cuda.get_device_capability()[0] >= 8
        elif self.tf32 and not (
            torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
        ):  # transformers names no fix
            raise ValueError(
                "tf32: true needs an NVIDIA GPU of Ampere or newer (TF32 is its matmul format), and this machine has "
                "none; drop it (a recipe turns tf32 on where the GPU has it)"
            )
        super().__post_init__()


# How a launcher's precision is named where it was read from the environment, not a config file.
ENVIRONMENT_PRECISION = (
    "ACCELERATE_MIXED_PRECISION is {launcher} (accelerate launch's mixed_precision, or left in this shell's "
    "environment) but the recipe trains with {ours}; pass --mixed_precision {ours} to accelerate launch or unset "
    "the variable where no launch runs this, or set bf16/fp16 in the recipe to match"
)
CONFIG_PRECISION = (
    "accelerate launch runs with mixed_precision {launcher} but the recipe with {ours}; "
    "pass --mixed_precision {ours} to accelerate launch, or set bf16/fp16 in the recipe to match"
)


def launch_precision(
    bf16: bool | None, fp16: bool, launcher: str | None, device_bf16: bool, refusal: str = CONFIG_PRECISION
) -> bool:
    """bf16 as a run settles it: the recipe's; where it leaves bf16 out, the mixed_precision of
    `accelerate launch` (`launcher`, bf16 or no), else whether the device has bf16. A launcher
    that disagrees with the result is refused (ValueError, `refusal` filled in): the trainer would
    fail at build, or train in the other precision. `medrecipes validate --accelerate-config`
    asks the same of a config file."""
    if launcher is not None and launcher not in ("bf16", "fp16", "no"):  # fp8: accelerate's, not a recipe's
        raise ValueError(
            f"the launch's mixed_precision {launcher} (accelerate's, for Transformer Engine or torchao on H100-class GPUs) is "
            "none of the precisions the recipes train in (bf16, fp16 or no); set mixed_precision bf16 (or no), and leave "
            "precision to the recipe"
        )
    if bf16 is None and launcher in ("bf16", "no") and not fp16:
        bf16 = launcher == "bf16"  # the recipe leaves precision to the machine: the launcher chose
    if bf16 is None:
        bf16 = device_bf16
    ours = "bf16" if bf16 else "fp16" if fp16 else "no"
    if launcher is not None and launcher != ours:
        raise ValueError(refusal.format(launcher=launcher, ours=ours))
    return bf16


@dataclass
class CPTConfig(DeviceDefaults, TrainingArguments):
    """HF TrainingArguments with the block length of packed pretraining data and CPT defaults.

    On a GPU the loss goes through TRL's chunked LM head (`fused_lm_head`), so the (batch,
    length, vocabulary) logits are never held: at 8,192 tokens and Gemma 3's 262k vocabulary
    they would take ~21 GiB per sequence. On a CPU, where memory is not what limits a run, the
    tiles cost time (a quarter of each step at SmolLM2-135M's size, docs/benchmarks.md), so the
    default (None) is on where a GPU trains and off on a CPU; true or false is kept as written.
    Liger's kernels (`use_liger_kernel`) default to on where liger-kernel is installed and a GPU
    trains; their own fused cross-entropy is then left out, since it replaces the forward that
    carries the chunked head.
    """

    max_length: int = field(default=2048, metadata={"help": "Tokens per packed training block."})
    dataset_num_proc: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule."})
    fused_lm_head: bool | None = field(
        default=None,
        metadata={"help": "Loss through TRL's chunked LM head, without the full logits (default: on a GPU)."},
    )
    use_liger_kernel: bool | None = field(
        default=None, metadata={"help": "Liger's Triton kernels (default: on a GPU when liger-kernel is installed)."}
    )

    def __post_init__(self):
        if self.use_liger_kernel is None:
            import torch

            self.use_liger_kernel = (
                not self.use_cpu and torch.cuda.is_available() and importlib.util.find_spec("liger_kernel") is not None
            )
        if self.use_liger_kernel and self.fused_lm_head is not False:  # Liger trains on a GPU: the head is on
            self.liger_kernel_config = {**(self.liger_kernel_config or {}), "fused_linear_cross_entropy": False}
        super().__post_init__()


@dataclass
class RecipeModelConfig(ModelConfig):
    """TRL's ModelConfig, whose one refusal (4-bit and 8-bit loading at once) names the keys."""

    def __post_init__(self):
        if self.load_in_4bit and self.load_in_8bit:
            raise ValueError("set load_in_4bit or load_in_8bit, not both: a model loads in one precision")
        super().__post_init__()


@dataclass
class CheckpointingOnByDefault:
    """Activation checkpointing for the SFT, DPO, KTO and GRPO recipes: as the recipe writes it, or,
    where it writes neither name, decided by the memory plan on a GPU at the start of an SFT, DPO or
    KTO run (on only where the run would not fit without it: `plan.summary.settle_checkpointing`,
    and `medrecipes plan` shows the same choice) and on elsewhere, TRL's default. TRL's configs set
    that default through the deprecated name, `gradient_checkpointing`, so a recipe that sets
    neither would get transformers' FutureWarning about a key it never wrote; it is given here
    under the new name. A recipe that still writes the old name is honoured, with the warning."""

    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated name of activation_checkpointing."}
    )

    def __post_init__(self):
        both = (self.activation_checkpointing, self.gradient_checkpointing)
        if None not in both and bool(both[0]) != bool(both[1]):  # transformers would keep one without a word
            raise ValueError(
                f"activation_checkpointing {str(both[0]).lower()} and gradient_checkpointing {str(both[1]).lower()} "
                "(its old name) disagree; set activation_checkpointing alone"
            )
        # Not a recipe key: whether the recipe left the choice to the memory plan.
        self.checkpointing_by_plan = self.activation_checkpointing is None and self.gradient_checkpointing is None
        if self.checkpointing_by_plan:
            self.activation_checkpointing = True  # until the plan decides, and where it does not
        super().__post_init__()


@dataclass
class MedSFTConfig(DeviceDefaults, CheckpointingOnByDefault, SFTConfig):
    """TRL's SFTConfig with bf16/tf32 chosen by the device and padding-free packing on.

    Packing (best-fit decreasing, TRL's default strategy) puts several examples in each row of
    `max_length` tokens and trains without padding; each example still attends only to itself,
    through flash-attention's varlen kernels or, with sdpa and eager attention, the
    block-diagonal mask transformers builds from the restarting position_ids (tested in
    tests/test_sft_recipe.py). `per_device_train_batch_size` then counts rows of `max_length`
    tokens, not examples.
    """

    packing: bool = field(
        default=True, metadata={"help": "Pack examples into rows of max_length, padding-free (bfd)."}
    )


@dataclass
class MedDPOConfig(DeviceDefaults, CheckpointingOnByDefault, DPOConfig):
    """TRL's DPOConfig with bf16/tf32 chosen by the device. Its own keys set the objective:
    `beta`, `loss_type` (one or several of TRL's losses: sigmoid, ipo, hinge, robust, ...) with
    `loss_weights`, `precompute_ref_log_probs` (the reference's log-probabilities computed once,
    before training, so no reference is held while training). With LoRA the reference is the
    base model with the adapter switched off, never a second copy."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "beta": POSITIVE_BETA,
        "label_smoothing": Bound(
            0, True, "the share of pairs taken as mislabelled: from 0.5 on, the rejected answers win", 0.5
        ),
        "ref_model_mixup_alpha": Bound(
            0, True, "TR-DPO's share of the policy mixed into the reference at each sync", 1, high_ok=True
        ),
        "ld_alpha": Bound(0, True, "LD-DPO's weight of the tokens past the shared length", 1, high_ok=True),
    }

    def __post_init__(self):
        # TRL checks only that there is a weight for each loss_type: one below 0 trains that loss
        # backwards (toward the rejected answers, or away from the chosen), all 0 learns nothing.
        weights = self.loss_weights or []
        if any(not math.isfinite(w) or w < 0 for w in weights) or (weights and not any(w > 0 for w in weights)):
            raise ValueError(
                f"loss_weights {[float(w) for w in weights]}: each loss_type's weight must be 0 or more, and one above "
                "0 (below 0 trains that loss backwards; all 0 learns nothing)"
            )
        super().__post_init__()


@dataclass
class MedKTOConfig(DeviceDefaults, CheckpointingOnByDefault, KTOConfig):
    """TRL's KTOConfig with bf16/tf32 chosen by the device. KTO learns from single answers marked
    desirable or not (pairs are split into one of each): `beta`, `loss_type` (kto or
    apo_zero_unpaired), `desirable_weight` and `undesirable_weight` (to balance unequal counts)
    are TRL's keys. The reference is as in DPO: the adapter switched off with LoRA."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "beta": POSITIVE_BETA,
        "desirable_weight": ANSWER_WEIGHT,
        "undesirable_weight": ANSWER_WEIGHT,
    }

    def __post_init__(self):
        # KTO's KL term pairs each answer with the next one's prompt in its batch (TRL's trainer
        # raises both only once the model and data are loaded).
        if self.loss_type == "kto" and self.per_device_train_batch_size < 2:
            raise ValueError(
                f"per_device_train_batch_size {self.per_device_train_batch_size}: KTO's KL estimate needs at "
                "least 2 answers per device batch; raise it, or use loss_type apo_zero_unpaired"
            )
        if self.loss_type == "kto" and self.train_sampling_strategy != "sequential":
            raise ValueError(
                f"train_sampling_strategy {self.train_sampling_strategy}: KTO's KL estimate pairs neighbours in a "
                "batch fixed in advance; use sequential (the mixture is already shuffled with its seed)"
            )
        super().__post_init__()


@dataclass
class MedGRPOConfig(DeviceDefaults, CheckpointingOnByDefault, GRPOConfig):
    """TRL's GRPOConfig with bf16/tf32 chosen by the device, the rewards as recipe entries,
    the prompt form, a batch counted in prompts and an optional learning rate for embeddings."""

    BOUNDS: ClassVar[dict[str, Bound]] = {
        "beta": Bound(0, True, "a negative beta rewards moving away from the reference model (0: no reference)"),
        "temperature": Bound(0, False, "answers are sampled, and 0 divides the logits by zero"),
        "epsilon": Bound(0, False, "it is the clipping range of the policy ratio; 0 or less leaves no update"),
        # SAPO's soft gate divides the policy ratio's log by them: 0 makes every gradient NaN (measured)
        "sapo_temperature_pos": Bound(0, False, "it divides the gate of answers with a positive advantage"),
        "sapo_temperature_neg": Bound(0, False, "it divides the gate of answers with a negative advantage"),
        "num_iterations": Bound(1, True, "each batch of answers is trained on this many times; 0 is no training"),
        "num_generations": Bound(
            2, True, "each answer is scored against the other answers to its question, and one answer has none"
        ),
        "delta": Bound(
            1, False, "it caps the policy ratio of answers with a negative advantage; at or below 1 it clips every one"
        ),
        "num_generations_eval": Bound(
            1, True, "answers sampled per question when evaluating; TRL takes 0 for num_generations without a word"
        ),
        "top_p": Bound(
            0,
            False,
            "answers are sampled from the likeliest tokens that make up this share of the probability "
            "(1: all of them); near 0 every answer is the one greedy answer, and GRPO learns from their differences",
            1,
            high_ok=True,
        ),
        "top_entropy_quantile": Bound(
            0, True, "the share of tokens, highest entropy first, kept in the policy loss", 1, high_ok=True
        ),
        "epsilon_high": Bound(
            0, False, "it is the upper clipping range of the policy ratio; 0 or less leaves no update"
        ),
        "entropy_coef_delta": Bound(0, False, "adaptive entropy control moves its coefficient by this step"),
        "entropy_target": Bound(0, True, "it is a mean entropy, in nats, which is never below 0"),
        "entropy_coef_min": Bound(0, True, "adaptive entropy control keeps its coefficient at or above it"),
        "off_policy_mask_threshold": Bound(
            0, False, "the KL above which answers with a negative advantage are masked; at 0 or below every one is"
        ),
        "vllm_gpu_memory_utilization": Bound(
            0, False, "it is the share of each GPU's memory vLLM takes for its weights and cache", 1, high_ok=True
        ),
    }

    rewards: list[dict[str, Any]] | None = field(
        default=None,
        metadata={"help": "Rewards [{name, weight, <settings>}] (medrecipes.rewards); default usmle_accuracy."},
    )
    prompt_format: Literal["chat", "plain"] = field(
        default="chat", metadata={"help": "chat: usmle.chat_messages; plain: usmle.completion_prompt."}
    )
    prompts_per_step: int | None = field(
        default=None,
        metadata={"help": "Prompts per optimizer step over all devices; sets gradient_accumulation_steps."},
    )
    embedding_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the input embeddings (and a tied output layer)."}
    )
    compile_generation: bool = field(
        default=False,
        metadata={
            "help": "With cache_implementation: static, compile generate's decoding step (CUDA graphs on a GPU); "
            "TRL turns compilation off. pad_to_multiple_of keeps the prompts' width, so the graphs, few."
        },
    )

    def __post_init__(self):
        check_ranges(self)  # first: the accumulation below divides by the batch size
        # Before GRPOConfig derives generation_batch_size from the accumulation; WORLD_SIZE is
        # what accelerate launch and torchrun set for every process, and 1 without them.
        if self.prompts_per_step is not None:
            world = world_size()
            try:
                self.gradient_accumulation_steps = prompts_per_step_accumulation(self, world)
            except UserError as err:  # a ValueError here is the recipe's line, its file named (parse_recipe)
                launched = f" (the {world} processes: WORLD_SIZE in the environment)" if world > 1 else ""
                raise ValueError(f"{err}{launched}") from None
        # Values derived after this point, kept as the recipe set them: GRPOConfig derives each of
        # steps_per_generation and generation_batch_size from the other (or from the
        # accumulation) and refuses both set, and reward_weights come from `rewards`. The
        # resolved recipe gives these back, and `plan` derives the first two again for another
        # number of devices.
        self.set_by_recipe = {
            name: getattr(self, name) for name in ("steps_per_generation", "generation_batch_size", "reward_weights")
        }
        try:  # TRL's refusals of the generation batch name no fix: said first, as it counts
            self.steps_per_generation_on(world_size())
        except UserError as err:
            raise ValueError(str(err)) from None
        # TRL's own refusal of this names neither key nor fix: said here, as it counts (its processes too).
        evals = (self.per_device_eval_batch_size or 0) * world_size()
        if self.num_generations_eval and evals % self.num_generations_eval:
            raise ValueError(
                f"num_generations_eval {self.num_generations_eval} does not divide the eval batch of {evals} "
                f"(per_device_eval_batch_size {self.per_device_eval_batch_size} on every process): each question's "
                "answers are sampled in one batch; choose a divisor of it, or a per_device_eval_batch_size it divides"
            )
        super().__post_init__()

    def steps_per_generation_on(self, world_size: int) -> int:
        """Micro-batches a process generates at once on `world_size` processes, as GRPOConfig
        derives them there; the generation batch checked as GRPOConfig checks it, each refusal
        with its fix."""
        steps, batch = self.set_by_recipe["steps_per_generation"], self.set_by_recipe["generation_batch_size"]
        per_pass = self.per_device_train_batch_size * world_size
        processes = f"{world_size} process{'es' if world_size > 1 else ''}"
        if steps is not None and batch is not None:
            raise UserError(
                f"generation_batch_size {batch} and steps_per_generation {steps} are both set, and each is derived "
                "from the other; keep one"
            )
        if batch is not None and batch % per_pass:
            raise UserError(
                f"generation_batch_size {batch} does not divide into per_device_train_batch_size "
                f"{self.per_device_train_batch_size} x {processes} = {per_pass}; make it a multiple of {per_pass}, "
                "or leave it out (it is then that batch x gradient_accumulation_steps)"
            )
        steps = steps or (batch // per_pass if batch is not None else self.gradient_accumulation_steps)
        if (per_pass * steps) % self.num_generations:
            made = f"generation_batch_size {batch}" if batch is not None else (
                f"the generation batch of {per_pass * steps} (per_device_train_batch_size "
                f"{self.per_device_train_batch_size} x {processes} x {steps} steps_per_generation)"
            )  # fmt: skip
            raise UserError(
                f"{made} does not hold whole groups of num_generations {self.num_generations} answers, which GRPO "
                f"compares within a question; make it a multiple of {self.num_generations}"
            )
        return steps


def prompts_per_step_accumulation(args, world_size: int) -> int:
    """The gradient accumulation that puts `prompts_per_step` prompts, each with
    `num_generations` completions, in one optimizer step on `world_size` processes."""
    if args.prompts_per_step < 1:
        raise UserError(f"prompts_per_step must be at least 1, got {args.prompts_per_step}")
    completions = args.prompts_per_step * args.num_generations
    per_pass = args.per_device_train_batch_size * world_size
    if completions % per_pass:
        sizes = [d for d in divisors(completions) if d <= 64 and completions % (d * world_size) == 0]
        hint = (
            f"use per_device_train_batch_size {' or '.join(map(str, sizes[-3:]))}"
            if sizes
            else f"make prompts_per_step x num_generations a multiple of the {world_size} processes"
        )
        raise UserError(
            f"prompts_per_step {args.prompts_per_step} x num_generations {args.num_generations} = {completions} "
            f"completions do not divide into per_device_train_batch_size {args.per_device_train_batch_size} x "
            f"{world_size} processes; {hint}"
        )
    return completions // per_pass


def divisors(n: int, most: int = 1024) -> list[int]:
    """The divisors of `n` up to `most` (the sizes and process counts a hint may offer): a
    recipe's huge value must not make the reading of it count to that value."""
    return [d for d in range(1, min(n, most) + 1) if n % d == 0]
