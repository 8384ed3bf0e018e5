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
"""

import argparse
import json
import math
import sys

from medrecipes.errors import UserError, exit_on_user_error
from medrecipes.libraries import keep_out
from medrecipes.names import PUBMEDQA_SETTINGS
from medrecipes.outputs import release_all

DEFAULT_CORPUS = ["data/medical_text/train.jsonl"]


# Commands that read recipes and data but never build or train a model: in a process of their own
# they keep the training back ends out (libraries.keep_out), which the recipe schema's imports
# (transformers' trainer utilities) would otherwise load, with lines some CPUs print.
READ_ONLY_COMMANDS = ("validate", "plan", "launch-plan", "decontaminate", "report")

SCRIPTS = {
    "cpt": "recipes/cpt.py",
    "sft": "recipes/sft.py",
    "grpo": "recipes/grpo.py",
    "dpo": "recipes/dpo.py",
    "kto": "recipes/kto.py",
    "eval": "recipes/evaluate.py",
}
TRAINING = tuple(method for method in SCRIPTS if method != "eval")  # the training recipes' methods


def _method(path: str, given: str | None, allowed=("cpt", "sft", "grpo")) -> str:
    """--method as given, or the script the recipe's keys are for (config.recipe_method)."""
    from medrecipes.config import recipe_method

    method = given or recipe_method(path)
    if method not in allowed:
        raise UserError(
            f"{path}: a recipe for {SCRIPTS[method]}; this command takes a {', '.join(allowed[:-1])} or {allowed[-1]} recipe"
        )
    return method


def _at_least(command: str, *checks: tuple[str, int | None, int]) -> None:
    """Each (flag, value, least) given has a value of at least `least`: one line otherwise."""
    for flag, value, least in checks:
        if value is not None and value < least:
            raise UserError(f"{command}: --{flag} must be at least {least}, got {value}")


def _parse(recipe_path: str, method: str, overrides: list[str]):
    from medrecipes.config import parse_recipe

    return parse_recipe(method, [recipe_path, *overrides])


def cmd_validate(args) -> None:
    from medrecipes.config import parse_eval_args, resolved_yaml

    method = _method(args.recipe, args.method, (*TRAINING, "eval"))
    if method == "eval":
        parsed, derived = (parse_eval_args([args.recipe, *args.overrides]),), {}
    else:
        recipe, training_args, model_args = _parse(args.recipe, method, args.overrides)
        parsed, derived = (recipe, model_args, training_args), recipe.derived
        _check_local_inputs(recipe)
    print(resolved_yaml(*parsed), end="")
    for key, value in derived.items():
        print(f"# derived: {key} = {value}")
    print(f"# {args.recipe}: valid {method} recipe ({SCRIPTS[method]})")


def _check_local_inputs(recipe) -> None:
    """What a run would refuse first among what is on this machine: a data source or data file
    that is missing or empty, a scratch architecture that is not known. Hub ids, URLs and the
    starting model (which an earlier stage may still be writing) are left to the run."""
    from medrecipes.data.sources import check_local_source
    from medrecipes.models import scratch_config

    sources = [*(recipe.mixture.sources if recipe.mixture else []), *recipe.eval_sources.values()]
    for source in sources:
        check_local_source(source)
    if recipe.init_from_scratch and recipe.architecture:
        scratch_config(recipe.architecture)


def cmd_plan(args) -> None:
    from medrecipes.plan import format_plan, plan

    _at_least("plan", ("num-gpus", args.num_gpus, 1), ("dataset-sequences", args.dataset_sequences, 1),
              ("prompt-tokens", args.prompt_tokens, 1))  # fmt: skip
    method = _method(args.recipe, args.method, TRAINING)
    recipe, training_args, model_args = _parse(args.recipe, method, args.overrides)
    result = plan(
        recipe,
        training_args,
        model_args,
        args.recipe,
        args.num_gpus,
        args.gpu,
        args.dataset_sequences,
        args.prompt_tokens,
    )
    print(json.dumps(result, indent=2) if args.json else format_plan(result))


def cmd_preview(args) -> None:
    from medrecipes.logs import setup_logging
    from medrecipes.preview import preview

    setup_logging()
    method = _method(args.recipe, args.method)
    _at_least("preview", ("examples", args.examples, 1))
    print(preview(method, *_parse(args.recipe, method, args.overrides), count=args.examples))


