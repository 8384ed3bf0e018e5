"""The checks and derived settings of a parsed recipe, run by `parse.parse_recipe`: what each
key needs of the others (token budgets -> steps, checkpoint ranking, GRPO's prompts and
rewards, benchmarks during training, adapters), caught when the recipe is read, not once a
model has loaded.

The reward entries are checked by building them with `medrecipes.rewards` (a layer below: it
knows only questions), which also gives `reward_weights`; a dotted import path to a user's
reward can only be checked by importing it.
"""

import dataclasses
import json
import math
import os
from typing import Any

from transformers import TrainingArguments
from trl import GRPOConfig, ModelConfig

from medrecipes.config.reading import build_dataclass, check_revision, shell_variable, split_names, written_keys
from medrecipes.config.schema import RecipeArguments
from medrecipes.config.trainer_configs import MedGRPOConfig, MedSFTConfig, divisors
from medrecipes.data_config import MixtureConfig, SourceConfig
from medrecipes.errors import UserError, check_choice, did_you_mean
from medrecipes.locations import (
    BUILDERS,
    SAMPLED,
    absent,
    file_as_model,
    is_url,
    local_path,
    looks_local,
    missing_local_model,
    shipped_template,
    shipped_templates,
    template_error,
    unreachable,
    weights_fingerprint,
)
from medrecipes.mirror import COMPLETE
from medrecipes.names import TASK_METRICS, check_task_names
from medrecipes.outputs.checkpoints import checkpoint_step
from medrecipes.pass_rates import check_measured_on
from medrecipes.rewards import form_rewarded, reward_functions

VLLM_MODES = ("colocate", "server")


def _build_source(data: Any, where: str, training: bool = True) -> SourceConfig:
    source = build_dataclass(SourceConfig, data, where)
    # ~ is the user's home, as in output_dir and the shell; datasets would read it as a folder named ~
    source.path = os.path.expanduser(source.path) if source.path.startswith("~") else source.path
    if isinstance(source.data_files, str | list):
        files = [source.data_files] if isinstance(source.data_files, str) else source.data_files
        files = [os.path.expanduser(f) if isinstance(f, str) and f.startswith("~") else f for f in files]
        source.data_files = files[0] if isinstance(source.data_files, str) else files
    if source.weight <= 0:
        raise UserError(f"{where}: weight must be positive, got {source.weight}")
    if source.pubmedqa_setting is not None and source.format != "usmle":
        raise UserError(
            f"{where}: pubmedqa_setting chooses what PubMedQA's questions are asked about, and this source is "
            f"format {source.format}; set format: usmle for PubMedQA rows, or leave pubmedqa_setting out"
        )
    if source.format == "usmle" and is_url(source.path) and not source.path.startswith("file://"):
        raise UserError(
            f"{where}: path {source.path} is a URL, and questions (format usmle) are read from local files, folders "
            "and Hub datasets; download the file and give its path"
        )
    if source.text_field != "text" and source.format != "text":
        raise UserError(
            f"{where}: text_field names the column of a format text source, and this source is format "
            f"{source.format}, whose columns are its format's; leave text_field out"
        )
    if source.sample_by is not None and (source.format != "text" or (other := _not_text_files(source))):
        what = f"this source is format {source.format}" if source.format != "text" else f"{other} names no .txt file"
        raise UserError(
            f"{where}: sample_by chooses what one document of a .txt file is, and {what}; leave sample_by out"
        )
    if not training and source.weight != 1.0:
        raise UserError(
            f"{where}: weight is a training source's share of the mixture, and an eval set is scored whole; "
            "leave weight out"
        )
    if source.balance_answers and (source.format != "usmle" or not training):
        what = f"this source is format {source.format}" if training else "an eval set is scored as it is"
        raise UserError(
            f"{where}: balance_answers draws a training source's multiple-choice answers equally often, and {what}; "
            "set it on format: usmle sources of dataset_mixture only"
        )
    _check_location_keys(source, where)
    for index, url in enumerate(source.locations()):
        key = "path" if index == 0 else "data_files"
        if problem := unreachable(url):
            raise UserError(f"{where}: {key} {url}: {problem}")
    if source.part is not None and not 0 < source.part.share < 1:
        raise UserError(
            f"{where}: part.share must be above 0 and below 1 (the share of the rows in the first part), "
            f"got {source.part.share:g}"
        )
    rates = source.pass_rate
    if rates is not None and source.format == "text":  # pass rates are kept by question id
        raise UserError(
            f"{where}: pass_rate keeps the questions a model answers right at some rate, and this source is format "
            f"{source.format}, whose rows are no questions to measure; leave pass_rate out"
        )
    if rates is not None:
        _check_pass_rate_window(rates, where)
    return source


def _not_text_files(source: SourceConfig) -> str | None:
    """The first location of a source, as written, that names files of another builder than
    datasets' text builder (a .jsonl file, path: json, a pattern of .csv files), or None. A
    folder or a Hub dataset says what it holds only when read (sources.load_documents)."""
    named = source.path if source.data_files is None else None
    builder = BUILDERS.get(os.path.splitext(named)[1]) if named and local_path(named) else None
    if source.path in set(BUILDERS.values()) - {"text"} or builder not in (None, "text"):
        return f"path {source.path}"
    for file in [] if source.data_files is None else source.locations()[1:]:
        if BUILDERS.get(os.path.splitext(str(file))[1], "text") != "text":
            return f"data_files {file}"
    return None


