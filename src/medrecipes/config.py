"""Recipe parsing: one YAML file plus command-line overrides into typed dataclasses.

A recipe's keys are the fields of TRL's `ModelConfig`, of the trainer's config class and of
`RecipeArguments` below. `parse_recipe` wraps TRL's `TrlParser` (which reads only
`--config`) so that `python recipes/cpt.py recipes/x.yaml` works too, rejects unknown keys
at every level with a did-you-mean line, turns nested entries into dataclasses, and computes
the derived fields (token budget -> steps) once, for the actual world size.
"""

import dataclasses
import importlib.util
import math
import os
import re
import sys
import types
import typing
from argparse import ArgumentTypeError
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import yaml
from transformers import TrainingArguments
from transformers.trainer_utils import SchedulerType
from trl import GRPOConfig, ModelConfig, SFTConfig, TrlParser

from medrecipes.errors import UserError, check_choice, check_output_folder, did_you_mean, not_utf8
from medrecipes.names import EVAL_MODES, check_task_names
from medrecipes.outputs import check_new_output


@dataclass
class SourceConfig:
    """One data source: a Hub id, a `datasets` builder (json, parquet, text, csv) or a local path."""

    path: str
    name: str | None = None
    split: str = "train"
    data_files: str | list[str] | None = None
    data_dir: str | None = None
    revision: str | None = None
    text_field: str = "text"
    # "text": a column of documents; "usmle": multiple-choice rows (MedQA, MedMCQA, MMLU, PubMedQA, ...)
    # rendered for the recipe (documents for CPT, chat turns for SFT); "chat": rows kept as they are
    # (messages, or prompt/completion), for SFT.
    format: str = "text"
    weight: float = 1.0
    # fsspec options for s3://, gs://, ... URLs in `path` or `data_files` (credentials, endpoint,
    # anon); passed to `datasets` as `storage_options`.
    storage_options: dict[str, Any] | None = None


SOURCE_FORMATS = ("text", "usmle", "chat")
WEIGHT_UNITS = ("documents", "tokens")


@dataclass
class MixtureConfig:
    """Weighted sources interleaved with a fixed seed; a weight may exceed its share (upsampling)."""

    sources: list[SourceConfig]
    seed: int = 42
    streaming: bool = False
    stopping_strategy: str = "all_exhausted"
    # "documents": a weight is the share of documents drawn; "tokens": the share of training tokens
    # (converted with each source's measured mean document length, see data/mixture.py).
    weight_unit: str = "documents"
    # Streaming only: packed blocks held and shuffled together before training (0: stream order).
    shuffle_buffer: int = 1000


@dataclass
class RecipeArguments:
    """What a recipe needs that TRL's ModelConfig and the trainer's config class lack."""

    dataset_mixture: dict[str, Any] | None = field(
        default=None, metadata={"help": "Training data: {seed, streaming, sources: [{path, weight, ...}]}."}
    )
    eval_sets: dict[str, Any] | None = field(
        default=None, metadata={"help": "Named evaluation sets {name: source}; each logs eval_<name>_loss."}
    )
    init_from_scratch: bool = field(default=False, metadata={"help": "Random weights from `architecture`."})
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start over: delete the checkpoints, final model and record of the run in output_dir."},
    )
    architecture: str | None = field(
        default=None,
        metadata={"help": "Scratch preset: tiny ... xlarge (plan: the shapes of a start model not trained yet)."},
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer when it differs from the model (always set for scratch)."}
    )
    total_tokens: int | None = field(default=None, metadata={"help": "Token budget; sets max_steps."})
    global_batch_tokens: int | None = field(
        default=None, metadata={"help": "Tokens per optimizer step over all devices; sets grad accumulation."}
    )
    warmup_tokens: int | None = field(default=None, metadata={"help": "Warmup in tokens; sets warmup_steps."})
    min_lr: float | None = field(default=None, metadata={"help": "Cosine floor; selects cosine_with_min_lr."})
    keep_best_checkpoints: int | None = field(
        default=None, metadata={"help": "Keep the best M checkpoints by metric_for_best_model, plus the last K."}
    )
    keep_last_checkpoints: int | None = field(
        default=None, metadata={"help": "Keep the newest K checkpoints (1 when only keep_best_checkpoints is set)."}
    )
    checkpoint_mirror_url: str | None = field(
        default=None, metadata={"help": "fsspec URL (s3://, gs://, file://...) each checkpoint is copied to."}
    )
    push_checkpoint_revisions: bool = field(
        default=False, metadata={"help": "Push each checkpoint's weights to its own Hub branch, checkpoint-<step>."}
    )
    # Long runs: preemption, non-finite steps, monitoring.
    preemption_grace_seconds: float = field(
        default=120.0, metadata={"help": "After SIGTERM/SIGUSR1: seconds to save a checkpoint and exit."}
    )
    nonfinite_policy: str = field(
        default="skip", metadata={"help": "A NaN/inf gradient norm: skip the step, or stop (checkpoint first)."}
    )
    max_nonfinite_skips: int = field(default=3, metadata={"help": "Skips allowed before the run stops."})
    gpu_hour_price: float | None = field(
        default=None, metadata={"help": "Price of one GPU-hour; logs the cost of the rest of the run."}
    )
    peak_tflops: float | None = field(
        default=None, metadata={"help": "Dense bf16 peak per device for MFU, when the GPU is not in plan.GPUS."}
    )
    # How multiple-choice rows (`format: usmle`) become chat turns, for SFT, GRPO and evaluation.
    system_prompt: str | None = field(default=None, metadata={"help": "System turn before each question."})
    chain_of_thought: bool = field(
        default=False, metadata={"help": "Ask for step-by-step reasoning ending in 'Final Answer: X'."}
    )
    with_explanation: bool = field(default=False, metadata={"help": "SFT targets carry the explanation."})
    subjects: list[str] | None = field(
        default=None, metadata={"help": "Train only on these subjects (per-subject 'division' training)."}
    )
    built_data: str | None = field(
        default=None,
        metadata={"help": "Folder written by `medrecipes build-data`: train on its packed blocks, not the sources."},
    )
    decontaminate_against: list[str] | None = field(
        default=None,
        metadata={"help": "Benchmark files (MCQ) that build-data checks the training data against, beside eval_sets."},
    )
    # Benchmarks scored at every evaluation (medrecipes.eval_callback), logged as eval_<task>_acc.
    eval_tasks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Benchmarks (medqa_4opt, mmlu_medical, ...) to score; for CPT also format: usmle eval_sets."
        },
    )
    eval_tasks_limit: int | None = field(
        default=None, metadata={"help": "Questions per task (per subject for MMLU) at each evaluation; all if unset."}
    )
    eval_tasks_data_dir: str | None = field(
        default=None, metadata={"help": "Folder of local benchmark files (the ../shared/data layout); else the Hub."}
    )
    eval_tasks_mode: str = field(
        default="loglik", metadata={"help": "loglik (as lm-evaluation-harness) or generate (chat, extracted letter)."}
    )

    def __post_init__(self):
        # Filled by parse_recipe from the raw dicts above, after key checks.
        self.mixture: MixtureConfig | None = None
        self.eval_sources: dict[str, SourceConfig] = {}
        self.derived: dict[str, Any] = {}


