"""`parse_recipe`: a recipe for one method (`config.methods`) read, checked and derived, and the
resolved recipe it gives back (`medrecipes validate`, the run record, the model card)."""

import dataclasses
import re
import shlex
import sys
import warnings
from enum import Enum
from typing import Any

import yaml
from transformers import TrainingArguments
from trl import ModelConfig

from medrecipes.config import checks, eval_args, library_checks
from medrecipes.config.eval_args import EvalArguments
from medrecipes.config.methods import METHODS, check_formats, method_named
from medrecipes.config.reading import (
    RecipeParser,
    UnknownKey,
    check_blank_text,
    check_choices,
    field_names,
    read_recipe_yaml,
)
from medrecipes.config.schema import RecipeArguments, say_rendezvous, world_size
from medrecipes.config.trainer_configs import RecipeModelConfig
from medrecipes.errors import UserError
from medrecipes.outputs.claims import check_not_read, check_run_names, check_writable


def script_classes(method: str) -> tuple:
    """The dataclasses of a method's recipe script, in the order its main() receives them."""
    return (RecipeArguments, method_named(method).config, RecipeModelConfig)


def recipe_method(path: str) -> str:
    """The method a recipe YAML is for (config.methods), or "eval" (recipes/evaluate.py): of those
    that train on its sources' formats, the first whose dataclasses take every key, so a recipe
    with only shared keys is a CPT recipe, and pairs with KTO's own keys a KTO one. A file that
    fits none gets the method nearest to it, whose parse then names the key that does not fit."""
    data = read_recipe_yaml(path)
    mixture = data.get("dataset_mixture")
    sources = mixture.get("sources") if isinstance(mixture, dict) else None
    formats = {s.get("format", "text") for s in sources if isinstance(s, dict)} if isinstance(sources, list) else set()
    fitting = [m.name for m in METHODS.values() if formats <= set(m.formats)] or list(METHODS)
    return min([*fitting, "eval"], key=lambda method: len(set(data) - _keys_of(method)))


def script_of(method: str) -> str:
    """The recipe script of a method (`config.methods`), or of "eval"."""
    return "recipes/evaluate.py" if method == "eval" else method_named(method).script


def _keys_of(method: str) -> set[str]:
    return set(field_names((EvalArguments,) if method == "eval" else script_classes(method))) | {"env"}


def launch_config_keys(path: str) -> list[str]:
    """The keys only an accelerate config has (accelerate's `config` writes them in every one) that a
    file read as a recipe holds."""
    try:
        data = read_recipe_yaml(path)
    except UserError:
        return []
    return [key for key in ("compute_environment", "distributed_type") if key in data]


def _reads_as_other(path: str, method: str, argv: list[str] | None, err: BaseException) -> str | None:
    """The method a recipe refused as `method`'s is written for, where that method's parse reads it
    (a DPO recipe's loss_type list under recipes/kto.py, where loss_type is one word): its keys fit
    both, so only the values tell them apart, of a key the two methods type differently (the key
    the refusal names). None where it fits no other."""
    try:
        other = recipe_method(path)
    except UserError:
        return None
    if other in (method, "eval"):
        return None
    key = re.match(r"(\w+)", str(err).removeprefix(f"{path}: "))
    types = [{f.name: f.type for c in script_classes(m) for f in dataclasses.fields(c)} for m in (method, other)]
    if key is None or key.group(1) not in types[0] or types[0][key.group(1)] == types[1].get(key.group(1)):
        return None
    try:
        parse_recipe(other, argv, to_train=False)
    except (UserError, TypeError, ValueError, ArithmeticError):
        return None
    return other


