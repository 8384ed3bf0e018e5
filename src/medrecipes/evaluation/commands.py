"""The `medrecipes eval` and `medrecipes calibrate` commands (and recipes/evaluate.py): load the
tasks and the model, score, and write the results."""

import json
import logging
import math
import os
import platform
import time

import torch

from medrecipes.errors import UserError
from medrecipes.evaluation import calibration as cal
from medrecipes.evaluation.loglik import max_context_length
from medrecipes.evaluation.scoring import evaluate_task
from medrecipes.locations import system_prompt_note, weights_fingerprint
from medrecipes.models.files import merged_adapter_fingerprint
from medrecipes.outputs.claims import claim_output
from medrecipes.outputs.writes import staged
from medrecipes.usmle import (
    LETTERS,
)

logger = logging.getLogger(__name__)


def load_for_evaluation(name_or_path: str, revision=None, dtype=None, device=None):
    """(model, tokenizer) as the recipes load them: Hub id, local folder, .gguf file, or a LoRA
    adapter's folder with its base (`models.loading.load_for_inference`, as lm-eval's peft=)."""
    from medrecipes.models.files import check_model_folder
    from medrecipes.models.loading import load_for_inference

    check_model_folder(name_or_path)
    model, tokenizer = load_for_inference(name_or_path, revision, dtype)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


