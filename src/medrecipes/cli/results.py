"""The commands that measure a model or show results: eval, perplexity, calibrate, report, card."""

import json
import os
import sys

from medrecipes.cli.arguments import (
    COUNT,
    html_path,
    input_path,
    output_path,
    repo_id,
)
from medrecipes.data_config import SAMPLE_BY
from medrecipes.names import DTYPES


def add_commands(commands) -> None:
    """eval, perplexity, calibrate, report and card."""
    # Its options are config.EvalArguments, parsed there (--help lists them); a YAML with those keys works too.
    evaluate = commands.add_parser("eval", help="accuracy on MedQA, MedMCQA, PubMedQA, MMLU-medical", add_help=False)
    evaluate.set_defaults(func=cmd_eval, takes_overrides=True)

    ppl = commands.add_parser("perplexity", help="perplexity of whole documents, each from BOS as in use")
    ppl.add_argument("--model", type=input_path, required=True, help="Hub id, local folder or .gguf file")
    ppl.add_argument("--data", type=input_path, required=True, help="a text, JSON or JSONL file of documents")
    ppl.add_argument("--text-field", default="text", help="the documents' column (default text)")
    ppl.add_argument(
        "--sample-by", choices=SAMPLE_BY, help="a .txt file's documents: a line each (default), a paragraph, the file"
    )
    ppl.add_argument("--limit", type=COUNT, help="the first N documents")
    ppl.add_argument("--dtype", default="auto", choices=DTYPES, help="auto (the checkpoint's), or the one to load in")
    ppl.add_argument("--output", type=output_path, help="JSON file for the result")
    ppl.add_argument("--overwrite", action="store_true", help="let --output replace an existing file")
    ppl.set_defaults(func=cmd_perplexity)

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
    calibrate.add_argument("--limit", type=COUNT, help="the first N questions of each set")
    calibrate.add_argument("--batch-size", type=COUNT, default=8)
    calibrate.add_argument("--overwrite", action="store_true", help="replace an earlier calibration.json")
    calibrate.set_defaults(func=cmd_calibrate)

    report = commands.add_parser("report", help="one HTML page with the plots of runs and evaluations")
    report.add_argument(
        "paths",
        type=input_path,
        nargs="+",
        metavar="PATH",
        help="run output_dirs, eval --output files or folders of them",
    )
    report.add_argument(
        "--output", type=html_path, default="report.html", help="the HTML file; its PNG files go to <name>_files/"
    )
    report.add_argument("--title", help="the page's title (default: the runs' names)")
    report.add_argument("--overwrite", action="store_true", help="replace an existing report")
    report.set_defaults(func=cmd_report)

    card = commands.add_parser(
        "card", help="the model card of a finished run, with the evaluations made after it, as a push writes it"
    )
    card.add_argument("run", type=input_path, metavar="RUN", help="a training run's output_dir")
    card.add_argument("evals", type=input_path, nargs="*", metavar="EVAL", help="eval --output files of its model")
    card.add_argument(
        "--output", type=output_path, required=True, help="a folder for README.md, images/ and recipe.yaml"
    )
    card.add_argument("--repo-id", type=repo_id, help="the model's name on the card (default: the run folder's name)")
    card.add_argument("--overwrite", action="store_true", help="replace an earlier card in --output")
    card.set_defaults(func=cmd_card)


def cmd_eval(args) -> None:
    from medrecipes.config import parse_eval_args
    from medrecipes.evaluation.commands import run_evaluation
    from medrecipes.evaluation.tables import format_table
    from medrecipes.logs import setup_logging

    setup_logging()
    print(format_table(run_evaluation(parse_eval_args(args.overrides))["tasks"]))


