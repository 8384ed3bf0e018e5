"""What every command shares: the parser that turns argparse's errors into one line, the types
of the arguments that name files read and written and of numeric ones, and reading a recipe."""

import argparse
import math
import os
import sys

from medrecipes.errors import UserError, typed


def method_of(path: str, given: str | None, allowed: tuple[str, ...] | None = None, why: str = "") -> str:
    """--method as given, or the method the recipe's keys are for (config.recipe_method), one of
    `allowed` (default: every training method); `why`: what the user should know of a recipe for
    another script."""
    from medrecipes.config import METHODS, method_misfit, recipe_method, script_of

    allowed = tuple(METHODS) if allowed is None else allowed
    method = given if given is not None else recipe_method(path)
    if given is not None and given not in (*METHODS, "eval"):
        raise UserError(f"--method: unknown method '{given}'; one of {', '.join(allowed)}")
    if given is not None and (misfit := method_misfit(path, given)):
        key, fitting = misfit
        raise UserError(
            f"{path}: a recipe for {script_of(fitting)} ({key} is a key of {fitting} recipes, which --method {given} "
            f"does not take); drop --method, or give a recipe for {script_of(given)}"
        )
    if method not in allowed:
        takes = f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]
        raise UserError(f"{path}: a recipe for {script_of(method)}; this command takes a {takes} recipe{why}")
    return method


class Number:
    """argparse type of a numeric option, with the range it takes: the value, or argparse's one line
    ("argument --batch-size: must be at least 1, got 0"). Every numeric option of every command has
    one (tests/test_properties.py holds each to its range with 0, negative, huge and non-finite
    values), so a value out of range is refused before the command loads anything."""

    def __init__(self, kind: type = int, least: float | None = None, most: float | None = None, above=None):
        self.kind, self.least, self.most, self.above = kind, least, most, above
        self.__name__ = "whole number" if kind is int else "number"  # argparse's word for the type

    def __call__(self, text: str):
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a {self.__name__}, got {text!r}") from None
        if not self.admits(value):
            raise argparse.ArgumentTypeError(f"must be {self.range()}, got {text}")
        return value

    def admits(self, value) -> bool:
        if not math.isfinite(value) or abs(value) > sys.maxsize:  # the largest count or index Python takes
            return False
        if self.above is not None and value <= self.above:
            return False
        return (self.least is None or value >= self.least) and (self.most is None or value <= self.most)

    def range(self) -> str:
        words = [f"above {typed(self.above)}"] if self.above is not None else []
        words += [f"at least {typed(self.least)}"] if self.least is not None else []
        words += [f"at most {typed(self.most)}"] if self.most is not None else []
        finite = "a finite number " if self.kind is float else ""
        return finite + (" and ".join(words) or f"a {self.__name__}")


COUNT = Number(int, least=1)  # GPUs, nodes, examples, questions, a batch, tokens to generate
SEED = Number(int, least=0, most=2**32 - 1)  # numpy's and torch's seeds


def repo_id(text: str) -> str:
    """argparse type of a Hub repository id, held to the Hub's own rule (huggingface_hub's
    validate_repo_id): a name the Hub would refuse is one line here, not a card that names it."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a Hub repository id ({str(err).splitlines()[0]})") from None
    return text


def html_path(text: str) -> str:
    """argparse type of a page to write: a new file is named .html (a browser opens nothing else as
    a page); what is there already is left to the claim's rules (`outputs.claims`)."""
    if not os.path.lexists(text) and not text.lower().endswith((".html", ".htm")):
        raise argparse.ArgumentTypeError(f"{text} is not an .html file; name the page NAME.html")
    return output_path(text)


def parse_recipe_file(
    recipe_path: str, method: str, overrides: list[str], to_train: bool = False, say_notes: bool = True
):
    """The recipe parsed for `method`; `to_train` as for `config.parse_recipe` (validate only),
    never `here`: a command may read a GPU recipe where its packages are not installed. Its notes
    (a value that does nothing, ...) are said on stderr, as the run will log them, unless the
    command says them its own way (`say_notes`)."""
    from medrecipes.config import parse_recipe

    parsed = parse_recipe(method, [recipe_path, *overrides], to_train=to_train, here=False)
    for note in parsed[0].notes if say_notes else []:
        print(f"warning: {note}", file=sys.stderr)
    return parsed


def input_path(text: str) -> str:
    """argparse type of an argument that names something the command reads (a file or folder;
    tests/test_properties.py feeds every such argument bad paths); ~ is the user's home, as a
    shell would have made it (a quoted ~ reaches the command as it is)."""
    return os.path.expanduser(text)


def output_path(text: str) -> str:
    """argparse type of an argument that names where the command writes (outputs.claims.claim_output);
    ~ is the user's home, not a folder named ~."""
    return os.path.expanduser(text)


# The options argparse lets a command line give many times (each one adds a value).
MANY = (
    argparse._AppendAction,
    argparse._AppendConstAction,
    argparse._ExtendAction,
    argparse._CountAction,
    argparse._HelpAction,
)


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

    def parse_known_args(self, args=None, namespace=None):
        """argparse keeps the last of an option given twice (what a wrapper's override relies on);
        one that takes a single value is said on stderr, whichever of its spellings each time."""
        seen: dict[str, str] = {}
        for arg in args if args is not None else sys.argv[1:]:
            if arg == "--":
                break
            action = self._option_string_actions.get(arg.split("=", 1)[0]) if arg.startswith("--") else None
            if action is None or isinstance(action, MANY):
                continue
            if action.dest in seen:
                both = {seen[action.dest], arg.split("=", 1)[0]}
                one = "is" if len(both) == 1 else "are one option,"
                print(f"# note: {' and '.join(sorted(both))} {one} given twice; the last is used", file=sys.stderr)
            seen[action.dest] = arg.split("=", 1)[0]
        return super().parse_known_args(args, namespace)


def recipe_command(commands, name: str, help: str, method: str = "sft"):
    """A command that reads a recipe: its path, --method (`method`, an example of one it takes), and
    --key value overrides of its keys."""
    sub = commands.add_parser(
        name,
        help=help,
        epilog="Any recipe key overrides the recipe's: --KEY VALUE after it (--max_steps 10, "
        "--architecture small for a model not trained yet).",
    )
    sub.add_argument("recipe", type=input_path, help="a recipe YAML file")
    sub.add_argument("--method", help=f"the training method it is for, e.g. {method} (default: from its keys)")
    sub.set_defaults(takes_overrides=True)  # unknown --key value pairs override the recipe
    return sub