def _versions() -> dict:
    import transformers

    import medrecipes

    return {
        "medrecipes": medrecipes.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def run_evaluation(args) -> dict:
    """Load the tasks and the model of `args` (config.EvalArguments), score every task, write
    `args.output` when set, and return {"tasks": {name: report}, "settings": ..., ...}."""
    from transformers import set_seed

    from medrecipes.evaluation.tasks import load_task

    if args.output:  # before the data and the model load: a refused output must not cost the evaluation
        where = f"{getattr(args, 'where', 'command line')}: output"
        claim_output(args.output, "eval", where, getattr(args, "inputs", []), overwrite=args.overwrite)
    for note in getattr(args, "notes", []):
        logger.warning(note)
    if args.mode == "generate" and (
        note := system_prompt_note(args.model_name_or_path, args.system_prompt, "--system_prompt")
    ):
        logger.warning(note)  # a loglik question is no chat: no system turn to miss
    started = time.time()
    set_seed(args.seed)
    tasks = {
        name: load_task(
            name,
            data=args.data_by_task.get(name),
            data_dir=args.data_dir,
            limit=args.limit,
            num_fewshot=args.num_fewshot,
            fewshot_data=args.fewshot_by_task.get(name),
            pubmedqa_setting=args.pubmedqa_setting,
        )
        for name in args.tasks
    }
    fitted, fitted_on = cal.read_temperature(args.model_name_or_path) or (None, None)  # `medrecipes calibrate`'s
    if fitted is not None and args.mode == "loglik" and (others := [t for t in args.tasks if t != fitted_on]):
        logger.warning(
            "the calibration temperature saved with %s was fitted on %s and scales the confidences of %s too; "
            "fit one on each task's dev questions (medrecipes calibrate --task) to read their calibration",
            args.model_name_or_path, fitted_on or "a task not named", ", ".join(others),
        )  # fmt: skip
    model, tokenizer = load_for_evaluation(args.model_name_or_path, args.model_revision, args.dtype, args.device)
    generation = {
        "system_prompt": args.system_prompt,
        "chain_of_thought": args.chain_of_thought,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "samples": args.samples,
    }
    if (
        args.mode == "generate"
        and args.max_new_tokens
        and args.max_new_tokens >= (limit := max_context_length(model, tokenizer))
    ):
        raise UserError(  # generation past the positions runs on, slower each token, answering nothing more
            f"max_new_tokens {args.max_new_tokens} is past the model's {limit} positions, with the question still to "
            f"fit before the answer; set max_new_tokens below {limit} (16 answers a letter, 512 a reasoning)"
        )
    if args.max_length and args.max_length > (limit := max_context_length(model, tokenizer)):
        logger.warning(
            "max_length %d is past the model's %d positions: prompts longer than those are scored on positions "
            "it never trained on; set max_length %d or less, or leave it out",
            args.max_length, limit, limit,
        )  # fmt: skip
    reports = {}
    for name, data in tasks.items():
        logger.info("%s: %d questions from %s, %s mode", name, len(data.rows), data.source, args.mode)
        reports[name] = evaluate_task(
            model, tokenizer, data, args.mode, args.num_fewshot, args.batch_size, args.max_length, generation, True,
            fitted,
        )  # fmt: skip
        _say_cut_answers(name, reports[name], args.max_new_tokens, args.chain_of_thought)
    settings = {
        "model": args.model_name_or_path,
        "model_fingerprint": weights_fingerprint(args.model_name_or_path),  # which weights, whatever the path
        # A merge-lora output names the adapter it folded in: the evaluation is of that LoRA run's model too
        "merged_adapter_fingerprint": merged_adapter_fingerprint(args.model_name_or_path),
        "mode": args.mode,
        "num_fewshot": args.num_fewshot,
        "limit": args.limit,
        "batch_size": args.batch_size,
        "max_length": args.max_length or max_context_length(model, tokenizer),
        "dtype": str(next(model.parameters()).dtype),
        "device": str(next(model.parameters()).device),
        "seed": args.seed,
        **(generation if args.mode == "generate" else {}),
        **({"calibration_temperature": fitted} if fitted is not None and args.mode == "loglik" else {}),
    }
    results = {"tasks": reports, "settings": settings, "versions": _versions(), "wall_time_s": time.time() - started}
    if args.output:
        with staged(args.output, folder=False, kind="eval") as path, open(path, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
        logger.info("results written to %s", args.output)
    return results


def _say_cut_answers(name: str, report: dict, max_new_tokens: int | None, chain_of_thought: bool = False) -> None:
    """Generated answers that ended at the token limit before an answer could be read are scored
    as wrong, a figure of the limit and not of the model: said in one line with their count. Under
    a chain of thought, a letter read from reasoning the limit cut is no final answer either."""
    predictions = report.get("predictions", [])
    cut = [p for p in predictions if p.get("stopped") is False and not p["abstained"]]
    unread = [p for p in cut if p["predicted"] is None]
    limit = f" ({max_new_tokens})" if max_new_tokens else ""
    if unread:
        logger.warning(
            "%s: %d of %d answers reached max_new_tokens%s before an answer could be read, and are scored as wrong; "
            "raise --max-new-tokens (a chain of thought takes hundreds)",
            name, len(unread), len(predictions), limit,
        )  # fmt: skip
    if chain_of_thought and (read := len(cut) - len(unread)):
        logger.warning(
            "%s: %d of %d answers reached max_new_tokens%s before their reasoning ended, and their letters are read "
            "from the unfinished text; raise --max-new-tokens (a chain of thought takes hundreds)",
            name, read, len(predictions), limit,
        )  # fmt: skip


def run_calibration(
    model_path: str,
    task: str,
    dev: str,
    held_out: str | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    batch_size: int = 8,
    overwrite: bool = False,
) -> dict:
    """Temperature scaling (`medrecipes calibrate`): fit one temperature to the option
    log-likelihoods of the `dev` questions of `task` (questions the model did not train on),
    measure calibration before and after on the held-out questions (`held_out`, else the task's
    own evaluation data), and save the temperature with the model (calibration.json), where
    `medrecipes eval` finds it."""
    from medrecipes.evaluation.tasks import CALIBRATE_WORDING, load_task

    if not os.path.isdir(model_path):
        raise UserError(
            f"calibrate: {model_path} is not a local model folder; the temperature is saved with the model"
        )
    target = os.path.join(model_path, cal.TEMPERATURE_FILE)
    claim_output(target, "calibration", "calibrate", [dev, *([held_out] if held_out else [])], overwrite)
    fit_data = load_task(task, data=dev, limit=limit, wording=CALIBRATE_WORDING)
    if len(fit_data.rows) < cal.MIN_FIT_QUESTIONS:
        raise UserError(
            f"calibrate: {fit_data.source} has {len(fit_data.rows)} questions to fit on (with --limit {limit}) "
            f"and a temperature fitted on fewer than {cal.MIN_FIT_QUESTIONS} follows those few answers, not the "
            "model (one question's fit made a held-out NLL 8 times worse); give --dev more questions"
            if limit
            else f"calibrate: {fit_data.source} has {len(fit_data.rows)} questions to fit on, fewer than "
            f"{cal.MIN_FIT_QUESTIONS}: a temperature fitted on so few follows their answers, not the model; "
            "give --dev more questions"
        )
    test_data = load_task(task, data=held_out, data_dir=data_dir, limit=limit, wording=CALIBRATE_WORDING)
    if {r["question"] for r in fit_data.rows} & {r["question"] for r in test_data.rows}:
        raise UserError(
            f"calibrate: the development questions ({fit_data.source}) and the held-out ones ({test_data.source}) "
            "share questions; fit on questions that are not measured"
        )
    if dev and _trained_on(model_path, dev):
        logger.warning(
            "calibrate: --dev %s is data the run that saved %s trained on (its run.json): the model is surer of "
            "those answers than of new ones, so the temperature fitted there makes it overconfident; fit on "
            "questions it never saw",
            dev, model_path,
        )  # fmt: skip
    model, tokenizer = load_for_evaluation(model_path)
    fitted = evaluate_task(model, tokenizer, fit_data, "loglik", batch_size=batch_size, progress=True)
    logliks = [p["logliks"] for p in fitted["predictions"]]
    gold = [LETTERS.index(p["answer"]) for p in fitted["predictions"]]
    temperature = cal.fit_temperature(logliks, gold)
    if min(abs(math.log(temperature / bound)) for bound in cal.TEMPERATURE_RANGE) < 0.01:
        logger.warning(
            "calibrate: the temperature fitted, %.3g, is at the end of the range searched (%g to %g): no "
            "temperature inside it fits %s's answers, which are %s; it is saved, and says little",
            temperature, *cal.TEMPERATURE_RANGE, fit_data.source,
            "no better than chance there" if temperature > 1 else "all but certain and right",
        )  # fmt: skip
    measured = evaluate_task(model, tokenizer, test_data, "loglik", batch_size=batch_size, progress=True,
                             temperature=temperature)  # fmt: skip
    record = {
        "temperature": temperature,
        "task": task,
        "fitted_on": {
            "source": fit_data.source,
            "questions": len(fit_data.rows),
            "nll_before": cal.gold_nll(logliks, gold),
            "nll_after": cal.gold_nll(logliks, gold, temperature),
        },
        "held_out": {
            "source": test_data.source,
            "questions": len(test_data.rows),
            "before": _summary(measured["calibration"]["acc"]),
            "after": _summary(measured["calibration"]["acc_temperature_scaled"]),
        },
    }
    with staged(target, folder=False, kind="calibration") as path, open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    return {**record, "report": measured}


def _trained_on(model_path: str, data: str) -> bool:
    """Whether `data` is a file among the training sources of the run whose folder holds the model
    (output_dir/final, output_dir/checkpoint-N: the run.json beside it)."""
    from medrecipes.locations import model_run_record

    record = model_run_record(model_path)
    mixture = ((record or {}).get("recipe") or {}).get("dataset_mixture") if isinstance(record, dict) else None
    named = [
        path
        for source in (mixture or {}).get("sources") or []
        if isinstance(source, dict)
        for path in [
            source.get("path"),
            *([source["data_files"]] if isinstance(source.get("data_files"), str) else source.get("data_files") or []),
        ]  # fmt: skip
        if isinstance(path, str)
    ]
    return any(os.path.isfile(path) and os.path.samefile(path, data) for path in named if os.path.isfile(data))


def _summary(found: dict) -> dict:
    """A calibration report's figures and intervals, without its bins and curve."""
    return {k: v for k, v in found.items() if k not in ("bins", "coverage_curve")}