def method_misfit(path: str, method: str) -> tuple[str, str] | None:
    """(a key, the method whose recipes take it) where a recipe written for another method is read
    as `method`: its keys that `method` does not take are all of the method its keys fit. None where
    they fit `method`, or where a key fits no method (a slip the parse names as an unknown key)."""
    try:
        data, fitting = read_recipe_yaml(path), recipe_method(path)
    except UserError:  # no such file, not YAML, ...: the parse says so
        return None
    unfit = sorted(set(data) - _keys_of(method))
    if fitting == method or not unfit or not set(unfit) <= _keys_of(fitting):
        return None
    return unfit[0], fitting


def _key_of_other_methods(err: BaseException, method: str) -> UserError | None:
    """The line for an unknown key or argument of a recipe that other methods' recipes take
    (chat_template_path in a DPO recipe): which take it, where the parse only found it unknown."""
    if not isinstance(err, UnknownKey):
        return None
    key = err.key.replace("-", "_")
    others = [m for m in METHODS if m != method and key in _keys_of(m)]
    if not others:
        return None
    scripts = [script_of(m) for m in others]
    taking = scripts[0] if len(scripts) == 1 else f"{', '.join(scripts[:-1])} and {scripts[-1]}"
    run = scripts[0] if len(scripts) == 1 else "the script it is for"
    return UserError(
        f"{err.where}: {key} is a key of {taking} recipes, which {script_of(method)} does not take; drop it, "
        f"or run {run}"
    )


def _for_another_script(path: str, method: str) -> UserError | None:
    """The line for a recipe written for another script than `method`'s (`method_misfit`)."""
    if misfit := method_misfit(path, method):
        key, fitting = misfit
        return UserError(
            f"{path}: a recipe for {script_of(fitting)} ({key} is a key of {fitting} recipes, which "
            f"{script_of(method)} does not take); run it with {script_of(fitting)}"
        )
    return None


def parse_eval_args(argv: list[str] | None = None) -> EvalArguments:
    """`eval_args.parse_eval_args`, where a training recipe given to it is named as one, with its script."""
    try:
        return eval_args.parse_eval_args(argv)
    except UserError:
        words = list(sys.argv[1:] if argv is None else argv)
        path = words[0] if words and words[0].endswith((".yaml", ".yml")) else None
        if path and (other := _for_another_script(path, "eval")):
            raise other from None
        raise


def library_words(err: BaseException, keys: frozenset[str] = frozenset()) -> str:
    """A library's refusal as one line: its lines joined (a list of "- item" lines as "item, item"),
    its enum members as the values a recipe writes ("IntervalStrategy.STEPS" as steps), its
    command-line flags for the recipe's `keys` as a recipe writes them ("--save_steps" as save_steps;
    another program's flag, accelerate launch's --mixed_precision, stays one)."""
    text = re.sub(r"\n\s*-\s+", lambda m: " " if m.start() == str(err).find("\n") else ", ", str(err))
    text = re.sub(r"\b[A-Z]\w*(?:Strategy|Type|Policy)\.([A-Z][A-Z0-9_]*)\b", lambda m: m.group(1).lower(), text)
    text = re.sub(r"(?<![\w-])--([a-z]\w*)", lambda m: m.group(1) if m.group(1) in keys else m.group(0), text)
    return " ".join(text.split())


