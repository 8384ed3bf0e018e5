"""The `medrecipes` command: validate a recipe, plan a run, build and check its data, evaluate a
model and calibrate its confidence, build preference data, build a tiny model, merge a LoRA
adapter, try a model.

examples:
medrecipes validate recipes/gemma3_4b.yaml
medrecipes eval --model outputs/demo/sft/final --tasks medqa_4opt,mmlu_medical --data-dir ../shared/data
medrecipes preview recipes/tiny_sft.yaml --examples 2
medrecipes plan recipes/gemma3_4b.yaml --num-gpus 8 --gpu h100-80gb --dataset-sequences 4312
medrecipes launch-plan recipes/gemma3_4b.yaml --nodes 4 --gpus-per-node 8
medrecipes build-data recipes/pure_transformer_0p4b.yaml --out data/built/0p4b --num-gpus 8
medrecipes decontaminate --train recipes/tiny_cpt.yaml --eval ../shared/data/medqa/medqa_us_4opt_test.jsonl
medrecipes perplexity --model outputs/demo/cpt/final --data data/medical_text/eval.jsonl
medrecipes calibrate --model outputs/demo/sft/final --task medqa_4opt --dev data/usmle_sample/train.jsonl --held-out data/usmle_sample/test.jsonl
medrecipes pairs --mcq data/usmle_sample/train.jsonl --out outputs/pairs/train.jsonl
medrecipes pairs --mcq data/usmle_sample/train.jsonl --model outputs/demo/sft/final --samples 4 --layout unpaired --out outputs/pairs/kto.jsonl
medrecipes tiny-model /tmp/tiny --arch llama
medrecipes merge-lora outputs/sft-lora/final outputs/sft-merged --dtype bfloat16
medrecipes convert-gguf gemma-3-270m-q4_k_m.gguf models/gemma-3-270m
medrecipes generate outputs/demo/sft/final --prompt "Which vitamin deficiency causes scurvy?"
medrecipes serve outputs/demo/sft/final --port 8000
medrecipes report outputs/demo/cpt outputs/demo/sft outputs/demo/grpo outputs/demo/eval.json --output outputs/demo/report.html
medrecipes card outputs/demo/sft outputs/demo/eval.json --output outputs/demo/sft-card
"""

import argparse
import os
import re
import sys

from medrecipes.cli import data, models, recipes, results
from medrecipes.cli.arguments import CommandParser
from medrecipes.errors import UserError, exit_on_user_error, mark_unconfigured_warnings
from medrecipes.libraries import TRAINING_BACKENDS, keep_out
from medrecipes.outputs.claims import release_all

# Commands that read recipes and data but never build or train a model: in a process of their own
# they keep the training back ends out (libraries.keep_out), which the recipe schema's imports
# (transformers' trainer utilities) would otherwise load, with lines some CPUs print.
READ_ONLY_COMMANDS = ("validate", "plan", "launch-plan", "decontaminate", "report")


def make_parser() -> argparse.ArgumentParser:
    summary, examples = __doc__.split("\n\n", 1)
    parser = CommandParser(
        prog="medrecipes",
        description=summary,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from importlib.metadata import version

    parser.add_argument("--version", action="version", version=f"%(prog)s {version('medrecipes')}")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (recipes, data, results, models):  # the order of --help's list
        group.add_commands(commands)
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    if not sys.stderr.isatty():  # datasets' bars in a log or a pipe: lines of \r-updates above the command's own
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        if os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] == "1" and "datasets" in sys.modules:
            sys.modules["datasets"].disable_progress_bars()  # imported already (a notebook): it read the variable then
    parser = make_parser()
    args, overrides = parser.parse_known_args(argv)
    if overrides and not getattr(args, "takes_overrides", False):
        command = f"{parser.prog} {args.command}"
        raise UserError(f"{command}: unknown argument {overrides[0]!r}; see {command} --help")
    args.overrides = overrides
    recipe = getattr(args, "recipe", None)
    if isinstance(recipe, str) and not recipe.endswith((".yaml", ".yml")):  # keys before the recipe: one taken for it
        if late := next((word for word in overrides if word.endswith((".yaml", ".yml"))), None):
            command = f"{parser.prog} {args.command}"
            raise UserError(
                f"{command}: the recipe {late} comes first, before its keys: {command} {late} [--key value ...]"
            )
    _refuse_empty_text(parser, args)
    try:
        args.func(args)
    except UserError as err:  # a recipe key the recipe does not know may be another command's option
        unknown = re.match(r"command line: unknown argument '(?:--)?([\w-]+)'", str(err))
        if unknown and (others := _commands_with(parser, unknown.group(1), args.command)):
            command = f"{parser.prog} {args.command}"
            raise UserError(
                f"{command}: --{unknown.group(1)} is an option of {' and '.join(others)}, not of {args.command} (nor a "
                f"key of the recipe); see {command} --help"
            ) from None
        raise
    finally:  # a command run in a process that goes on (a notebook, a test) leaves no lock behind
        release_all()


def _refuse_empty_text(parser, args) -> None:
    """An option given as empty text (--title '', --data ''): whatever it names, nothing is given, and
    a command would fall back to its default or read the empty name as a path without a word."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for action in subparsers.choices[args.command]._actions:
        value = getattr(args, action.dest, None) if action.option_strings else None
        values = value if isinstance(value, list) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            command = f"{parser.prog} {args.command}"
            fix = "" if action.required else ", or leave it out"  # a required option cannot be left out
            raise UserError(f"{command}: {action.option_strings[-1]} is empty; give it a value{fix}")


def _commands_with(parser, name: str, but: str) -> list[str]:
    """The other commands that take option --name (as written, or with '-' for '_')."""
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = {f"--{name}", f"--{name.replace('_', '-')}"}
    return [
        f"{parser.prog} {command}"
        for command, sub in subparsers.choices.items()
        if command != but and any(flags & set(action.option_strings) for action in sub._actions)
    ]


def run() -> None:
    """The `medrecipes` console command: `main` in a process of its own."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command in READ_ONLY_COMMANDS:
        keep_out([name for name in TRAINING_BACKENDS if not _named(name, sys.argv[1:])])
    mark_unconfigured_warnings()  # a command that sets up no logging (generate, merge-lora)
    sys.exit(main())


def _named(backend: str, argv: list[str]) -> bool:
    """Whether the command line or a recipe file in it names the back end as a key (`deepspeed:`
    takes a DeepSpeed config, which transformers checks with DeepSpeed itself)."""
    for arg in argv:
        if arg.lstrip("-").replace("-", "_").split("=")[0] == backend:
            return True
        if arg.endswith((".yaml", ".yml")) and os.path.isfile(arg):
            with open(arg, encoding="utf-8", errors="replace") as f:
                if any(line.startswith(f"{backend}:") for line in f):
                    return True
    return False
