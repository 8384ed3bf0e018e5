"""medrecipes.evaluation and `medrecipes eval`: loglik scoring as lm-evaluation-harness does it,
generate mode on a model with known answers, subjects, the command, real benchmark files."""

import json
import logging
import math
import re

import pytest
import torch
from conftest import ROOT, SHARED_DATA
from transformers import AutoModelForCausalLM, AutoTokenizer

from medrecipes import cli
from medrecipes.config import parse_eval_args, parse_recipe
from medrecipes.errors import UserError
from medrecipes.evaluation.commands import _say_cut_answers
from medrecipes.evaluation.generate import chat_prompt, generate_answers, score
from medrecipes.evaluation.loglik import continuation_logliks
from medrecipes.evaluation.scoring import evaluate_task
from medrecipes.evaluation.statistics import by_subject, wilson_interval
from medrecipes.evaluation.tables import format_table
from medrecipes.evaluation.tasks import TASKS, load_task

needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real benchmark files not present at {SHARED_DATA}"
)


def mcq(id, question, options, answer, subject="", context=""):
    return {
        "id": id,
        "question": question,
        "options": options,
        "answer": answer,
        "subject": subject,
        "explanation": "",
        "context": context,
    }


ROWS = [
    mcq("q1", "Which organ pumps blood?", ["Heart", "Lung", "Liver", "Kidney"], "A", "cardiology"),
    mcq("q2", "Which drug lowers cholesterol?", ["Aspirin", "Statin", "Insulin", "Heparin"], "B", "pharmacology"),
    mcq("q3", "Which organ filters blood?", ["Heart", "Lung", "Kidney", "Skin"], "C", "nephrology"),
    mcq(
        "q4", "Which vessel carries blood from the heart?", ["Vein", "Capillary", "Lymph", "Artery"], "D", "cardiology"
    ),
]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


def write_jsonl_rows(rows, folder):
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def by_hand(model, tokenizer, context: str, answer: str, max_length: int = 2048) -> float:
    """log P(answer | context) from the model's logits: the joint encoding split at the context."""
    context_ids = tokenizer.encode(context)
    answer_ids = tokenizer.encode(context + answer)[len(context_ids) :]
    tokens = (context_ids + answer_ids)[-(max_length + 1) :]
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]])).logits[0]
    total = 0.0
    for offset, token in enumerate(answer_ids):
        position = len(tokens) - 1 - len(answer_ids) + offset
        row = logits[position].double()
        total += float(row[token] - torch.logsumexp(row, dim=0))
    return total


def test_loglik_equals_the_hand_computed_log_probability(tiny):
    model, tokenizer = tiny
    task = TASKS["medqa_4opt"]
    context = task.context(ROWS[0], [])
    assert context == "Question: Which organ pumps blood?\nA. Heart\nB. Lung\nC. Liver\nD. Kidney\nAnswer:"
    requests = [(context, " A"), (context, " B"), (context, " Heart failure"), ("Question: x  ", "y")]
    got = continuation_logliks(model, tokenizer, requests, batch_size=3)
    for (ctx, answer), (loglik, _) in zip(requests[:3], got, strict=False):
        assert loglik == pytest.approx(by_hand(model, tokenizer, ctx, answer), abs=1e-4)
    # Trailing spaces of the context belong to the continuation, as in lm-eval.
    assert got[3][0] == pytest.approx(by_hand(model, tokenizer, "Question: x", "  y"), abs=1e-4)
    # Too long for the model: the input loses tokens on the left.
    (short, _), (full, _) = continuation_logliks(model, tokenizer, [(context, " C")], max_length=8)[0], got[0]
    assert short == pytest.approx(by_hand(model, tokenizer, context, " C", max_length=8), abs=1e-4)
    assert short != pytest.approx(full)