def parse_recipe(method: str, argv: list[str] | None = None, to_train: bool = True, here: bool = True):
    """Parse a recipe for `method` ("cpt", ...) and return its dataclasses in script order.
    `to_train`: the recipe is about to train (a recipe script, `medrecipes validate`), so its
    sources' pass_rate files must be there and of its model, and a push must be able to reach the
    Hub; off where a recipe is read for another purpose: `medrecipes pass-rate` (it writes those
    files), plan, preview, launch-plan and build-data. `here`, with `to_train`: it trains on this
    machine (a recipe script), so the packages it asks for must be installed; off for the
    `medrecipes` commands, which may read a GPU recipe on a machine without them."""
    trains = method_named(method)
    say_rendezvous()  # the launcher's WORLD_SIZE, read by the trainer configs as they are built: a count
    parser = RecipeParser(script_classes(method))
    try:
        with warnings.catch_warnings(record=True) as said:  # the configs' deprecations, as notes below
            warnings.simplefilter("always", FutureWarning)
            outputs, path = parser.parse_recipe(argv)
        deprecated = [
            " ".join(str(w.message).split()).replace("`", "")
            for w in said
            if w.category is FutureWarning and not str(w.message).startswith(LIBRARY_KEYS_KEPT)
        ]
        for other in (w for w in said if w.category is not FutureWarning):
            warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    except UserError:
        if parser.recipe_path != "command line" and (launch := launch_config_keys(parser.recipe_path)):
            raise UserError(
                f"{parser.recipe_path}: an accelerate config ({', '.join(launch)}), not a recipe; give it to accelerate "
                f"launch --config_file, and a recipe (recipes/) to {script_of(method)}"
            ) from None
        if parser.recipe_path != "command line" and (other := _for_another_script(parser.recipe_path, method)):
            raise other from None
        err = sys.exc_info()[1]
        if parser.recipe_path != "command line" and (other := _reads_as_other(parser.recipe_path, method, argv, err)):
            raise UserError(
                f"{parser.recipe_path}: a recipe for {script_of(other)}, which reads it whole ({script_of(method)} "
                f"does not: {str(err).removeprefix(f'{parser.recipe_path}: ')}); run it with {script_of(other)}"
            ) from None
        if other_key := _key_of_other_methods(err, method):
            raise other_key from None
        raise
    except (TypeError, ValueError, ArithmeticError) as err:  # a dataclass __post_init__ refusing a value
        reason = library_words(err, frozenset(field_names(script_classes(method))))
        if reason.startswith("load_best_model_at_end requires"):  # transformers names no fix
            reason = (
                f"{reason.rstrip('.')}: it keeps the best of the saved checkpoints, so each save must fall on an "
                "evaluation; make save_strategy and eval_strategy one, and save_steps a multiple of eval_steps, or set "
                "load_best_model_at_end: false"
            )
        if reason.startswith("Your setup doesn't support bf16/gpu"):  # transformers names neither key nor fix
            asked = [k for k in ("bf16", "bf16_full_eval") if str(parser.given.get(k)).lower() == "true"] or ["bf16"]
            reason = (
                f"{asked[0]}: true computes in bfloat16 on a GPU, and this machine has none that does (use_cpu is "
                f"false); set use_cpu: true to compute in bfloat16 on the CPU, or {asked[0]}: false"
            )
        if "process group" in reason:  # a setting that starts one (ddp_backend) outside a launch
            asked = [k for k in parser.given if k in library_checks.distributed_keys(script_classes(method)[1])]
            reason = (
                f"{', '.join(asked) or 'these settings'} set up a process group, which a launch of several processes "
                "starts (accelerate launch, torchrun); run under a launch, or drop them"
            )
        # A library's own words may quote the value and not the key ("invalid literal for int(): 'x'").
        quoted = [
            k
            for k, v in parser.given.items()
            if isinstance(v, str) and (f"'{v}'" in reason or reason.startswith(f"{v} ")) and k not in reason
        ]
        raise UserError(f"{parser.recipe_path}: {f'{quoted[0]}: ' if quoted else ''}{reason}") from None
    recipe = next(o for o in outputs if isinstance(o, RecipeArguments))
    args = next(o for o in outputs if isinstance(o, TrainingArguments))
    model_args = next(o for o in outputs if isinstance(o, ModelConfig))
    if path is None and not (recipe.init_from_scratch or model_args.model_name_or_path):
        raise UserError(f"no recipe: run `python {trains.script} RECIPE.yaml [--key value ...]` (see recipes/)")
    recipe.recipe_file, recipe.given, recipe.on_command_line = path, parser.given, parser.on_command_line
    path = path or "command line"
    if to_train and not (recipe.init_from_scratch or model_args.model_name_or_path):  # a data-only recipe parses
        raise UserError(f"{path}: model_name_or_path is not set; name the model this recipe starts from")
    check_writable(args.output_dir, f"{path}: output_dir", folder=True)
    check_run_names(args.output_dir, f"{path}: output_dir", run=True)
    # What the run reads that is not its data (whose files the run's claim adds): its model, above all.
    read = [recipe.recipe_file, model_args.model_name_or_path, recipe.tokenizer_name_or_path]
    check_not_read(args.output_dir, [*read, getattr(args, "chat_template_path", None)], f"{path}: output_dir")
    for obj in (recipe, args, model_args):
        check_choices(obj, path)
    checks.resolve_data(recipe, path)
    if recipe.init_from_scratch and not (recipe.architecture and recipe.tokenizer_name_or_path):
        raise UserError(f"{path}: init_from_scratch needs 'architecture' and 'tokenizer_name_or_path'")
    check_formats(recipe, trains, path)
    for check in trains.checks:
        check(recipe, args, path)
    derived = checks.resolve_token_budget(recipe, args, path)
    checks.check_stream_length(recipe, args, path)
    if getattr(args, "prompts_per_step", None) is not None:
        derived["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    checks.check_eval_needed(recipe, args, path)
    checks.resolve_best_metric(recipe, args, path)
    checks.check_long_run_settings(recipe, path)
    check_blank_text(outputs, parser.given, path)
    checks.check_model_paths(recipe, model_args, path, elsewhere=to_train and not here)
    checks.check_model_args(model_args, path)
    checks.check_reference(args, model_args, path)
    if recipe.checkpoint_mirror_url:
        checks.check_mirror_target(recipe.checkpoint_mirror_url, args.output_dir, path, recipe.notes)
    if to_train:
        checks.check_pass_rates(recipe, model_args, path)
        library_checks.check_hub_reachable(args, recipe, path)
    library_checks.check_loggers(args, path)
    library_checks.check_hub_model_id(args, path)
    library_checks.check_optimizer(args, path)
    library_checks.check_dataloader(args, path)
    library_checks.check_structured_settings(args, path, parser.given)
    library_checks.check_seed(args, path)
    library_checks.check_compile_mode(args, path)
    library_checks.check_trainer_choices(args, path)
    library_checks.check_branch_settings(args, path)
    if to_train and here:  # names the libraries know, installed on this machine; the processes started
        library_checks.check_installed(args, model_args, path)
        library_checks.check_parallelism(args, path, world_size())
        library_checks.check_accelerator_settings(args, path)
        if note := library_checks.accelerator_note(args):
            recipe.notes.append(note)
    checks.check_eval_tasks(recipe, args, path, trains)
    checks.check_read_keys(recipe, args, model_args, trains, path)
    checks.check_best_metric(recipe, args, path, trains)
    recipe.derived = derived  # logged by medrecipes.logs.setup_logging once logging is set up
    recipe.notes += (
        library_checks.notes(args, recipe) + checks.unread_notes(recipe, trains, path) + parser.repeated + deprecated
    )  # likewise, as warnings (a check above may have said one)
    return tuple(outputs)


# Recipe keys a library deprecates that medrecipes keeps and applies as the library now asks
# (`runs.settle`: pad_token set on the tokenizer): its notice, with a fix no recipe can follow, is not said.
LIBRARY_KEYS_KEPT = ("`pad_token` is deprecated", "pad_token is deprecated")


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


def recorded_command(*parsed) -> str:
    """The command line that started this process, as a run records it and a card shows it to paste
    into a shell: each word quoted as the shell needs (a YAML mapping given as a key), a credential
    given on it (SECRET_FIELDS) replaced by <redacted>."""
    command = shlex.join(["python", *sys.argv])
    for obj in parsed:
        for name in SECRET_FIELDS:
            if secret := getattr(obj, name, None):
                command = command.replace(secret, "<redacted>")
    return command


def resolved_yaml(*parsed) -> str:
    return yaml.safe_dump(resolved_recipe(*parsed), sort_keys=False)