# Trainer settings that, out of range, fail only once training runs (a division by zero, a
# DataLoader's or an optimizer's ValueError), or in GRPOConfig's own derivations.
AT_LEAST_ONE = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "max_completion_length",
)
NOT_NEGATIVE = ("learning_rate", "embedding_learning_rate", "weight_decay")


# Step intervals: a count of steps, or below 1 a fraction of the run; 0 would never save, log
# or evaluate, which the trainer accepts silently.
POSITIVE_INTERVALS = ("save_steps", "logging_steps", "eval_steps")


def check_ranges(args) -> None:
    """A ValueError (the recipe's one line, from parse_recipe) for a setting out of range."""
    schedulers = [s.value for s in SchedulerType]
    scheduler = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    if scheduler not in schedulers:
        raise ValueError(
            f"lr_scheduler_type '{scheduler}' is unknown{did_you_mean(scheduler, schedulers)}; use {', '.join(schedulers)}"
        )
    for keys, low, words in ((AT_LEAST_ONE, 1, "at least 1"), (NOT_NEGATIVE, 0, "0 or more")):
        for key in keys:
            value = getattr(args, key, None)
            if value is not None and value < low:
                raise ValueError(f"{key} must be {words}, got {value}")
    for key in POSITIVE_INTERVALS:
        value = getattr(args, key, None)
        if value is not None and value <= 0:
            raise ValueError(f"{key} must be positive (steps, or a fraction of the run below 1), got {value}")
    # A run that trains no step would still write final/ over the one in output_dir.
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(f"max_steps must be at least 1, or -1 to train num_train_epochs; got {args.max_steps}")
    if args.max_steps == -1 and args.num_train_epochs <= 0:
        raise ValueError(f"num_train_epochs must be positive when max_steps is -1, got {args.num_train_epochs}")


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
        if self.bf16 is None and launcher in ("bf16", "no") and not self.fp16:
            self.bf16 = launcher == "bf16"  # the recipe leaves precision to the machine: the launcher chose
        if self.bf16 is None:
            self.bf16 = gpu and torch.cuda.is_bf16_supported()
        if self.tf32 is None:
            self.tf32 = gpu and torch.cuda.get_device_capability()[0] >= 8
        ours = "bf16" if self.bf16 else "fp16" if self.fp16 else "no"
        if launcher is not None and launcher != ours:  # else the trainer fails at build, or trains in the other
            raise ValueError(
                f"accelerate launch runs with mixed_precision {launcher} but the recipe with {ours}; "
                f"pass --mixed_precision {ours} to accelerate launch, or set bf16/fp16 in the recipe to match"
            )
        super().__post_init__()


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
class CheckpointingOnByDefault:
    """TRL's configs turn activation checkpointing on through its deprecated name,
    `gradient_checkpointing`, so a recipe that sets neither gets transformers' FutureWarning
    about a key it never wrote. The same default (on) is given here under the new name; a
    recipe that still writes the old name is honoured, with the warning."""

    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated name of activation_checkpointing."}
    )

    def __post_init__(self):
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = True
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