def cmd_launch_plan(args) -> None:
    import shlex

    from medrecipes.plan import launch_plan

    recipe, training_args, model_args = _parse(
        args.recipe, _method(args.recipe, args.method, TRAINING), args.overrides
    )
    values = launch_plan(recipe, training_args, args.recipe, args.nodes, args.gpus_per_node)
    values["MODEL"] = model_args.model_name_or_path or ""
    for key, value in values.items():
        print(f"{key}={shlex.quote(str(value))}")


def cmd_build_data(args) -> None:
    from medrecipes.data.build import build_data
    from medrecipes.data.decontamination import format_report

    _at_least("build-data", ("num-gpus", args.num_gpus, 1))
    recipe, training_args, model_args = _parse(args.recipe, "cpt", args.overrides)
    manifest, built = build_data(recipe, training_args, model_args, args.recipe, args.out, args.num_gpus, args.force)
    out = args.out or recipe.built_data
    shares = ", ".join(f"{name} {n:,}" for name, n in manifest["tokens_per_source"].items())
    print(f"{out}: {'built' if built else 'up to date, not rebuilt'}: {manifest['train']['blocks']:,} training blocks")
    print(f"tokens per source: {shares}")
    if manifest["decontamination"]:
        print(format_report(manifest["decontamination"]))


def cmd_decontaminate(args) -> None:
    import os

    from medrecipes.data import decontamination as dc
    from medrecipes.data.sources import local_files
    from medrecipes.outputs import claim_output, staged

    _at_least("decontaminate", ("n", args.n, 1))
    is_recipe = args.train.endswith((".yaml", ".yml"))
    if not is_recipe and args.overrides:  # --key value pairs override a recipe's keys; a file has none
        raise UserError(
            f"decontaminate: unknown argument {args.overrides[0]!r}; see medrecipes decontaminate --help "
            "(--key value overrides apply to a recipe given as --train)"
        )
    if not is_recipe and not args.eval:
        raise UserError("decontaminate: no evaluation sets to check against; pass --eval FILE")
    benchmarks, streaming = {}, False
    if is_recipe:
        from medrecipes.data.mixture import source_names

        recipe, _, _ = _parse(args.train, _method(args.train, args.method, ("cpt", "sft")), args.overrides)
        if recipe.mixture is None:
            raise UserError(f"{args.train}: no 'dataset_mixture'; nothing to check")
        sources = dict(zip(source_names(recipe.mixture), recipe.mixture.sources, strict=True))
        streaming = recipe.mixture.streaming
        benchmarks = dc.recipe_benchmarks(recipe)
    else:
        sources = {dc.benchmark_name(args.train): dc.training_file_source(args.train)}
    benchmarks.update(dc.file_benchmarks(args.eval or []))
    if not benchmarks:
        raise UserError("decontaminate: no evaluation sets to check against; pass --eval FILE")
    drops = {}  # checked before the (long) check, so a refused --drop costs nothing
    if args.drop:
        drops = {
            name: os.path.join(args.drop, name.replace("/", "_").replace("#", "_") + ".jsonl")
            if is_recipe
            else args.drop
            for name in sources
        }
        inputs = [args.train, *(args.eval or []), *(f for source in sources.values() for f in local_files(source))]
        for out in drops.values():
            claim_output(out, "decontaminate", "decontaminate --drop", inputs, args.overwrite)
            if os.path.splitext(out)[1] not in dc.KEPT_FORMATS:
                raise UserError(f"--drop {out}: unsupported file type; use {', '.join(dc.KEPT_FORMATS)}")
    report, contaminated = dc.check_sources(sources, benchmarks, args.n, streaming)
    print(json.dumps(report, indent=2) if args.json else dc.format_report(report))
    for name, out in drops.items():
        with staged(out, folder=False, kind="decontaminate") as path:
            kept = dc.write_kept(sources[name], contaminated[name], path, os.path.splitext(out)[1])
        print(f"{name}: {kept} rows kept, {len(contaminated[name])} dropped -> {out}", file=sys.stderr)


def cmd_eval(args) -> None:
    from medrecipes.config import parse_eval_args
    from medrecipes.evaluation import format_table, run_evaluation
    from medrecipes.logs import setup_logging

    setup_logging()
    print(format_table(run_evaluation(parse_eval_args(args.overrides))["tasks"]))