def _check_pass_rate_window(rates, where: str) -> None:
    """A pass rate is a share of samples, 0 to 1: a bound outside it is refused (80 for 80% would keep
    every rate), and so is a window no rate is in."""
    for key, side in (("above", "lower"), ("below", "upper")):
        value = getattr(rates, key)
        if value is not None and not 0 <= value <= 1:
            percent = f"write {value / 100:g} for {value:g}%, or " if 1 < value <= 100 else ""
            raise UserError(
                f"{where}: pass_rate.{key} {value:g} is no pass rate (the share of a question's samples answered "
                f"right, 0 to 1); {percent}null for no {side} bound"
            )
    low = -1 if rates.above is None else rates.above
    high = 2 if rates.below is None else rates.below
    if not (low < high and low < 1 and high > 0):
        raise UserError(
            f"{where}: pass_rate keeps pass rates above {low:g} and below {high:g}, which no rate (0 to 1) is; "
            "use above < below (above: 0, below: 1 keeps the questions answered right sometimes, not always; "
            "below: null keeps those always answered right too)"
        )


def _check_location_keys(source: SourceConfig, where: str) -> None:
    """The keys that choose among a Hub dataset's versions, configs and files, refused where
    `datasets` would read the source without them (it ignores them there without a word): a
    revision of anything but a Hub dataset, a config name, data_dir or data_files beside a path
    that names one file, and a config name or data_dir for a packaged builder (json, csv, ...). A
    shell's variable in a location ($HOME) is kept as written, so it is refused."""
    for location in source.locations():
        if problem := shell_variable(location):
            raise UserError(f"{where}: {problem}")
    local = local_path(source.path)
    one_file = local and os.path.splitext(source.path)[1] in BUILDERS
    builder = source.path in BUILDERS.values()
    what = "a local file" if one_file else "a local folder" if local else f"the packaged builder {source.path}"
    if source.revision is not None and (local or builder):
        raise UserError(
            f"{where}: revision picks a version of a Hub dataset, and '{source.path}' is {what}, "
            "which has none; leave revision out"
        )
    unused = [key for key in ("name", "data_dir", "data_files") if getattr(source, key) is not None]
    if one_file and unused:
        raise UserError(
            f"{where}: path '{source.path}' names the one file read, so {unused[0]} is not used; "
            "leave it out, or set path to the folder or builder (json, csv, ...) the files belong to"
        )
    if builder and (unused := [key for key in unused if key != "data_files"]):
        raise UserError(
            f"{where}: {unused[0]} chooses among a Hub dataset's configs or folders, and {what} reads "
            "exactly its data_files; leave it out"
        )


def check_pass_rates(recipe: RecipeArguments, model_args: ModelConfig, path: str) -> None:
    """Each source's pass_rate file, where it is there already, is a pass-rate file measured on the
    weights this recipe starts from (their fingerprint, `locations.weights_fingerprint`): a filter by
    another model's pass rates keeps the questions that model found hard, not this one. A file an
    earlier stage has not written yet is looked for when the data loads, as the data files are."""
    sources = [
        (f"dataset_mixture.sources[{i}]", s) for i, s in enumerate(recipe.mixture.sources if recipe.mixture else [])
    ]
    sources += [(f"eval_sets.{name}", s) for name, s in recipe.eval_sources.items()]
    measured = [(where, s.pass_rate.file) for where, s in sources if s.pass_rate and os.path.exists(s.pass_rate.file)]
    if not measured:
        return
    model = model_args.model_name_or_path
    fingerprint = None if recipe.init_from_scratch else weights_fingerprint(model, ends=SAMPLED)
    for where, file in measured:
        try:
            check_measured_on(file, fingerprint, model)
        except UserError as err:
            raise UserError(f"{path}: {where}.pass_rate: {err}") from None


def resolve_data(recipe: RecipeArguments, path: str) -> None:
    if recipe.dataset_mixture is not None:
        where = f"{path}: dataset_mixture"
        mixture = dict(recipe.dataset_mixture)
        sources = mixture.get("sources")
        if not isinstance(sources, list) or not sources:
            raise UserError(f"{where}: 'sources' must be a non-empty list of sources")
        mixture["sources"] = [_build_source(s, f"{where}.sources[{i}]") for i, s in enumerate(sources)]
        built = mixture["sources"]
        if again := next(((i, j) for j in range(len(built)) for i in range(j) if built[i] == built[j]), None):
            raise UserError(
                f"{where}.sources[{again[1]}] is sources[{again[0]}] again, so each of its rows would train twice; "
                "give it once (a weight above 1 draws a source more often on purpose)"
            )
        recipe.mixture = build_dataclass(MixtureConfig, mixture, where)
        chosen = [i for i, s in enumerate(recipe.mixture.sources) if s.part is not None or s.pass_rate is not None]
        if recipe.mixture.streaming and chosen:
            raise UserError(
                f"{where}.sources[{chosen[0]}]: part and pass_rate choose among all the rows of a source, which a "
                "stream reads one by one; set streaming: false"
            )
        if recipe.mixture.shuffle_buffer < 0:
            raise UserError(f"{where}: shuffle_buffer must be 0 or more, got {recipe.mixture.shuffle_buffer}")
    for name, source in (recipe.eval_sets or {}).items():
        if not str(name).strip():  # its metrics would be logged as eval__loss
            raise UserError(f"{path}: eval_sets has a set with an empty name; name it (its metrics are eval_NAME_...)")
        recipe.eval_sources[name] = _build_source(source, f"{path}: eval_sets.{name}", training=False)


