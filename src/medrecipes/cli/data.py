"""The commands that make data from data: decontaminate (n-gram overlap with evaluation sets),
pairs (DPO and KTO preference data from multiple-choice questions) and pass-rate (how often a
model answers each of a GRPO recipe's questions right, which its `pass_rate` filter reads)."""

import json
import sys

from medrecipes.cli.arguments import (
    COUNT,
    SEED,
    Number,
    input_path,
    method_of,
    output_path,
    parse_recipe_file,
    recipe_command,
)
from medrecipes.errors import UserError, given_twice
from medrecipes.names import MOST_SAMPLES, PUBMEDQA_SETTINGS, TASK_NAMES


def add_commands(commands) -> None:
    """decontaminate and pairs."""
    decon = commands.add_parser("decontaminate", help="n-gram overlap between training data and evaluation sets")
    decon.add_argument(
        "--train",
        type=input_path,
        required=True,
        help="a training file (text, MCQ, conversations or preference pairs) or a training recipe YAML",
    )
    decon.add_argument(
        "--eval", type=input_path, action="append", help="an evaluation file or folder (MCQ or text); repeatable"
    )
    decon.add_argument("--n", type=COUNT, default=13, help="words per n-gram (default 13)")
    decon.add_argument(
        "--drop", type=output_path, metavar="OUT", help="write the training rows without overlap to OUT"
    )
    decon.add_argument("--overwrite", action="store_true", help="let --drop replace an existing OUT")
    decon.add_argument("--json", action="store_true", help="print the report as one JSON object")
    decon.add_argument("--method", help="the training method a recipe is for, e.g. grpo (default: from its keys)")
    decon.set_defaults(func=cmd_decontaminate, takes_overrides=True)

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
    pairs.add_argument(
        "--samples",
        type=Number(int, least=2, most=MOST_SAMPLES),
        default=4,
        help="--model: answers sampled per question (default 4)",
    )
    pairs.add_argument("--temperature", type=Number(float, above=0), default=1.0, help="--model: sampling temperature")
    pairs.add_argument("--max-new-tokens", type=COUNT, help="--model: tokens per answer (default: eval's)")
    pairs.add_argument("--batch-size", type=COUNT, default=8, help="--model: prompts generated at once")
    pairs.add_argument("--seed", type=SEED, default=42, help="draws the samples and the answers paired (default 42)")
    pairs.add_argument("--overwrite", action="store_true", help="replace an earlier pairs file")
    # The options whose help says they are for --model (on-policy sampling), with their defaults.
    for_model = {a.dest: a.default for a in pairs._actions if (a.help or "").startswith("--model:")}
    pairs.set_defaults(func=cmd_pairs, for_model=for_model)

    rates = recipe_command(
        commands,
        "pass-rate",
        "each question's pass rate: a model's answers sampled, scored by the recipe's reward",
        method="grpo",  # the recipes that have a reward
    )
    rates.add_argument(
        "--output", type=output_path, help="the JSONL file to write (default: the file the recipe's pass_rate reads)"
    )
    rates.add_argument(
        "--samples",
        type=Number(int, least=2, most=MOST_SAMPLES),
        default=8,
        help="answers sampled a question (default 8)",
    )
    rates.add_argument("--batch-size", type=COUNT, default=16, help="prompts generated at once (default 16)")
    rates.add_argument("--seed", type=SEED, default=42, help="draws the samples (default 42)")
    rates.add_argument("--overwrite", action="store_true", help="replace an earlier pass-rate file")
    rates.set_defaults(func=cmd_pass_rate)


