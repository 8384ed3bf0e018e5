"""The `medrecipes` command: validate a recipe, plan a run, evaluate a model, build a tiny model, merge a LoRA adapter.

medrecipes validate recipes/gemma3_4b.yaml
medrecipes eval --model outputs/demo/sft/final --tasks medqa_4opt,mmlu_medical --data-dir ../shared/data
medrecipes plan recipes/gemma3_4b.yaml --num-gpus 8 --gpu h100-80gb --dataset-sequences 4312
medrecipes tiny-model /tmp/tiny --arch llama
medrecipes merge-lora outputs/sft-lora/final outputs/sft-merged --dtype bfloat16
"""

import argparse
import dataclasses
import json
import sys

import yaml

from medrecipes.errors import UserError, exit_on_user_error

DEFAULT_CORPUS = ["data/medical_text/train.jsonl"]


def _parse(recipe_path: str, method: str, overrides: list[str]):
    from medrecipes.config import parse_recipe

    return parse_recipe(method, [recipe_path, *overrides])


def cmd_validate(args) -> None:
    recipe, training_args, model_args = _parse(args.recipe, args.method, args.overrides)
    resolved = {}
    for obj in (recipe, model_args, training_args):
        for f in dataclasses.fields(obj):
            if f.init and f.name not in resolved:
                resolved[f.name] = getattr(obj, f.name)
    print(yaml.safe_dump(json.loads(json.dumps(resolved, default=str)), sort_keys=False), end="")
    for key, value in recipe.derived.items():
        print(f"# derived: {key} = {value}")
    print(f"# {args.recipe}: valid {args.method} recipe")


def cmd_plan(args) -> None:
    from medrecipes.plan import format_plan, plan

    if args.num_gpus < 1:
        raise UserError(f"plan: --num-gpus must be at least 1, got {args.num_gpus}")
    recipe, training_args, model_args = _parse(args.recipe, args.method, args.overrides)
    result = plan(recipe, training_args, model_args, args.recipe, args.num_gpus, args.gpu, args.dataset_sequences)
    print(json.dumps(result, indent=2) if args.json else format_plan(result))


def cmd_eval(args) -> None:
    from medrecipes.config import parse_eval_args
    from medrecipes.evaluation import format_table, run_evaluation
    from medrecipes.logs import setup_logging

    setup_logging()
    print(format_table(run_evaluation(parse_eval_args(args.overrides))["tasks"]))


def cmd_tiny_model(args) -> None:
    from medrecipes.tiny import build_tiny_model

    build_tiny_model(
        args.out_dir,
        args.corpus or DEFAULT_CORPUS,
        args.arch,
        args.vocab_size,
        args.seed,
        args.hidden_size,
        args.layers,
    )
    print(f"tiny {args.arch} model and tokenizer saved to {args.out_dir}")


def cmd_merge_lora(args) -> None:
    from medrecipes.merge import merge_lora

    merge_lora(args.adapter_dir, args.out_dir, args.dtype)
    print(f"adapter {args.adapter_dir} merged into its base model; saved to {args.out_dir}")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="medrecipes", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    def recipe_command(name: str, help: str):
        sub = commands.add_parser(name, help=help)
        sub.add_argument("recipe", help="a recipe YAML file")
        sub.add_argument("--method", default="cpt", choices=["cpt", "sft"], help="the recipe script it is for")
        sub.set_defaults(takes_overrides=True)  # unknown --key value pairs override the recipe
        return sub

    recipe_command("validate", "parse a recipe and print the resolved configuration").set_defaults(func=cmd_validate)

    plan_parser = recipe_command("plan", "training math and a memory estimate per device")
    plan_parser.add_argument("--num-gpus", type=int, default=1)
    plan_parser.add_argument("--gpu", default="h100-80gb", help="h100-80gb, a100-80gb, a100-40gb, l40s-48gb, ...")
    plan_parser.add_argument("--dataset-sequences", type=int, help="packed training sequences, when not known")
    plan_parser.add_argument("--json", action="store_true", help="print one JSON object")
    plan_parser.set_defaults(func=cmd_plan)

    # Its options are config.EvalArguments, parsed there (--help lists them); a YAML with those keys works too.
    evaluate = commands.add_parser("eval", help="accuracy on MedQA, MedMCQA, PubMedQA, MMLU-medical", add_help=False)
    evaluate.set_defaults(func=cmd_eval, takes_overrides=True)

    tiny = commands.add_parser("tiny-model", help="build a random 2-layer model and a local tokenizer")
    tiny.add_argument("out_dir")
    tiny.add_argument("--arch", default="llama", choices=["llama", "gemma3_text", "qwen2"])
    tiny.add_argument("--corpus", nargs="+", help="text or JSONL files to train the tokenizer on")
    tiny.add_argument("--vocab-size", type=int, default=1024)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden-size", type=int, default=64)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.set_defaults(func=cmd_tiny_model)

    merge = commands.add_parser("merge-lora", help="fold a LoRA adapter into its base model and save the result")
    merge.add_argument("adapter_dir", help="the folder a LoRA run saved (with adapter_config.json)")
    merge.add_argument("out_dir", help="where to save the merged model and tokenizer")
    merge.add_argument(
        "--dtype", choices=["bfloat16", "float16", "float32"], help="weights dtype (default: the base checkpoint's)"
    )
    merge.set_defaults(func=cmd_merge_lora)
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args, overrides = parser.parse_known_args(argv)
    if overrides and not getattr(args, "takes_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(overrides)}")
    args.overrides = overrides
    args.func(args)


if __name__ == "__main__":
    sys.exit(main())