def resolve_token_budget(
    recipe: RecipeArguments, args: TrainingArguments, path: str, world_size: int | None = None
) -> dict[str, Any]:
    """Turn token counts into max_steps, gradient_accumulation_steps and warmup_steps.

    `world_size` defaults to this launch's; `medrecipes plan` passes the one it plans for.
    Returns the derived fields (also set on `args`) so that callers can log them.
    """
    derived: dict[str, Any] = {}
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    # linear is the trainers' default, which a recipe that sets min_lr without naming a schedule leaves
    floored = ("cosine", "cosine_with_min_lr") + (() if "lr_scheduler_type" in recipe.given else ("linear",))
    if recipe.min_lr is not None and recipe.min_lr < 0:
        raise UserError(
            f"{path}: min_lr must be 0 or more (the floor the learning rate decays to), got {recipe.min_lr:g}"
        )
    if recipe.min_lr is not None and recipe.min_lr > args.learning_rate:
        raise UserError(
            f"{path}: min_lr {recipe.min_lr:g} is above learning_rate {args.learning_rate:g}: the schedule decays from "
            "learning_rate down to min_lr, and would climb instead; give a min_lr below learning_rate (a tenth is usual)"
        )
    if recipe.min_lr is not None and schedule not in floored:
        raise UserError(
            f"{path}: min_lr decays the learning rate on a cosine to its floor (cosine_with_min_lr), and "
            f"lr_scheduler_type {schedule} would be replaced by it; set lr_scheduler_type: cosine, or drop min_lr"
        )
    if recipe.min_lr is not None:
        args.lr_scheduler_type = "cosine_with_min_lr"
        args.lr_scheduler_kwargs = {**(args.lr_scheduler_kwargs or {}), "min_lr": recipe.min_lr}
        derived["lr_scheduler_type"] = args.lr_scheduler_type
    budget = (recipe.total_tokens, recipe.global_batch_tokens, recipe.warmup_tokens)
    if all(v is None for v in budget):
        return derived
    for key, least in (("total_tokens", 1), ("global_batch_tokens", 1), ("warmup_tokens", 0)):
        value = getattr(recipe, key)
        if value is not None and value < least:  # 0 steps would fall back to the epochs and train anyway
            raise UserError(f"{path}: {key} must be at least {least}, got {value}: it counts the tokens to train")
    if recipe.global_batch_tokens is None:
        raise UserError(f"{path}: total_tokens and warmup_tokens need global_batch_tokens")
    given_steps = {key: recipe.given[key] for key in STEPS_OF_TOKENS.values() if key in recipe.given}
    world = world_size or args.world_size
    micro = args.per_device_train_batch_size * args.max_length
    per_step = micro * world
    if recipe.global_batch_tokens % per_step:
        candidates = [per_step * k for k in (1, 2, 4, 8) if per_step * k != recipe.global_batch_tokens]
        fitting = recipe.global_batch_tokens // micro if recipe.global_batch_tokens % micro == 0 else 0
        worlds = divisors(fitting) if fitting else []
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
        if args.max_steps > 0 and args.warmup_steps > args.max_steps:
            raise UserError(
                f"{path}: warmup_tokens {recipe.warmup_tokens:,} is {args.warmup_steps:,} steps, beyond the run's "
                f"{args.max_steps:,}: the learning rate would never reach its peak; lower warmup_tokens"
            )
    for tokens, steps in STEPS_OF_TOKENS.items():  # a step count given beside its token count, other than it derives
        if steps in given_steps and steps in derived and not _same_number(given_steps[steps], derived[steps]):
            if tokens in recipe.on_command_line and steps not in recipe.on_command_line:  # the later word: said
                recipe.notes.append(
                    f"{tokens} on the command line makes {steps} {derived[steps]}, in place of the recipe's "
                    f"{given_steps[steps]}"
                )
                continue
            raise UserError(
                f"{path}: {steps} {given_steps[steps]} and {tokens} are both given, and {tokens} makes it "
                f"{derived[steps]}, so {steps} {given_steps[steps]} would do nothing; give one of them (null for "
                f"{tokens} to count in steps)"
            )
    return derived


def check_stream_length(recipe: RecipeArguments, args: TrainingArguments, path: str) -> None:
    """A streaming mixture has no length for epochs to count: its run ends at max_steps, given or
    derived from total_tokens (the trainer refuses it only once the data is built)."""
    if recipe.mixture is not None and recipe.mixture.streaming and args.max_steps <= 0:
        raise UserError(f"{path}: a streaming mixture has no length; set max_steps or total_tokens")


# The step count each token count of a budget derives (a resolved recipe gives both, the same).
STEPS_OF_TOKENS = {"total_tokens": "max_steps", "global_batch_tokens": "gradient_accumulation_steps",
                   "warmup_tokens": "warmup_steps"}  # fmt: skip


def _same_number(given, derived) -> bool:
    try:
        return float(given) == float(derived)
    except (TypeError, ValueError):
        return False


# Which way a metric improves, by how its name ends (transformers' default reads only "loss").
LOWER_BETTER, HIGHER_BETTER = ("loss", "perplexity", "ppl"), ("acc", "accuracy", "f1", "reward")


# What each setting that evaluates, or ranks checkpoints by an evaluation, is set to for a run without one.
WITHOUT_EVAL = {"eval_strategy": "no", "eval_on_start": "false", "keep_best_checkpoints": "null",
                "load_best_model_at_end": "false"}  # fmt: skip


def check_eval_needed(recipe: RecipeArguments, args: TrainingArguments, path: str) -> None:
    """A recipe without eval_sets whose settings evaluate or rank by an evaluation: all of them in
    one line with the flags that turn them off (a recipe's eval_sets set to null leaves several), or
    eval_tasks, which are scored at an evaluation; and
    keep_best_checkpoints said where eval sets are there and no evaluation in training ranks by them."""
    if recipe.eval_sources:
        if args.eval_strategy == "no" and recipe.keep_best_checkpoints is not None:
            recipe.notes.append(
                f"keep_best_checkpoints {recipe.keep_best_checkpoints} keeps the checkpoints an evaluation ranks "
                "best, and eval_strategy is no, so none is ranked and only the newest is kept (keep_last_checkpoints); "
                "set eval_strategy: steps to rank them, or drop keep_best_checkpoints"
            )
        return
    if recipe.eval_tasks:  # the trainer evaluates, and so scores the tasks, only with eval sets
        raise UserError(
            f"{path}: eval_tasks are scored at each evaluation, which runs on eval_sets, and there are none; add "
            "eval_sets (with eval_strategy: steps and eval_steps), or drop eval_tasks and score the model after "
            "training (medrecipes eval)"
        )
    values = {
        "eval_strategy": None if args.eval_strategy == "no" else args.eval_strategy.value,
        "eval_on_start": "true" if args.eval_on_start else None,
        "keep_best_checkpoints": recipe.keep_best_checkpoints,
        "load_best_model_at_end": "true" if args.load_best_model_at_end else None,
    }
    needing = {key: value for key, value in values.items() if value is not None}
    if needing:
        settings = ", ".join(f"{key}: {value}" for key, value in needing.items())
        flags = " ".join(f"--{key} {WITHOUT_EVAL[key]}" for key in needing)
        raise UserError(
            f"{path}: there are no eval_sets, and {settings} {'evaluates' if len(needing) == 1 else 'evaluate'} or "
            f"{'ranks' if len(needing) == 1 else 'rank'} checkpoints by an evaluation; add eval_sets, or turn "
            f"{'it' if len(needing) == 1 else 'them'} off ({flags})"
        )


