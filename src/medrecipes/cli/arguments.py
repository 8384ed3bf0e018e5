"""What every command shares: the parser that turns argparse's errors into one line, the types
of the arguments that name files read and written, the checks of numbers, and reading a recipe."""

import argparse

from medrecipes.errors import UserError

SCRIPTS = {
    "cpt": "recipes/cpt.py",
    "sft": "recipes/sft.py",
    "grpo": "recipes/grpo.py",
    "dpo": "recipes/dpo.py",
    "kto": "recipes/kto.py",
    "eval": "recipes/evaluate.py",
}
TRAINING = tuple(method for method in SCRIPTS if method != "eval")  # the training recipes' methods


def method_of(path: str, given: str | None, allowed=("cpt", "sft", "grpo")) -> str:
    """--method as given, or the script the recipe's keys are for (config.recipe_method)."""
    from medrecipes.config import recipe_method

    method = given or recipe_method(path)
    if method not in allowed:
        raise UserError(
            f"{path}: a recipe for {SCRIPTS[method]}; this command takes a {', '.join(allowed[:-1])} or {allowed[-1]} recipe"
        )
    return method


def at_least(command: str, *checks: tuple[str, int | None, int]) -> None:
    """Each (flag, value, least) given has a value of at least `least`: one line otherwise."""
    for flag, value, least in checks:
        if value is not None and value < least:
            raise UserError(f"{command}: --{flag} must be at least {least}, got {value}")


def parse_recipe_file(recipe_path: str, method: str, overrides: list[str]):
    from medrecipes.config import parse_recipe

    return parse_recipe(method, [recipe_path, *overrides])


def input_path(text: str) -> str:
    """argparse type of an argument that names something the command reads (a file or folder;
    tests/test_properties.py feeds every such argument bad paths)."""
    return text


def output_path(text: str) -> str:
    """argparse type of an argument that names where the command writes (outputs.claims.claim_output)."""
    return text


class CommandParser(argparse.ArgumentParser):
    """argparse, with its errors as the command's one line ("error: medrecipes plan: ...") in
    place of the usage block and argparse's own line; `--help` still shows the usage. A flag
    must be written whole: `--num-gpu` is not taken for `--num-gpus` (nor, for a command that
    passes other flags to its recipe, kept from the recipe, which names it)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise UserError(f"{self.prog}: {message}; see {self.prog} --help")


def recipe_command(commands, name: str, help: str):
    """A command that reads a recipe: its path, --method, and --key value overrides of its keys."""
    sub = commands.add_parser(name, help=help)
    sub.add_argument("recipe", type=input_path, help="a recipe YAML file")
    sub.add_argument(
        "--method",
        choices=TRAINING,
        help="the recipe script it is for (default: from its keys)",
    )
    sub.set_defaults(takes_overrides=True)  # unknown --key value pairs override the recipe
    return sub