def cmd_calibrate(args) -> None:
    from medrecipes.evaluation import calibration_table, run_calibration
    from medrecipes.logs import setup_logging

    setup_logging()
    _at_least("calibrate", ("limit", args.limit, 1), ("batch-size", args.batch_size, 1))
    found = run_calibration(
        args.model, args.task, args.dev, args.held_out, args.data_dir, args.limit, args.batch_size, args.overwrite
    )
    fit, held = found["fitted_on"], found["held_out"]
    print(
        f"temperature {found['temperature']:.3f}, fitted on {fit['questions']} questions of {fit['source']} "
        f"(NLL {fit['nll_before']:.3f} -> {fit['nll_after']:.3f}); saved in {args.model}/calibration.json, "
        f"where medrecipes eval finds it\n\n{held['questions']} held-out questions of {held['source']}:\n"
    )
    calibration = found["report"]["calibration"]
    print(calibration_table([(args.task, v, calibration[v]) for v in ("acc", "acc_temperature_scaled")]))


def cmd_perplexity(args) -> None:
    from medrecipes.data.sources import load_source
    from medrecipes.data_config import SourceConfig
    from medrecipes.evaluation import document_perplexity, load_for_evaluation
    from medrecipes.logs import setup_logging
    from medrecipes.outputs import claim_output, staged

    setup_logging()
    if args.output:  # before the model loads: a refused output must not cost the evaluation
        claim_output(args.output, "perplexity", "perplexity --output", [args.data, args.model], args.overwrite)
    texts = list(load_source(SourceConfig(path=args.data, text_field=args.text_field))["text"])[: args.limit]
    model, tokenizer = load_for_evaluation(args.model, dtype=args.dtype)
    result = {"model": args.model, "data": args.data, **document_perplexity(model, tokenizer, texts)}
    lo, hi = result["ci95"]
    print(
        f"{args.data}: perplexity {result['perplexity']:.3f} (95% CI {lo:.3f}-{hi:.3f}), loss {result['loss']:.4f}, "
        f"{result['documents']} documents, {result['tokens']:,} tokens"
    )
    if args.output:
        with staged(args.output, folder=False, kind="perplexity") as path, open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


def cmd_pairs(args) -> None:
    from medrecipes.data.preference import mcq_pairs, on_policy_pairs, unpaired
    from medrecipes.outputs import claim_output, staged
    from medrecipes.usmle import load_mcq

    claim_output(args.out, "pairs", "pairs --out", [*args.mcq, *([args.model] if args.model else [])], args.overwrite)
    if not args.out.endswith(".jsonl"):
        raise UserError(f"pairs --out {args.out}: write a .jsonl file (one row a line)")
    _at_least("pairs", ("samples", args.samples, 2), ("max-new-tokens", args.max_new_tokens, 1),
              ("batch-size", args.batch_size, 1))  # fmt: skip
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise UserError(
            f"pairs: --temperature must be a positive number (answers are sampled), got {args.temperature}"
        )
    rows = [row for file in args.mcq for row in load_mcq(file, answered=True, pubmedqa_setting=args.pubmedqa_setting)]
    files = ", ".join(args.mcq)
    if args.model:
        pairs, left_out = on_policy_pairs(rows, _sampled_answers(args, rows), args.system_prompt, args.seed)
        how = (
            f"on-policy: {args.model}'s own answers to {len(rows)} questions of {files}, {args.samples} sampled "
            f"each (temperature {args.temperature:g}, seed {args.seed}); a right answer chosen against a wrong one; "
            f"{left_out['all right']} questions left out where every sample was right, {left_out['all wrong']} "
            "where every one was wrong"
        )
    else:
        pairs = mcq_pairs(rows, args.system_prompt, args.seed)
        how = f"the gold answer of each of {len(rows)} questions of {files} chosen against a wrong option drawn with seed {args.seed}"
    written = unpaired(pairs) if args.layout == "unpaired" else pairs
    if args.layout == "unpaired":
        how += "; written unpaired (chosen labelled true, rejected false)"
    with staged(args.out, folder=False, kind="pairs", about=how) as path, open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in written)
    count = (
        f"{len(written)} answers ({len(pairs)} pairs split)" if args.layout == "unpaired" else f"{len(pairs)} pairs"
    )
    print(f"{count} written to {args.out}: {how}")


def _sampled_answers(args, rows) -> list[list[str]]:
    """`--samples` answers of the model to each row, sampled in the chat prompt eval uses."""
    from transformers import set_seed

    from medrecipes.evaluation import load_for_evaluation, sample_answers

    set_seed(args.seed)
    model, tokenizer = load_for_evaluation(args.model)
    answers, _ = sample_answers(
        model, tokenizer, rows, args.samples, system_prompt=args.system_prompt, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size, temperature=args.temperature, progress=True,
    )  # fmt: skip
    return answers