def resolve_best_metric(recipe: RecipeArguments, args: TrainingArguments, path: str) -> None:
    # With several named eval sets there is no plain eval_loss: rank by the first set's loss.
    if recipe.eval_sources and args.metric_for_best_model in (None, "loss", "eval_loss"):
        first = next(iter(recipe.eval_sources))
        args.metric_for_best_model = f"eval_{first}_loss"
        if args.greater_is_better is None:
            args.greater_is_better = False
    metric = args.metric_for_best_model or ""
    lower = metric.endswith(LOWER_BETTER)
    if (
        args.greater_is_better is not None
        and (lower or metric.endswith(HIGHER_BETTER))
        and args.greater_is_better == lower
    ):
        raise UserError(
            f"{path}: greater_is_better: {str(args.greater_is_better).lower()} would keep the checkpoint with the "
            f"{'highest' if lower else 'lowest'} {metric}, the worst one; leave greater_is_better out"
        )
    if recipe.keep_best_checkpoints is not None:
        if recipe.keep_best_checkpoints < 1:
            raise UserError(f"{path}: keep_best_checkpoints must be at least 1")
        if args.save_total_limit is not None:
            raise UserError(f"{path}: set keep_best_checkpoints or save_total_limit, not both")
    if recipe.keep_last_checkpoints is not None:
        if recipe.keep_last_checkpoints < 1:
            raise UserError(f"{path}: keep_last_checkpoints must be at least 1")
        if args.save_total_limit is not None:
            raise UserError(f"{path}: set keep_last_checkpoints or save_total_limit, not both")


def check_long_run_settings(recipe: RecipeArguments, path: str) -> None:
    if recipe.max_nonfinite_skips < 0:
        raise UserError(f"{path}: max_nonfinite_skips must be 0 or more")
    if recipe.preemption_grace_seconds <= 0:
        raise UserError(f"{path}: preemption_grace_seconds must be positive")
    for key in ("gpu_hour_price", "peak_tflops"):
        if getattr(recipe, key) is not None and getattr(recipe, key) <= 0:
            raise UserError(f"{path}: {key} must be positive")


def resolve_grpo(recipe: RecipeArguments, args: MedGRPOConfig, path: str) -> None:
    budget = {"total_tokens", "global_batch_tokens", "warmup_tokens"}
    if any(getattr(recipe, key) is not None for key in budget):
        raise UserError(f"{path}: token budgets are for pretraining; count GRPO batches with prompts_per_step")
    if args.prompt_format == "plain" and (recipe.system_prompt or recipe.chain_of_thought):
        raise UserError(
            f"{path}: system_prompt and chain_of_thought shape chat prompts; with prompt_format: plain, leave them out"
        )
    if args.reward_weights is not None:
        raise UserError(f"{path}: give each reward its weight in its 'rewards' entry, not in reward_weights")
    check_choice(args.vllm_mode, VLLM_MODES, f"{path}: vllm_mode")  # TRL's field: a str, not a Literal
    if args.compile_generation and (args.cache_implementation != "static" or args.use_vllm):
        raise UserError(
            f"{path}: compile_generation compiles generate's decoding step over a static cache: set "
            "cache_implementation: static (and use_vllm: false, which generates otherwise)"
        )
    if args.epsilon_high is not None and args.epsilon_high < args.epsilon:  # TRL takes it without a word
        recipe.notes.append(
            f"epsilon_high {args.epsilon_high} is below epsilon {args.epsilon}: the upper clip of the policy ratio is "
            "then the tighter one, the reverse of the clip-higher it is for (DAPO: epsilon_high above epsilon, e.g. "
            "0.28 over 0.2); swap them if that was meant"
        )
    if args.rewards is None:
        args.rewards = [{"name": "usmle_accuracy"}]
    functions, args.reward_weights = reward_functions(args.rewards, f"{path}: rewards")
    asked = "final_answer_line" if recipe.chain_of_thought else "letter"  # the form the prompt asks for
    for i, function in enumerate(functions):
        if (form := form_rewarded(function)) not in (None, asked):
            styled = function.__name__ == "answer_format"
            named, fix = (
                (f"answer_format style {form}", f"use style {asked}") if styled else (function.__name__, "drop it")
            )
            raise UserError(
                f"{path}: rewards[{i}]: {named} rewards another form than the prompt asks for ({form}, where "
                f"chain_of_thought {str(recipe.chain_of_thought).lower()} asks for {asked}), so answers that do as "
                f"asked score 0; {fix}, or set chain_of_thought: {str(not recipe.chain_of_thought).lower()}"
            )
    for i, function in enumerate(functions):
        if getattr(function, "__name__", None) == "overlong_penalty":
            start = function.settings["max_tokens"] - function.settings["buffer_tokens"]
            if start >= args.max_completion_length:
                raise UserError(
                    f"{path}: rewards[{i}]: overlong_penalty starts past {start} tokens, and no answer is longer than "
                    f"max_completion_length {args.max_completion_length}, so it never fires; set its max_tokens to "
                    "max_completion_length"
                )