class AllPositions(torch.nn.Module):
    """A model whose forward takes no `logits_to_keep`: it projects every position."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids, use_cache):
        return self.model(input_ids=input_ids, use_cache=use_cache)


def test_loglik_projects_only_the_positions_it_scores(tiny):
    model, tokenizer = tiny
    short = TASKS["medqa_4opt"].context(ROWS[1], [])
    requests = [(short, " A"), (short, " B"), (short + " and", " Heart failure"), (short * 3, " C")]
    projected = []
    hook = model.lm_head.register_forward_hook(lambda module, inputs, output: projected.append(inputs[0].shape[1]))
    kept = continuation_logliks(model, tokenizer, requests, batch_size=2)
    hook.remove()
    # Two batches, longest inputs first, each projecting only the positions that score its rows'
    # answers (one for a one-token answer, one per token of a longer one), not whole rows: the
    # three-question row and the multi-token answer, then the row that " A" and " B" share.
    answer_tokens = len(tokenizer.encode(short + " and Heart failure")) - len(tokenizer.encode(short + " and"))
    assert answer_tokens > 1 and projected == [1 + answer_tokens, 1]
    full = continuation_logliks(AllPositions(model), tokenizer, requests, batch_size=2)
    for (a, greedy_a), (b, greedy_b) in zip(kept, full, strict=True):
        assert a == pytest.approx(b, abs=1e-5) and greedy_a == greedy_b


def test_loglik_report_takes_the_best_answer_and_normalises_by_length(tiny, tmp_path):
    model, tokenizer = tiny
    pubmed = [mcq("p1", "Does aspirin prevent stroke?", ["yes", "no", "maybe"], "A", context="A trial. It worked.")]
    data = load_task("pubmedqa", data=str(write_jsonl_rows(pubmed, tmp_path)))
    report = evaluate_task(model, tokenizer, data)
    context = "Abstract: A trial. It worked.\nQuestion: Does aspirin prevent stroke?\nAnswer:"
    expected = [by_hand(model, tokenizer, context, f" {word}") for word in ("yes", "no", "maybe")]
    prediction = report["predictions"][0]
    assert prediction["logliks"] == pytest.approx(expected, abs=1e-4)
    best = max(range(3), key=lambda i: expected[i])
    best_per_char = max(range(3), key=lambda i: expected[i] / len(("yes", "no", "maybe")[i]))
    assert prediction["predicted"] == "ABC"[best] and prediction["predicted_norm"] == "ABC"[best_per_char]
    assert report["accuracy"] == (best == 0) and report["acc_norm"] == (best_per_char == 0)


def test_subject_breakdown():
    rows = [ROWS[0], ROWS[1], ROWS[3], {**ROWS[2], "subject": ""}]
    report = by_subject(rows, [True, False, False, True])
    assert report["accuracy"] == 0.5 and report["n"] == 4
    assert report["ci95"] == list(wilson_interval(2, 4))
    assert report["subjects"]["cardiology"] == {"accuracy": 0.5, "n": 2, "ci95": list(wilson_interval(1, 2))}
    assert report["subjects"]["pharmacology"]["accuracy"] == 0.0 and report["subjects"]["all"]["n"] == 1
    lo, hi = wilson_interval(2, 4)
    assert lo < 0.5 < hi and math.isclose(lo + hi, 1.0)  # symmetric at p = 0.5


def train_to_answer(model, tokenizer, rows, answers, max_steps=400):
    """Fine-tune `model` until it gives `answers` (its chat turns) to `rows`; loss on the answers only."""
    pairs = []
    for row, answer in zip(rows, answers, strict=True):
        prompt = tokenizer(chat_prompt(tokenizer, row), add_special_tokens=False).input_ids
        target = tokenizer(answer + "<|im_end|>", add_special_tokens=False).input_ids
        pairs.append((prompt, target))
    width = max(len(p) + len(t) for p, t in pairs)
    ids = torch.full((len(pairs), width), tokenizer.pad_token_id)
    labels = torch.full((len(pairs), width), -100)
    for i, (prompt, target) in enumerate(pairs):
        ids[i, : len(prompt) + len(target)] = torch.tensor(prompt + target)
        labels[i, len(prompt) : len(prompt) + len(target)] = torch.tensor(target)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    model.train()
    for _ in range(max_steps):
        loss = model(input_ids=ids, labels=labels).loss
        if loss.item() < 0.02:
            break
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return loss.item()


def test_generate_mode_reads_the_answers_the_model_gives(tiny_model, caplog):
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    answers = ["A. Heart", "The answer is (B).", "D", "Unsure."]
    assert train_to_answer(model, tokenizer, ROWS, answers) < 0.02
    completions, stopped = generate_answers(model, tokenizer, ROWS, batch_size=3)
    assert completions == answers and stopped == [True] * 4  # each ended at EOS
    _, cut = generate_answers(model, tokenizer, ROWS, batch_size=3, max_new_tokens=1)
    assert cut == [False] * 4  # one token: every reply ran to max_new_tokens
    with caplog.at_level(logging.WARNING):
        _say_cut_answers("t", score(ROWS, [""] * 4, cut), 1)  # nothing readable, cut at the limit
        _say_cut_answers("u", score(ROWS, completions, stopped), None)
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["t"]
    assert "4 of 4 answers reached max_new_tokens (1) before an answer could be read" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # letters read from replies cut short: under a chain of thought, said
        _say_cut_answers("v", score(ROWS, completions, [False] * 4), 4, chain_of_thought=True)
        _say_cut_answers("w", score(ROWS, completions, [False] * 4), 4)
    assert [r.getMessage() for r in caplog.records] == [
        "v: 3 of 4 answers reached max_new_tokens (4) before their reasoning ended, and their letters are read from "
        "the unfinished text; raise --max-new-tokens (a chain of thought takes hundreds)"
    ]
    report = score(ROWS, completions, stopped)
    assert report["stopped"] == 1.0
    assert [p["predicted"] for p in report["predictions"]] == ["A", "B", "D", None]
    # "Unsure." declines to answer: an abstention, counted apart from replies that name nothing.
    assert report["accuracy"] == 0.5 and report["abstained"] == 0.25 and report["unparseable"] == 0.0
    assert report["subjects"]["cardiology"]["accuracy"] == 0.5  # q1 right, q4 abstained


def test_chat_prompt_puts_few_shot_examples_before_the_question(tiny):
    _, tokenizer = tiny
    prompt = chat_prompt(tokenizer, ROWS[1], shots=[ROWS[0]], system_prompt="Be brief.")
    assert prompt.index("Be brief.") < prompt.index("pumps blood") < prompt.index("A. Heart<|im_end|>")
    assert prompt.index("A. Heart<|im_end|>") < prompt.index("lowers cholesterol")
    assert prompt.endswith("<|im_start|>assistant\n")


def test_eval_command_writes_reports_and_prints_the_table(tiny_model, tmp_path, capsys):
    data = write_jsonl_rows(ROWS, tmp_path)
    output = tmp_path / "out" / "results.json"
    cli.main(["eval", "--model", tiny_model, "--tasks", "mine", "--data", f"mine={data}", "--output", str(output)])
    table = capsys.readouterr().out
    assert "| mine | loglik | 4 |" in table and "|   mine / cardiology | loglik | 2 |" in table
    results = json.loads(output.read_text())
    report = results["tasks"]["mine"]
    assert report["n"] == 4 and len(report["predictions"]) == 4 and report["source"] == str(data)
    assert report["example_prompt"].startswith("Question: Which organ pumps blood?\nA. Heart")
    assert results["settings"]["mode"] == "loglik" and results["settings"]["model"] == tiny_model
    assert table.strip() == format_table(results["tasks"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tasks", "medqa_4op"], "unknown task 'medqa_4op' (did you mean 'medqa_4opt'"),
        (["--tasks", "medqa_5opt"], "medqa_5opt: has no Hub copy; pass --data_dir"),
        (["--tasks", "medqa_4opt,mmlu_medical", "--data", "x.jsonl"], "--data x.jsonl: name the task"),
        (
            ["--tasks", "medqa_4opt", "--data", "medqa_4op=x.jsonl"],
            "data names task 'medqa_4op', which is not in tasks",
        ),
        (["--tasks", "mine", "--data", "mine=x.jsonl", "--fewshot_data", "mien=y"], "fewshot_data names task 'mien'"),
        (["--tasks", "medqa_4opt", "--data_dir", "/nonexistent"], "--data_dir /nonexistent: no such file or folder"),
        (["--mode", "generat"], "mode 'generat' is unknown (did you mean 'generate'?)"),
        (["--max_new_tokens", "0"], "max_new_tokens must be at least 1, got 0"),
        (["--tasks", "mine", "--data", "mine=data/usmle_sample/test.jsonl", "--num_fewshot", "1"], "no few-shot"),
    ],
)
def test_eval_command_errors_are_one_line(tiny_model, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit:
        cli.main(["eval", "--model", tiny_model, *argv])
    err = capsys.readouterr().err
    said = [line for line in err.replace("\r", "\n").splitlines() if line.strip() and "%|" not in line]
    assert exit.value.code == 2 and message in err and len(said) == 1, err  # a progress bar where data is read anew


@needs_shared_data
def test_real_benchmark_files_load_with_their_subjects_and_few_shot_examples(tiny):
    model, tokenizer = tiny
    medqa = load_task("medqa_4opt", data_dir=str(SHARED_DATA))
    assert len(medqa.rows) == 1273 and {r["subject"] for r in medqa.rows} == {"step1", "step2&3"}
    assert [r["answer"] for r in medqa.rows].count("A") == 353  # the README's gold letter counts
    five = load_task("medqa_5opt", data_dir=str(SHARED_DATA), limit=2)
    assert [len(r["options"]) for r in five.rows] == [5, 5]
    mmlu = load_task("mmlu_medical", data_dir=str(SHARED_DATA), limit=2, num_fewshot=5)
    assert len(mmlu.rows) == 12 and sorted({r["subject"] for r in mmlu.rows}) == sorted(TASKS["mmlu_medical"].subjects)
    anatomy = mmlu.rows[0]
    shots = mmlu.shots(anatomy, 5)
    assert [s["subject"] for s in shots] == ["anatomy"] * 5
    context = mmlu.task.context(anatomy, shots)
    assert context.startswith("The following are multiple choice questions (with answers) about anatomy.\n\n")
    assert context.count("\nAnswer: ") == 5 and context.endswith("\nAnswer:")
    report = evaluate_task(model, tokenizer, five)
    assert all(len(p["logliks"]) == 5 for p in report["predictions"])


PQAL = {
    "11": {"QUESTION": "Does aspirin prevent stroke?", "CONTEXTS": ["A trial.", "It worked."],
           "final_decision": "yes", "LONG_ANSWER": "Aspirin prevented strokes."},
    "12": {"QUESTION": "Is coffee harmful?", "CONTEXTS": ["A cohort."],
           "final_decision": "no", "LONG_ANSWER": "Coffee was not harmful."},
}  # fmt: skip


@pytest.mark.parametrize(
    "setting, context",
    [
        (None, "Abstract: A trial.\nIt worked.\n"),
        ("reasoning_required", "Abstract: A trial.\nIt worked.\n"),
        ("reasoning_free", "Conclusion: Aspirin prevented strokes.\n"),
        ("reasoning_free_with_abstract", "Abstract: A trial.\nIt worked.\nConclusion: Aspirin prevented strokes.\n"),
    ],
)
def test_pubmedqa_is_scored_and_recorded_in_its_setting(tiny, tmp_path, setting, context):
    model, tokenizer = tiny
    path = tmp_path / "ori_pqal.json"
    path.write_text(json.dumps(PQAL))
    data = load_task("pubmedqa", data=str(path), pubmedqa_setting=setting)
    prompt = f"{context}Question: Does aspirin prevent stroke?\nAnswer:"
    assert data.task.context(data.rows[0], []) == prompt
    loglik = evaluate_task(model, tokenizer, data)
    assert loglik["example_prompt"] == prompt and loglik["pubmedqa_setting"] == (setting or "reasoning_required")
    generated = evaluate_task(model, tokenizer, data, "generate", generation={"max_new_tokens": 2})
    assert ("Aspirin prevented strokes." in generated["example_prompt"]) == ("Conclusion" in context)
    assert "A trial.\nIt worked." in generated["example_prompt"] or setting == "reasoning_free"
    assert generated["pubmedqa_setting"] == (setting or "reasoning_required")
    # A task that brings its own PubMedQA questions takes the setting; the other registry tasks do not.
    assert load_task("mine", data=str(path), pubmedqa_setting=setting).pubmedqa_setting == setting
    medqa = load_task("medqa_4opt", data=str(ROOT / "data/usmle_sample/test.jsonl"), pubmedqa_setting=setting)
    assert medqa.pubmedqa_setting is None and "pubmedqa_setting" not in evaluate_task(model, tokenizer, medqa)


def test_a_pubmedqa_setting_without_a_pubmedqa_task_is_one_line():
    for tasks in ("medqa_4opt", "medqa_4opt,mmlu_medical"):
        with pytest.raises(UserError, match=f"pubmedqa_setting .* tasks {tasks.replace(',', ', ')} hold none"):
            parse_eval_args(["--model", "m", "--tasks", tasks, "--pubmedqa_setting", "reasoning_free"])
    with pytest.raises(UserError, match="pubmedqa_setting 'free' is unknown"):
        parse_eval_args(["--model", "m", "--tasks", "pubmedqa", "--pubmedqa_setting", "free"])
    for tasks in ("pubmedqa", "medqa_4opt,pubmedqa", "mine"):
        args = parse_eval_args(
            ["--model", "m", "--tasks", tasks, "--data", "mine=x.json", "--pubmedqa_setting", "reasoning_free"]
        )
        assert args.pubmedqa_setting == "reasoning_free"


def test_eval_yaml_and_flags_parse_into_one_set_of_arguments():
    args = parse_eval_args(
        [str(ROOT / "recipes/tiny_eval.yaml"), "--mode", "loglik", "--tasks", "usmle_test,pubmedqa"]
    )
    assert args.tasks == ["usmle_test", "pubmedqa"] and args.mode == "loglik"
    assert args.data_by_task["usmle_test"] == "data/usmle_sample/test.jsonl"
    assert args.system_prompt.startswith("You are a careful medical expert")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["--eval_tasks", "medqa_4op"], "eval_tasks: unknown task 'medqa_4op' (did you mean 'medqa_4opt'"),
        (["--eval_tasks", "usmle", "--eval_tasks_mode", "gen"], "eval_tasks_mode 'gen' is unknown"),
        (
            ["--eval_tasks", "usmle", "--eval_strategy", "no", "--load_best_model_at_end", "false"],
            "eval_strategy is 'no'",
        ),
    ],
)
def test_recipe_eval_tasks_are_checked_when_the_recipe_is_read(overrides, message):
    with pytest.raises(UserError, match=re.escape("'usmle_test' is an eval set this recipe already scores")):
        parse_recipe("sft", [str(ROOT / "recipes/tiny_sft.yaml"), "--eval_tasks", "usmle_test"])
    grpo = [str(ROOT / "recipes/tiny_grpo.yaml"), "--eval_tasks", "usmle_test"]
    with pytest.raises(UserError, match=re.escape("'usmle_test' is an eval set this recipe already scores")):
        parse_recipe("grpo", grpo)  # chat prompts: greedy accuracy already logged
    recipe, _, _ = parse_recipe("grpo", [*grpo, "--prompt_format", "plain", "--system_prompt", ""])
    assert recipe.eval_tasks == ["usmle_test"]
    with pytest.raises(UserError, match=re.escape(message)):
        parse_recipe("cpt", [str(ROOT / "recipes/tiny_cpt.yaml"), *overrides])
    recipe, _, _ = parse_recipe("cpt", [str(ROOT / "recipes/tiny_cpt.yaml"), "--eval_tasks", "usmle,medqa_4opt"])
    assert recipe.eval_tasks == ["usmle", "medqa_4opt"] and recipe.eval_tasks_mode == "loglik"


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_and_its_bootstrap_agree_with_scikit_learn(seed):
    import random

    import numpy as np
    from sklearn.metrics import f1_score

    from medrecipes.evaluation.statistics import _macro_f1_of_resamples, macro_f1

    rng = random.Random(seed)
    classes = "ABCD"[: rng.randint(2, 4)]
    gold = [rng.choice(classes) for _ in range(rng.randint(5, 80))]
    # Right, another class, a letter no question has as gold, or unparseable.
    guess = [g if rng.random() < 0.5 else rng.choice([*classes, "E", None]) for g in gold]
    result = macro_f1(gold, guess)
    labels = sorted(set(gold))
    as_strings = ["" if g is None else g for g in guess]
    expected = f1_score(gold, as_strings, labels=labels, average="macro", zero_division=0)
    assert result["macro_f1"] == pytest.approx(expected, abs=1e-12)
    # The bootstrap's own counting gives scikit-learn's value on any resample.
    index = np.random.default_rng(seed).integers(0, len(gold), (20, len(gold)))
    ours = _macro_f1_of_resamples(np.asarray(gold), np.asarray(as_strings), np.asarray(labels), index)
    for row, value in zip(index, ours, strict=True):
        theirs = f1_score(
            np.asarray(gold)[row], np.asarray(as_strings)[row], labels=labels, average="macro", zero_division=0
        )
        assert value == pytest.approx(theirs, abs=1e-12)
    low, high = result["macro_f1_ci95"]
    assert low <= result["macro_f1"] <= high
    assert macro_f1(gold, guess) == result  # seeded


def test_always_yes_on_pubmedqa_scores_its_published_macro_f1():
    from medrecipes.evaluation.statistics import macro_f1

    # PubMedQA's 500 labelled questions: yes 276, no 169, maybe 55; always "yes" gives 0.24 (its README).
    gold = ["A"] * 276 + ["B"] * 169 + ["C"] * 55
    assert round(macro_f1(gold, ["A"] * 500)["macro_f1"], 2) == 0.24


def test_document_perplexity_scores_whole_documents_from_bos(tiny_model, tmp_path, capsys):
    from medrecipes.evaluation.perplexity import document_perplexity

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    texts = ["Metformin is first-line therapy for type 2 diabetes.", "Hypokalaemia flattens T waves.", "Ok."]
    result = document_perplexity(model, tokenizer, texts)
    # Independently: each document alone from its BOS, the model's own mean loss times its tokens.
    total, tokens = 0.0, 0
    for text in texts:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]
        assert ids[0, 0] == tokenizer.bos_token_id
        with torch.no_grad():
            total += model(input_ids=ids, labels=ids).loss.item() * (ids.shape[1] - 1)
        tokens += ids.shape[1] - 1
    assert result["tokens"] == tokens and result["documents"] == 3 and result["left_out"] == 0
    assert result["perplexity"] == pytest.approx(math.exp(total / tokens), rel=1e-5)
    blanks = document_perplexity(model, tokenizer, [texts[0], "", "  \n ", *texts[1:]])  # nothing to score in them
    assert (blanks["left_out"], blanks["documents"], blanks["perplexity"]) == (2, 3, result["perplexity"])
    assert result["ci95"][0] <= result["perplexity"] <= result["ci95"][1]
    assert document_perplexity(model, tokenizer, texts[:1])["ci95"] is None  # one document: nothing to resample

    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "ppl.json"
    cli.main(["perplexity", "--model", tiny_model, "--data", str(data), "--output", str(out)])
    assert json.loads(out.read_text())["perplexity"] == pytest.approx(result["perplexity"], rel=1e-5)
    assert "perplexity" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit:
        cli.main(["perplexity", "--model", tiny_model, "--data", str(data), "--output", str(out)])
    assert exit.value.code == 2 and "already exists" in capsys.readouterr().err
    for limit, said in (("2", ""), ("3", ""), ("50", "--limit 50 is more than the 3 documents")):
        cli.main(["perplexity", "--model", tiny_model, "--data", str(data), "--limit", limit])
        shown = capsys.readouterr()
        assert f"{min(int(limit), 3)} documents" in shown.out and said in shown.err
        assert ("warning" in shown.err) is bool(said), shown.err


def test_the_command_says_which_documents_were_scored_in_windows(tiny_model, tmp_path, capsys):
    """A document past the model's positions: the command's line says so and how it was scored,
    and no tokenizer warning about indexing errors that the windows avoid."""
    from medrecipes.evaluation.loglik import max_context_length

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    window = max_context_length(model, tokenizer)
    sentence = "Metformin lowers hepatic glucose output. "
    long = sentence * (2 * window // len(tokenizer(sentence)["input_ids"]))
    data = tmp_path / "docs.jsonl"
    data.write_text(json.dumps({"text": long}) + "\n" + json.dumps({"text": sentence}) + "\n")
    cli.main(["perplexity", "--model", tiny_model, "--data", str(data)])
    out, err = capsys.readouterr()
    assert "2 documents" in out and f"1 longer than the model's {window:,} positions" in out, out
    assert "indexing errors" not in out + err


def test_a_document_longer_than_the_model_is_scored_whole_in_windows(tiny_model):
    """Every token after the first scored once, each forward pass no longer than the window; a
    document that fits gives the one-pass figure, whatever the window."""
    from medrecipes.evaluation.perplexity import document_perplexity

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = " ".join(["Metformin lowers hepatic glucose output and is first-line in type 2 diabetes."] * 12)
    length = len(tokenizer(text)["input_ids"])
    whole = document_perplexity(model, tokenizer, [text], window=length)
    seen = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    for window in (length // 3, 17, 2):
        seen.clear()
        cut = document_perplexity(model, tokenizer, [text], window=window)
        assert cut["tokens"] == whole["tokens"] == length - 1 and cut["windowed_documents"] == 1
        assert max(seen) <= window and cut["stride"] == max(window // 2, 1) and math.isfinite(cut["loss"])
    assert whole["windowed_documents"] == 0
    assert document_perplexity(model, tokenizer, [text], window=length + 50)["loss"] == pytest.approx(whole["loss"])
    # A window that leaves half a window of context agrees closely with the one pass on this text.
    assert document_perplexity(model, tokenizer, [text], window=length // 2 + 4)["loss"] == pytest.approx(
        whole["loss"], rel=0.05
    )


@pytest.mark.parametrize("mode", ["loglik", "generate"])
def test_a_question_longer_than_the_model_is_cut_and_counted_in_the_report(tiny_model, tmp_path, mode):
    """A question longer than the model's positions keeps its last tokens (as lm-eval does), so
    that generation never runs past the positions; the report says how many and how."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model.config.max_position_embeddings = tokenizer.model_max_length = 96
    long = "Which drug? " + "A patient with a long history of hypertension and diabetes. " * 40
    rows = [mcq("short", "Which drug?", ["Aspirin", "Statin"], "A"), mcq("long", long, ["Aspirin", "Statin"], "B")]
    data = load_task("mine", data=str(write_jsonl_rows(rows, tmp_path)))
    seen = []
    model.register_forward_pre_hook(
        lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    report = evaluate_task(model, tokenizer, data, mode, generation={"max_new_tokens": 4})
    assert report["truncated"]["prompts"] == 1 and "first tokens dropped" in report["truncated"]["how"]
    assert report["n"] == 2 and max(seen) <= 96
    # Nor the tokenizer's line that such a text "will result in indexing errors": it was cut.
    assert "sequence-length-is-longer-than-the-specified-maximum" not in tokenizer.deprecation_warnings
    short = evaluate_task(model, tokenizer, load_task("mine", data=str(write_jsonl_rows(rows[:1], tmp_path))), mode,
                          generation={"max_new_tokens": 4})  # fmt: skip
    assert "truncated" not in short


def test_a_question_asked_more_than_once_is_reported(tiny, tmp_path):
    model, tokenizer = tiny
    rows = [mcq(f"q{i}", "Which drug?", ["Aspirin", "Statin"], "A") for i in range(3)]
    rows.append(mcq("other", "Which drug?", ["Aspirin", "Heparin"], "A"))  # other options: another question
    report = evaluate_task(model, tokenizer, load_task("mine", data=str(write_jsonl_rows(rows, tmp_path))))
    assert report["n"] == 4 and report["duplicates"] == {"copies": 2, "pairs": [["q0", "q1"], ["q0", "q2"]]}
    assert "duplicates" not in evaluate_task(
        model, tokenizer, load_task("mine", data=str(write_jsonl_rows(rows[2:], tmp_path)))
    )


def test_a_limit_past_the_questions_is_said_where_it_cuts_nothing(tmp_path, caplog):
    """A limit above the questions a file holds (or, for MMLU, its largest subject's) scores them
    all: said in one line by the option's name; a limit that cuts, or that takes them all exactly, is not."""
    sample = str(ROOT / "data/usmle_sample/test.jsonl")
    count = len(load_task("mine", data=sample).rows)
    for limit, said in ((count - 1, False), (count, False), (count + 1, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="medrecipes"):
            assert len(load_task("mine", data=sample, limit=limit).rows) == min(limit, count)
        notes = [r.getMessage() for r in caplog.records if "all of them are scored" in r.getMessage()]
        assert len(notes) == said and all(f"--limit {limit} is more than the {count} questions" in n for n in notes)
    val = tmp_path / "val"
    val.mkdir()
    for subject, rows in zip(TASKS["mmlu_medical"].subjects, (3, 1, 1, 1, 1, 1), strict=True):
        lines = [f"Which {i} in {subject}?,a,b,c,d,B" for i in range(rows)]
        (val / f"{subject}_val.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for limit, said in ((2, False), (4, True)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="medrecipes"):
            load_task("mmlu_medical", data=str(val), limit=limit)
        assert any("3 questions of its largest subject" in r.getMessage() for r in caplog.records) == said


def test_a_folder_of_one_splits_files_is_scored_whole_and_a_folder_of_several_by_the_tasks(tmp_path):
    """MMLU's val/ folder (anatomy_val.csv, ...) given as a task's data is what the user points at:
    scored whole, as a file is, though the task's own split is test. A folder whose files make
    several splits is read for the task's split, and one without it names the splits it has."""
    val = tmp_path / "val"
    val.mkdir()
    subjects = TASKS["mmlu_medical"].subjects
    for subject in subjects:
        (val / f"{subject}_val.csv").write_text(f"Which in {subject}?,a,b,c,d,B\n", encoding="utf-8")
    rows = load_task("mmlu_medical", data=str(val)).rows
    assert sorted(r["subject"] for r in rows) == sorted(subjects) and {r["answer"] for r in rows} == {"B"}
    splits = tmp_path / "splits"
    splits.mkdir()
    row = {"question": "Which?", "options": {"A": "a", "B": "b"}, "answer_idx": "B"}
    for name, answer in (("train", "A"), ("test", "B")):
        (splits / f"{name}.jsonl").write_text(json.dumps({**row, "answer_idx": answer}) + "\n")
    assert [r["answer"] for r in load_task("mine", data=str(splits)).rows] == ["B"]
    (splits / "test.jsonl").rename(splits / "validation.jsonl")
    with pytest.raises(UserError, match=r"no 'test' split: its files make train, validation"):
        load_task("mine", data=str(splits))


def test_an_eval_recipe_writes_a_tasks_data_as_a_list_or_as_a_mapping(tmp_path):
    """TASK=PATH entries, or the mapping TASK: PATH a YAML writer reaches for first: one reading."""
    listed = parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml")])
    mapped = tmp_path / "mapped.yaml"
    text = (ROOT / "recipes/tiny_eval.yaml").read_text()
    mapped.write_text(
        text.replace(
            "data: [usmle_train=data/usmle_sample/train.jsonl, usmle_test=data/usmle_sample/test.jsonl]",
            "data:\n  usmle_train: data/usmle_sample/train.jsonl\n  usmle_test: data/usmle_sample/test.jsonl\n"
            "fewshot_data: {usmle_test: data/usmle_sample/train.jsonl}\nnum_fewshot: 1",
        )
    )
    args = parse_eval_args([str(mapped)])
    assert args.data_by_task == listed.data_by_task and args.fewshot_by_task == {
        "usmle_test": "data/usmle_sample/train.jsonl"
    }
    mapped.write_text(text.replace("data: [usmle_train=", "data: {usmle_train: [a, b]}\n# [usmle_train="))
    with pytest.raises(UserError, match=r"mapped\.yaml: data\.usmle_train must be text, got \['a', 'b'\]"):
        parse_eval_args([str(mapped)])


def test_generate_options_in_loglik_mode_are_said_not_refused():
    """A YAML written for generate switched to loglik on the command line (as tiny_eval.yaml's
    comment shows): its generate-only options (their help says `generate:`) do nothing, and the
    parse says so in one line, which `medrecipes eval` logs and `validate` prints."""
    args = parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml"), "--mode", "loglik", "--temperature", "0.7"])
    (note,) = args.notes
    assert note.startswith("system_prompt, temperature shape generated answers, and mode loglik") and "nothing" in note
    assert parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml")]).notes == []
    # Sampling-only options (their help: "when temperature > 0") under greedy decoding, likewise.
    (note,) = parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml"), "--mode", "generate", "--top_p", "0.5"]).notes
    assert note.startswith("top_p shapes sampled answers, and temperature 0 answers greedily")
    (note,) = parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml"), "--mode", "generate", "--seed", "7"]).notes
    assert note.startswith("seed shapes sampled answers, and temperature 0 answers greedily")
    sampled = ["--mode", "generate", "--top_p", "0.5", "--temperature", "1", "--seed", "7"]
    assert parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml"), *sampled]).notes == []
    # --tasks choosing some of a YAML's tasks: the data of the others is not read, and said so
    picked = parse_eval_args([str(ROOT / "recipes/tiny_eval.yaml"), "--tasks", "[usmle_train]"])
    assert picked.tasks == ["usmle_train"]
    assert picked.notes == ["data for usmle_test is not read: tasks are usmle_train; add it to tasks to score it"]


def test_few_shot_examples_of_another_option_count_are_said(tmp_path, caplog):
    """Examples with five options shown before four-option questions answer among letters the
    questions do not have: said once, naming both counts."""
    from medrecipes.evaluation.tasks import load_task

    five = tmp_path / "five.jsonl"
    row = {"question": "Which vitamin prevents scurvy?", "answer": "C"}
    five.write_text(json.dumps({**row, "options": dict(zip("ABCDE", "ABCDE", strict=True))}) + "\n")
    with caplog.at_level("WARNING"):
        load_task("mine", data="data/usmle_sample/test.jsonl", num_fewshot=1, fewshot_data=str(five))
    assert [r.getMessage().split(": ", 1)[1][:60] for r in caplog.records] == [
        f"few-shot examples in {five} have 5 options and the questions 4"[:60]
    ]


def test_a_file_laid_out_as_another_benchmarks_is_refused_for_a_task_and_read_under_its_own_name(tmp_path):
    """The layouts only one benchmark's files have (MMLU's header-less CSV, MedMCQA's opa..cop,
    PubMedQA's QUESTION/final_decision) given to another registry task: one line naming the task
    they fit; MedQA's JSON Lines layout, which collections write every benchmark in, fits all."""
    from medrecipes.usmle.formats import CONVERTERS

    mmlu = tmp_path / "anatomy_test.csv"
    mmlu.write_text("Which bone?,Femur,Tibia,Ulna,Radius,B\n", encoding="utf-8")
    medqa = tmp_path / "medqa.jsonl"
    medqa.write_text(
        json.dumps({"question": "Which?", "options": {"A": "a", "B": "b", "C": "c", "D": "d"}, "answer_idx": "A"})
        + "\n"
    )
    specific = {layout: task.name for task in TASKS.values() for layout in task.layouts}
    assert set(specific) == set(CONVERTERS) - {"medqa", "seed"}  # every benchmark's own layout is someone's
    with pytest.raises(UserError, match=r"anatomy_test\.csv: its rows are laid out as mmlu_medical's files are"):
        load_task("medqa_4opt", data=str(mmlu))
    assert load_task("mmlu_questions", data=str(mmlu)).rows[0]["answer"] == "B"
    named = tmp_path / "mine.csv"  # the same columns under a header: anyone's layout, not MMLU's own files
    named.write_text("question,A,B,C,D,answer\nWhich bone?,Femur,Tibia,Ulna,Radius,B\n", encoding="utf-8")
    assert load_task("medqa_4opt", data=str(named)).rows[0]["answer"] == "B"
    for name in ("medqa_4opt", "medmcqa"):
        assert load_task(name, data=str(medqa)).rows[0]["answer"] == "A"


def test_a_benchmark_scored_in_training_from_the_file_the_recipe_trains_on_is_said(tmp_path, caplog):
    from types import SimpleNamespace

    from medrecipes.data_config import MixtureConfig, SourceConfig
    from medrecipes.training.eval_callback import say_trained_on

    questions = tmp_path / "test.jsonl"
    questions.write_text((ROOT / "data/usmle_sample/test.jsonl").read_text())
    recipe = SimpleNamespace(mixture=MixtureConfig(sources=[SourceConfig(path=str(questions), format="usmle")]))
    with caplog.at_level("WARNING"):
        say_trained_on(recipe, {"medqa_4opt": str(tmp_path / "." / "test.jsonl"), "medmcqa": str(ROOT / "data")})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"eval_tasks medqa_4opt scores {tmp_path}/test.jsonl, which the")


def test_a_model_asked_without_the_system_prompt_it_was_trained_with_is_told(tmp_path):
    """eval (generate), generate and pairs --model read the run's run.json beside final/: a system turn
    other than the one it trained with (or none) is said, with the flag that gives it."""
    from medrecipes.locations import system_prompt_note

    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "run" / "run.json").write_text(json.dumps({"recipe": {"system_prompt": "Answer as a doctor."}}))
    model = str(tmp_path / "run" / "final")
    assert system_prompt_note(model, "Answer as a doctor.", "--system_prompt") is None
    assert system_prompt_note(model, None, "--system_prompt").endswith(
        "is asked with none: its answers are to prompts it was not trained on; pass --system_prompt "
        "'Answer as a doctor.' to ask as it was trained"
    )
    (tmp_path / "run" / "run.json").write_text(json.dumps({"recipe": {"system_prompt": None}}))
    assert "leave --system out" in system_prompt_note(model, "Be brief.", "--system")
    assert system_prompt_note(str(tmp_path / "elsewhere"), None, "--system") is None  # no run to read
    assert system_prompt_note("org/model", None, "--system") is None  # a Hub id