def cmd_tiny_model(args) -> None:
    from medrecipes.outputs import claim_output, staged
    from medrecipes.tiny import build_tiny_model

    # The tokenizer needs its 256 byte symbols and special tokens; attention has 4 heads.
    for flag, value, low in (
        ("vocab-size", args.vocab_size, 300),
        ("hidden-size", args.hidden_size, 4),
        ("layers", args.layers, 1),
    ):
        if value < low:
            raise UserError(f"tiny-model: --{flag} must be at least {low}, got {value}")
    if args.hidden_size % 4:
        raise UserError(f"tiny-model: --hidden-size must divide by the 4 attention heads, got {args.hidden_size}")
    corpus = args.corpus or DEFAULT_CORPUS
    claim_output(args.out_dir, "tiny-model", "tiny-model OUT_DIR", corpus, args.overwrite, folder=True)
    with staged(args.out_dir, folder=True, kind="tiny-model") as path:
        build_tiny_model(path, corpus, args.arch, args.vocab_size, args.seed, args.hidden_size, args.layers)
    print(f"tiny {args.arch} model and tokenizer saved to {args.out_dir}")


def cmd_merge_lora(args) -> None:
    from medrecipes.merge import merge_lora

    merge_lora(args.adapter_dir, args.out_dir, args.dtype, args.overwrite)
    print(f"adapter {args.adapter_dir} merged into its base model; saved to {args.out_dir}")


def cmd_convert_gguf(args) -> None:
    from medrecipes.models import convert_gguf

    convert_gguf(args.gguf, args.out_dir, args.overwrite)
    print(f"{args.gguf} saved as a model folder in {args.out_dir}")


def cmd_generate(args) -> None:
    from medrecipes.serving import generate

    if not args.prompt.strip():
        raise UserError("generate: --prompt is empty; give the question to answer")
    _at_least("generate", ("max-new-tokens", args.max_new_tokens, 1))

    print(generate(args.model, args.prompt, args.system, args.max_new_tokens))


def cmd_report(args) -> None:
    from medrecipes.report import images_folder, write_report

    images = write_report(args.paths, args.output, args.title, args.overwrite)
    print(f"report written to {args.output}: {len(images)} plots, also as PNG files in {images_folder(args.output)}")


def cmd_serve(args) -> None:
    from medrecipes.serving import serve

    if not 1 <= args.port <= 65535:
        raise UserError(f"serve: --port must be between 1 and 65535, got {args.port}")

    serve(args.model, args.host, args.port)


def input_path(text: str) -> str:
    """argparse type of an argument that names something the command reads (a file or folder;
    tests/test_properties.py feeds every such argument bad paths)."""
    return text


def output_path(text: str) -> str:
    """argparse type of an argument that names where the command writes (outputs.claim_output)."""
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