def cmd_decontaminate(args) -> None:
    import os

    from medrecipes.data import decontamination as dc
    from medrecipes.data.rows import local_files
    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged

    is_recipe = args.train.endswith((".yaml", ".yml"))
    if not is_recipe and args.overrides:  # --key value pairs override a recipe's keys; a file has none
        raise UserError(
            f"decontaminate: unknown argument {args.overrides[0]!r}; see medrecipes decontaminate --help "
            "(--key value overrides apply to a recipe given as --train)"
        )
    if not is_recipe and not args.eval:
        raise UserError("decontaminate: no evaluation sets to check against; pass --eval FILE")
    if not is_recipe and args.method:
        raise UserError(f"decontaminate --method {args.method} names a recipe's script, and --train {args.train} is a "
                        "data file; leave --method out, or give a recipe")  # fmt: skip
    if named := next((e for e in args.eval or [] if e in TASK_NAMES and not os.path.exists(e)), None):
        raise UserError(
            f"decontaminate --eval {named}: a task's name, and --eval reads evaluation sets' files; pass the file or "
            f"folder of {named}'s questions (as medrecipes eval --data takes it), or a Hub dataset id"
        )
    if args.overwrite and not args.drop:
        print("warning: decontaminate --overwrite lets --drop replace its file, and no --drop is given: it does "
              "nothing here", file=sys.stderr, flush=True)  # fmt: skip
    if repeat := given_twice(args.eval or []):  # the same set twice would be counted twice, under two names
        raise UserError(f"decontaminate --eval {repeat}; name each evaluation set once")
    benchmarks, streaming = {}, False
    if is_recipe:
        from medrecipes.data.mixture import source_names

        recipe, _, _ = parse_recipe_file(
            args.train, method_of(args.train, args.method), args.overrides, say_notes=False
        )
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
        for name, out in drops.items():
            claim_output(out, "decontaminate", "decontaminate --drop", inputs, args.overwrite)
            if os.path.splitext(out)[1].lower() not in dc.KEPT_FORMATS:
                raise UserError(f"--drop {out}: unsupported file type; use {', '.join(dc.KEPT_FORMATS)}")
            if sources[name].format == "usmle" and out.lower().endswith(".csv"):  # a cell holds no list
                raise UserError(
                    f"--drop {out}: these are multiple-choice rows, whose options a CSV cell cannot hold as a list "
                    "to read back; name it .jsonl or .parquet"
                )
    report, contaminated = dc.check_sources(sources, benchmarks, args.n, streaming)
    if all(b["too_short"] == b["rows"] for b in report["benchmarks"].values()):  # a --n past every item
        print(f"warning: decontaminate --n {args.n}: every evaluation item is shorter than {args.n} words, so none "
              "could be checked, and none is found; lower --n (13 is usual)", file=sys.stderr, flush=True)  # fmt: skip
    print(json.dumps(report, indent=2) if args.json else dc.format_report(report))
    for name, out in drops.items():
        with staged(out, folder=False, kind="decontaminate") as path:
            kept = dc.write_kept(sources[name], contaminated[name], path, os.path.splitext(out)[1].lower(), out)
        print(f"{name}: {kept} rows kept, {len(contaminated[name])} dropped -> {out}", file=sys.stderr)


def _say_shared_questions(by_file: dict) -> None:
    """Questions of a later --mcq file that an earlier one holds too (the same context, text and
    options), counted and named: each would be paired twice. Said, not refused (repeats within one
    file are said where it is read)."""
    import logging

    from medrecipes.usmle import question_key

    seen = {}
    for file, rows in by_file.items():
        keys = [question_key(r["context"], r["question"], r["options"]) for r in rows]
        shared = [(row["id"], seen[key]) for row, key in zip(rows, keys, strict=True) if seen.get(key, file) != file]
        if shared:
            logging.getLogger(__name__).warning(
                "%s: %d question(s) are also in %s (%s%s): each is paired twice; give each file once, or drop them",
                file, len(shared), shared[0][1], ", ".join(f"'{i}'" for i, _ in shared[:3]), ", ..." if len(shared) > 3 else "",
            )  # fmt: skip
        for key in keys:
            seen.setdefault(key, file)


def cmd_pairs(args) -> None:
    from medrecipes.data.preference import chosen_account, mcq_pairs, on_policy_pairs, unpaired
    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged
    from medrecipes.usmle import load_mcq

    given = [dest for dest, default in args.for_model.items() if getattr(args, dest) != default]
    if given and not args.model:
        flags = ", ".join("--" + dest.replace("_", "-") for dest in given)
        raise UserError(
            f"pairs: {flags} {'is' if len(given) == 1 else 'are'} for sampling a model's own answers, and no --model "
            "is given (the pairs are then the gold answer against a drawn option); add --model, or leave them out"
        )
    claim_output(args.out, "pairs", "pairs --out", [*args.mcq, *([args.model] if args.model else [])], args.overwrite)
    if not args.out.endswith(".jsonl"):
        raise UserError(f"pairs --out {args.out}: write a .jsonl file (one row a line)")
    if twice := next((file for i, file in enumerate(args.mcq) if file in args.mcq[:i]), None):
        raise UserError(f"pairs --mcq: {twice} is given twice; name each file once")
    by_file = {file: load_mcq(file, answered=True, pubmedqa_setting=args.pubmedqa_setting) for file in args.mcq}
    _say_shared_questions(by_file)
    rows = [row for questions in by_file.values() for row in questions]
    files = ", ".join(args.mcq)
    if args.model:
        pairs, left_out = on_policy_pairs(rows, _sampled_answers(args, rows), args.system_prompt, args.seed)
        how = (
            f"on-policy: {args.model}'s own answers to {len(rows)} questions of {files}, {args.samples} sampled "
            f"each (temperature {args.temperature:g}, seed {args.seed}); a right answer chosen against a wrong one; "
            f"{left_out['all right']} questions left out where every sample was right, {left_out['all wrong']} "
            "where every one was wrong"
        )
        how += "; " + chosen_account(rows, pairs)
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

    from medrecipes.evaluation.commands import load_for_evaluation
    from medrecipes.evaluation.generate import sample_answers
    from medrecipes.locations import system_prompt_note

    if note := system_prompt_note(args.model, args.system_prompt, "--system-prompt"):
        print(f"warning: pairs --model: {note}", file=sys.stderr)
    set_seed(args.seed)
    model, tokenizer = load_for_evaluation(args.model)
    answers, _ = sample_answers(
        model, tokenizer, rows, args.samples, system_prompt=args.system_prompt, max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size, temperature=args.temperature, progress=True,
    )  # fmt: skip
    return answers