PROMPT_FORMATS = ("chat", "plain")
VLLM_MODES = ("colocate", "server")


@dataclass
class MedGRPOConfig(DeviceDefaults, CheckpointingOnByDefault, GRPOConfig):
    """TRL's GRPOConfig with bf16/tf32 chosen by the device, the rewards as recipe entries,
    the prompt form, a batch counted in prompts and an optional learning rate for embeddings."""

    rewards: list[dict[str, Any]] | None = field(
        default=None,
        metadata={"help": "Rewards [{name, weight, <settings>}] (medrecipes.rewards); default usmle_accuracy."},
    )
    prompt_format: str = field(
        default="chat", metadata={"help": "chat: usmle.chat_messages; plain: usmle.completion_prompt."}
    )
    prompts_per_step: int | None = field(
        default=None,
        metadata={"help": "Prompts per optimizer step over all devices; sets gradient_accumulation_steps."},
    )
    embedding_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the input embeddings (and a tied output layer)."}
    )

    def __post_init__(self):
        check_ranges(self)  # first: the accumulation below divides by the batch size
        # Before GRPOConfig derives generation_batch_size from the accumulation; WORLD_SIZE is
        # what accelerate launch and torchrun set for every process, and 1 without them.
        if self.prompts_per_step is not None:
            world = int(os.environ.get("WORLD_SIZE", "1"))
            self.gradient_accumulation_steps = prompts_per_step_accumulation(self, world)
        # Values derived after this point, kept as the recipe set them: GRPOConfig derives each of
        # steps_per_generation and generation_batch_size from the other (or from the
        # accumulation) and refuses both set, and reward_weights come from `rewards`. The
        # resolved recipe gives these back, and `plan` derives the first two again for another
        # number of devices.
        self.set_by_recipe = {
            name: getattr(self, name) for name in ("steps_per_generation", "generation_batch_size", "reward_weights")
        }
        super().__post_init__()

    def steps_per_generation_on(self, world_size: int) -> int:
        """Micro-batches a process generates at once on `world_size` processes, as GRPOConfig
        derives them there."""
        steps, batch = self.set_by_recipe["steps_per_generation"], self.set_by_recipe["generation_batch_size"]
        if steps is not None:
            return steps
        if batch is None:
            return self.gradient_accumulation_steps
        per_pass = self.per_device_train_batch_size * world_size
        if batch % per_pass:
            raise UserError(
                f"generation_batch_size {batch} does not divide into per_device_train_batch_size "
                f"{self.per_device_train_batch_size} x {world_size} processes"
            )
        return batch // per_pass


def prompts_per_step_accumulation(args, world_size: int) -> int:
    """The gradient accumulation that puts `prompts_per_step` prompts, each with
    `num_generations` completions, in one optimizer step on `world_size` processes."""
    if args.prompts_per_step < 1:
        raise UserError(f"prompts_per_step must be at least 1, got {args.prompts_per_step}")
    completions = args.prompts_per_step * args.num_generations
    per_pass = args.per_device_train_batch_size * world_size
    if completions % per_pass:
        sizes = [d for d in _divisors(completions) if d <= 64 and completions % (d * world_size) == 0]
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


@dataclass
class EvalArguments:
    """`medrecipes eval` and recipes/evaluate.py: which model, which benchmarks, how to score them."""

    model_name_or_path: str = field(metadata={"aliases": ["--model"], "help": "Hub id, local folder or .gguf file."})
    tasks: list[str] = field(
        default_factory=lambda: ["medqa_4opt"],
        metadata={"help": "Comma- or space-separated: medqa_4opt, medqa_5opt, medmcqa, pubmedqa, mmlu_medical."},
    )
    mode: str = field(default="loglik", metadata={"help": "loglik (as lm-evaluation-harness) or generate."})
    data: list[str] | None = field(
        default=None,
        metadata={"help": "TASK=PATH (file, folder or Hub id) for a task's questions; PATH alone with one task."},
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "Folder with the benchmark files laid out as in ../shared/data."}
    )
    limit: int | None = field(
        default=None, metadata={"help": "First N questions of each task (of each MMLU subject)."}
    )
    num_fewshot: int = field(default=0, metadata={"help": "Solved examples before each question (MMLU: dev split)."})
    fewshot_data: list[str] | None = field(
        default=None, metadata={"help": "TASK=PATH of few-shot examples for tasks without a dev split."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})
    max_length: int | None = field(
        default=None, metadata={"help": "Context length; longer inputs lose tokens on the left (default: model's)."}
    )
    model_revision: str | None = field(default=None, metadata={"help": "Hub revision of the model."})
    dtype: str = field(default="auto", metadata={"help": "auto (the checkpoint's), bfloat16, float16 or float32."})
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1 (default: cuda when available)."})
    system_prompt: str | None = field(default=None, metadata={"help": "generate: system turn before each question."})
    chain_of_thought: bool = field(default=False, metadata={"help": "generate: reason, then 'Final Answer: X'."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "generate: 16, or 512 with chain of thought."})
    temperature: float = field(default=0.0, metadata={"help": "generate: 0 is greedy; above 0 samples."})
    top_p: float = field(default=1.0, metadata={"help": "generate: nucleus sampling when temperature > 0."})
    seed: int = field(default=42, metadata={"help": "Seed for sampling."})
    output: str | None = field(default=None, metadata={"help": "JSON file for the reports and every prediction."})
    overwrite: bool = field(default=False, metadata={"help": "Let `output` replace an existing file."})

    def __post_init__(self):
        self.tasks = split_names(self.tasks)
        self.data_by_task = _by_task(self.data, self.tasks, "--data")
        self.fewshot_by_task = _by_task(self.fewshot_data, self.tasks, "--fewshot_data")


