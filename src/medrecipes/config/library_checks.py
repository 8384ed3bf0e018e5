"""The checks of a recipe's settings against the libraries that will use them, run by
`parse.parse_recipe` before any model or data loads: each builds or asks the library's own
object (the Hub's repository-id rule, the loggers transformers knows, TRL's trainers' choices, the
optimizer and its schedule, torch's DataLoader) rather than keeping a copy of its rules, so a
library that changes them is followed. `notes` says, in one line each, the settings that the
libraries accept and then do nothing with on this machine.
"""

import copy
import dataclasses
import functools
import inspect
import math
import os
import re
import typing

from transformers import TrainingArguments

from medrecipes.config.reading import build_dataclass, check_value, written_keys
from medrecipes.config.schema import world_size, zero_stage
from medrecipes.errors import UserError, check_choice, did_you_mean


def check_hub_model_id(args: TrainingArguments, path: str) -> None:
    """The Hub's own rule for a repository id (`huggingface_hub.utils.validate_repo_id`), before
    the training whose push it would refuse."""
    if not getattr(args, "hub_model_id", None):
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(args.hub_model_id)
    except HFValidationError as err:
        raise UserError(f"{path}: hub_model_id: {str(err).splitlines()[0]}") from None


def check_dpo_reference(args, path: str) -> None:
    """TRL refuses a reference that is both synced and precomputed when its trainer is built, after
    both models loaded."""
    if args.sync_ref_model and args.precompute_ref_log_probs:
        raise UserError(
            f"{path}: sync_ref_model moves the reference model, and precompute_ref_log_probs scores it once before "
            "training; set one of them to false"
        )


def _trainer_of(args):
    """The TRL config `args` parses into and the trainer it is written for (DPOConfig, DPOTrainer);
    None for the plain Trainer's arguments."""
    import trl

    for cls in type(args).__mro__:
        if cls.__module__.startswith("trl.") and cls.__name__.endswith("Config"):
            trainer = getattr(trl, cls.__name__.removesuffix("Config") + "Trainer", None)
            return (cls, trainer) if trainer is not None else None
    return None


def _own_fields(config) -> list:
    return [f for f in dataclasses.fields(config) if f.name not in TrainingArguments.__dataclass_fields__]


def _default(field):
    return field.default if field.default_factory is dataclasses.MISSING else field.default_factory()


def _named(field) -> bool:
    """A setting that names a choice: a name, or a list of names (DPO's loss_type)."""
    default = _default(field)
    return isinstance(default, str) or (isinstance(default, list) and all(isinstance(x, str) for x in default))


def _name_of(node) -> str | None:
    import ast

    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None


@functools.cache
def _source_tree(cls):
    import ast
    import textwrap

    return ast.parse(textwrap.dedent(inspect.getsource(cls)))


@functools.cache
def _compared_values(config, trainer) -> dict[str, frozenset[str]]:
    """The names each choice of a TRL config is compared with in its trainer's and its own source
    (`loss_type == "sigmoid"`, `scale_rewards in ["group", "none"]`): the values TRL acts on."""
    import ast

    choices = {f.name for f in _own_fields(config) if _named(f)}
    found: dict[str, set[str]] = {}
    for cls in (trainer, config):
        for node in ast.walk(_source_tree(cls)):
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
                continue
            if not isinstance(node.ops[0], ast.Eq | ast.NotEq | ast.In | ast.NotIn):
                continue
            for side, other in ((node.left, node.comparators[0]), (node.comparators[0], node.left)):
                items = other.elts if isinstance(other, ast.Tuple | ast.List | ast.Set) else [other]
                if _name_of(side) in choices and all(
                    isinstance(i, ast.Constant) and isinstance(i.value, str) for i in items
                ):
                    found.setdefault(_name_of(side), set()).update(i.value for i in items)
    return {name: frozenset(values) for name, values in found.items()}


def check_trainer_choices(args, path: str) -> None:
    """Each choice a TRL trainer makes by name (DPO's loss_type and f_divergence_type, GRPO's
    scale_rewards, multi_objective_aggregation and importance_sampling_level, SFT's
    packing_strategy, ...) is one it acts on: TRL refuses another only once the model has loaded,
    at the first loss, or takes it and does nothing. The names are read from the installed
    trainer's source, so a TRL that adds one is followed."""
    found = _trainer_of(args)
    if found is None:
        return
    config, trainer = found
    for field, known in _compared_values(config, trainer).items():
        value = getattr(args, field)
        for name in value if isinstance(value, list) else [value]:
            if isinstance(name, str) and name not in known:
                options = sorted(known)
                raise UserError(
                    f"{path}: {field} '{name}' is none of the values TRL's {trainer.__name__} acts on"
                    f"{did_you_mean(name, options)}; use {', '.join(options)}"
                )


@functools.cache
def _branch_readers(config, trainer) -> dict[str, tuple[str, frozenset[str]]]:
    """The settings of a TRL config that its trainer reads only inside branches of one choice
    (`if loss_type == "discopop": ... self.args.discopop_tau`), found in the trainer's source:
    setting -> (the choice, the values whose branch reads it). A setting read anywhere else (a copy
    `self.x = args.x` and a check that only raises or warns do not count) is read whatever the choice."""
    import ast

    own = _own_fields(config)
    choices = {f.name for f in own if _named(f)}
    tree = _source_tree(trainer)

    def said(stmt) -> bool:  # a statement that refuses or warns, and does nothing else
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        warns = isinstance(call, ast.Call) and _name_of(call.func) in ("warn", "warning", "info", "warning_once")
        return isinstance(stmt, ast.Raise) or warns

    inside: dict[int, set[tuple[str, str]]] = {}  # a node -> the (choice, value) branches it lies in
    skipped: set[int] = set()  # copies and raising checks
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            if (
                isinstance(test, ast.Compare)
                and isinstance(test.ops[0], ast.Eq)
                and _name_of(test.left) in choices
                and isinstance(value := test.comparators[0], ast.Constant)
                and isinstance(value.value, str)
            ):
                for sub in (n for stmt in node.body for n in ast.walk(stmt)):
                    inside.setdefault(id(sub), set()).add((_name_of(test.left), value.value))
            if all(map(said, node.body)):
                skipped.update(id(n) for part in (test, *node.body) for n in ast.walk(part))
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and _name_of(node.targets[0]) == _name_of(node.value)
        ):
            skipped.update((id(node.targets[0]), id(node.value)))
    readers = {}
    for field in (f.name for f in own if f.name not in choices):
        reads = [inside.get(id(n), set()) for n in ast.walk(tree) if _name_of(n) == field and id(n) not in skipped]
        if not reads or not all(reads):
            continue
        for choice in {c for c, _ in reads[0]}:
            values = [{v for c, v in branches if c == choice} for branches in reads]
            if all(values):
                readers[field] = (choice, frozenset().union(*values))
    return readers