def check_eval_tasks(recipe: RecipeArguments, args: TrainingArguments, path: str, method) -> None:
    recipe.eval_tasks = split_names(recipe.eval_tasks or [])  # --eval_tasks "" switches them off
    if not recipe.eval_tasks:
        written = written_keys(recipe.given)
        setup = [f for f in dataclasses.fields(recipe) if f.name.startswith("eval_tasks_")]  # each sets up eval_tasks
        given = [f.name for f in setup if f.name in written and getattr(recipe, f.name) != f.default]
        if given:
            raise UserError(
                f"{path}: {given[0]} sets up eval_tasks, and the recipe names none; add eval_tasks, or drop it"
            )
        return
    if recipe.eval_tasks_data_dir and not os.path.isdir(recipe.eval_tasks_data_dir):
        raise UserError(
            f"{path}: eval_tasks_data_dir {recipe.eval_tasks_data_dir}: "
            f"{'a file, not a folder' if os.path.isfile(recipe.eval_tasks_data_dir) else absent(recipe.eval_tasks_data_dir)}; name the "
            "folder that holds the benchmark files (laid out as ../shared/data), or drop it for the Hub copies"
        )
    usmle_sets = [name for name, source in recipe.eval_sources.items() if source.format == "usmle"]
    if answers_eval_sets(args, method):
        # SFT and chat-prompt GRPO already log eval_<set>_acc for these sets; a second value would
        # overwrite it. CPT and plain-prompt GRPO can score them here.
        clash = next((name for name in recipe.eval_tasks if name in usmle_sets), None)
        if clash is not None:
            raise UserError(
                f"{path}: eval_tasks: '{clash}' is an eval set this recipe already scores (eval_{clash}_acc); "
                "list benchmarks (medqa_4opt, mmlu_medical, ...) in eval_tasks, or rename the eval set"
            )
        usmle_sets = []
    check_task_names(
        recipe.eval_tasks,
        usmle_sets,
        f"{path}: eval_tasks",
        "to score a file of questions name it in eval_sets ({NAME: {path: FILE, format: usmle}})",
    )
    if recipe.eval_tasks_limit is not None and recipe.eval_tasks_limit < 1:
        raise UserError(f"{path}: eval_tasks_limit must be at least 1, got {recipe.eval_tasks_limit}")
    if args.eval_strategy == "no":
        raise UserError(
            f"{path}: eval_tasks are scored at each evaluation, but eval_strategy is 'no'; set eval_strategy: steps and eval_steps"
        )


# eval_<name>_<suffix>: the task evaluation's scalars (names.TASK_METRICS) and each eval set's loss;
# longest first, so that "_acc_norm" is read before "_acc".
TASK_METRIC_SUFFIXES = tuple(sorted(TASK_METRICS, key=len, reverse=True))


def answers_eval_sets(args: TrainingArguments, method) -> bool:
    """A method that trains in chat (SFT) and chat-prompt GRPO answer their multiple-choice eval
    sets at every evaluation. `method`: its `config.methods.Method`."""
    return method.chat == "trains" or getattr(args, "prompt_format", None) == "chat"


def scored_names(recipe: RecipeArguments, args: TrainingArguments, method) -> list[str]:
    """The names whose accuracy an evaluation logs: the recipe's eval_tasks and, where the run
    answers them, its multiple-choice eval sets."""
    answered = answers_eval_sets(args, method)
    sets = [name for name, source in recipe.eval_sources.items() if answered and source.format == "usmle"]
    return [*recipe.eval_tasks, *sets]


def check_best_metric(recipe: RecipeArguments, args: TrainingArguments, path: str, method) -> None:
    """A metric_for_best_model that names a task or eval set this recipe does not evaluate would be
    looked for only at the first evaluation, after a whole interval of training, and fail there
    (Trainer raises KeyError); here it fails before training. Metrics of other shapes (a
    library's own, compute_metrics') are left to the trainer."""
    if not args.metric_for_best_model:
        return
    metric = f"eval_{args.metric_for_best_model.removeprefix('eval_')}"  # as the trainer looks it up
    if metric == "eval_loss":  # one unnamed eval set's (resolve_best_metric renames it for named ones)
        return
    if metric.endswith("_loss"):
        names, suffix = list(recipe.eval_sources), "loss"
    else:
        suffix = next((s for s in TASK_METRIC_SUFFIXES if metric.endswith(f"_{s}")), None)
        if suffix is None:
            return
        names = scored_names(recipe, args, method)
    name = metric.removeprefix("eval_").removesuffix(f"_{suffix}")
    if name in names:
        return
    logged = [f"eval_{n}_{suffix}" for n in names]
    if logged:
        hint = f"metrics of this kind it logs: {', '.join(logged)}"
    else:
        hint = "add eval_sets" if suffix == "loss" else "it scores no task at evaluation: list one in eval_tasks"
    raise UserError(
        f"{path}: metric_for_best_model '{args.metric_for_best_model}' names '{name}', which this recipe "
        f"does not evaluate{did_you_mean(metric, logged)}; {hint}"
    )


