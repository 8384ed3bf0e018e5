"""The recipe schema and its parse: one YAML file plus command-line overrides into typed
dataclasses, every key checked and the derived settings computed once, for the actual world size.

- `schema`: the dataclasses a recipe's keys fill (`RecipeArguments`) and the ranges of numeric
  keys; `trainer_configs`: the trainer configs with this project's defaults; the data keys'
  dataclasses live in the leaf `medrecipes.data_config`.
- `reading`: the YAML file and the command line into those dataclasses (`RecipeParser`), one
  line for each unknown key, wrong type or value outside a `Literal` field's choices.
- `checks`: what each key needs of the others, and the derived settings (token budgets).
- `methods`: the training methods (cpt, sft, grpo, dpo, kto), each declared once (`Method`).
- `parse`: `parse_recipe` for any of them, and the resolved recipe it gives back.
- `eval_args`: the arguments of `medrecipes eval` and recipes/evaluate.py.
"""

from medrecipes.config.checks import resolve_token_budget
from medrecipes.config.eval_args import EvalArguments
from medrecipes.config.methods import METHODS, Method, method_named, method_of_args, register_method
from medrecipes.config.parse import (
    method_misfit,
    parse_eval_args,
    parse_recipe,
    recipe_method,
    recorded_command,
    resolved_recipe,
    resolved_yaml,
    script_of,
)
from medrecipes.config.reading import read_yaml_mapping
from medrecipes.config.schema import RecipeArguments
from medrecipes.config.trainer_configs import (
    CPTConfig,
    MedDPOConfig,
    MedGRPOConfig,
    MedKTOConfig,
    MedSFTConfig,
    prompts_per_step_accumulation,
)
from medrecipes.data_config import MixtureConfig, SourceConfig

__all__ = [
    "CPTConfig",
    "EvalArguments",
    "METHODS",
    "Method",
    "MedDPOConfig",
    "MedGRPOConfig",
    "MedKTOConfig",
    "MedSFTConfig",
    "MixtureConfig",
    "RecipeArguments",
    "SourceConfig",
    "method_named",
    "method_of_args",
    "parse_eval_args",
    "method_misfit",
    "parse_recipe",
    "prompts_per_step_accumulation",
    "read_yaml_mapping",
    "recipe_method",
    "register_method",
    "resolve_token_budget",
    "recorded_command",
    "resolved_recipe",
    "resolved_yaml",
    "script_of",
]