def check_branch_settings(args, path: str) -> None:
    """A setting that the trainer reads only under some values of a choice, set while the choice is
    another (DPO's discopop_tau beside loss_type sigmoid, its f_alpha_divergence_coef beside a
    reverse KL; GRPO's SAPO temperatures under another loss): TRL takes it and does nothing with it.
    Read from the installed trainer's source, so a TRL that adds a loss or a setting is followed.
    A setting at its default is left alone: a resolved recipe (`medrecipes validate`, a run's record)
    writes every key, and parses again."""
    found = _trainer_of(args)
    if found is None:
        return
    config, trainer = found
    defaults = {f.name: _default(f) for f in dataclasses.fields(config)}
    for field, (choice, values) in _branch_readers(config, trainer).items():
        default = defaults[field]
        chosen = getattr(args, choice)
        chosen = chosen if isinstance(chosen, list) else [chosen]
        if getattr(args, field) != default and not values & set(chosen):
            readers = sorted(values)
            instead = readers[0] if len(readers) == 1 else "one of those"
            raise UserError(
                f"{path}: {field} is read only by TRL's {choice} {', '.join(readers)}, and {choice} "
                f"{', '.join(map(str, chosen))} does not read it; set {choice} to {instead}, or leave {field} out"
            )


def check_loggers(args: TrainingArguments, path: str) -> None:
    """report_to names loggers transformers knows (the Trainer refuses others only once it is built)."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    for name in args.report_to:
        check_choice(name, [*INTEGRATION_TO_CALLBACK, "all", "none"], f"{path}: report_to")
    if len(args.report_to) > 1 and {"none", "all"} & set(args.report_to):  # transformers refuses it once built
        word = "none" if "none" in args.report_to else "all"
        raise UserError(
            f"{path}: report_to {', '.join(args.report_to)}: '{word}' stands alone (no logger, or every one); "
            "give it alone, or list the loggers"
        )


def check_installed(args: TrainingArguments, model_args, path: str) -> None:
    """What the run needs installed on this machine, asked of the libraries' own availability
    checks before anything loads (each is refused by the trainer or the model's loader only once
    the model and data are there): the loggers in report_to, the Liger kernels, the optimizer's
    package (bitsandbytes, GaLore, ...) and the attention implementation's."""
    from transformers import Trainer
    from transformers.integrations.integration_utils import get_available_reporting_integrations
    from transformers.utils import is_liger_kernel_available

    installed = get_available_reporting_integrations()
    if missing := [name for name in args.report_to if name not in (*installed, "all", "none")]:
        raise UserError(
            f"{path}: report_to {missing[0]}: its package is not installed here (installed loggers: "
            f"{', '.join(installed) or 'none'}); install it, or leave {missing[0]} out of report_to"
        )
    if args.use_liger_kernel and not is_liger_kernel_available():
        raise UserError(
            f"{path}: use_liger_kernel: the liger-kernel package is not installed (its kernels run on GPUs); "
            "install it, or set use_liger_kernel: false"
        )
    try:
        Trainer.get_optimizer_cls_and_kwargs(args)
    except ImportError as err:
        optim = getattr(args.optim, "value", args.optim)
        raise UserError(f"{path}: optim {optim}: {' '.join(str(err).split())}; or choose another optim") from None
    except Exception:  # an optimizer that needs the model: the trainer checks it
        pass
    attention = model_args.attn_implementation
    if attention and (missing := _attention_missing(attention)):
        raise UserError(f"{path}: attn_implementation {attention} needs {missing}; use sdpa (the default) or eager")


def _attention_missing(attention: str) -> str | None:
    """What this machine lacks for an attention implementation, asked of transformers' own
    availability checks: a flash-attention package (flash_attention_N) or the kernels package
    (a Hub kernel, org/name); None where it has it."""
    import transformers.utils as available

    if attention.startswith("flash_attention_"):
        check = getattr(available, f"is_flash_attn_{attention.rsplit('_', 1)[-1]}_available", None)
        if check is not None and not check():
            return f"the flash-attn package for {attention}, which is not installed (it runs on NVIDIA GPUs only)"
    if "/" in attention and not available.is_kernels_available():
        return "the kernels package to fetch a Hub kernel, which is not installed"
    return None


# The TrainingArguments the optimizer is built from (weight_decay through its parameter groups).
OPTIMIZER_SETTINGS = ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "optim_args")


def _optimizer_probe(args: TrainingArguments):
    """The run's optimizer, built as the trainer builds it on a one-element parameter, with its
    learning-rate scheduler; None where it cannot be built without the model or a GPU (GaLore,
    some 8-bit optimizers): the trainer then checks it at its own time."""
    import torch
    from transformers import Trainer

    try:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    except Exception:  # an optimizer that needs the model, or a library that is not installed (check_installed)
        return None
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = cls([{"params": [parameter], "weight_decay": args.weight_decay}], **kwargs)
    # transformers' schedules scale learning_rate by a factor from 0 to 1 at each step; a factor
    # outside (a polynomial of negative power, a cosine of negative cycles) is a setting's slip.
    steps, factors = _schedule_factors(args, optimizer)
    for step, value in factors.items():
        if not 0 <= value <= 1 + 1e-9:
            raise ValueError(
                f"the learning rate would be {value * args.learning_rate:.3g} at step {step} of {steps}, outside "
                f"0 to learning_rate {args.learning_rate:g}"
            )
    return optimizer