def check_read_keys(recipe: RecipeArguments, args: TrainingArguments, model_args, method, path: str) -> None:
    """Recipe keys the run would take and never read, each refused in one line: `subjects` without
    question sources, or empty; a model to start from beside init_from_scratch; SFT's
    dataset_text_field (the rows reach TRL with their text in 'text': a source's text_field names a
    column of yours); weight_unit tokens where rows, not documents, are drawn; save_strategy best
    without the metric it keeps the best by."""
    if recipe.subjects is not None and not recipe.subjects:
        raise UserError(f"{path}: subjects is an empty list; name the subjects to train on, or drop it for all")
    training = {s.format for s in (recipe.mixture.sources if recipe.mixture else [])}
    if recipe.subjects and "usmle" not in training:
        raise UserError(
            f"{path}: subjects chooses questions by subject, and no training source is format usmle "
            f"({', '.join(sorted(training)) or 'none'}); drop subjects, or train on questions"
        )
    if recipe.mixture and recipe.mixture.weight_unit == "tokens" and method.chat != "none":
        raise UserError(
            f"{path}: dataset_mixture: weight_unit tokens shares a pretraining run's tokens among its sources (their "
            f"documents' measured lengths), and a {method.name} run draws rows; drop weight_unit (its weights then "
            "count rows), or train documents with recipes/cpt.py"
        )
    if recipe.init_from_scratch and model_args.model_name_or_path:
        raise UserError(
            f"{path}: init_from_scratch builds a new model from 'architecture', and model_name_or_path "
            f"{model_args.model_name_or_path} would not be loaded; drop one of them"
        )
    field = getattr(args, "dataset_text_field", "text")
    if field != "text":
        raise UserError(
            f"{path}: dataset_text_field {field!r}: medrecipes hands TRL each row's text as 'text'; name your "
            "column with the source's text_field instead"
        )
    if getattr(args, "model_init_kwargs", None):
        raise UserError(
            f"{path}: model_init_kwargs is read by TRL only when it loads the model itself, and the recipe hands "
            "it a loaded one (models.loading), so they would be ignored; set dtype, attn_implementation, "
            "model_revision or trust_remote_code instead"
        )
    # A causal language model's forward takes its labels as "labels" (transformers' find_labels), and
    # the trainer computes the eval loss only for batches that hold every name in label_names.
    if args.label_names is not None and list(args.label_names) != ["labels"]:
        raise UserError(
            f"{path}: label_names {args.label_names}: the batches hold their labels as 'labels', so with another "
            "name the trainer finds none and computes no eval loss; drop label_names"
        )
    if getattr(args.save_strategy, "value", args.save_strategy) == "best" and not args.metric_for_best_model:
        raise UserError(
            f"{path}: save_strategy best saves when metric_for_best_model improves, and none is set, so no "
            "checkpoint would be saved; set metric_for_best_model (with eval_sets), or save_strategy: steps"
        )


def unread_notes(recipe: RecipeArguments, method, path: str) -> list[str]:
    """The recipe's keys that this run takes and nothing in it reads, said in one line each rather
    than refused: the prompt's keys where no question is put to the model as a prompt (a method that
    writes questions as text, sources that are not questions, and no eval_tasks in generate mode: a
    shipped recipe's system prompt stays when its sources are swapped for chat rows), and
    decontaminate_against in a run from the sources (the commands that check data read it)."""
    found = []
    formats = {source.format for source in named_sources(recipe).values()}
    prompted = (method.chat != "none" and "usmle" in formats) or (
        bool(recipe.eval_tasks) and recipe.eval_tasks_mode == "generate"
    )
    given = [key for key in ("system_prompt", "chain_of_thought") if getattr(recipe, key)]
    if given and not prompted:
        found.append(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for questions asked as a prompt, and this "
            f"{method.name.upper()} recipe asks none (no format: usmle source it prompts with, no eval_tasks in "
            "generate mode), so nothing reads it"
        )
    prompt = (recipe.system_prompt or "").strip()
    if prompt and "\n" not in prompt and os.path.isfile(os.path.expanduser(prompt)):
        found.append(
            f"system_prompt is the prompt's own text, and '{prompt}' is a file here: the model would be prompted "
            "with its path; write the text itself"
        )
    if recipe.with_explanation and not (method.name == "sft" and "usmle" in formats):
        found.append(
            f"with_explanation writes the explanation into SFT's answers to questions (format: usmle), and this "
            f"{method.name.upper()} recipe {'trains no questions' if method.name == 'sft' else 'writes none'}, so "
            "nothing reads it"
        )
    mixture = recipe.mixture
    if mixture and len(mixture.sources) == 1:  # the keys that share draws among sources
        written = recipe.dataset_mixture or {}
        shares = [k for k in ("stopping_strategy", "weight_unit") if k in written]
        shares += ["sources[0].weight"] if mixture.sources[0].weight != 1.0 else []
        if shares:
            found.append(
                f"dataset_mixture has one source, and {', '.join(shares)} share{'s' if len(shares) == 1 else ''} "
                "draws among sources, so nothing reads them (a weight is a share of the mixture, not of its file: "
                "to train on part of a file, cut the file or set max_steps); drop them"
            )
    if mixture and not mixture.streaming and "shuffle_buffer" in (recipe.dataset_mixture or {}):
        found.append(
            "dataset_mixture.shuffle_buffer shuffles a stream's packed blocks, and this mixture is not streamed "
            "(the trainer shuffles its rows whole), so nothing reads it"
        )
    for where, source in named_sources(recipe).items():
        urls = [u for u in source.locations() if is_url(u)]
        if source.storage_options and all(u.startswith("file://") for u in urls):
            found.append(
                f"{where}.storage_options are for object storage (s3://, gs://, ...), and this source reads local "
                "files, so nothing reads them"
            )
    if recipe.decontaminate_against and not recipe.built_data:
        found.append(
            f"decontaminate_against is read by `medrecipes decontaminate --train {path}` and by build-data, and a run "
            "from the sources checks nothing against it: run that command before training"
        )
    return found


def named_sources(recipe: RecipeArguments) -> dict:
    """Every data source of a recipe by where it is written: dataset_mixture.sources[i], eval_sets.NAME."""
    sources = {
        f"dataset_mixture.sources[{i}]": s for i, s in enumerate(recipe.mixture.sources if recipe.mixture else [])
    }
    return sources | {f"eval_sets.{name}": s for name, s in recipe.eval_sources.items()}


