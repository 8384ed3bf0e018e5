"""The recipe schema: the dataclasses a recipe's keys fill, besides TRL's `ModelConfig` and the trainer
configs (`trainer_configs`).

`RecipeArguments` holds what the trainer configs lack (data, token budgets, checkpoints, long
runs, prompts, benchmarks during training); the ranges of numeric keys are stated here once
(`Bound`, `check_ranges`). A field whose values are a fixed list is a `Literal`: the parser checks
it (`reading.check_choices`) and the list is written once, here."""

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from transformers.trainer_utils import SchedulerType

from medrecipes.data_config import MixtureConfig, SourceConfig
from medrecipes.errors import UserError, did_you_mean, typed
from medrecipes.names import EvalMode


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
    resume_from_another_run: bool = field(
        default=False,
        metadata={"help": "Resume from a resume_from_checkpoint of another run (script, model or data) on purpose."},
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
    nonfinite_policy: Literal["skip", "stop"] = field(
        default="skip", metadata={"help": "A NaN/inf gradient norm: skip the step, or stop (checkpoint first)."}
    )
    max_nonfinite_skips: int = field(default=3, metadata={"help": "Skips allowed before the run stops."})
    gpu_hour_price: float | None = field(
        default=None, metadata={"help": "Price of one GPU-hour; logs the cost of the rest of the run."}
    )
    peak_tflops: float | None = field(
        default=None,
        metadata={"help": "Dense bf16 peak per device for MFU, when the GPU is not in plan.hardware.GPUS."},
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
    # Benchmarks scored at every evaluation (medrecipes.training.eval_callback), logged as eval_<task>_acc.
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
    eval_tasks_mode: EvalMode = field(
        default="loglik", metadata={"help": "loglik (as lm-evaluation-harness) or generate (chat, extracted letter)."}
    )

    def __post_init__(self):
        # Filled by parse_recipe from the raw dicts above, after key checks.
        self.mixture: MixtureConfig | None = None
        self.eval_sources: dict[str, SourceConfig] = {}
        self.derived: dict[str, Any] = {}
        self.notes: list[str] = []  # settings the libraries take and then do nothing with (library_checks.notes)
        self.recipe_file: str | None = None  # the YAML it was read from; None for the command line
        self.given: dict[str, Any] = {}  # the keys its YAML and command line wrote, as written
        self.on_command_line: set[str] = set()  # those of them the command line wrote (over the YAML's)


# Trainer settings that, out of range, fail only once training runs (a division by zero, a
# DataLoader's or an optimizer's ValueError), or in GRPOConfig's own derivations.
AT_LEAST_ONE = (
    "per_device_train_batch_size",
    "per_device_eval_batch_size",
    "gradient_accumulation_steps",
    "eval_accumulation_steps",  # the evaluation loop divides its step by it
    "ref_model_sync_steps",  # DPO's reference sync, every this many steps
    "max_length",
    "max_completion_length",
    "steps_per_generation",  # GRPO: optimizer steps per generation round
    "generation_batch_size",  # GRPO: completions generated at once
    "precompute_ref_batch_size",  # DPO, KTO: the reference's batch when it is scored before training
    "dataloader_prefetch_factor",  # batches each loader worker loads ahead (torch takes 0 until it loads)
    "ddp_timeout",  # seconds a process waits for the others
    "ddp_bucket_cap_mb",  # DDP's gradient buckets
    "dataset_num_proc",  # processes that tokenise the data (0 is refused by datasets' map)
    "pad_to_multiple_of",  # TRL's collators divide by it ("auto" aside)
    "num_completions_to_print",  # GRPO: completions logged each time
)


NOT_NEGATIVE = ("learning_rate", "embedding_learning_rate", "weight_decay", "eval_delay", "num_train_epochs")


@dataclass(frozen=True)
class Bound:
    """The values a method's numeric key may take where its library accepts more: `low` (allowed
    itself when `low_ok`), an optional `high` (allowed itself when `high_ok`), and what a value
    outside does to the method."""

    low: float
    low_ok: bool
    why: str
    high: float | None = None
    high_ok: bool = False  # `high` allowed itself

    def admits(self, value: float) -> bool:
        above = value >= self.low if self.low_ok else value > self.low
        below = self.high is None or (value <= self.high if self.high_ok else value < self.high)
        return above and below

    def words(self) -> str:
        low = f"{'at least' if self.low_ok else 'above'} {typed(self.low)}"
        if self.high is None:
            return low
        return f"{low} and {'at most' if self.high_ok else 'below'} {typed(self.high)}"


POSITIVE_BETA = Bound(0, False, "a negative beta prefers the rejected answers, and 0 learns no preference")


ANSWER_WEIGHT = Bound(0, False, "0 leaves that kind of answer out of the loss, and a negative weight turns it around")


# Step intervals: a count of steps, or below 1 a fraction of the run; 0 would never save, log
# or evaluate, which the trainer accepts silently.
POSITIVE_INTERVALS = ("save_steps", "logging_steps", "eval_steps")


# Keys every trainer config has, bounded where the trainer takes any value.
COMMON_BOUNDS = {
    "save_total_limit": Bound(1, True, "the trainer deletes no checkpoint at 0 or below, as when it is left out"),
    "neftune_noise_alpha": Bound(0, False, "NEFTune draws its noise from -alpha to alpha"),
    "router_aux_loss_coef": Bound(
        0, True, "it weighs the loss that spreads tokens over the experts; a negative one rewards crowding them"
    ),
    "label_smoothing_factor": Bound(
        0, True, "the share of probability taken off the right token; from 1 on none is left on it", 1
    ),
    "adam_epsilon": Bound(  # torch takes 0; its first step then makes every embedding row the batch missed NaN
        0,
        False,
        "Adam divides each update by the root of its second moment plus it, so a weight whose gradient is 0 "
        "(an embedding row no token of the batch used) gets 0 / 0, NaN, at the first step",
    ),
}


# The counts a launcher (accelerate launch, torchrun) writes into every process it starts, which
# torch's env:// rendezvous, accelerate's state and transformers' TrainingArguments read as whole numbers.
LAUNCH_COUNTS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")


def world_size() -> int:
    """The processes a launcher started: its WORLD_SIZE (accelerate launch and torchrun set it in
    every process), 1 without one; one line where the environment holds what no launcher writes
    (a count that is not a whole number, a rank beyond the processes, several processes with no
    address to meet at), which the libraries would report as int()'s refusal or a multi-node setup."""
    env = os.environ
    for name in (n for n in LAUNCH_COUNTS if n in env):
        if not env[name].strip().isdigit():
            raise UserError(
                f"{name}={env[name]!r} in the environment is not a whole number; unset it (a launcher sets it)"
            )
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        if name in env and int(env[name]) < 1:
            raise UserError(
                f"{name}={env[name]!r} in the environment is no count of processes; unset it (a launcher sets it)"
            )
    if "MASTER_PORT" in env and not 0 < int(env["MASTER_PORT"]) < 2**16:  # torch's store refuses it, naming a "port"
        raise UserError(
            f"MASTER_PORT={env['MASTER_PORT']} in the environment is no port (1 to 65535); unset it (a launcher "
            "sets it), or give a free port in that range"
        )
    world = int(env.get("WORLD_SIZE", "1"))
    for rank, size in (("RANK", world), ("LOCAL_RANK", int(env.get("LOCAL_WORLD_SIZE", world)))):
        if int(env.get(rank, 0)) >= size:
            raise UserError(
                f"{rank}={env[rank]} in the environment is not below the {size} processes started; unset it "
                "(a launcher sets it)"
            )
    # transformers sets up torch.distributed once LOCAL_RANK is there, whatever the count
    if (world > 1 or "LOCAL_RANK" in env) and (unset := [n for n in ("MASTER_ADDR", "MASTER_PORT") if not env.get(n)]):
        given = ", ".join(f"{n}={env[n]}" for n in ("WORLD_SIZE", "LOCAL_RANK") if n in env)
        raise UserError(
            f"{given} in the environment, with no {' or '.join(unset)} for the processes to meet at: a launcher "
            "sets these together; run with accelerate launch (or torchrun), or unset them"
        )
    return world


# What each launcher of several processes writes besides the counts: torchrun's (accelerate launch's
# for GPUs), DeepSpeed's, MPI's (accelerate's MULTI_CPU) and Slurm's.
LAUNCHER_MARKS = ("TORCHELASTIC_RUN_ID", "LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_PROCID")


def say_rendezvous() -> None:
    """One line where the counts of several processes were set with no launcher's marks (by hand,
    or left in a shell): the process then waits, silent, for the others to join, as long as
    ddp_timeout; the line says so while it waits. One line too where accelerate launch was asked
    for several processes and started one."""
    world = world_size()
    launched = any(mark in os.environ for mark in LAUNCHER_MARKS)
    # accelerate launch's plain launcher sets MASTER_ADDR only when asked for several processes or
    # machines, and then starts this one alone (on CPUs it starts several only under mpirun).
    if world == 1 and not launched and "ACCELERATE_MIXED_PRECISION" in os.environ and os.environ.get("MASTER_ADDR"):
        logging.getLogger("medrecipes").warning(
            "accelerate launch was asked for several processes or machines and started this one alone (on CPUs it "
            "starts several only under mpirun: mpirun_config.mpirun_hostfile): this run trains in one process; "
            "medrecipes validate --accelerate-config FILE says what a config starts"
        )
    if world > 1 and not launched:
        logging.getLogger("medrecipes").warning(
            "WORLD_SIZE=%d with no launcher's marks: this process (RANK %s) now waits for the other %d to join at "
            "%s:%s, up to ddp_timeout; start them, or unset WORLD_SIZE and its fellows to run alone",
            world, os.environ.get("RANK", "0"), world - 1, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"],
        )  # fmt: skip


def zero_stage() -> str:
    """The DeepSpeed ZeRO stage a launch set up ("0" to "3", as accelerate launch writes it in every
    process from its config), "" outside a DeepSpeed launch."""
    return os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "")


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
            if isinstance(value, str) and value.lstrip("-").isdigit():  # an `int | str` key, not yet cast
                value = int(value)
            if isinstance(value, int | float) and value < low:  # a word ("auto") is its library's to read
                raise ValueError(f"{key} must be {words}, got {value}")
    for key, bound in {**COMMON_BOUNDS, **getattr(args, "BOUNDS", {})}.items():
        value = getattr(args, key, None)
        if value is not None and not bound.admits(value):
            raise ValueError(f"{key} must be {bound.words()}, got {value:g}: {bound.why}")
    for key in POSITIVE_INTERVALS:
        value = getattr(args, key, None)
        if value is not None and value <= 0:
            raise ValueError(f"{key} must be positive (steps, or a fraction of the run below 1), got {value}")
    # A run that trains no step would still write final/ over the one in output_dir.
    if args.max_steps == 0 or args.max_steps < -1:
        raise ValueError(f"max_steps must be at least 1, or -1 to train num_train_epochs; got {args.max_steps}")
    if args.max_steps == -1 and args.num_train_epochs <= 0:
        raise ValueError(f"num_train_epochs must be positive when max_steps is -1, got {args.num_train_epochs}")
    low, high = getattr(args, "entropy_coef_min", None), getattr(args, "entropy_coef_max", None)
    if low is not None and high is not None and low > high:  # GRPO's adaptive entropy keeps its coefficient between
        raise ValueError(f"entropy_coef_min {low:g} is above entropy_coef_max {high:g}; swap them")
    # Relations between keys: warmup (steps from 1 up, a fraction of the run below 1) within the run.
    if args.warmup_steps < 0:
        raise ValueError(f"warmup_steps must be 0 or more, got {args.warmup_steps}")
    if args.warmup_steps > 1 and args.warmup_steps != int(args.warmup_steps):  # transformers' get_warmup_steps
        raise ValueError(
            f"warmup_steps {args.warmup_steps:g} would warm up for {int(args.warmup_steps)} step(s): from 1 up it "
            "counts whole steps, below 1 it is a fraction of the run; give one of them"
        )
    if args.max_steps > 0 and args.warmup_steps >= 1 and args.warmup_steps > args.max_steps:
        raise ValueError(
            f"warmup_steps {args.warmup_steps:g} is beyond max_steps {args.max_steps}: the learning rate would never "
            "reach its peak; lower warmup_steps, or give a fraction of the run below 1"
        )