def _schedule_factors(
    args: TrainingArguments, optimizer=None, steps: int | None = None
) -> tuple[int, dict[int, float]]:
    """The run's step count (`steps`, else max_steps, 100 where it is counted in epochs) and the factor
    transformers' schedule scales learning_rate by at steps spread over it ({} for a schedule of no
    factor: plateau)."""
    import torch
    from transformers.optimization import get_scheduler

    optimizer = optimizer or torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    steps = steps or (args.max_steps if args.max_steps > 0 else 100)
    scheduler = get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.get_warmup_steps(steps),
        num_training_steps=steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    lambdas = getattr(scheduler, "lr_lambdas", [])
    sampled = sorted({*range(0, steps + 1, max(1, steps // 200)), steps - 1, steps})
    return steps, {step: _factor(lambdas[0], step) for step in sampled} if lambdas else {}


def _factor(schedule, step: int) -> float:
    try:
        return schedule(step)
    except ArithmeticError:  # 0 to a negative power, ...: no rate at all
        return math.inf


def _refused_key(args: TrainingArguments, probe, keys: tuple[str, ...], path: str, refuser: str) -> None:
    """Run `probe` on the run's settings; where the library refuses them, one line with its reason
    naming the key whose default makes the probe pass (or every key, where no one alone does)."""
    try:
        probe(args)
        return
    except (ValueError, TypeError) as err:
        reason = " ".join(str(err).split()).rstrip(".") or type(err).__name__
    defaults = TrainingArguments(output_dir=args.output_dir, use_cpu=True)
    for key in keys:
        trial = copy.copy(args)
        setattr(trial, key, getattr(defaults, key))
        try:
            probe(trial)
        except (ValueError, TypeError):
            continue
        raise UserError(
            f"{path}: {key} {getattr(args, key)!r} is refused by {refuser} ({reason}); "
            f"use a value it accepts (default {getattr(defaults, key)!r})"
        )
    raise UserError(f"{path}: {refuser} refuses these settings ({reason}); check {', '.join(keys)}")


def check_optimizer(args: TrainingArguments, path: str) -> None:
    """The optimizer and its schedule accept the recipe's settings: torch's and transformers' own
    refusals ("Invalid beta parameter at index 0: 1.5") become one line naming the key, before
    any model or data is loaded rather than at the first step."""
    optim = getattr(args.optim, "value", args.optim)
    _check_optim_args(args, optim, path)
    _check_read_by_optimizer(args, optim, path)
    keys = (*OPTIMIZER_SETTINGS, "lr_scheduler_kwargs")
    _refused_key(args, _optimizer_probe, keys, path, f"the {optim} optimizer or its schedule")


def _optimizer_given(args: TrainingArguments, **changes) -> str:
    """What transformers hands the run's optimizer (its keyword arguments, as text) with `changes`
    made to a copy of the settings: a setting whose changes leave it alone is not read."""
    from transformers import Trainer

    trial = copy.copy(args)
    for key, value in changes.items():
        setattr(trial, key, value)
    return repr(Trainer.get_optimizer_cls_and_kwargs(trial)[1])


def _check_read_by_optimizer(args: TrainingArguments, optim: str, path: str) -> None:
    """Adam's settings changed for an optimizer that does not read them (SGD, Adafactor, ...):
    transformers builds it without them and without a word. A key is read where what the optimizer
    is given changes with its value."""
    # The defaults as declared: building TrainingArguments here would set up accelerate's state
    # (under a launch, its process group) before the run's own arguments do.
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    for key in ("adam_beta1", "adam_beta2", "adam_epsilon"):
        if getattr(args, key) == defaults[key]:
            continue
        try:
            ignored = _optimizer_given(args, **{key: 0.5}) == _optimizer_given(args, **{key: 0.25})
        except Exception:  # needs the model, or a library that is not installed: the trainer checks it
            return
        if ignored:
            raise UserError(
                f"{path}: {key} is not read by the {optim} optimizer (transformers builds it without it); leave it "
                f"out, or choose an Adam optimizer (adamw_torch, ...)"
            )


def _check_optim_args(args: TrainingArguments, optim: str, path: str) -> None:
    """optim_args is "key=value,key=value" (as transformers splits it), and each key reaches the
    optimizer: transformers hands on only the keys the chosen optimizer's branch reads (SGD's
    momentum, ...) and drops the others without a word. Checked where the optimizer's arguments
    can be worked out without the model (not GaLore's or LOMO's)."""
    from transformers import Trainer

    if not args.optim_args:
        return
    pairs = [pair for pair in args.optim_args.replace(" ", "").split(",") if pair]
    if malformed := next((pair for pair in pairs if pair.count("=") != 1), None):
        raise UserError(
            f"{path}: optim_args '{args.optim_args}' holds '{malformed}', not key=value; write key=value pairs "
            "separated by commas (momentum=0.9,nesterov=True)"
        )
    given = dict(pair.split("=") for pair in pairs)

    def built(key: str, value: str) -> str:  # the optimizer's arguments with `key` set to `value`
        try:
            return _optimizer_given(
                args, optim_args=",".join(f"{k}={value if k == key else v}" for k, v in given.items())
            )
        except (ValueError, TypeError):  # the value was cast, so the key is read
            return f"refused {value}"

    try:
        Trainer.get_optimizer_cls_and_kwargs(args)
    except Exception:  # needs the model, or a library that is not installed: the trainer checks it
        return
    # A key is read where what the optimizer is given changes with its value.
    if ignored := [key for key in given if len({built(key, value) for value in ("0", "1", "True", "False")}) == 1]:
        raise UserError(
            f"{path}: optim_args {', '.join(ignored)} is not read for the {optim} optimizer (transformers drops "
            "it without a word); leave it out, or set adam_beta1, adam_beta2, adam_epsilon or weight_decay as "
            "keys of their own"
        )


# The TrainingArguments each DataLoader of the run is built from (transformers' get_train_dataloader).
DATALOADER_SETTINGS = (
    "dataloader_num_workers",
    "dataloader_prefetch_factor",
    "dataloader_persistent_workers",
    "dataloader_pin_memory",
    "dataloader_drop_last",
)


def _dataloader_probe(args: TrainingArguments) -> None:
    """A DataLoader over one row with the run's settings: torch checks them in its constructor,
    and the trainer builds its loaders only after the model and the data have loaded."""
    import warnings

    from torch.utils.data import DataLoader

    with warnings.catch_warnings():  # its advice on the worker count is for the machine that trains
        warnings.simplefilter("ignore")
        DataLoader(
            [0],
            num_workers=args.dataloader_num_workers,
            prefetch_factor=args.dataloader_prefetch_factor,
            persistent_workers=args.dataloader_persistent_workers,
            pin_memory=args.dataloader_pin_memory,
            drop_last=args.dataloader_drop_last,
        )


def check_dataloader(args: TrainingArguments, path: str) -> None:
    """torch's own refusal of the loader settings ("num_workers option should be non-negative")
    as one line naming the key."""
    _refused_key(args, _dataloader_probe, DATALOADER_SETTINGS, path, "torch's DataLoader")


def _seed_probe(args: TrainingArguments) -> None:
    """The generators transformers' `set_seed` seeds with the run's seed, each a fresh one (the
    process's own are not touched): numpy's takes 0 to 2**32 - 1 only, refused when the run starts."""
    import numpy as np
    import torch

    np.random.RandomState(args.seed)
    torch.Generator().manual_seed(args.seed)


def check_seed(args: TrainingArguments, path: str) -> None:
    """The seed as the random number generators that `set_seed` seeds take it, as one line."""
    _refused_key(args, _seed_probe, ("seed",), path, "the generators set_seed seeds (numpy, torch)")


def check_generation_config(args, path: str) -> None:
    """The GenerationConfig GRPO's trainer builds from its sampling settings, cache_implementation
    and generation_kwargs (built when the trainer is, after the model loaded), built here with the
    same keys and asked to validate itself: an unknown cache, generation_kwargs that are no
    mapping, or a value transformers refuses are one line."""
    from transformers import GenerationConfig

    kwargs = args.generation_kwargs
    if kwargs is not None and not isinstance(kwargs, dict):
        raise UserError(
            f"{path}: generation_kwargs {kwargs!r} is not a mapping; write it as {{key: value, ...}} "
            "(transformers' GenerationConfig settings)"
        )
    # The generation settings the trainer builds from the recipe's own keys (generation setting: key)
    own = {
        key: key for key in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "cache_implementation")
    }
    own["max_new_tokens"] = "max_completion_length"
    if (kwargs or {}).get("do_sample", True) is not True:
        raise UserError(
            f"{path}: generation_kwargs.do_sample {kwargs['do_sample']!r}: GRPO learns from the differences between "
            "a group's sampled answers, and greedy answers are all one; drop it (GRPO always samples)"
        )
    if args.top_k == 1:  # generation samples from the one most likely token: greedy by another name
        raise UserError(
            f"{path}: top_k 1 samples from the single most likely token, so a group's answers are all one, and GRPO "
            "learns from the differences between them; use 0 (no limit) or a top_k above 1"
        )
    if args.min_p is not None and args.min_p >= 1:  # only tokens as likely as the likeliest: greedy again
        raise UserError(
            f"{path}: min_p {args.min_p} keeps only the tokens as likely as the most likely one, so a group's answers "
            "are all one, and GRPO learns from the differences between them; use a min_p below 1 (0.05 to 0.1 is "
            "usual), or leave it out"
        )
    if overridden := [key for key in own if key in (kwargs or {})]:  # TRL lets generation_kwargs win, silently
        raise UserError(
            f"{path}: generation_kwargs.{overridden[0]} overrides the recipe's {own[overridden[0]]}; set "
            f"{own[overridden[0]]} instead, and drop it from generation_kwargs"
        )
    settings = {setting: getattr(args, key) for setting, key in own.items()}
    settings |= {"do_sample": True, **(kwargs or {})}
    try:
        config = GenerationConfig(**settings)
        config.validate(strict=True)
    except (ValueError, TypeError) as err:
        reason = " ".join(str(err).split())
        named = next((key for key in settings if key in reason), "generation_kwargs")
        raise UserError(
            f"{path}: {named}: transformers' generation refuses it ({reason}); change or drop it"
        ) from None
    mode = config.get_generation_mode()  # transformers' own reading of the settings: beams are no samples
    if mode.value != "sample":
        asked = [key for key in (kwargs or {}) if key not in ("do_sample",)] or ["generation_kwargs"]
        raise UserError(
            f"{path}: generation_kwargs {', '.join(asked)}: transformers generates by {mode.value} with them, not by "
            "plain sampling, and GRPO learns from the differences between a group's sampled answers; drop them"
        )


# Below these (temperature, top_p) or from this on (min_p), sampling is greedy in all but name for
# most tokens (a token at 0.3 against one at 0.7 falls under 2% at temperature 0.2; min_p 0.5 drops
# every token under half the likeliest's); usual GRPO runs sample at 0.6 to 1.0 with top_p 0.9 to 1
# and min_p, where set, 0.05 to 0.1.
NEAR_GREEDY = {"temperature": 0.2, "top_p": 0.2}
NEAR_GREEDY_MIN_P = 0.5


def sampling_note(args) -> str | None:
    """A GRPO sampling setting so narrow that a group's answers will be nearly all the same: said,
    not refused, as the point where it stops teaching depends on the model's confidence."""
    narrow = [f"{key} {getattr(args, key)}" for key, bound in NEAR_GREEDY.items() if getattr(args, key) < bound]
    if args.min_p is not None and args.min_p >= NEAR_GREEDY_MIN_P:
        narrow.append(f"min_p {args.min_p}")
    if not narrow:
        return None
    return (
        f"{' and '.join(narrow)}: answers sampled this narrowly are nearly all the one greedy answer, and GRPO "
        "learns from the differences within a group (frac_reward_zero_std in the log is the share of groups that "
        "taught nothing); temperature 0.6 to 1.0, top_p 0.9 to 1 and min_p 0.05 to 0.1 (or none) are usual"
    )


def check_sampling(args, path: str) -> None:
    """GRPO's sampling settings as transformers' generation takes them: it builds a logits processor
    for each setting that changes sampling, whose constructor refuses a value out of its range, at
    the first generation, after the model loaded. Here each is built as generation would build it."""
    from transformers.generation import logits_process as lp

    processors = (  # (key, the processor generation builds for it, whether it builds one for this value)
        ("top_k", lp.TopKLogitsWarper, lambda v: v is not None and v != 0),
        ("top_p", lp.TopPLogitsWarper, lambda v: v is not None and v < 1.0),
        ("min_p", lp.MinPLogitsWarper, lambda v: v is not None),
        ("repetition_penalty", lp.RepetitionPenaltyLogitsProcessor, lambda v: v is not None and v != 1.0),
    )
    for key, processor, built in processors:
        value = getattr(args, key, None)
        if built(value):
            try:
                processor(value)
            except ValueError as err:
                raise UserError(
                    f"{path}: {key} {value} is refused by transformers' generation ({' '.join(str(err).split())}); "
                    f"set {key} within that range, or leave it out"
                ) from None


def check_compile_mode(args: TrainingArguments, path: str) -> None:
    """torch_compile_backend and torch_compile_mode are torch's (dynamo's backends, inductor's
    modes): torch refuses another only when the model is first compiled, in the first step."""
    backend = getattr(args, "torch_compile_backend", None)
    if backend and getattr(args, "torch_compile", False):
        import torch._dynamo

        if backend not in torch._dynamo.list_backends(exclude_tags=()):  # its own, debugging ones included
            shown = torch._dynamo.list_backends()
            raise UserError(
                f"{path}: torch_compile_backend '{backend}' is not one of torch's{did_you_mean(backend, shown)}; "
                f"use {', '.join(shown)}"
            )
    mode = getattr(args, "torch_compile_mode", None)
    if mode is None or not getattr(args, "torch_compile", False):
        return
    import torch._inductor

    modes = list(torch._inductor.list_mode_options())
    if mode not in modes:
        raise UserError(
            f"{path}: torch_compile_mode '{mode}' is not one of torch's{did_you_mean(mode, modes)}; use {', '.join(modes)}"
        )


# The settings that send something to the Hub during or at the end of a run.
HUB_WRITES = ("push_to_hub", "push_checkpoint_revisions")


def check_hub_reachable(args: TrainingArguments, recipe, path: str) -> None:
    """A run that would push while huggingface_hub is offline (HF_HUB_OFFLINE) fails at its first
    push, after it trained: refused before. push_to_hub is the trainer's key, push_checkpoint_revisions
    the recipe's."""
    from huggingface_hub import constants

    asked = [key for key in HUB_WRITES if getattr(args, key, False) or getattr(recipe, key, False)]
    if asked and constants.HF_HUB_OFFLINE:
        raise UserError(
            f"{path}: {asked[0]} is true but the Hub is offline here (HF_HUB_OFFLINE=1), so the push would fail "
            f"after training; set {asked[0]}: false and upload final/ later (hf upload), or unset HF_HUB_OFFLINE"
        )
    if asked:  # the trainer creates the repository as it is built, with this token: no token fails there
        from huggingface_hub import HfApi, get_token

        token = getattr(args, "hub_token", None) or get_token()
        if token is None:
            raise UserError(
                f"{path}: {asked[0]} is true and no Hub token is set here (hf auth login, HF_TOKEN, or hub_token), "
                f"so the push would fail; log in, or set {asked[0]}: false and upload final/ later (hf upload)"
            )
        try:
            HfApi().whoami(token=token)
        except Exception as err:  # no network, a revoked token: the trainer's repository call fails the same way
            reason = " ".join(str(err).split())[:160] or type(err).__name__
            raise UserError(
                f"{path}: {asked[0]} is true and the Hub does not answer for this token ({reason}); check the network "
                f"and the token, or set {asked[0]}: false and upload final/ later (hf upload)"
            ) from None


def trains_on_cpu(args: TrainingArguments) -> bool:
    import torch

    return args.use_cpu or not torch.accelerator.is_available()


# How transformers' help words the settings that only a run of several processes reads.
SEVERAL_PROCESSES = re.compile(
    r"^(When (using|doing) (a )?(multi-?node )?distributed training|The backend to use for distributed training|"
    r"Logging level for replica processes)|from all devices|across devices|init_process_group",
    re.IGNORECASE,
)


@functools.cache
def distributed_keys(config: type) -> tuple[str, ...]:
    """The settings of `config` whose help says they set up training on several processes (DDP's
    flags, its backend and timeout, logging and saving per node, gathering from all devices,
    averaging the tokens across them)."""
    return tuple(
        f.name
        for f in dataclasses.fields(config)
        if SEVERAL_PROCESSES.search(" ".join((f.metadata.get("help") or "").split()))
    )


def _said_true(value) -> bool:
    """A switch as the recipe wrote it (true in YAML, 'true' or 'yes' on the command line)."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "yes", "y", "t", "1")


def notes(args: TrainingArguments, recipe=None) -> list[str]:
    """The settings the libraries take and then do nothing with, each as one line: in the run's
    course (`_course_notes`), on this machine and its processes (`_machine_notes`), keys no part of
    a recipe's run reads (`_unread_notes`), and the keys of a feature switched off (`_switched_off`).
    `recipe.given` holds what the recipe wrote: a key the library sets from another is not said."""
    given = getattr(recipe, "given", {})
    return [
        *_course_notes(args, given),
        *_machine_notes(args, given),
        *_unread_notes(args, given),
        *_switched_off(args, recipe),
        *_no_evaluation(args, recipe),
        *_logger_variables(args),
    ]


# A logger's settings in the environment start with its name in transformers' list, as one word
# (WANDB_PROJECT, MLFLOW_EXPERIMENT_NAME, AZUREML_...); Comet's drop its "_ml". Its credentials
# are left unsaid: they live in shells and profiles for every project.
CREDENTIAL_WORDS = ("KEY", "TOKEN", "PASSWORD", "SECRET")


def _logger_variables(args: TrainingArguments) -> list[str]:
    """Settings in the environment of a logger that report_to leaves out: no logger reads them."""
    return [
        f"{', '.join(read)} in the environment {'is' if len(read) == 1 else 'are'} read by the {name} logger, and "
        f"report_to is {', '.join(args.report_to) or 'none'}: nothing reads {'it' if len(read) == 1 else 'them'}; "
        f"add {name} to report_to to log there"
        for name, read in logger_settings(args.report_to).items()
    ]


def logger_settings(report_to: list[str]) -> dict[str, list[str]]:
    """{logger: its settings in the environment} for each logger transformers knows outside `report_to`."""
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    found = {}
    for name in sorted(set(INTEGRATION_TO_CALLBACK) - set(report_to)):
        prefixes = {name.replace("_", "").upper() + "_", name.removesuffix("_ml").upper() + "_"} - {"AZURE_"}
        if read := sorted(
            v for v in os.environ if v.startswith(tuple(prefixes)) and not any(w in v for w in CREDENTIAL_WORDS)
        ):
            found[name] = read
    return found


def _no_evaluation(args: TrainingArguments, recipe) -> list[str]:
    """How an evaluation runs (eval a word of the key: per_device_eval_batch_size, bf16_full_eval,
    eval_accumulation_steps, a trainer's own), read from the config's fields, where the recipe has no
    eval sets: no run evaluates, so none reads them (do_eval, and what eval_strategy no switches off,
    are said by `_unread_notes` and `_switched_off`)."""
    if recipe is None or getattr(recipe, "eval_sources", True):
        return []
    written = written_keys(getattr(recipe, "given", {}))
    said = ("do_eval", *(SWITCHED_OFF["eval_strategy"][1] if args.eval_strategy == "no" else ()))  # said there
    unread = [
        f.name
        for f in dataclasses.fields(args)
        if re.search(r"(^|_)eval(_|$)", f.name) and f.name in written and f.name not in said
        and f.default is not dataclasses.MISSING and getattr(args, f.name) != f.default
    ]  # fmt: skip
    if not unread:
        return []
    them = "it" if len(unread) == 1 else "them"
    return [
        f"{_they(unread, 'sets', 'set')} how the run evaluates, and there are no eval_sets, so nothing reads {them}; "
        f"add eval_sets, or drop {them}"
    ]


def _they(keys: list[str], one: str, many: str) -> str:
    """'a, b are' / 'a is': the keys as the subject of a verb."""
    return f"{', '.join(keys)} {one if len(keys) == 1 else many}"


def _flat_after_warmup(args: TrainingArguments) -> bool:
    """Whether the run's schedule holds one factor from the end of its warm-up to its last step (a
    cosine of 0 cycles, a polynomial of power 0): transformers builds it without a word."""
    try:
        steps, factors = _schedule_factors(args)
    except Exception:  # refused, in check_optimizer's line
        return False
    after = [value for step, value in factors.items() if args.get_warmup_steps(steps) <= step < steps]
    return len(after) > 1 and max(after) - min(after) < 1e-9


def _takes_warmup(args: TrainingArguments) -> bool:
    """Whether the schedule's function, in transformers' own table, takes a warm-up."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION

    function = TYPE_TO_SCHEDULER_FUNCTION.get(args.lr_scheduler_type)
    return function is None or "num_warmup_steps" in inspect.signature(function).parameters


def warmup_note(args: TrainingArguments, steps: int) -> str | None:
    """A warm-up that takes every step of a run of `steps`: the learning rate never reaches
    learning_rate (a run of one step trains at 0 and changes no weight). The warm-up's count is
    transformers' (`get_warmup_steps`: a share below 1 rounded up), the rate its schedule's."""
    warm = args.get_warmup_steps(steps) if steps > 0 else 0
    if not warm or warm < steps or args.learning_rate == 0 or not _takes_warmup(args):
        return None
    peak = max(value for step, value in _schedule_factors(args, steps=steps)[1].items() if step < steps)
    reached = (
        "trains at learning rate 0 and changes no weight"
        if peak == 0
        else (f"reaches {peak:.0%} of learning_rate at its last step")
    )
    return (
        f"warmup_steps {args.warmup_steps:g} is a warm-up of {warm} step{'s' if warm > 1 else ''}, the whole run "
        f"({steps} step{'s' if steps > 1 else ''}): it {reached}; lower warmup_steps, or train more steps"
    )


def _course_notes(args: TrainingArguments, given: dict) -> list[str]:
    """A learning rate of 0 trains nothing; transformers clips gradients only at a norm above 0; a
    schedule whose function takes no warm-up ignores it; a compile mode alone switches compiling
    on; an interval longer than the run happens at no step of it; max_steps (or the total_tokens
    that decides it) ends the run whatever the epochs."""
    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION

    found = []
    if args.learning_rate == 0 and not getattr(args, "embedding_learning_rate", None):
        found.append("learning_rate 0 changes no weight: the run saves the model it starts from; give a positive rate")
    if args.max_grad_norm is not None and args.max_grad_norm <= 0:
        found.append(
            f"max_grad_norm {args.max_grad_norm:g} turns gradient clipping off (transformers clips only above 0); "
            "give a positive norm (1.0 is usual) to clip"
        )
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    if args.warmup_steps and not _takes_warmup(args):
        with_warmup = f"{schedule}_with_warmup"
        instead = (
            with_warmup if any(t.value == with_warmup for t in TYPE_TO_SCHEDULER_FUNCTION) else "linear or cosine"
        )
        found.append(
            f"warmup_steps {args.warmup_steps:g} is ignored by lr_scheduler_type {schedule}, which has no warm-up; "
            f"use {instead} to warm up, or drop warmup_steps"
        )
    if isinstance(given.get("warmup_steps"), float | str) and str(given["warmup_steps"]).strip() in ("1.0", "1."):
        found.append(
            "warmup_steps 1.0 is one step: transformers counts steps from 1 up and reads a share of the run only "
            "below 1; write 1 for one step, or a share such as 0.1"
        )
    if args.max_steps > 0 and (note := warmup_note(args, args.max_steps)):
        found.append(note)
    if "constant" not in schedule and _flat_after_warmup(args):
        found.append(
            f"lr_scheduler_type {schedule} with lr_scheduler_kwargs {args.lr_scheduler_kwargs} keeps learning_rate "
            "unchanged after warm-up (a constant schedule); change the kwargs for it to move, or say constant"
        )
    switches = [key for key in ("torch_compile_mode", "torch_compile_backend") if key in given]
    if args.torch_compile and switches and "torch_compile" not in given:  # transformers switches it on
        found.append(
            f"{switches[0]} switches torch_compile on (transformers does): the model is compiled before it trains; "
            "set torch_compile: true to say so, or drop it"
        )
    intervals = (
        ("eval_steps", "eval_strategy"),
        ("save_steps", "save_strategy"),
        ("logging_steps", "logging_strategy"),
    )
    for key, strategy in intervals if args.max_steps > 0 else ():
        value, every = getattr(args, key, None), getattr(args, strategy, None)
        steps = getattr(every, "value", every) == "steps" and value is not None and value >= 1  # not a fraction
        if key in given and steps and value > args.max_steps:
            found.append(
                f"{key} {value:g} is beyond max_steps {args.max_steps}, so it happens at no step of the run; "
                f"lower it to {args.max_steps} or less"
            )
    for key, strategy in intervals:  # "no" is said with the feature it switches off
        every = getattr(getattr(args, strategy, None), "value", getattr(args, strategy, None))
        if key in given and every not in ("steps", "no", None):
            found.append(
                f"{key} is read only while {strategy} is steps, and it is {every}; set {strategy}: steps to use it, "
                "or drop it"
            )
    if "num_train_epochs" in given and "max_steps" in given and args.max_steps > 0:
        found.append("num_train_epochs does nothing while max_steps is set (the run stops at max_steps); drop one")
    elif "num_train_epochs" in given and given.get("total_tokens") is not None:
        found.append("num_train_epochs does nothing while total_tokens is set (it decides max_steps); drop one")
    return found


def _machine_notes(args: TrainingArguments, given: dict) -> list[str]:
    """What this machine and the run's processes make of the settings: accelerate runs fp16 only on
    an accelerator (on a CPU it neither autocasts nor scales); an accelerator's cache, pinned memory
    and activation offloading are nothing on a CPU; FSDP and the settings transformers' help says
    are for several processes do nothing in one; the launcher sets local_rank."""
    found = []
    cpu, processes = trains_on_cpu(args), world_size()
    if args.fp16 and cpu:
        found.append("fp16 does nothing on a CPU run (accelerate runs fp16 only on an accelerator); bf16 is the CPU's")
    if args.torch_empty_cache_steps and cpu:
        found.append("torch_empty_cache_steps does nothing on a CPU run (it empties an accelerator's cache); drop it")
    if _said_true(given.get("dataloader_pin_memory", False)) and cpu:  # transformers turns it off
        found.append("dataloader_pin_memory does nothing on a CPU run (it pins memory for copies to an accelerator)")
    if getattr(args, "activation_offloading", False) and cpu:
        found.append("activation_offloading does nothing on a CPU run (the activations are in CPU memory already)")
    if cpu and processes > (cores := len(os.sched_getaffinity(0))):
        found.append(
            f"the launch's {processes} processes train on the CPU and share this machine's {cores} cores: each step "
            f"waits on the slowest, so it runs slower than {cores} would; launch at most {cores} (--num_processes)"
        )
    if args.fsdp and (processes == 1 or cpu):
        found.append(
            f"fsdp shards the model over the GPU processes of a launch, and this run "
            f"{'trains on a CPU' if cpu else 'is one process'}, so it trains unsharded; launch on GPUs "
            "(accelerate launch --config_file accelerate_configs/fsdp.yaml), or drop fsdp"
        )
    if processes == 1 and (several := [k for k in distributed_keys(type(args)) if k in given]):
        found.append(
            f"{_they(several, 'sets', 'set')} up training on several processes, and "
            f"{'does' if len(several) == 1 else 'do'} nothing in a run of one (a launch of several reads "
            f"{'it' if len(several) == 1 else 'them'})"
        )
    parallel = getattr(args, "parallelism_config", None)
    if parallel is not None and parallel.total_size > 1 and "WORLD_SIZE" not in os.environ:
        found.append(
            f"parallelism_config's groups take {parallel.total_size} processes: launch them (accelerate launch "
            f"--num_processes {parallel.total_size}); one process alone refuses it"
        )
    if "local_rank" in given:
        found.append("local_rank is set for each process by the launcher (accelerate launch, torchrun); drop it")
    zero3 = args.deepspeed or zero_stage() == "3"
    if not zero3 and (read := [k for k in zero3_keys(type(args)) if k in given]):
        found.append(
            f"{_they(read, 'applies', 'apply')} only under DeepSpeed ZeRO-3, and this run is not launched with it "
            "(accelerate launch --config_file accelerate_configs/zero3.yaml); launch it so, or drop "
            f"{'it' if len(read) == 1 else 'them'}"
        )
    return found


@functools.cache
def zero3_keys(config: type) -> tuple[str, ...]:
    """The settings of `config` whose help says they apply to DeepSpeed ZeRO-3 (GRPO's gathering of
    the weights for generation)."""
    return tuple(
        f.name for f in dataclasses.fields(config) if "applies to DeepSpeed ZeRO-3" in (f.metadata.get("help") or "")
    )


def _unread_notes(args: TrainingArguments, given: dict) -> list[str]:
    """Keys nothing in a recipe's run reads: transformers' script flags (its help leaves them to the
    script: a recipe trains, evaluates as eval_strategy says and predicts nothing), the settings of a
    trainer argument no recipe passes, one logger's keys without it, optim_target_modules under an
    optimizer that takes no target modules."""
    found = []
    script_flags = {"do_train": True, "do_eval": args.eval_strategy != "no", "do_predict": False}
    if ignored := [k for k, v in script_flags.items() if k in given and _said_true(given[k]) != v]:
        found.append(
            f"{_they(ignored, 'is', 'are')} left by transformers to the script, and a recipe always trains, "
            f"evaluates as eval_strategy says and predicts nothing; drop {'it' if len(ignored) == 1 else 'them'}"
        )
    for argument, keys in UNPASSED.items():
        if read := [k for k in keys if k in given]:
            found.append(
                f"{_they(read, 'is', 'are')} read only with a trainer's {argument}, which the recipes do not "
                f"pass; drop {'it' if len(read) == 1 else 'them'}"
            )
    for logger_name, keys in LOGGER_KEYS.items():
        named = [k for k in given for key in keys if k == key or (key.endswith("_") and k.startswith(key))]
        if named and logger_name not in args.report_to and "all" not in args.report_to:
            found.append(
                f"{_they(named, 'is', 'are')} read only by the {logger_name} logger, and report_to is "
                f"{', '.join(args.report_to) or 'empty'}; add {logger_name} to report_to, or drop "
                f"{'it' if len(named) == 1 else 'them'}"
            )
    if "run_name" in given and not [r for r in args.report_to or [] if r != "none"]:  # the loggers' name for it
        found.append(
            "run_name names the run in a logger's records, and report_to is none, so nothing reads it; add a "
            "logger to report_to, or drop it"
        )
    if "include_num_input_tokens_seen" in given and args.include_num_input_tokens_seen in ("no", False):
        found.append(
            "include_num_input_tokens_seen false leaves the count on: a recipe counts the tokens seen from its "
            "batches' shapes, with no sync per step, and logs them (true, or all, uses transformers' count); drop it"
        )
    if _said_true(given.get("enable_jit_checkpoint", False)):  # its handler is set first, ours replaces it
        found.append(
            "enable_jit_checkpoint does nothing: a recipe checkpoints on SIGTERM and SIGUSR1 itself, at the end of "
            "the optimizer step, and exits (docs/long-runs.md); drop it"
        )
    optim = getattr(args.optim, "value", args.optim)
    if "optim_target_modules" in given and not any(name in optim for name in TARGETED_OPTIMIZERS):
        found.append(
            f"optim_target_modules is read only by the {', '.join(TARGETED_OPTIMIZERS)} optimizers, and optim is "
            f"{optim}; choose one of them, or drop it"
        )
    return found


# Keys only one logger reads (its name in report_to), "_" ending a prefix; and the optimizers
# (their names' part) that transformers gives optim_target_modules to.
LOGGER_KEYS = {"trackio": ("project", "trackio_")}
TARGETED_OPTIMIZERS = ("galore", "apollo")


# The keys a trainer reads only for an argument of its own that no recipe passes: compute_metrics
# (eval_tasks scores the model with medrecipes' evaluation), tools (GRPO trains no agent).
UNPASSED = {
    "compute_metrics": ("include_for_metrics", "batch_eval_metrics", "eval_do_concat_batches"),
    "tools": ("max_tool_calling_iterations",),
}


# A feature switched off (its key, and the values that switch it off), and the keys that set it
# up; a key ending in "_" stands for every key of the config that starts with it.
SWITCHED_OFF = {
    "push_to_hub": (
        (False,),
        ("hub_model_id", "hub_private_repo", "hub_strategy", "hub_revision", "hub_always_push", "hub_token"),
    ),
    "eval_strategy": (("no",), ("eval_steps", "eval_delay", "eval_packing", "metric_for_best_model")),
    "packing": ((False,), ("packing_strategy",)),  # SFT
    "save_strategy": (
        ("no",),
        ("save_steps", "save_total_limit", "keep_best_checkpoints", "keep_last_checkpoints", "checkpoint_mirror_url"),
    ),
    "logging_strategy": (("no",), ("logging_steps", "logging_first_step")),
    "use_vllm": ((False,), ("vllm_",)),  # GRPO: vLLM's settings
    "sync_ref_model": ((False,), ("ref_model_sync_steps", "ref_model_mixup_alpha")),  # DPO, GRPO, KTO
    "nonfinite_policy": (("stop",), ("max_nonfinite_skips",)),  # the recipe's: a non-finite step stops the run
    "activation_checkpointing": ((False, None), ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs")),
    "train_sampling_strategy": (("random", "sequential"), ("length_column_name",)),  # read by group_by_length
    "precompute_ref_log_probs": ((False,), ("precompute_ref_batch_size",)),  # DPO, KTO
    "prompt_format": (("plain",), ("chat_template_kwargs",)),  # GRPO: no template is applied to a plain prompt
    "fsdp": ((None, False, ""), ("fsdp_config",)),
    "use_liger_kernel": ((False,), ("liger_kernel_config",)),
    "use_adaptive_entropy": (
        (False,),
        ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target"),
    ),
}


def _switched_off(args: TrainingArguments, recipe=None) -> list[str]:
    """A line for each key that sets up a feature the recipe has switched off (push_to_hub false,
    a strategy 'no', vLLM unused, no reference sync, non-finite steps stopping the run), read against
    the config classes' own defaults: the trainer's, and the recipe's own keys (`recipe`). A push of
    checkpoints as revisions (push_checkpoint_revisions) uses hub_model_id without push_to_hub."""
    found = []
    for switch, (off, keys) in SWITCHED_OFF.items():
        obj = next((o for o in (args, recipe) if o is not None and hasattr(o, switch)), None)
        if obj is None:
            continue
        defaults = {f.name: f.default for f in dataclasses.fields(obj) if f.default is not dataclasses.MISSING}
        value = getattr(obj, switch)
        value = getattr(value, "value", value)
        pushes = switch == "push_to_hub" and getattr(recipe, "push_checkpoint_revisions", False)
        if switch not in defaults or value not in off or pushes:
            continue
        written = getattr(recipe, "given", None)  # the library may set a key from another (post_init)
        given = []
        for holder in (o for o in (args, recipe) if o is not None):  # the keys may be the other's (a recipe's)
            fields = {f.name: f.default for f in dataclasses.fields(holder) if f.default is not dataclasses.MISSING}
            named = [k for key in keys for k in fields if k == key or (key.endswith("_") and k.startswith(key))]
            given += [k for k in named if getattr(holder, k, None) != fields[k] and (written is None or k in written)]
        if given:
            them = "it" if len(given) == 1 else "them"
            found.append(
                f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} nothing while {switch} is "
                f"{str(value).lower()}; set {switch} to use {them}, or drop {them}"
            )
    return found


def _checkpoint_keywords() -> dict:
    """The keywords torch's `checkpoint` takes (transformers hands it activation_checkpointing_kwargs)
    with their types: its signature's, and the ones it pops from **kwargs (preserve_rng_state), typed
    by their default. A function-valued keyword (context_fn) cannot be written in a recipe."""
    from torch.utils.checkpoint import checkpoint

    hints = typing.get_type_hints(checkpoint)
    kinds = {name: hint for name, hint in hints.items() if hint in (bool, str, int, float, bool | None)}
    popped = re.findall(r'kwargs\.pop\(\s*"(\w+)"\s*,\s*(?:True|False)\s*\)', inspect.getsource(checkpoint))
    for name in popped:
        kinds[name] = bool
    return kinds


def _trainer_checkpoint_keywords(args) -> dict:
    """The keys of gradient_checkpointing_kwargs that the method's TRL trainer reads itself (SFT's
    `selective`, which it strips before torch sees the rest), found in the trainer's source and
    typed bool (each is read for its truth)."""
    found = _trainer_of(args)
    if found is None:
        return {}
    source = inspect.getsource(inspect.getmodule(found[1]))
    return {name: bool for name in re.findall(r'gradient_checkpointing_kwargs or \{\}\)\.get\(\s*"(\w+)"', source)}


def check_structured_settings(args: TrainingArguments, path: str, given: dict) -> None:
    """The settings that are mappings of a library's own keys, checked key by key against that
    library's types: transformers builds accelerator_config into its AcceleratorConfig without
    checking a value (split_batches: maybe is kept), and hands activation_checkpointing_kwargs to
    torch's checkpoint only when the model is prepared. accelerator_config's
    gradient_accumulation_kwargs are accelerate's GradientAccumulationPlugin; its num_steps would
    replace gradient_accumulation_steps (transformers does), which is the recipe's key for it."""
    config = getattr(args, "accelerator_config", None)
    if dataclasses.is_dataclass(config):
        hints = typing.get_type_hints(type(config))
        for field in dataclasses.fields(config):
            check_value(f"accelerator_config.{field.name}", getattr(config, field.name), hints[field.name], path)
        kwargs = config.gradient_accumulation_kwargs
        if kwargs is not None:
            from accelerate.utils import GradientAccumulationPlugin

            build_dataclass(
                GradientAccumulationPlugin, kwargs, f"{path}: accelerator_config.gradient_accumulation_kwargs"
            )
            if "num_steps" in kwargs:
                raise UserError(
                    f"{path}: accelerator_config.gradient_accumulation_kwargs.num_steps would replace "
                    f"gradient_accumulation_steps {args.gradient_accumulation_steps} (transformers does); set "
                    "gradient_accumulation_steps instead"
                )
    kwargs = getattr(args, "dataset_kwargs", None)
    if isinstance(kwargs, dict) and kwargs and (found := _trainer_of(args)):  # the keys TRL's trainer reads
        known = sorted(
            set(re.findall(r'dataset_kwargs(?:\.get\(|\[)\s*"(\w+)"', inspect.getsource(inspect.getmodule(found[1]))))
        )
        if unknown := [name for name in kwargs if name not in known]:
            raise UserError(
                f"{path}: dataset_kwargs.{unknown[0]} is not read by TRL's trainer{did_you_mean(unknown[0], known)}; "
                f"it reads {', '.join(known) or 'none'}"
            )
    # transformers mirrors the deprecated name onto the new one: the name the recipe wrote is said.
    key = (
        "gradient_checkpointing_kwargs"
        if "gradient_checkpointing_kwargs" in given
        else "activation_checkpointing_kwargs"
    )
    if isinstance(kwargs := getattr(args, key, None), dict):
        torchs, trainers = _checkpoint_keywords(), _trainer_checkpoint_keywords(args)
        kinds, trainer = {**torchs, **trainers}, f"TRL's {_trainer_of(args)[1].__name__}" if trainers else ""
        for name, value in kwargs.items():
            if name not in kinds:
                raise UserError(
                    f"{path}: {key}.{name} is not a setting of torch's checkpoint{f' or of {trainer}' if trainer else ''}"
                    f"{did_you_mean(name, list(kinds))}; use {', '.join(sorted(kinds))}"
                )
            check_value(f"{key}.{name}", value, kinds[name], path)
            if name not in torchs and value and args.gradient_checkpointing is False:  # the trainer's own key
                raise UserError(  # TRL's trainer refuses it as it builds, after the model has loaded
                    f"{path}: {key}.{name} is read by {trainer} only with activation checkpointing on, and "
                    f"activation_checkpointing is false; set activation_checkpointing: true, or drop {name}"
                )


def check_accelerator_settings(args: TrainingArguments, path: str) -> None:
    """Settings that need an accelerator on the machine, which TRL reads from torch as it builds
    the trainer and fails without (its activation offloading asks for the accelerator's type)."""
    import torch

    if getattr(args, "activation_offloading", False) and not torch.accelerator.is_available():
        raise UserError(
            f"{path}: activation_offloading moves activations from an accelerator's memory to the CPU's, and this "
            "machine has no accelerator (TRL fails on it); drop it"
        )


def accelerator_note(args: TrainingArguments) -> str | None:
    """A run that asks for an accelerator (use_cpu: false) on a machine without one trains on the
    CPU, which transformers does without a word."""
    import torch

    if args.use_cpu or torch.accelerator.is_available():
        return None
    return (
        "use_cpu is false, and this machine has no GPU or other accelerator: the run trains on the CPU; set "
        "use_cpu: true to say so, or run it where a GPU is"
    )


def check_parallelism(args: TrainingArguments, path: str, world_size: int) -> None:
    """parallelism_config's groups multiply to the processes that train (accelerate refuses another
    product when the run sets up, after the model loaded)."""
    config = getattr(args, "parallelism_config", None)
    if config is not None and config.total_size != world_size:
        raise UserError(
            f"{path}: parallelism_config's groups multiply to {config.total_size} processes, and {world_size} "
            f"train{'s' if world_size == 1 else ''}; launch {config.total_size} processes, or change the sizes"
        )