def _has_chat_template(folder: str) -> bool:
    """Whether the tokenizer saved in `folder` has a chat template, in any of the files transformers
    saves one to (a chat_template.jinja or .json beside it, or the key in tokenizer_config.json)."""
    if any(os.path.isfile(os.path.join(folder, name)) for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as file:
            return bool(json.load(file).get("chat_template"))
    except (OSError, ValueError, AttributeError):  # unreadable: the tokenizer's loading says so in the run
        return True


def check_sft_sources(recipe: RecipeArguments, args: MedSFTConfig, path: str) -> None:
    """A chat template file must exist (TRL opens it once the trainer is built), and a template
    shipped with medrecipes may be named (gemma, chatml); assistant_only_loss needs conversations:
    TRL refuses plain documents once it is built; completion_only_loss masks only prompt/completion
    rows, and does nothing to others. A target that writes the explanation (for PubMedQA the long
    answer) before its label needs the prompt that asks for it, and evaluation the room to read it."""
    formats = sorted({source.format for source in (recipe.mixture.sources if recipe.mixture else [])})
    if "text" in formats and len(formats) > 1:  # TRL trains one layout: the other rows' column is null
        others = ", ".join(f"format: {f}" for f in formats if f != "text")
        raise UserError(
            f"{path}: dataset_mixture mixes documents (format: text) with conversations ({others}), and SFT trains "
            "rows of one layout; train the documents with recipes/cpt.py first, or give the sources as one layout"
        )
    # TRL's SFTTrainer refuses it once the model is loaded, with its traceback (its own condition, here).
    if args.padding_free and not args.packing and args.max_length is not None:
        raise UserError(
            f"{path}: padding_free: true without packing holds no row to max_length {args.max_length} (TRL refuses "
            "it); set packing: true (packing_strategy bfd), or padding_free: false"
        )
    if recipe.with_explanation and not recipe.chain_of_thought:
        raise UserError(
            f"{path}: with_explanation trains answers that explain, then end in 'Final Answer: X', while the prompt "
            "asks for the letter only and evaluation reads 16 tokens; set chain_of_thought: true with it"
        )
    template = args.chat_template_path
    if template and shipped_template(template):
        args.chat_template_path = shipped_template(template)
    elif template:  # TRL reads a .jinja or .j2 file as a template, and anything else as a tokenizer
        kind = "no such file" if template.endswith((".jinja", ".j2")) and not os.path.isfile(template) else None
        if os.path.isfile(template) and not template.endswith((".jinja", ".j2")):
            kind = "a file that is no template (.jinja or .j2), so it would be read as a tokenizer"
        elif looks_local(template) and not os.path.exists(template):
            kind = kind or "no such file or tokenizer folder"
        elif os.path.isdir(template) and not any(
            os.path.isfile(os.path.join(template, name)) for name in ("tokenizer_config.json", "tokenizer.json")
        ):  # TRL would load it as a tokenizer, and find none
            kind = "a folder with no tokenizer in it (no tokenizer_config.json)"
        elif os.path.isdir(template) and not _has_chat_template(template):  # TRL would clone a template it lacks
            kind = "a tokenizer with no chat template (none in tokenizer_config.json, no chat_template.jinja)"
        if kind:
            raise UserError(
                f"{path}: chat_template_path: {template} is {kind}; name a .jinja file, a tokenizer, "
                f"or a template shipped with medrecipes ({', '.join(shipped_templates())})"
            )
    if args.chat_template_path and os.path.isfile(args.chat_template_path):
        check_template_syntax(args.chat_template_path, f"{path}: chat_template_path")
    sources = named_sources(recipe)
    if args.completion_only_loss:  # TRL masks by it only rows with a completion
        for where, source in sources.items():
            if source.format in ("text", "usmle"):
                rows = "documents" if source.format == "text" else "conversations (messages)"
                raise UserError(
                    f"{path}: {where}: completion_only_loss trains the completions of prompt/completion rows, and "
                    f"format {source.format} gives {rows}; leave it out (assistant_only_loss trains the answers "
                    "of conversations), or give format chat rows with prompt and completion"
                )
    if not args.assistant_only_loss:
        return
    for where, source in sources.items():
        if source.format == "text":
            raise UserError(
                f"{path}: {where}: format text has no assistant turns for assistant_only_loss; use format chat "
                "or usmle, set assistant_only_loss: false, or train on documents with recipes/cpt.py"
            )


def check_one_layout(recipe: RecipeArguments, args: TrainingArguments, path: str) -> None:
    """DPO's and KTO's sources share one layout (pairs, or unpaired answers: `medrecipes pairs
    --layout` writes either), since a mixture's rows share their columns."""
    training = {s.format for s in (recipe.mixture.sources if recipe.mixture else [])}
    if len(training) > 1:
        raise UserError(
            f"{path}: dataset_mixture mixes {' and '.join(sorted(training))} sources; give every source one layout "
            "(medrecipes pairs --layout writes either)"
        )


# ModelConfig's LoRA settings: they take effect only with use_peft.
# bitsandbytes' 4-bit settings, read only with load_in_4bit.
FOUR_BIT_SETTINGS = ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage")


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


def check_reference(args: TrainingArguments, model_args: ModelConfig, path: str) -> None:
    """sync_ref_model (DPO, KTO, GRPO) moves a reference model towards the policy: TRL refuses it,
    once its trainer is built after the models loaded, with an adapter (whose reference is the
    base model without it) and with GRPO's beta 0 (which loads no reference model)."""
    if not getattr(args, "sync_ref_model", False):
        return
    if model_args.use_peft:
        raise UserError(
            f"{path}: sync_ref_model moves a reference model, and with use_peft the reference is the base model "
            "under the adapter, which TRL cannot sync; set sync_ref_model: false, or train without LoRA"
        )
    if getattr(args, "beta", None) == 0 and isinstance(args, GRPOConfig):
        raise UserError(
            f"{path}: sync_ref_model moves the reference model, and beta 0 loads none (no KL term); set beta above 0, "
            "or sync_ref_model: false"
        )


def check_template_syntax(template: str, where: str) -> None:
    """A .jinja chat template compiled as transformers compiles it (its sandbox and tags, the
    `generation` block among them): a syntax error is one line with the template's own line, not
    jinja2's traceback when the first conversation is rendered."""
    with open(template, encoding="utf-8", errors="replace") as f:
        problem = template_error(f.read())
    if problem:
        raise UserError(f"{where}: {template} {problem}; fix the template")


def check_model_paths(recipe: RecipeArguments, model_args: ModelConfig, path: str, elsewhere: bool = False) -> None:
    """A model or tokenizer named by a file (a data file, a model's config.json): one line naming the
    key, not the loader's words about an unreadable config after the data is built. `elsewhere`: the
    recipe is read here to train later or on another machine (validate), so a local model not there
    yet (an earlier stage's output) is a note; a run here says so as it loads."""
    named = {
        "model_name_or_path": model_args.model_name_or_path,
        "tokenizer_name_or_path": recipe.tokenizer_name_or_path,
    }
    for key, value in named.items():
        if value and (problem := file_as_model(value)):
            raise UserError(f"{path}: {key}: {problem}")
        if elsewhere and value and missing_local_model(value):
            recipe.notes.append(
                f"{key} {value}: {absent(value)} here yet; the run needs it there (an earlier stage's output, or a "
                "model copied in)"
            )
        if value and not local_path(value) and not is_url(value):
            check_hub_id(value, key, path)


def check_hub_id(name: str, key: str, path: str) -> None:
    """A name that is no local path is a Hub id, which the Hub's own rule holds to (it refuses
    another only when the model loads, after the data): a revision after '@' (as pip and vLLM
    write it) has a key of its own."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as err:
        repo, at, revision = name.partition("@")
        if at and revision:
            raise UserError(
                f"{path}: {key} '{name}': a Hub id takes no @revision; write {key}: {repo} and "
                f"model_revision: {revision}"
            ) from None
        raise UserError(
            f"{path}: {key} '{name}' is no local path, and not a Hub id either ({str(err).split(':')[0]}); "
            "give a folder that exists or an id such as org/name"
        ) from None


def check_model_args(model_args: ModelConfig, path: str) -> None:
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
    if model_args.use_peft and model_args.lora_task_type != "CAUSAL_LM":  # PEFT's name for a causal LM's adapter
        raise UserError(
            f"{path}: lora_task_type '{model_args.lora_task_type}': every recipe trains a causal language model; "
            "use CAUSAL_LM (the default)"
        )
    # PEFT's LoraConfig takes both as they come; torch's Dropout refuses a probability above 1 only
    # when the model loads, and an alpha of 0 scales the adapter to nothing: B gets no gradient.
    if model_args.use_peft and not 0 <= model_args.lora_dropout < 1:
        raise UserError(
            f"{path}: lora_dropout must be at least 0 and below 1, got {model_args.lora_dropout}: it is the "
            "probability of zeroing each adapter input"
        )
    if model_args.use_peft and model_args.lora_alpha <= 0:
        raise UserError(
            f"{path}: lora_alpha must be above 0, got {model_args.lora_alpha}: the adapter's output is scaled by "
            "lora_alpha / lora_r, so 0 trains nothing (the usual choice is 2 x lora_r)"
        )
    if str(model_args.dtype) in ("float16", "half") and not model_args.use_peft:
        raise UserError(
            f"{path}: dtype {model_args.dtype} trains the weights themselves in half precision, with no float32 copy: "
            "updates underflow or overflow (the loss diverges within steps), and fp16: true refuses to unscale their "
            "gradients; load bfloat16 or float32 weights (fp16: true computes in float16 on a GPU), or train an "
            "adapter (use_peft: true)"
        )
    bits = [key for key in ("load_in_4bit", "load_in_8bit") if getattr(model_args, key)]  # one: RecipeModelConfig
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
    ignored = [key for key in FOUR_BIT_SETTINGS if getattr(model_args, key) != getattr(defaults, key)]
    if ignored and not model_args.load_in_4bit:
        raise UserError(
            f"{path}: {ignored[0]} sets up 4-bit loading, and load_in_4bit is false, so the model loads unquantised; "
            f"set load_in_4bit: true for QLoRA, or drop {', '.join(ignored)}"
        )
    if model_args.model_revision != defaults.model_revision:
        check_revision(model_args.model_name_or_path or "", model_args.model_revision, path)


def check_mirror_target(url: str, output_dir: str | None, where: str, recipe_notes: list[str]) -> None:
    """A mirror on this machine's filesystem (a path or file://) writes checkpoint-<step> folders
    into its folder, replacing files of those names: refused where it is, holds or lies inside the
    run's output_dir (the run would copy its checkpoints into themselves), and where it holds
    anything but checkpoint copies a mirror completed (a user's own files would be replaced).
    Object stores (s3://, gs://, ...) are the run's to reach, once fsspec can open them here; a
    memory:// mirror is noted, since its copies go with the process."""
    if problem := unreachable(url):
        raise UserError(f"{where}: checkpoint_mirror_url {url}: {problem}")
    protocol, _, rest = url.partition("://")
    if protocol == "memory":
        recipe_notes.append(
            f"checkpoint_mirror_url {url} copies into this process's memory, which goes when it exits: the copies "
            "outlive nothing; name a folder on another disk or an object store"
        )
    if protocol == "file" and not rest:  # fsspec would read it as the root
        raise UserError(f"{where}: checkpoint_mirror_url {url} names no folder; write file:///PATH/TO/FOLDER")
    if rest and protocol != "file":
        return
    folder = os.path.abspath(os.path.expanduser(rest if rest else url))
    if output_dir:
        run = os.path.abspath(output_dir)
        if os.path.commonpath([folder, run]) in (folder, run):
            raise UserError(
                f"{where}: checkpoint_mirror_url {url} is, holds or lies inside output_dir {output_dir}, where the "
                "checkpoints are already; name a folder on another disk (or an object store)"
            )
    if not os.path.isdir(folder):
        return
    for name in sorted(os.listdir(folder)):
        copy = os.path.join(folder, name)
        if checkpoint_step(name) is None or not os.path.isfile(os.path.join(copy, COMPLETE)):
            raise UserError(
                f"{where}: checkpoint_mirror_url {url} holds {name}, which is not a checkpoint a mirror copied "
                "there, and a copy could replace files in it; name an empty or new folder"
            )
