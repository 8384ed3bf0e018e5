"""Loglik mode against lm-evaluation-harness itself, on the same model and the same questions.

lm-eval runs its own medqa_4options (benchmarks/lm_eval_tasks/medqa_4options_local.yaml, which
calls lm-eval's prompt and target functions) on a MedQA-layout file; `medrecipes` scores the
same file. Every question must get the same prediction and the same log-likelihoods.
"""

import json

import pytest
import yaml
from conftest import ROOT, SHARED_DATA
from transformers import AutoModelForCausalLM, AutoTokenizer

from medrecipes.evaluation.loglik import lm_eval_agreement
from medrecipes.evaluation.scoring import evaluate_task
from medrecipes.evaluation.tasks import load_task

lm_eval = pytest.importorskip("lm_eval")
TASKS = ROOT / "benchmarks" / "lm_eval_tasks"


def run_lm_eval(model_dir, tasks: list[str], include_path, num_fewshot=None, limit=None) -> dict:
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir)},
        tasks=tasks,
        # Only the project's task files: indexing lm-eval's thousands of built-in tasks takes long.
        task_manager=TaskManager(include_path=str(include_path), include_defaults=False),
        num_fewshot=num_fewshot,
        limit=limit,
        batch_size=1,
        device="cpu",
        log_samples=True,
    )


def medqa_layout(rows: list[dict]) -> str:
    """The bundled questions as MedQA test-file lines (question, options, answer_idx, meta_info)."""
    return "".join(
        json.dumps(
            {
                "question": r["question"],
                "options": r["options"],
                "answer": r["options"][r["answer"]],
                "answer_idx": r["answer"],
                "meta_info": r["subject"],
            }
        )
        + "\n"
        for r in rows
    )


def test_medqa_predictions_and_logliks_equal_lm_eval(tiny_model, tmp_path):
    bundled = [
        json.loads(line) for name in ("train", "test") for line in open(ROOT / f"data/usmle_sample/{name}.jsonl")
    ]
    questions = tmp_path / "medqa.jsonl"
    questions.write_text(medqa_layout(bundled[:50]))
    # lm-eval's task on this file: the project's task file with another data file.
    task_dir = tmp_path / "tasks"
    task_dir.mkdir()
    (task_dir / "medqa_here.yaml").write_text(
        yaml.safe_dump(
            {
                "include": str(TASKS / "medqa_4options_local.yaml"),
                "task": "medqa_here",
                "dataset_kwargs": {"data_files": {"test": str(questions)}},
            }
        )
    )
    theirs = run_lm_eval(tiny_model, ["medqa_here"], task_dir)

    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    ours = evaluate_task(model, tokenizer, load_task("medqa_4opt", data=str(questions)), batch_size=4)

    agreement = lm_eval_agreement(ours, theirs["samples"]["medqa_here"])
    assert agreement["n"] == 50 and agreement["identical_predictions"] == 50
    assert agreement["max_loglik_difference"] < 1e-4
    assert ours["accuracy"] == pytest.approx(theirs["results"]["medqa_here"]["acc,none"])
    assert ours["acc_norm"] == pytest.approx(theirs["results"]["medqa_here"]["acc_norm,none"])
    context, answer = theirs["samples"]["medqa_here"][0]["arguments"][0]
    assert (context, answer) == (ours["example_prompt"], ours["example_continuations"][0])  # the same text


@pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"real benchmark files not present at {SHARED_DATA}")
def test_mmlu_few_shot_prompts_equal_lm_eval(tiny_model, monkeypatch):
    monkeypatch.chdir(ROOT)  # the task files name ../shared/data from the project root
    theirs = run_lm_eval(tiny_model, ["mmlu_anatomy_local"], TASKS, num_fewshot=3, limit=6)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(tiny_model), AutoTokenizer.from_pretrained(tiny_model)
    data = load_task("mmlu_medical", data_dir=str(SHARED_DATA), limit=6, num_fewshot=3)
    data.rows = [r for r in data.rows if r["subject"] == "anatomy"]
    ours = evaluate_task(model, tokenizer, data, num_fewshot=3, batch_size=4)
    agreement = lm_eval_agreement(ours, theirs["samples"]["mmlu_anatomy_local"])
    assert agreement["identical_predictions"] == 6 and agreement["max_loglik_difference"] < 1e-4