# The ranges `medrecipes pass-rate` counts: what a filter of each would keep.
RANGES = [(0.0, 1.0), (0.0, 0.5), (0.5, 1.0)]


def _one_row_per_id(rows: list[dict], recipe: str) -> list[dict]:
    """`rows` with each id once (the filter reads a pass rate by id): a question asked again under
    its id is measured once; one line where an id names two different questions."""
    from medrecipes.usmle.loading import shared_ids
    from medrecipes.usmle.schema import question_key

    ids = [row["id"] for row in rows]
    shared = shared_ids(ids, [question_key(row.get("context"), row["question"], row["options"]) for row in rows])
    if shared:
        raise UserError(
            f"{recipe}: {len(shared)} of its questions have the id of another question (the first: "
            f"{ids[shared[0][0]]!r}; loading named their lines), and the pass_rate filter keeps a question by its "
            "id; give each question its own id"
        )
    first: dict[str, dict] = {}
    for row in rows:
        first.setdefault(row["id"], row)
    return list(first.values())


def cmd_pass_rate(args) -> None:
    """Each training question of a GRPO recipe asked `--samples` times with the recipe's own chat prompt
    and sampling (temperature, top_p, top_k, max_completion_length), scored by its correctness reward; one
    row a question, with the fingerprint of the model that answered. The recipe's own pass_rate
    filter is not applied: these are the rows it chooses among."""
    from transformers import set_seed

    from medrecipes.config import parse_recipe
    from medrecipes.data.sources import load_mcq_source
    from medrecipes.evaluation.commands import load_for_evaluation
    from medrecipes.evaluation.generate import sample_answers
    from medrecipes.locations import SAMPLED, weights_fingerprint
    from medrecipes.outputs.claims import claim_output
    from medrecipes.outputs.writes import staged
    from medrecipes.pass_rates import range_counts
    from medrecipes.rewards import correctness_index, reward_functions

    method = method_of(args.recipe, args.method, ("grpo",))
    recipe, training, model_args = parse_recipe(method, [args.recipe, *args.overrides], to_train=False)
    if recipe.mixture is None:
        raise UserError(f"{args.recipe}: no 'dataset_mixture'; pass-rate measures the questions it trains on")
    if training.prompt_format != "chat":
        raise UserError(f"{args.recipe}: pass-rate asks the questions as chat prompts; this recipe's are plain")
    functions, _ = reward_functions(training.rewards)
    correct = correctness_index(functions)
    if correct is None:
        raise UserError(
            f"{args.recipe}: no reward scores whether an answer is right (usmle_accuracy or accuracy_or_abstain); "
            "a pass rate counts the answers it scores 1"
        )
    named = {source.pass_rate.file for source in recipe.mixture.sources if source.pass_rate}
    output = args.output or (named.pop() if len(named) == 1 else None)
    if output is None:
        raise UserError(f"{args.recipe}: its sources name no single pass_rate file; give --output FILE.jsonl")
    if not output.endswith(".jsonl"):
        raise UserError(f"pass-rate --output {output}: write a .jsonl file (one row a line)")
    model = model_args.model_name_or_path
    claim_output(output, "pass-rate", "pass-rate --output", [args.recipe, model], args.overwrite)
    rows = [row for source in recipe.mixture.sources for row in load_mcq_source(source, recipe.subjects, False)]
    rows = _one_row_per_id(rows, args.recipe)
    set_seed(args.seed)
    loaded, tokenizer = load_for_evaluation(model)
    answers, _ = sample_answers(
        loaded, tokenizer, rows, args.samples, system_prompt=recipe.system_prompt,
        chain_of_thought=recipe.chain_of_thought, max_new_tokens=training.max_completion_length,
        batch_size=args.batch_size, temperature=training.temperature, top_p=training.top_p, top_k=training.top_k,
        progress=True,
    )  # fmt: skip
    fingerprint = weights_fingerprint(model, ends=SAMPLED)
    written = []
    for row, sampled in zip(rows, answers, strict=True):
        columns = {"answer": [row["answer"]] * len(sampled), "options": [row["options"]] * len(sampled)}
        scores = functions[correct](completions=sampled, **columns)
        right = sum(score == 1.0 for score in scores)
        written.append({"id": row["id"], "pass_rate": right / len(sampled), "right": right, "samples": len(sampled),
                        "model": model, "model_fingerprint": fingerprint})  # fmt: skip
    how = f"{args.samples} answers of {model} to each of {len(rows)} questions of {args.recipe} (seed {args.seed})"
    with staged(output, folder=False, kind="pass-rate", about=how) as path, open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in written)
    counts = range_counts([row["pass_rate"] for row in written], RANGES)
    print(f"{len(written)} pass rates written to {output}: {how}")
    print("kept by pass_rate " + "; ".join(f"{where}: {n}" for where, n in counts.items()))
