"""The answer-extraction study (benchmarks/answer_extraction.py): its labels and baselines read
replies as documented, and the script scores a set of replies end to end."""

import json

import answer_extraction as study

OPTIONS = {"A": "Goblet cells", "B": "Type II pneumocytes", "C": "Clara cells", "D": "Alveolar macrophages"}
LABELS = [
    ("C. Clara cells", "C"),
    ("Clara cells", "C"),
    ("The answer is B because surfactant is made there.", "B"),
    ("**Final Answer: (D)**", "D"),
    ("C. Goblet cells", None),  # a letter and another option's text
    ("A. Goblet cells\nB. Type II pneumocytes\nC. Clara", None),  # the options listed again
    ("The correct answer is:\nA. Goblet cells\nB. Type II pneumocytes", None),
    ("The correct answer is:\nD. Alveolar macrophages", "D"),
    ("The answer is A. Actually the answer is B.", None),
    ("Answer A is incorrect because goblet cells make mucus.", None),
    ("A 45-year-old man with cough", None),
    ("The cells are Clara cells, not goblet cells", None),
    ("Option B is correct.", "B"),
    ("", None),
]


def test_labels_follow_the_written_rules():
    for reply, expected in LABELS:
        assert study.label(reply, OPTIONS) == expected, reply


def test_baselines_read_as_published():
    assert study.simple_evals("Reasoning...\n**Answer: C**", OPTIONS) == "C"
    assert study.simple_evals("The answer is C", OPTIONS) is None
    assert study.lm_eval_strict("So. The answer is (B).", OPTIONS) == "B"
    assert study.lm_eval_strict("The answer is B. Type II pneumocytes", OPTIONS) is None
    assert study.lm_eval_flexible("(A) no, (C) yes", OPTIONS) == "C"  # the last (X)
    assert study.lm_eval_flexible("A. Goblet cells\nB. Type II pneumocytes", OPTIONS) == "B"  # last text
    assert study.lm_eval_flexible("answer: D", OPTIONS) == "D"
    assert study.lm_eval_flexible("I do not know", OPTIONS) is None


def test_the_study_scores_replies_end_to_end(tmp_path):
    questions = tmp_path / "questions.jsonl"
    rows = [{"id": str(i), "question": f"Q{i}?", "options": OPTIONS, "answer": "C"} for i in range(3)]
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    replies = ["C. Clara cells", "C. Goblet cells", "A. Goblet cells\nB. Type II pneumocytes"]
    predictions = [{"id": str(i), "answer": "C", "predicted": None, "completion": r} for i, r in enumerate(replies)]
    result = tmp_path / "model-generate.json"
    result.write_text(json.dumps({"tasks": {"medqa_4opt": {"predictions": predictions}}}))
    report = study.main(
        [str(result), "--questions", str(questions), "--out", str(tmp_path), "--report-dir", str(tmp_path)]
    )
    assert report["labels"] == {"named": 1, "none": 2}
    ours = report["extractors"]["medrecipes"]
    assert ours["agreement"] == 1.0 and ours["letter_where_none_is_named"] == 0
    flexible = report["extractors"]["lm-eval flexible-extract"]
    assert flexible["letter_where_none_is_named"] == 2  # "A" for the first, "B" for the list
    assert (tmp_path / "answer_extraction.md").exists()
    assert (tmp_path / "extraction-disagreements.jsonl").read_text() == ""