def cmd_perplexity(args) -> None:
    from medrecipes.data.sources import MissingColumn, NotTextColumn, load_source
    from medrecipes.data_config import SourceConfig
    from medrecipes.errors import UserError
    from medrecipes.evaluation.commands import load_for_evaluation
    from medrecipes.evaluation.perplexity import document_perplexity
    from medrecipes.locations import BUILDERS
    from medrecipes.logs import setup_logging
    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged

    setup_logging()
    if args.sample_by and BUILDERS.get(os.path.splitext(args.data)[1]) != "text":
        raise UserError(
            f"perplexity --sample-by chooses what one document of a .txt file is, and --data {args.data} is not one; "
            "leave --sample-by out"
        )
    if args.output:  # before the model loads: a refused output must not cost the evaluation
        claim_output(args.output, "perplexity", "perplexity --output", [args.data, args.model], args.overwrite)
    files = sorted(f for f in os.listdir(args.data) if not f.startswith(".")) if os.path.isdir(args.data) else []
    if len(files) > 1:  # datasets reads one split of a folder
        raise UserError(
            f"perplexity --data: {args.data} is a folder of {len(files)} files ({', '.join(files[:4])}), of which "
            "datasets would read one split; pass the file to score"
        )
    try:
        source = SourceConfig(path=args.data, text_field=args.text_field, sample_by=args.sample_by)
        texts = list(load_source(source)["text"])
    except MissingColumn as err:  # its fix names the recipes' key
        raise UserError(
            f"perplexity --data {args.data}: no column '{args.text_field}' (columns: {err.shown}); pass --text-field "
            "with the column that holds its documents"
        ) from None
    except NotTextColumn as err:
        raise UserError(
            f"perplexity --data {args.data}: column '{args.text_field}' holds no text in any row; pass --text-field "
            f"with a column of text ({f'here: {err.texts}' if err.texts else 'it has none'})"
        ) from None
    if args.limit is not None and args.limit > len(texts):  # as eval says of its --limit
        print(f"warning: perplexity --limit {args.limit} is more than the {len(texts)} documents in {args.data}: "
              "all of them are scored", file=sys.stderr)  # fmt: skip
    texts = texts[: args.limit]
    model, tokenizer = load_for_evaluation(args.model, dtype=args.dtype)
    result = {"model": args.model, "data": args.data, **document_perplexity(model, tokenizer, texts)}
    interval = (
        "95% CI {:.3f}-{:.3f}".format(*result["ci95"]) if result["ci95"] else "one document: no interval; give several"
    )
    windowed = result["windowed_documents"]
    long = (
        f"; {windowed} longer than the model's {result['window']:,} positions, scored in windows moving "
        f"{result['stride']:,} tokens at a time"
        if windowed
        else ""
    )
    print(
        f"{args.data}: perplexity {result['perplexity']:.3f} ({interval}), loss {result['loss']:.4f}, "
        f"{result['documents']} documents, {result['tokens']:,} tokens{long}"
        + (f"; {result['left_out']} left out (no text, or one token)" if result["left_out"] else "")
    )
    if args.output:
        with staged(args.output, folder=False, kind="perplexity") as path, open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"written to {args.output}")


def cmd_calibrate(args) -> None:
    from medrecipes.evaluation.commands import run_calibration
    from medrecipes.evaluation.tables import calibration_table
    from medrecipes.logs import setup_logging
    from medrecipes.names import check_task_names

    setup_logging()
    if not args.held_out:  # the task's own held-out questions: it must be a task of the registry
        check_task_names(
            [args.task], [], "calibrate --task", "score your own questions under that name with --held-out FILE"
        )
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


def cmd_report(args) -> None:
    from medrecipes.report import images_folder, write_report

    images = write_report(args.paths, args.output, args.title, args.overwrite)
    print(f"report written to {args.output}: {len(images)} plots, also as PNG files in {images_folder(args.output)}")


def cmd_card(args) -> None:
    from medrecipes.hub.card import card_of_run

    card_of_run(args.run, args.evals, args.output, args.repo_id, args.overwrite)
    print(f"model card of {args.run} written to {args.output}/README.md, with its plots and recipe.yaml")