def make_parser() -> argparse.ArgumentParser:
    summary, examples = __doc__.split("\n\n", 1)
    parser = CommandParser(
        prog="medrecipes",
        description=summary,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def recipe_command(name: str, help: str):
        sub = commands.add_parser(name, help=help)
        sub.add_argument("recipe", type=input_path, help="a recipe YAML file")
        sub.add_argument(
            "--method",
            choices=TRAINING,
            help="the recipe script it is for (default: from its keys)",
        )
        sub.set_defaults(takes_overrides=True)  # unknown --key value pairs override the recipe
        return sub

    recipe_command("validate", "parse a recipe and print the resolved configuration").set_defaults(func=cmd_validate)

    plan_parser = recipe_command("plan", "training math and a memory estimate per device")
    plan_parser.add_argument("--num-gpus", type=int, default=1)
    plan_parser.add_argument("--gpu", default="h100-80gb", help="h100-80gb, a100-80gb, a100-40gb, l40s-48gb, ...")
    plan_parser.add_argument("--dataset-sequences", type=int, help="packed training sequences, when not known")
    plan_parser.add_argument("--prompt-tokens", type=int, help="GRPO: tokens per prompt, typical of the data")
    plan_parser.add_argument("--json", action="store_true", help="print one JSON object")
    plan_parser.set_defaults(func=cmd_plan)

    show = recipe_command("preview", "the first training examples as the model will see them, trained part marked")
    show.add_argument("--examples", type=int, default=3, help="how many (default 3)")
    show.set_defaults(func=cmd_preview)

    launch = recipe_command("launch-plan", "shell variables for a multi-node launch (recipes/launch/)")
    launch.add_argument("--nodes", type=int, required=True)
    launch.add_argument("--gpus-per-node", type=int, default=8)
    launch.set_defaults(func=cmd_launch_plan)

    build = commands.add_parser(
        "build-data", help="tokenise, pack and save a pretraining recipe's data, with a manifest"
    )
    build.add_argument("recipe", type=input_path, help="a CPT or pretraining recipe YAML file")
    build.set_defaults(func=cmd_build_data, takes_overrides=True)
    build.add_argument(
        "--out", type=output_path, help="folder to write (default: the recipe's built_data); an fsspec URL works too"
    )
    build.add_argument("--num-gpus", type=int, default=1, help="processes the run will use (streaming: sets blocks)")
    build.add_argument("--force", action="store_true", help="build even when the manifest says it is up to date")

    decon = commands.add_parser("decontaminate", help="n-gram overlap between training data and evaluation sets")
    decon.add_argument(
        "--train", type=input_path, required=True, help="a training file (text or MCQ) or a recipe YAML"
    )
    decon.add_argument(
        "--eval", type=input_path, action="append", help="an evaluation file or folder (MCQ or text); repeatable"
    )
    decon.add_argument("--n", type=int, default=13, help="words per n-gram (default 13)")
    decon.add_argument(
        "--drop", type=output_path, metavar="OUT", help="write the training rows without overlap to OUT"
    )
    decon.add_argument("--overwrite", action="store_true", help="let --drop replace an existing OUT")
    decon.add_argument("--json", action="store_true", help="print the report as one JSON object")
    decon.add_argument(
        "--method", choices=["cpt", "sft"], help="the recipe script, for a recipe (default: from its keys)"
    )
    decon.set_defaults(func=cmd_decontaminate, takes_overrides=True)

    # Its options are config.EvalArguments, parsed there (--help lists them); a YAML with those keys works too.
    evaluate = commands.add_parser("eval", help="accuracy on MedQA, MedMCQA, PubMedQA, MMLU-medical", add_help=False)
    evaluate.set_defaults(func=cmd_eval, takes_overrides=True)

    ppl = commands.add_parser("perplexity", help="perplexity of whole documents, each from BOS as in use")
    ppl.add_argument("--model", type=input_path, required=True, help="Hub id, local folder or .gguf file")
    ppl.add_argument("--data", type=input_path, required=True, help="a text, JSON or JSONL file of documents")
    ppl.add_argument("--text-field", default="text", help="the documents' column (default text)")
    ppl.add_argument("--limit", type=int, help="the first N documents")
    ppl.add_argument("--dtype", default="auto", help="auto (the checkpoint's), bfloat16, float16 or float32")
    ppl.add_argument("--output", type=output_path, help="JSON file for the result")
    ppl.add_argument("--overwrite", action="store_true", help="let --output replace an existing file")
    ppl.set_defaults(func=cmd_perplexity)

    pairs = commands.add_parser("pairs", help="DPO and KTO preference data from multiple-choice questions")
    pairs.add_argument("--mcq", type=input_path, nargs="+", required=True, help="MCQ files with gold answers")
    pairs.add_argument("--out", type=output_path, required=True, help="the JSONL file to write")
    pairs.add_argument("--system-prompt", help="a system turn before each question, as the SFT recipe has")
    pairs.add_argument(
        "--pubmedqa-setting",
        choices=PUBMEDQA_SETTINGS,
        help="PubMedQA questions: asked about the abstract (reasoning_required, the default), the conclusion or both",
    )
    pairs.add_argument(
        "--layout",
        choices=["pairs", "unpaired"],
        default="pairs",
        help="pairs: prompt/chosen/rejected (DPO, KTO); unpaired: prompt/completion/label (KTO)",
    )
    pairs.add_argument(
        "--model", type=input_path, help="on-policy: pair this model's own right and wrong sampled answers"
    )
    pairs.add_argument("--samples", type=int, default=4, help="--model: answers sampled per question (default 4)")
    pairs.add_argument("--temperature", type=float, default=1.0, help="--model: sampling temperature")
    pairs.add_argument("--max-new-tokens", type=int, help="--model: tokens per answer (default: eval's)")
    pairs.add_argument("--batch-size", type=int, default=8, help="--model: prompts generated at once")
    pairs.add_argument("--seed", type=int, default=42, help="draws the samples and the answers paired (default 42)")
    pairs.add_argument("--overwrite", action="store_true", help="replace an earlier pairs file")
    pairs.set_defaults(func=cmd_pairs)

    calibrate = commands.add_parser(
        "calibrate", help="fit a temperature to a model's answer probabilities and save it with the model"
    )
    calibrate.add_argument(
        "--model", type=input_path, required=True, help="a local model folder (the file goes there)"
    )
    calibrate.add_argument("--task", required=True, help="the task whose questions are scored, e.g. medmcqa")
    calibrate.add_argument("--dev", type=input_path, required=True, help="questions to fit on, not trained on")
    calibrate.add_argument("--held-out", type=input_path, help="questions to measure on (default: the task's)")
    calibrate.add_argument("--data-dir", type=input_path, help="the ../shared/data layout, for the task's own data")
    calibrate.add_argument("--limit", type=int, help="the first N questions of each set")
    calibrate.add_argument("--batch-size", type=int, default=8)
    calibrate.add_argument("--overwrite", action="store_true", help="replace an earlier calibration.json")
    calibrate.set_defaults(func=cmd_calibrate)

    tiny = commands.add_parser("tiny-model", help="build a random 2-layer model and a local tokenizer")
    tiny.add_argument("out_dir", type=output_path)
    tiny.add_argument("--arch", default="llama", choices=["llama", "gemma3_text", "qwen2"])
    tiny.add_argument("--corpus", type=input_path, nargs="+", help="text or JSONL files to train the tokenizer on")
    tiny.add_argument("--vocab-size", type=int, default=1024)
    tiny.add_argument("--seed", type=int, default=0)
    tiny.add_argument("--hidden-size", type=int, default=64)
    tiny.add_argument("--layers", type=int, default=2)
    tiny.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    tiny.set_defaults(func=cmd_tiny_model)

    merge = commands.add_parser("merge-lora", help="fold a LoRA adapter into its base model and save the result")
    merge.add_argument("adapter_dir", type=input_path, help="the folder a LoRA run saved (with adapter_config.json)")
    merge.add_argument("out_dir", type=output_path, help="where to save the merged model and tokenizer")
    merge.add_argument(
        "--dtype", choices=["bfloat16", "float16", "float32"], help="weights dtype (default: the base checkpoint's)"
    )
    merge.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    merge.set_defaults(func=cmd_merge_lora)

    convert = commands.add_parser("convert-gguf", help="save a .gguf model as an ordinary model folder, once")
    convert.add_argument("gguf", type=input_path, help="the .gguf model file")
    convert.add_argument("out_dir", type=output_path, help="where to save the model, tokenizer and generation config")
    convert.add_argument("--overwrite", action="store_true", help="replace an existing OUT_DIR")
    convert.set_defaults(func=cmd_convert_gguf)

    gen = commands.add_parser("generate", help="the model's greedy answer to one prompt")
    gen.add_argument("model", type=input_path, help="a model folder (e.g. output_dir/final) or Hub id")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", help="a system turn before the prompt")
    gen.add_argument("--max-new-tokens", type=int, default=256)
    gen.set_defaults(func=cmd_generate)

    report = commands.add_parser("report", help="one HTML page with the plots of runs and evaluations")
    report.add_argument(
        "paths",
        type=input_path,
        nargs="+",
        metavar="PATH",
        help="run output_dirs, eval --output files or folders of them",
    )
    report.add_argument(
        "--output", type=output_path, default="report.html", help="the HTML file; its PNG files go to <name>_files/"
    )
    report.add_argument("--title", help="the page's title (default: the runs' names)")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report")
    report.set_defaults(func=cmd_report)

    serve = commands.add_parser("serve", help="an OpenAI-compatible chat endpoint (transformers serve)")
    serve.add_argument("model", type=input_path, help="a model folder (e.g. output_dir/final) or Hub id")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(func=cmd_serve)
    return parser


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = make_parser()
    args, overrides = parser.parse_known_args(argv)
    if overrides and not getattr(args, "takes_overrides", False):
        command = f"{parser.prog} {args.command}"
        raise UserError(f"{command}: unknown argument {overrides[0]!r}; see {command} --help")
    args.overrides = overrides
    try:
        args.func(args)
    finally:  # a command run in a process that goes on (a notebook, a test) leaves no lock behind
        release_all()


def run() -> None:
    """The `medrecipes` console command: `main` in a process of its own."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if command in READ_ONLY_COMMANDS:
        keep_out()
    sys.exit(main())


if __name__ == "__main__":
    run()
