"""`parse_recipe`: a recipe for one method (cpt, sft, grpo) read, checked and derived, and the
resolved recipe it gives back (`medrecipes validate`, the run record, the model card)."""

import dataclasses
import sys
from enum import Enum
from typing import Any

import yaml
from transformers import TrainingArguments
from trl import ModelConfig

from medrecipes.config import checks, library_checks
from medrecipes.config.eval_args import EvalArguments
from medrecipes.config.reading import RecipeParser, check_choices, field_names, read_recipe_yaml
from medrecipes.config.schema import RecipeArguments
from medrecipes.config.trainer_configs import CPTConfig, MedDPOConfig, MedGRPOConfig, MedKTOConfig, MedSFTConfig
from medrecipes.errors import UserError
from medrecipes.outputs.claims import check_writable

# The dataclasses of each recipe script, in the order the script's main() receives them.
METHODS = {
    "cpt": (RecipeArguments, CPTConfig, ModelConfig),
    "sft": (RecipeArguments, MedSFTConfig, ModelConfig),
    "grpo": (RecipeArguments, MedGRPOConfig, ModelConfig),
    "dpo": (RecipeArguments, MedDPOConfig, ModelConfig),
    "kto": (RecipeArguments, MedKTOConfig, ModelConfig),
}


def recipe_method(path: str) -> str:
    """The script a recipe YAML is for, from its keys: "cpt", "sft", "grpo" (the first whose
    dataclasses take every key, so a recipe with only shared keys is a CPT recipe) or "eval"
    (recipes/evaluate.py). A file that fits none gets the method nearest to it, whose parse
    then names the key that does not fit."""
    data = read_recipe_yaml(path)
    keys = {method: set(field_names(classes)) for method, classes in {**METHODS, "eval": (EvalArguments,)}.items()}
    mixture = data.get("dataset_mixture")
    sources = mixture.get("sources") if isinstance(mixture, dict) else None
    formats = {s.get("format") for s in sources if isinstance(s, dict)} if isinstance(sources, list) else set()
    if formats & {"preference", "unpaired"}:
        # DPO's and KTO's keys (beta, loss_type) are GRPO's too: their data tells them apart. Pairs
        # train either (KTO splits them): unpaired rows or KTO's own keys make it KTO.
        return "kto" if "unpaired" in formats or set(data) & (keys["kto"] - keys["dpo"]) else "dpo"
    return min(keys, key=lambda method: len(set(data) - keys[method] - {"env"}))


def parse_recipe(method: str, argv: list[str] | None = None, to_train: bool = True):
    """Parse a recipe for `method` ("cpt", ...) and return its dataclasses in script order.
    `to_train`: the recipe is about to train, so its sources' pass_rate files must be there and of
    its model, and a push must be able to reach the Hub. Off for the commands that read a recipe
    without training it: `medrecipes pass-rate` (which writes those files) and `medrecipes card`
    (which reads a finished run's recipe, wherever it was trained)."""
    parser = RecipeParser(METHODS[method])
    try:
        outputs, path = parser.parse_recipe(argv)
    except (TypeError, ValueError, ArithmeticError) as err:  # a dataclass __post_init__ refusing a value
        raise UserError(f"{parser.recipe_path}: {' '.join(str(err).split())}") from None  # its lines, as one
    recipe = next(o for o in outputs if isinstance(o, RecipeArguments))
    args = next(o for o in outputs if isinstance(o, TrainingArguments))
    model_args = next(o for o in outputs if isinstance(o, ModelConfig))
    if path is None and not (recipe.init_from_scratch or model_args.model_name_or_path):
        raise UserError(f"no recipe: run `python recipes/{method}.py RECIPE.yaml [--key value ...]` (see recipes/)")
    recipe.recipe_file = path
    path = path or "command line"
    check_writable(args.output_dir, f"{path}: output_dir", folder=True)
    for obj in (recipe, args, model_args):
        check_choices(obj, path)
    checks.resolve_data(recipe, path)
    if recipe.init_from_scratch and not (recipe.architecture and recipe.tokenizer_name_or_path):
        raise UserError(f"{path}: init_from_scratch needs 'architecture' and 'tokenizer_name_or_path'")
    if isinstance(args, MedGRPOConfig):
        checks.resolve_grpo(recipe, args, path)
    derived = checks.resolve_token_budget(recipe, args, path)
    if getattr(args, "prompts_per_step", None) is not None:
        derived["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    checks.resolve_best_metric(recipe, args, path)
    checks.check_long_run_settings(recipe, path)
    checks.check_model_args(model_args, path)
    if to_train:
        checks.check_pass_rates(recipe, model_args, path)
        library_checks.check_hub_reachable(args, path)
    library_checks.check_loggers(args, path)
    library_checks.check_hub_model_id(args, path)
    if isinstance(args, MedDPOConfig):
        library_checks.check_dpo_losses(args, path)
    library_checks.check_optimizer(args, path)
    library_checks.check_dataloader(args, path)
    if isinstance(args, MedSFTConfig):
        checks.check_sft_sources(recipe, args, path)
    if isinstance(args, MedDPOConfig | MedKTOConfig):
        checks.check_preference_sources(recipe, path, method)
    checks.check_eval_tasks(recipe, args, path, method)
    checks.check_best_metric(recipe, args, path, method)
    if not recipe.eval_sources and args.eval_strategy != "no":
        raise UserError(
            f"{path}: eval_strategy is '{args.eval_strategy.value}' but there are no eval_sets; "
            "add eval_sets, or set eval_strategy: no"
        )
    recipe.derived = derived  # logged by medrecipes.logs.setup_logging once logging is set up
    recipe.notes = library_checks.notes(args)  # likewise, as warnings
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


def recorded_command(*parsed) -> str:
    """The command line that started this process, as a run records it: a credential given on it
    (SECRET_FIELDS) replaced by <redacted>."""
    command = " ".join(["python", *sys.argv])
    for obj in parsed:
        for name in SECRET_FIELDS:
            if secret := getattr(obj, name, None):
                command = command.replace(secret, "<redacted>")
    return command


def resolved_yaml(*parsed) -> str:
    return yaml.safe_dump(resolved_recipe(*parsed), sort_keys=False)