def split_names(entries: list[str]) -> list[str]:
    """Names given as a list, comma-separated, or both: [a,b c] -> [a, b, c]."""
    return [name for entry in entries for name in entry.split(",") if name]


def _by_task(entries: list[str] | None, tasks: list[str], flag: str) -> dict[str, str]:
    """{task: path} from TASK=PATH entries; a bare PATH belongs to the only task."""
    result = {}
    for entry in entries or []:
        name, sep, path = entry.partition("=")
        if not sep:
            if len(tasks) != 1:
                raise UserError(f"{flag} {entry}: name the task it is for, as {flag} TASK={entry}")
            name, path = tasks[0], entry
        result[name] = path
    return result


def parse_eval_args(argv: list[str] | None = None) -> EvalArguments:
    """EvalArguments from the command line (and an optional positional YAML with the same keys)."""
    (args,), path = RecipeParser([EvalArguments]).parse_recipe(argv)
    where = path or "command line"
    check_task_names(args.tasks, list(args.data_by_task), where)
    # An entry for a task not run is fine (a YAML's data for several tasks, --tasks picking some),
    # unless its name is a misspelling of a task that runs without an entry of its own.
    for flag, by_task in (("data", args.data_by_task), ("fewshot_data", args.fewshot_by_task)):
        for name in by_task:
            hint = "" if name in args.tasks else did_you_mean(name, [t for t in args.tasks if t not in by_task])
            if hint:
                raise UserError(
                    f"{where}: {flag} names task '{name}', which is not in tasks{hint}; "
                    f"name the task as in tasks, or drop the {flag} entry"
                )
    check_choice(args.mode, EVAL_MODES, f"{where}: mode")
    for key in ("limit", "batch_size", "max_new_tokens"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            raise UserError(f"{where}: {key} must be at least 1, got {getattr(args, key)}")
    if args.num_fewshot < 0:
        raise UserError(f"{where}: num_fewshot must be 0 or more, got {args.num_fewshot}")
    if args.temperature < 0:
        raise UserError(f"{where}: temperature must be 0 (greedy) or more, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise UserError(f"{where}: top_p must be above 0 and at most 1, got {args.top_p}")
    if args.output:  # written at the end: a bad path must not cost the evaluation
        if os.path.isdir(args.output):
            raise UserError(f"{where}: output {args.output} is a folder; name the JSON file to write")
        check_output_folder(os.path.dirname(os.path.abspath(args.output)), f"{where}: output")
        inputs = [args.model_name_or_path, *args.data_by_task.values(), *args.fewshot_by_task.values()]
        # Never over an input; over an earlier result, checked when the evaluation starts.
        check_new_output(args.output, f"{where}: output", inputs, overwrite=True)
    return args


# The dataclasses of each recipe script, in the order the script's main() receives them.
METHODS = {
    "cpt": (RecipeArguments, CPTConfig, ModelConfig),
    "sft": (RecipeArguments, MedSFTConfig, ModelConfig),
    "grpo": (RecipeArguments, MedGRPOConfig, ModelConfig),
}


NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", re.IGNORECASE)


def _attach_negative_numbers(argv: list[str]) -> list[str]:
    """`--key -1e-3` as `--key=-1e-3`: argparse takes a value that starts with '-' and is not a
    plain number for an option, and says "expected one argument"."""
    out = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE_NUMBER.fullmatch(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


class RecipeParser(TrlParser):
    """TrlParser that also takes the YAML as a positional argument and fails in one line."""

    def __init__(self, dataclass_types):
        # No prefix matching: `--learning_rat 1` must be an error, not learning_rate.
        super().__init__(dataclass_types, allow_abbrev=False)
        self.recipe_path = "command line"
        # argparse would call dict() on the text of a mapping key (a mixture, eval sets, a kernel
        # config) and take a list of mappings (rewards) word by word: both take one YAML value.
        kinds = {
            name: _structured_kind(hint)
            for cls in dataclass_types
            for name, hint in typing.get_type_hints(cls).items()
        }
        for action in self._actions:
            kind = kinds.get(action.dest)
            if kind is not None:
                action.type, action.nargs = _yaml_value(kind), None

    def error(self, message):  # argparse calls this for bad values and types
        raise UserError(f"{self.recipe_path}: {message}")

    def set_defaults_with_config(self, **config):
        # YAML reads 11e9 as a string, and argparse's int() refuses it; a whole number is meant.
        int_fields = {
            f.name for cls in self.dataclass_types for f in dataclasses.fields(cls) if f.type in (int, int | None)
        }
        for key, value in config.items():
            if key in int_fields and isinstance(value, str | float) and _is_whole_number(value):
                config[key] = int(float(value))
        return super().set_defaults_with_config(**config)

    def parse_recipe(self, argv: list[str] | None = None):
        argv = _attach_negative_numbers(list(sys.argv[1:] if argv is None else argv))
        if argv and not argv[0].startswith("-"):
            argv = ["--config", *argv]
        path = argv[argv.index("--config") + 1] if "--config" in argv else None
        if path is not None:
            self.recipe_path = path
            self._check_yaml_keys(path)
        *outputs, remaining = self.parse_args_and_config(argv, return_remaining_strings=True)
        unknown = [arg for arg in remaining if arg.startswith("--")]
        if remaining:
            name = (unknown or remaining)[0].lstrip("-").split("=")[0]
            raise UserError(f"command line: unknown argument '{name}'{did_you_mean(name, self._keys())}")
        return outputs, path

    def _keys(self) -> list[str]:
        return field_names(self.dataclass_types)

    def _check_yaml_keys(self, path: str) -> None:
        reject_unknown_keys(read_recipe_yaml(path), set(self._keys()) | {"env"}, path)


def _is_union(hint) -> bool:
    """`a | b` or `Optional[a]`: a field that takes more than one type."""
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _structured_kind(hint) -> type | None:
    """dict for a mapping field, list for a list of mappings, None for the others (Optional
    stripped)."""
    if _is_union(hint):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        hint = options[0] if len(options) == 1 else None
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin is dict:
        return dict
    if origin is list and args and (typing.get_origin(args[0]) or args[0]) is dict:
        return list
    return None


def _yaml_value(kind: type):
    """An argparse type: the text as YAML (so JSON too), which must be a `kind` or null."""

    def parse(text: str):
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ArgumentTypeError(f"not valid YAML ({str(err).splitlines()[0]})") from None
        if value is not None and not isinstance(value, kind):
            example = "'{key: value, ...}'" if kind is dict else "'[{key: value, ...}, ...]'"
            raise ArgumentTypeError(f"expected a YAML {kind.__name__} such as {example}, got {text!r}")
        return value

    return parse


def read_recipe_yaml(path: str) -> dict:
    """A recipe file's mapping of keys to values, or the one-line error of a missing or bad file."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a folder; pass the path of a YAML recipe in it")
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such recipe file; pass the path of a YAML recipe")
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except UnicodeDecodeError as err:
        raise not_utf8(path, err) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"{path}: not valid YAML ({where}{problem}); fix the recipe there") from None
    if data is None:
        raise UserError(f"{path}: the recipe is empty; write its keys (see recipes/ for examples)")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a recipe must be a mapping of keys to values")
    return data


def field_names(classes) -> list[str]:
    """The keys a recipe may set for these dataclasses."""
    return [f.name for cls in classes for f in dataclasses.fields(cls) if f.init]


def reject_unknown_keys(data: dict, valid: set[str], where: str) -> None:
    for key in data:
        if key not in valid:
            raise UserError(f"{where}: unknown key '{key}'{did_you_mean(key, valid)}")


def _is_whole_number(value) -> bool:
    try:
        return float(value).is_integer()
    except ValueError:
        return False


def build_dataclass(cls, data: Any, where: str):
    """`cls(**data)` with unknown and missing keys reported as one line naming `where`."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of keys to values, got {data!r}")
    reject_unknown_keys(data, {f.name for f in dataclasses.fields(cls)}, where)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
    ]
    if missing:
        raise UserError(f"{where}: missing key '{missing[0]}'")
    hints = typing.get_type_hints(cls)
    data = dict(data)
    for key, value in data.items():
        if isinstance(value, str) and _fits(1.0, hints[key]) and not _fits("", hints[key]):
            data[key] = value = _yaml_number(value)  # YAML reads 1e-2 as text
        if not _fits(value, hints[key]):
            raise UserError(f"{where}: {key} must be {_kind(hints[key])}, got {value!r}")
    return cls(**data)


KINDS = {float: "a number", int: "a whole number", str: "text", bool: "true or false", type(None): "null"}


def _kind(hint) -> str:
    """A field's type in a user's words: "text or a list or null"."""
    if _is_union(hint):
        return " or ".join(_kind(arg) for arg in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    return KINDS.get(origin) or {list: "a list", dict: "a mapping"}.get(origin, getattr(origin, "__name__", str(hint)))


def _yaml_number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _fits(value, hint) -> bool:
    """Whether a YAML value has the type a nested recipe entry's field declares (a float field
    takes an int; containers are checked by kind, not item by item)."""
    if _is_union(hint):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is Any:
        return True
    if isinstance(value, bool) and hint is not bool:
        return False
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, typing.get_origin(hint) or hint)


def _build_source(data: Any, where: str) -> SourceConfig:
    source = build_dataclass(SourceConfig, data, where)
    check_choice(source.format, SOURCE_FORMATS, f"{where}: format")
    if source.weight <= 0:
        raise UserError(f"{where}: weight must be positive, got {source.weight}")
    return source


def _resolve_data(recipe: RecipeArguments, path: str) -> None:
    if recipe.dataset_mixture is not None:
        where = f"{path}: dataset_mixture"
        mixture = dict(recipe.dataset_mixture)
        sources = mixture.get("sources")
        if not isinstance(sources, list) or not sources:
            raise UserError(f"{where}: 'sources' must be a non-empty list of sources")
        mixture["sources"] = [_build_source(s, f"{where}.sources[{i}]") for i, s in enumerate(sources)]
        recipe.mixture = build_dataclass(MixtureConfig, mixture, where)
        if recipe.mixture.stopping_strategy not in ("all_exhausted", "first_exhausted"):
            raise UserError(f"{where}: stopping_strategy must be all_exhausted or first_exhausted")
        check_choice(recipe.mixture.weight_unit, WEIGHT_UNITS, f"{where}: weight_unit")
        if recipe.mixture.shuffle_buffer < 0:
            raise UserError(f"{where}: shuffle_buffer must be 0 or more, got {recipe.mixture.shuffle_buffer}")
    for name, source in (recipe.eval_sets or {}).items():
        recipe.eval_sources[name] = _build_source(source, f"{path}: eval_sets.{name}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_token_budget(
    recipe: RecipeArguments, args: TrainingArguments, path: str, world_size: int | None = None
) -> dict[str, Any]:
    """Turn token counts into max_steps, gradient_accumulation_steps and warmup_steps.

    `world_size` defaults to this launch's; `medrecipes plan` passes the one it plans for.
    Returns the derived fields (also set on `args`) so that callers can log them.
    """
    derived: dict[str, Any] = {}
    if recipe.min_lr is not None:
        args.lr_scheduler_type = "cosine_with_min_lr"
        args.lr_scheduler_kwargs = {**(args.lr_scheduler_kwargs or {}), "min_lr": recipe.min_lr}
        derived["lr_scheduler_type"] = args.lr_scheduler_type
    budget = (recipe.total_tokens, recipe.global_batch_tokens, recipe.warmup_tokens)
    if all(v is None for v in budget):
        return derived
    if recipe.global_batch_tokens is None:
        raise UserError(f"{path}: total_tokens and warmup_tokens need global_batch_tokens")
    world = world_size or args.world_size
    micro = args.per_device_train_batch_size * args.max_length
    per_step = micro * world
    if recipe.global_batch_tokens % per_step:
        candidates = [per_step * k for k in (1, 2, 4, 8) if per_step * k != recipe.global_batch_tokens]
        fitting = recipe.global_batch_tokens // micro if recipe.global_batch_tokens % micro == 0 else 0
        worlds = _divisors(fitting) if fitting else []
        hint = f" or run on {', '.join(map(str, worlds[:6]))} processes" if worlds else ""
        raise UserError(
            f"{path}: global_batch_tokens {recipe.global_batch_tokens} is not a multiple of "
            f"per_device_train_batch_size x max_length x processes = {args.per_device_train_batch_size} x "
            f"{args.max_length} x {world} = {per_step}; use a multiple such as "
            f"{', '.join(map(str, candidates[:3]))}{hint}"
        )
    args.gradient_accumulation_steps = recipe.global_batch_tokens // per_step
    derived["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    if recipe.total_tokens is not None:
        # A budget rarely divides into whole steps; round up and say how many tokens that is.
        args.max_steps = math.ceil(recipe.total_tokens / recipe.global_batch_tokens)
        derived["max_steps"] = args.max_steps
        derived["tokens_trained"] = args.max_steps * recipe.global_batch_tokens
    if recipe.warmup_tokens is not None:
        args.warmup_steps = max(1, round(recipe.warmup_tokens / recipe.global_batch_tokens))
        derived["warmup_steps"] = args.warmup_steps
    return derived


def _resolve_best_metric(recipe: RecipeArguments, args: TrainingArguments, path: str) -> None:
    # With several named eval sets there is no plain eval_loss: rank by the first set's loss.
    if recipe.eval_sources and args.metric_for_best_model in (None, "loss", "eval_loss"):
        first = next(iter(recipe.eval_sources))
        args.metric_for_best_model = f"eval_{first}_loss"
        args.greater_is_better = False
    if recipe.keep_best_checkpoints is not None:
        if recipe.keep_best_checkpoints < 1:
            raise UserError(f"{path}: keep_best_checkpoints must be at least 1")
        if args.save_total_limit is not None:
            raise UserError(f"{path}: set keep_best_checkpoints or save_total_limit, not both")
        if not recipe.eval_sources:
            raise UserError(f"{path}: keep_best_checkpoints ranks by eval loss; add eval_sets")
    if recipe.keep_last_checkpoints is not None:
        if recipe.keep_last_checkpoints < 1:
            raise UserError(f"{path}: keep_last_checkpoints must be at least 1")
        if args.save_total_limit is not None:
            raise UserError(f"{path}: set keep_last_checkpoints or save_total_limit, not both")


NONFINITE_POLICIES = ("skip", "stop")


def _check_long_run_settings(recipe: RecipeArguments, path: str) -> None:
    check_choice(recipe.nonfinite_policy, NONFINITE_POLICIES, f"{path}: nonfinite_policy")
    if recipe.max_nonfinite_skips < 0:
        raise UserError(f"{path}: max_nonfinite_skips must be 0 or more")
    if recipe.preemption_grace_seconds <= 0:
        raise UserError(f"{path}: preemption_grace_seconds must be positive")
    for key in ("gpu_hour_price", "peak_tflops"):
        if getattr(recipe, key) is not None and getattr(recipe, key) <= 0:
            raise UserError(f"{path}: {key} must be positive")


def _resolve_grpo(recipe: RecipeArguments, args: MedGRPOConfig, path: str) -> None:
    from medrecipes.rewards import reward_functions

    budget = {"total_tokens", "global_batch_tokens", "warmup_tokens"}
    if any(getattr(recipe, key) is not None for key in budget):
        raise UserError(f"{path}: token budgets are for pretraining; count GRPO batches with prompts_per_step")
    check_choice(args.prompt_format, PROMPT_FORMATS, f"{path}: prompt_format")
    if args.prompt_format == "plain" and (recipe.system_prompt or recipe.chain_of_thought):
        raise UserError(
            f"{path}: system_prompt and chain_of_thought shape chat prompts; with prompt_format: plain, leave them out"
        )
    if args.reward_weights is not None:
        raise UserError(f"{path}: give each reward its weight in its 'rewards' entry, not in reward_weights")
    if args.temperature <= 0:
        raise UserError(f"{path}: temperature must be positive (GRPO samples its completions), got {args.temperature}")
    if args.beta < 0:
        raise UserError(f"{path}: beta must be 0 or more, got {args.beta}")
    check_choice(args.vllm_mode, VLLM_MODES, f"{path}: vllm_mode")
    if args.rewards is None:
        args.rewards = [{"name": "usmle_accuracy"}]
    _, args.reward_weights = reward_functions(args.rewards, f"{path}: rewards")


def _check_eval_tasks(recipe: RecipeArguments, args: TrainingArguments, path: str, method: str) -> None:
    recipe.eval_tasks = split_names(recipe.eval_tasks or [])  # --eval_tasks "" switches them off
    if not recipe.eval_tasks:
        return
    usmle_sets = [name for name, source in recipe.eval_sources.items() if source.format == "usmle"]
    if method == "sft" or getattr(args, "prompt_format", None) == "chat":
        # SFT and chat-prompt GRPO already log eval_<set>_acc for these sets; a second value would
        # overwrite it. CPT and plain-prompt GRPO can score them here.
        clash = next((name for name in recipe.eval_tasks if name in usmle_sets), None)
        if clash is not None:
            raise UserError(
                f"{path}: eval_tasks: '{clash}' is an eval set this recipe already scores (eval_{clash}_acc); "
                "list benchmarks (medqa_4opt, mmlu_medical, ...) in eval_tasks, or rename the eval set"
            )
        usmle_sets = []
    check_task_names(recipe.eval_tasks, usmle_sets, f"{path}: eval_tasks")
    check_choice(recipe.eval_tasks_mode, EVAL_MODES, f"{path}: eval_tasks_mode")
    if recipe.eval_tasks_limit is not None and recipe.eval_tasks_limit < 1:
        raise UserError(f"{path}: eval_tasks_limit must be at least 1, got {recipe.eval_tasks_limit}")
    if args.eval_strategy == "no":
        raise UserError(
            f"{path}: eval_tasks are scored at each evaluation, but eval_strategy is 'no'; set eval_strategy: steps and eval_steps"
        )


def _check_sft_sources(recipe: RecipeArguments, args: MedSFTConfig, path: str) -> None:
    """A chat template file must exist (TRL opens it once the trainer is built); assistant_only_loss
    needs conversations: TRL refuses plain documents once it is built."""
    template = args.chat_template_path
    if template and template.endswith(".jinja") and not os.path.isfile(template):
        raise UserError(f"{path}: chat_template_path: no such file {template}; see recipes/templates/")
    if not args.assistant_only_loss:
        return
    sources = {
        f"dataset_mixture.sources[{i}]": s for i, s in enumerate(recipe.mixture.sources if recipe.mixture else [])
    }
    sources |= {f"eval_sets.{name}": s for name, s in recipe.eval_sources.items()}
    for where, source in sources.items():
        if source.format == "text":
            raise UserError(
                f"{path}: {where}: format text has no assistant turns for assistant_only_loss; use format chat "
                "or usmle, set assistant_only_loss: false, or train on documents with recipes/cpt.py"
            )


def _check_loggers(args: TrainingArguments, path: str) -> None:
    """report_to names loggers transformers knows (the Trainer refuses others only once it is built)."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    for name in args.report_to:
        check_choice(name, [*INTEGRATION_TO_CALLBACK, "all", "none"], f"{path}: report_to")


# ModelConfig's LoRA settings: they take effect only with use_peft.
ADAPTER_SETTINGS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_target_parameters",
    "lora_modules_to_save",
    "lora_task_type",
    "use_rslora",
    "use_dora",
)


def _check_model_args(model_args: ModelConfig, path: str) -> None:
    """What transformers or PEFT would refuse only once the model loads, after the data is built."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    attention = model_args.attn_implementation
    known = ["eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()]
    if attention and "/" not in attention and attention not in known:  # org/name: a Hub kernel
        raise UserError(
            f"{path}: attn_implementation '{attention}' is unknown{did_you_mean(attention, known)}; "
            f"use {', '.join(known)} or a Hub kernel (org/name)"
        )
    if model_args.use_peft and model_args.lora_r < 1:
        raise UserError(f"{path}: lora_r must be at least 1, got {model_args.lora_r}")
    bits = [key for key in ("load_in_4bit", "load_in_8bit") if getattr(model_args, key)]
    if len(bits) == 2:
        raise UserError(f"{path}: set load_in_4bit or load_in_8bit, not both")
    if bits and not model_args.use_peft:
        raise UserError(
            f"{path}: a model loaded in {bits[0].removeprefix('load_in_').removesuffix('bit')} bits trains only through adapters; "
            "add use_peft: true or remove load_in_4bit/load_in_8bit"
        )
    defaults = ModelConfig()
    ignored = [key for key in ADAPTER_SETTINGS if getattr(model_args, key) != getattr(defaults, key)]
    if ignored and not model_args.use_peft:
        raise UserError(
            f"{path}: {ignored[0]} is set but use_peft is false, so the whole model would train; "
            f"set use_peft: true for LoRA, or drop {', '.join(ignored)}"
        )


def recipe_method(path: str) -> str:
    """The script a recipe YAML is for, from its keys: "cpt", "sft", "grpo" (the first whose
    dataclasses take every key, so a recipe with only shared keys is a CPT recipe) or "eval"
    (recipes/evaluate.py). A file that fits none gets the method nearest to it, whose parse
    then names the key that does not fit."""
    data = read_recipe_yaml(path)
    keys = {method: set(field_names(classes)) for method, classes in {**METHODS, "eval": (EvalArguments,)}.items()}
    return min(keys, key=lambda method: len(set(data) - keys[method] - {"env"}))


def parse_recipe(method: str, argv: list[str] | None = None):
    """Parse a recipe for `method` ("cpt", ...) and return its dataclasses in script order."""
    parser = RecipeParser(METHODS[method])
    try:
        outputs, path = parser.parse_recipe(argv)
    except (TypeError, ValueError) as err:  # a dataclass __post_init__ refusing a value
        raise UserError(f"{parser.recipe_path}: {str(err).splitlines()[0]}") from None
    recipe = next(o for o in outputs if isinstance(o, RecipeArguments))
    args = next(o for o in outputs if isinstance(o, TrainingArguments))
    model_args = next(o for o in outputs if isinstance(o, ModelConfig))
    if path is None and not (recipe.init_from_scratch or model_args.model_name_or_path):
        raise UserError(f"no recipe: run `python recipes/{method}.py RECIPE.yaml [--key value ...]` (see recipes/)")
    path = path or "command line"
    check_output_folder(args.output_dir, f"{path}: output_dir")
    _resolve_data(recipe, path)
    if recipe.init_from_scratch and not (recipe.architecture and recipe.tokenizer_name_or_path):
        raise UserError(f"{path}: init_from_scratch needs 'architecture' and 'tokenizer_name_or_path'")
    if isinstance(args, MedGRPOConfig):
        _resolve_grpo(recipe, args, path)
    derived = resolve_token_budget(recipe, args, path)
    if getattr(args, "prompts_per_step", None) is not None:
        derived["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    _resolve_best_metric(recipe, args, path)
    _check_long_run_settings(recipe, path)
    _check_model_args(model_args, path)
    _check_loggers(args, path)
    if isinstance(args, MedSFTConfig):
        _check_sft_sources(recipe, args, path)
    _check_eval_tasks(recipe, args, path, method)
    if not recipe.eval_sources and args.eval_strategy != "no":
        raise UserError(
            f"{path}: eval_strategy is '{args.eval_strategy.value}' but there are no eval_sets; "
            "add eval_sets, or set eval_strategy: no"
        )
    recipe.derived = derived  # logged by medrecipes.logs.setup_logging once logging is set up
    return tuple(outputs)


# Credentials a recipe may carry: left out of anything printed, saved or pushed.
SECRET_FIELDS = ("hub_token",)


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def resolved_recipe(*parsed) -> dict[str, Any]:
    """Every field of a parsed recipe's dataclasses with its final value as plain YAML data,
    credentials left out: what `medrecipes validate` prints and a model card records. Parsed
    again, it gives the same run."""
    resolved = {}
    for obj in parsed:
        own = getattr(obj, "set_by_recipe", {})  # fields whose derived values may not be given back
        for f in dataclasses.fields(obj):
            if f.init and f.name not in resolved and f.name not in SECRET_FIELDS:
                resolved[f.name] = _plain(own.get(f.name, getattr(obj, f.name)))
    return resolved


def resolved_yaml(*parsed) -> str:
    return yaml.safe_dump(resolved_recipe(*parsed), sort_keys=False)
