"""Tests for the MCQ schema: loaders for every format, prompts, targets and answer extraction."""

import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT
from datasets import Dataset

from medrecipes import usmle
from medrecipes.errors import UserError
from medrecipes.evaluation.tasks import MMLU_MEDICAL
from medrecipes.usmle import (
    COLUMNS,
    chat_messages,
    completion_prompt,
    extract_answer,
    letters_for,
    load_mcq,
    option_map,
    pretraining_text,
    sft_target,
)
from medrecipes.usmle.answers import _normalise_text

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"real benchmark files not present at {SHARED_DATA}"
)

MEDQA_ROW = {
    "realidx": 7,
    "question": "A 60-year-old man has hypertension and diabetes. Which drug is best?",
    "answer": "Start ACE inhibitor",
    "options": {
        "A": "Start aspirin",
        "B": "Start statin",
        "C": "Start ACE inhibitor",
        "D": "Observe",
    },
    "meta_info": "step2&3",
    "answer_idx": "C",
}
PUBMEDQA_ROW = {
    "QUESTION": "Does exercise lower blood pressure?",
    "CONTEXTS": ["Background sentence.", "Results sentence."],
    "LABELS": ["BACKGROUND", "RESULTS"],
    "final_decision": "maybe",
    "LONG_ANSWER": "The evidence is mixed.",
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def medmcqa_row(cop: int | str, **extra) -> dict:
    row = {
        "question": "Which nerve?",
        "opa": "Ulnar",
        "opb": "Radial",
        "opc": "Median",
        "opd": "Axillary",
        "cop": cop,
        "subject_name": "Anatomy",
        "exp": "Because.",
        "choice_type": "single",
    }
    return {**row, **extra}


# ---------------------------------------------------------------------------
# Formats


def test_medqa_row_is_normalised(tmp_path):
    ds = load_mcq(write_jsonl(tmp_path / "medqa.jsonl", [MEDQA_ROW]))
    assert ds.column_names == COLUMNS
    assert ds[0] == {
        "id": "7",
        "question": MEDQA_ROW["question"],
        "options": ["Start aspirin", "Start statin", "Start ACE inhibitor", "Observe"],
        "answer": "C",
        "subject": "step2&3",
        "explanation": "",
        "context": "",
    }


def test_medqa_file_mixing_four_and_five_options(tmp_path):
    five = {
        **MEDQA_ROW,
        "realidx": 8,
        "options": {**MEDQA_ROW["options"], "E": "Refer"},
        "answer_idx": "E",
        "answer": "Refer",
    }
    ds = load_mcq(write_jsonl(tmp_path / "mixed.jsonl", [MEDQA_ROW, five]), format="medqa")
    assert [len(o) for o in ds["options"]] == [4, 5]
    assert list(ds["answer"]) == ["C", "E"]
    assert letters_for(ds[1]) == "ABCDE"
    assert option_map(ds[1])["E"] == "Refer"


def test_medqa_hf_layout(tmp_path):
    row = {
        "id": "q1",
        "sent1": "Which drug?",
        "sent2": "",
        "ending0": "a0",
        "ending1": "a1",
        "ending2": "a2",
        "ending3": "a3",
        "label": 2,
    }
    ds = load_mcq(write_jsonl(tmp_path / "hf.jsonl", [row]))
    assert ds[0]["options"] == ["a0", "a1", "a2", "a3"]
    assert (ds[0]["question"], ds[0]["answer"], ds[0]["id"]) == ("Which drug?", "C", "q1")


@pytest.mark.parametrize(
    "cops, expected",
    [
        ([0, 1, 3], ["A", "B", "D"]),  # a 0 and no 4: the Hub release, 0-based
        ([1, 2, 4], ["A", "B", "D"]),  # a 4: the original JSON, 1-based
        ([0, 2, -1], ["A", "C", None]),  # -1 marks an unanswered test row
        (["b", "D", "A"], ["B", "D", "A"]),  # letters read one way
        (["B", 4, 2], ["B", "D", "B"]),  # letters beside the original JSON's numbers
    ],
)
def test_medmcqa_cop_base_is_detected_per_dataset(tmp_path, cops, expected):
    rows = [medmcqa_row(c, id=f"m{i}") for i, c in enumerate(cops)]
    ds = load_mcq(write_jsonl(tmp_path / "medmcqa.jsonl", rows))
    assert list(ds["answer"]) == expected
    assert ds[0]["subject"] == "Anatomy" and ds[0]["explanation"] == "Because."
    assert ds[0]["options"] == ["Ulnar", "Radial", "Median", "Axillary"]


@pytest.mark.parametrize("cops", [[1, 2, 3], [2], [3, -1, 1]])
def test_medmcqa_cop_numbers_that_read_both_ways_are_refused(tmp_path, cops):
    """1-3 alone read as B-D in the Hub release and A-C in the original JSON: a guess shifts every gold."""
    rows = [medmcqa_row(c, id=f"m{i}") for i, c in enumerate(cops)]
    with pytest.raises(UserError, match=r"medmcqa\.jsonl: every numbered 'cop' is 1, 2 or 3.*letter \(A-D\)"):
        load_mcq(write_jsonl(tmp_path / "medmcqa.jsonl", rows))


def test_medmcqa_csv_with_header(tmp_path):
    path = tmp_path / "medmcqa.csv"
    Dataset.from_list([medmcqa_row(0), medmcqa_row(3)]).to_csv(path, index=False)
    assert list(load_mcq(path)["answer"]) == ["A", "D"]


def test_mmlu_csv_without_header_takes_subject_from_file_name(tmp_path):
    path = tmp_path / "anatomy_test.csv"
    path.write_text('"Which bone, if any?",Femur,None,0.50,NA,B\nSecond?,w,x,y,z,D\n', encoding="utf-8")
    ds = load_mcq(path)
    assert ds[0]["question"] == "Which bone, if any?"
    assert ds[0]["options"] == ["Femur", "None", "0.50", "NA"]
    assert list(ds["answer"]) == ["B", "D"]
    assert set(ds["subject"]) == {"anatomy"}


def test_mmlu_directory_split_picks_subfolder(tmp_path):
    for split in ("dev", "test"):
        (tmp_path / split).mkdir()
        for subject in ("anatomy", "virology"):
            rows = "".join(f"{subject} {split} {i}?,a,b,c,d,A\n" for i in range(2 if split == "dev" else 3))
            (tmp_path / split / f"{subject}_{split}.csv").write_text(rows, encoding="utf-8")
    assert len(load_mcq(tmp_path)) == 6
    dev = load_mcq(tmp_path, split="dev")
    assert len(dev) == 4 and all(" dev " in q for q in dev["question"])
    with pytest.raises(UserError, match="no 'val' split folder"):
        load_mcq(tmp_path, split="val")
    assert load_mcq(tmp_path, split="test[:4]")["question"] == load_mcq(tmp_path)["question"][:4]


def test_a_slice_in_split_takes_those_rows_of_a_file():
    path = ROOT / "data/usmle_sample/train.jsonl"  # 60 questions
    whole = load_mcq(path)["id"]
    assert load_mcq(path, split="train[:32]")["id"] == whole[:32]
    assert load_mcq(path, split="test[10%:20%]")["id"] == whole[6:12]  # a file is one split, whatever its name
    assert load_mcq(path, split="train[-5:]")["id"] == whole[-5:]
    assert load_mcq(path, split="validation")["id"] == whole
    with pytest.raises(
        UserError, match=r"split 'train\[:x\]' is not a slice of one split .* write e.g. train\[:100\]"
    ):
        load_mcq(path, split="train[:x]")


def test_a_json_document_of_columns_or_of_rows_under_a_key_is_read_as_its_rows(tmp_path):
    path = ROOT / "data/usmle_sample/train.jsonl"
    whole = load_mcq(path)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:5]]
    columns = {key: [row.get(key) for row in rows] for key in rows[0]}  # Dataset.to_dict's layout
    (tmp_path / "columns.json").write_text(json.dumps(columns), encoding="utf-8")
    assert load_mcq(tmp_path / "columns.json")["question"] == whole["question"][:5]
    (tmp_path / "held.json").write_text(json.dumps({"version": "1.0", "data": rows}), encoding="utf-8")
    assert load_mcq(tmp_path / "held.json")["question"] == whole["question"][:5]  # rows under one key


def test_a_folder_save_to_disk_wrote_is_read_whole(tmp_path):
    import datasets

    path = ROOT / "data/usmle_sample/train.jsonl"
    rows = datasets.load_dataset("json", data_files=str(path), split="train")
    rows.save_to_disk(tmp_path / "one")
    datasets.DatasetDict(train=rows, test=rows.select(range(5))).save_to_disk(tmp_path / "two")
    whole = load_mcq(path)
    assert load_mcq(tmp_path / "one")["question"] == whole["question"]  # not its state.json as a row
    assert load_mcq(tmp_path / "one", split="train[:4]")["answer"] == whole["answer"][:4]
    assert load_mcq(tmp_path / "two", split="test")["question"] == whole["question"][:5]
    with pytest.raises(UserError, match=r"two: several splits: it holds train, test; pass split= one of them"):
        load_mcq(tmp_path / "two")
    with pytest.raises(UserError, match=r"no 'tset' split \(did you mean 'test'\?\)"):
        load_mcq(tmp_path / "two", split="tset")
    (tmp_path / "one" / "dataset_info.json").unlink()
    with pytest.raises(
        UserError, match=r"one: a folder save_to_disk wrote, which cannot be read \(.*\); write it again"
    ):
        load_mcq(tmp_path / "one")


def test_pubmedqa_jsonl(tmp_path):
    ds = load_mcq(write_jsonl(tmp_path / "pqal.jsonl", [PUBMEDQA_ROW]))
    row = ds[0]
    assert row["options"] == ["yes", "no", "maybe"] and row["answer"] == "C"
    assert row["context"] == "Background sentence.\nResults sentence."
    assert row["explanation"] == "The evidence is mixed."
    # the Hub copy's context mapping, or the abstract as one text
    for context in (
        {"contexts": ["Background sentence.", "Results sentence."]},
        "Background sentence.\nResults sentence.",
    ):
        row = {"question": "Does exercise lower blood pressure?", "context": context, "final_decision": "maybe"}
        assert load_mcq(write_jsonl(tmp_path / "hub.jsonl", [row]))[0]["context"] == ds[0]["context"]


# What each PubMedQA setting asks the question about: the abstract alone (reasoning-required), the
# conclusion alone (reasoning-free), or both; the same file serves every setting.
PUBMEDQA_CONTEXTS = {
    None: "Background sentence.\nResults sentence.",
    "reasoning_required": "Background sentence.\nResults sentence.",
    "reasoning_free": "Conclusion: The evidence is mixed.",
    "reasoning_free_with_abstract": "Abstract: Background sentence.\nResults sentence.\nConclusion: The evidence is mixed.",
}


@pytest.mark.parametrize("setting", list(PUBMEDQA_CONTEXTS))
def test_pubmedqa_settings_read_one_file(tmp_path, setting):
    path = tmp_path / "ori_pqal.json"
    path.write_text(json.dumps({"1": PUBMEDQA_ROW, "2": {**PUBMEDQA_ROW, "final_decision": "yes"}}), encoding="utf-8")
    rows = load_mcq(path, pubmedqa_setting=setting).to_list()
    assert [r["context"] for r in rows] == [PUBMEDQA_CONTEXTS[setting]] * 2
    assert [r["answer"] for r in rows] == ["C", "A"]
    assert all(r["explanation"] == "The evidence is mixed." for r in rows)  # the long-answer target


def test_pubmedqa_settings_cover_the_named_ones():
    from medrecipes.names import PUBMEDQA_SETTINGS

    assert set(PUBMEDQA_SETTINGS) == set(PUBMEDQA_CONTEXTS) - {None}


@pytest.mark.parametrize("setting", ["reasoning_free", "reasoning_free_with_abstract"])
@pytest.mark.parametrize("long_answer", [None, "", "   "])
def test_reasoning_free_needs_each_rows_conclusion(tmp_path, setting, long_answer):
    rows = [PUBMEDQA_ROW, {**PUBMEDQA_ROW, "LONG_ANSWER": long_answer}]
    path = write_jsonl(tmp_path / "pqal.jsonl", rows)
    with pytest.raises(UserError, match=rf"pqal.jsonl line 2: has no LONG_ANSWER .* {setting} .*reasoning_required"):
        load_mcq(path, pubmedqa_setting=setting)
    assert load_mcq(path)[1]["context"] == PUBMEDQA_CONTEXTS[None]  # the abstract needs no conclusion


@pytest.mark.parametrize("setting", ["reasoning_required", "reasoning_free"])
def test_a_pubmedqa_setting_on_other_rows_is_refused(tmp_path, setting):
    path = write_jsonl(tmp_path / "medqa.jsonl", [MEDQA_ROW])
    with pytest.raises(UserError, match=rf"medqa.jsonl: pubmedqa_setting {setting} .* these are medqa rows"):
        load_mcq(path, pubmedqa_setting=setting)


def test_an_unknown_pubmedqa_setting_names_the_valid_ones(tmp_path):
    path = write_jsonl(tmp_path / "pqal.jsonl", [PUBMEDQA_ROW])
    with pytest.raises(UserError, match="pubmedqa_setting 'reasoning-free' is unknown.*did you mean 'reasoning_free'"):
        load_mcq(path, pubmedqa_setting="reasoning-free")


def test_pubmedqa_keyed_json_uses_the_key_as_id(tmp_path):
    path = tmp_path / "ori_pqal.json"
    data = {"12345": PUBMEDQA_ROW, "67890": {**PUBMEDQA_ROW, "final_decision": "no"}}
    path.write_text(json.dumps(data), encoding="utf-8")
    ds = load_mcq(path, format="pubmedqa")
    assert list(ds["id"]) == ["12345", "67890"]
    assert list(ds["answer"]) == ["C", "B"]


def test_seed_rows(tmp_path):
    rows = [
        {
            "id": "s1",
            "question": "Q1?",
            "options": {"A": "x", "B": "y", "C": "z"},
            "answer": "b",
            "explanation": "Because y.",
            "subject": "cardiology",
        },
        {
            "question": "Q2?",
            "options": {"A": "x", "B": "y", "C": "z"},
            "answer": "A",
            "explanation": "",
        },
    ]
    ds = load_mcq(write_jsonl(tmp_path / "seed.jsonl", rows))
    assert ds[0] == {
        "id": "s1",
        "question": "Q1?",
        "options": ["x", "y", "z"],
        "answer": "B",
        "subject": "cardiology",
        "explanation": "Because y.",
        "context": "",
    }
    assert ds[1]["id"] == "seed-1" and ds[1]["subject"] == ""


def test_parquet_file(tmp_path):
    path = tmp_path / "medqa.parquet"
    Dataset.from_list([MEDQA_ROW]).to_parquet(path)
    assert load_mcq(path)[0]["answer"] == "C"


def test_directory_of_mixed_formats(tmp_path):
    write_jsonl(tmp_path / "a_medqa.jsonl", [MEDQA_ROW])
    (tmp_path / "sub").mkdir()
    write_jsonl(tmp_path / "sub" / "b_pubmedqa.jsonl", [PUBMEDQA_ROW])
    ds = load_mcq(tmp_path)
    assert list(ds["answer"]) == ["C", "C"]
    assert list(ds["context"])[0] == "" and list(ds["context"])[1].startswith("Background")


def test_hub_id_goes_to_load_dataset(monkeypatch):
    calls = []

    def fake_load_dataset(path, name, split):
        calls.append((path, name, split))
        return Dataset.from_list(
            [
                {
                    "sent1": "Q?",
                    "ending0": "a",
                    "ending1": "b",
                    "ending2": "c",
                    "ending3": "d",
                    "label": 1,
                }
            ]
        )

    monkeypatch.setattr(usmle.loading, "load_dataset", fake_load_dataset)
    ds = load_mcq("GBaker/MedQA-USMLE-4-options-hf", split="test")
    load_mcq("cais/mmlu", split="dev", config="anatomy")
    assert calls == [("GBaker/MedQA-USMLE-4-options-hf", None, "test"), ("cais/mmlu", "anatomy", "dev")]
    assert ds[0]["answer"] == "B" and ds[0]["id"] == "GBaker_MedQA-USMLE-4-options-hf-0"


# ---------------------------------------------------------------------------
# Mistakes a user can make


def test_unrecognised_row_names_file_row_and_formats(tmp_path):
    path = write_jsonl(tmp_path / "weird.jsonl", [{"prompt": "Q?", "response": "A"}])
    with pytest.raises(UserError) as info:
        load_mcq(path)
    message = str(info.value)
    assert f"{path} line 1" in message and "fit no MCQ format" in message
    assert all(name in message for name in usmle.FORMATS)
    assert "\n" not in message


def test_explicit_format_is_checked_on_every_row(tmp_path):
    broken = {k: v for k, v in MEDQA_ROW.items() if k != "answer_idx"}
    path = tmp_path / "medqa.jsonl"
    path.write_text(f"{json.dumps(MEDQA_ROW)}\n\n{json.dumps(broken)}\n")  # the file's line, blank lines counted
    with pytest.raises(
        UserError, match=r"medqa\.jsonl line 3: 'answer_idx' has no value \(null, or left out of this row\)"
    ):
        load_mcq(str(path), format="medqa")
    with pytest.raises(UserError, match="line 1: no 'opa'"):
        load_mcq(write_jsonl(tmp_path / "one.jsonl", [MEDQA_ROW]), format="medmcqa")


@pytest.mark.parametrize(
    "row",
    [
        {**MEDQA_ROW, "answer_idx": "E"},
        {"question": "Q?", "options": {"A": "x", "B": "y"}, "answer": "C"},
        {"question": "Q?", "A": "a", "B": "b", "C": "c", "D": "d", "answer": "F"},
    ],
)
def test_gold_letter_not_among_options(tmp_path, row):
    path = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(UserError, match=r"bad\.jsonl line 1: answer .* is not one of the option letters"):
        load_mcq(path)


def test_csv_rows_are_named_by_their_line_with_or_without_a_header(tmp_path):
    with_header = tmp_path / "medmcqa.csv"
    Dataset.from_list([medmcqa_row(0), {**medmcqa_row(1), "cop": 7}]).to_csv(with_header, index=False)
    with pytest.raises(UserError, match=r"medmcqa\.csv line 3: answer index 7"):
        load_mcq(str(with_header))
    mmlu = tmp_path / "anatomy_test.csv"
    mmlu.write_text('Q1?,a,b,c,d,A\n"Q2,\nover two lines?",a,b,c,d,F\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"anatomy_test\.csv line 2: answer 'F' is not one of"):
        load_mcq(str(mmlu), format="mmlu")


def test_data_to_train_on_needs_a_gold_answer_on_every_row(tmp_path):
    rows = [medmcqa_row(0), {**medmcqa_row(1), "cop": -1}]  # MedMCQA's unanswered test rows
    path = write_jsonl(tmp_path / "medmcqa.jsonl", rows)
    assert load_mcq(path)["answer"][1] is None  # fine to predict on
    with pytest.raises(
        UserError,
        match=r"medmcqa\.jsonl line 2: has no gold answer in .cop., the layout of the file.s first row \(question, opa, cop\), which training",
    ):
        load_mcq(path, answered=True)


def test_pubmedqa_bad_decision(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{**PUBMEDQA_ROW, "final_decision": "perhaps"}])
    with pytest.raises(UserError, match="line 1: final_decision 'perhaps'"):
        load_mcq(path)


@pytest.mark.parametrize("source", ["./missing.jsonl", "nowhere.csv", "/no/such/dir", "a/b/c"])
def test_missing_local_path(source):
    with pytest.raises(UserError, match="no such file or folder"):
        load_mcq(source)


def test_a_file_that_does_not_parse_is_named(tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("not json\n")
    with pytest.raises(UserError) as info:
        load_mcq(str(path))
    assert str(info.value) == f"{path} line 1: not JSON (Expecting value at column 1); fix or drop that line"


def test_unknown_format_suggests_one():
    with pytest.raises(UserError, match="did you mean 'medmcqa'"):
        load_mcq("x.jsonl", format="medmcq")


def test_subjects_filter_and_unknown_subject(tmp_path):
    rows = [
        medmcqa_row(0, subject_name="Anatomy"),
        medmcqa_row(1, subject_name="Pharmacology"),
        medmcqa_row(2, subject_name="Anatomy"),
    ]
    path = write_jsonl(tmp_path / "m.jsonl", rows)
    assert list(load_mcq(path, subjects=["Anatomy"])["answer"]) == ["A", "C"]
    with pytest.raises(UserError, match="no rows with subject 'Anatomi' \\(did you mean 'Anatomy'\\?\\)"):
        load_mcq(path, subjects=["Anatomi"])


def test_sft_target_needs_gold():
    row = {"id": "t1", "question": "Q?", "options": ["a", "b"], "answer": None, "explanation": ""}
    with pytest.raises(UserError, match="has no gold answer"):
        sft_target(row)


# ---------------------------------------------------------------------------
# Prompts and targets

ROW4 = {
    "id": "r",
    "question": "Which drug?",
    "options": ["Aspirin", "Statin", "ACE inhibitor", "Observe"],
    "answer": "C",
    "subject": "",
    "explanation": "ACE inhibitors protect the kidney.",
    "context": "",
}
PUBMED = {
    "id": "p",
    "question": "Does it work?",
    "options": ["yes", "no", "maybe"],
    "answer": "A",
    "subject": "",
    "explanation": "",
    "context": "Abstract text.",
}


def test_completion_prompt_four_options():
    assert completion_prompt(ROW4) == (
        "Question: Which drug?\nA. Aspirin\nB. Statin\nC. ACE inhibitor\nD. Observe\nAnswer:"
    )


def test_completion_prompt_pubmedqa():
    assert completion_prompt(PUBMED) == (
        "Context: Abstract text.\nQuestion: Does it work?\nA. yes\nB. no\nC. maybe\nAnswer:"
    )


def test_chat_messages_letter_only_with_system_prompt():
    messages = chat_messages(ROW4, system_prompt="You are a physician.")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "You are a physician."
    user = messages[1]["content"]
    assert user.startswith("Which drug?\n\nA. Aspirin\nB. Statin\nC. ACE inhibitor\nD. Observe\n\n")
    assert "letter of the correct option (A, B, C, D) only" in user
    assert "Final Answer" not in user


def test_chat_messages_chain_of_thought_without_system_prompt():
    messages = chat_messages(PUBMED, chain_of_thought=True)
    assert [m["role"] for m in messages] == ["user"]
    user = messages[0]["content"]
    assert user.startswith("Context: Abstract text.\n\nDoes it work?\n\nA. yes\nB. no\nC. maybe")
    assert "step by step" in user and "'Final Answer: X'" in user and "A, B, C" in user


def test_sft_targets_and_pretraining_text():
    assert sft_target(ROW4) == "C. ACE inhibitor"
    assert sft_target(ROW4, with_explanation=True) == ("ACE inhibitors protect the kidney.\n\nFinal Answer: C")
    assert sft_target(PUBMED, chain_of_thought=True) == "Final Answer: A"
    for target in (sft_target(ROW4), sft_target(ROW4, chain_of_thought=True)):
        assert extract_answer(target) == "C"
    assert pretraining_text(ROW4) == completion_prompt(ROW4) + " C\nACE inhibitors protect the kidney."
    assert pretraining_text(PUBMED) == completion_prompt(PUBMED) + " A"


# ---------------------------------------------------------------------------
# Answer extraction

OPTIONS = ["Start aspirin", "Start statin", "Start ACE inhibitor", "Observe"]
READS = [
    ("Final Answer: C", "ABCD", None, "C"),
    ("Final Answer: **C**", "ABCD", None, "C"),
    ("**Final Answer:** C", "ABCD", None, "C"),
    ("Murmur radiates to the carotids.\n\nFinal Answer: (B)", "ABCD", None, "B"),
    ("final answer: d", "ABCD", None, "D"),
    ("The final answer is $\\boxed{A}$", "ABCD", None, "A"),
    ("**C**", "ABCD", None, "C"),
    ("(C)", "ABCD", None, "C"),
    ("The answer is C.", "ABCD", None, "C"),
    ("the correct answer is (c)", "ABCD", None, "C"),
    ("C. Start ACE inhibitor", "ABCD", None, "C"),
    ("C) Start ACE inhibitor", "ABCD", None, "C"),
    ("(c) Start ACE inhibitor", "ABCD", None, "C"),
    ("Answer: C", "ABCD", None, "C"),
    ("Answer:C", "ABCD", None, "C"),
    ("Answer:\nC", "ABCD", None, "C"),
    ("ANSWER: b", "ABCD", None, "B"),
    ("C", "ABCD", None, "C"),
    ("A", "ABCD", None, "A"),
    ("A.", "ABCD", None, "A"),
    ("c", "ABCD", None, "C"),
    ("  c.  ", "ABCD", None, "C"),
    ("**Answer:** C", "ABCD", None, "C"),
    ("**Answer: D**", "ABCD", None, "D"),
    ("I think it's B because the murmur radiates to the carotids.", "ABCD", None, "B"),
    ("The answer is A. Final answer: B", "ABCD", None, "B"),
    ("Answer: A\nFinal Answer: A", "ABCD", None, "A"),
    ("The correct option is D", "ABCD", None, "D"),
    ("The correct choice is (b).", "ABCD", None, "B"),
    ("After weighing the findings, the answer would be **B**.", "ABCD", None, "B"),
    ("The answer is [D]", "ABCD", None, "D"),
    ("I would choose D.", "ABCD", None, "D"),
    (
        "A 30-year-old woman with these findings has sarcoidosis. The answer is C.",
        "ABCD",
        None,
        "C",
    ),
    ("A. is wrong.\nB. is wrong.\nC. fits.\n\nFinal Answer: C", "ABCD", None, "C"),
    ("Let me think.\nThe presentation suggests aortic stenosis.\n\n**B**", "ABCD", None, "B"),
    ("E", "ABCDE", None, "E"),
    ("The answer is E.", "ABCDE", None, "E"),
    ("Start ACE inhibitor", "ABCD", OPTIONS, "C"),
    ("start ace-inhibitor.", "ABCD", OPTIONS, "C"),
    ("The best next step is to Start ACE inhibitor therapy today", "ABCD", OPTIONS, "C"),
    ("Maybe", "ABC", {"A": "yes", "B": "no", "C": "maybe"}, "C"),
    ("Option C", "ABCD", None, "C"),
    ("option (c)", "ABCD", None, "C"),
    ("Choice B.", "ABCD", None, "B"),
    ("The answer is option C", "ABCD", None, "C"),
    ("Answer: choice B", "ABCD", None, "B"),
    ("Answer - C", "ABCD", None, "C"),
    ("Final answer \u2014 option D", "ABCD", None, "D"),
    ("B is correct.", "ABCD", None, "B"),
    ("Option (b) is the right answer; A is wrong.", "ABCD", None, "B"),
    ("C. Start ACE inhibitor", "ABCD", OPTIONS, "C"),
    ("The answer is (C) Start ACE inhibitor.", "ABCD", OPTIONS, "C"),
    ("C. Start ACE inhibitor because the pressure is high", "ABCD", OPTIONS, "C"),
    ("C. Start ACE inhibitor\nIt lowers the pressure and protects the kidney.", "ABCD", OPTIONS, "C"),
    ("A. Start aspirin\nB. Start statin\nC. Start ACE inhibitor\n\nThe correct answer is:\nC", "ABCD", OPTIONS, "C"),
]
NONES = [
    ("A 45-year-old man presents with chest pain.", "ABCD", None),
    ("A patient with this presentation needs urgent care.", "ABCD", None),
    ("", "ABCD", None),
    ("   \n ", "ABCD", None),
    (None, "ABCD", None),
    ("I am not sure about this one.", "ABCD", None),
    ("The answer is A. Actually, the answer is B.", "ABCD", None),
    ("A or B", "ABCD", None),
    ("either A or C", "ABCD", None),
    ("The answer is A or B.", "ABCD", None),
    ("Answer: A/B", "ABCD", None),
    ("The answer is (A) or (C)", "ABCD", None),
    ("Both A and C are reasonable.", "ABCD", None),
    ("Final Answer: A\nFinal Answer: B", "ABCD", None),
    ("The answer is E.", "ABCD", None),
    ("E", "ABCD", None),
    ("Final Answer: E", "ABCD", None),
    ("Answer A is incorrect because aspirin does not lower pressure.", "ABCD", None),
    ("The answer is a difficult one to determine.", "ABCD", None),
    ("It's a classic presentation of sarcoidosis.", "ABCD", None),
    ("Start ACE inhibitor", "ABCD", None),
    ("Either Start aspirin or Start statin", "ABCD", OPTIONS),
    ("B is incorrect.", "ABCD", None),
    ("Answer B is not right.", "ABCD", None),
    # a letter and the text of another option: which one is meant cannot be told
    ("C. Start aspirin", "ABCD", OPTIONS),
    ("The correct answer is (B) Observe.", "ABCD", OPTIONS),
    ("Final Answer: D. Start ACE inhibitor", "ABCD", OPTIONS),
    # options discussed by letter, or more than one option's text: no answer named
    ("Option A: Start aspirin helps some. Option B: the statin", "ABCD", OPTIONS),
    ("Start ACE inhibitor, not Start aspirin", "ABCD", OPTIONS),
    # the options repeated as a list
    ("A. Start aspirin\nB. Start statin\nC. Start ACE inhibitor\nD. Observe", "ABCD", OPTIONS),
    ("A. is wrong.\nB. is wrong.\nC. fits.", "ABCD", None),
    ("The correct answer is:\nA. Start aspirin\nB. Start statin\nC. Start ACE inhibitor", "ABCD", OPTIONS),
]


@pytest.mark.parametrize("text, letters, options, expected", READS)
def test_extract_answer_reads(text, letters, options, expected):
    assert extract_answer(text, letters, options) == expected


@pytest.mark.parametrize("text, letters, options", NONES)
def test_extract_answer_none(text, letters, options):
    assert extract_answer(text, letters, options) is None


# ---------------------------------------------------------------------------
# Real benchmark files


@pytest.fixture(scope="module")
def medqa4():
    return load_mcq(SHARED_DATA / "medqa" / "medqa_us_4opt_test.jsonl")


@needs_shared_data
def test_real_medqa_4_options(medqa4):
    assert len(medqa4) == 1273
    assert Counter(medqa4["answer"]) == {"A": 353, "B": 309, "C": 346, "D": 265}
    assert {len(o) for o in medqa4["options"]} == {4}
    assert set(medqa4["subject"]) == {"step1", "step2&3"}


@needs_shared_data
def test_real_medqa_5_options():
    ds = load_mcq(SHARED_DATA / "medqa" / "medqa_us_5opt_test.jsonl")
    assert len(ds) == 1273
    assert {len(o) for o in ds["options"]} == {5}


@needs_shared_data
def test_real_mmlu_medical():
    ds = load_mcq(SHARED_DATA / "mmlu_medical", split="test")
    assert len(ds) == 1089
    assert set(ds["subject"]) == set(MMLU_MEDICAL)
    anatomy = load_mcq(SHARED_DATA / "mmlu_medical", subjects=["anatomy"])
    assert len(anatomy) == 135 and set(anatomy["subject"]) == {"anatomy"}
    assert len(load_mcq(SHARED_DATA / "mmlu_medical", split="dev")) == 30


@needs_shared_data
def test_real_medqa_extraction(medqa4):
    opening_with_article = 0
    for row in medqa4:
        letter, letters = row["answer"], letters_for(row)
        assert extract_answer(sft_target(row), letters) == letter
        assert extract_answer(sft_target(row, chain_of_thought=True), letters) == letter
        assert extract_answer(f"{letter}. {option_map(row)[letter]}", letters) == letter
        assert extract_answer(f"{letter}. {option_map(row)[letter]}", letters, row["options"]) == letter
        other = next(k for k in letters if k != letter)
        if _normalise_text(option_map(row)[other]) != _normalise_text(option_map(row)[letter]):
            assert extract_answer(f"{letter}. {option_map(row)[other]}", letters, row["options"]) is None
        assert extract_answer(completion_prompt(row), letters) is None
        if row["question"].startswith("A "):
            opening_with_article += 1
            assert extract_answer(row["question"], letters) is None
    assert opening_with_article > 0


@needs_shared_data
def test_real_medqa_option_text_extraction(medqa4):
    # Options that are themselves letters ("E" among A, B, C, E) cannot be told apart.
    wrong = [
        row["id"]
        for row in medqa4
        if extract_answer(option_map(row)[row["answer"]], options=row["options"]) != row["answer"]
    ]
    assert len(wrong) <= 2, wrong


def test_answer_index_that_is_not_a_number(tmp_path):
    row = {"sent1": "Q?", "ending0": "a", "ending1": "b", "label": "two"}
    with pytest.raises(UserError, match="line 1: answer index 'two' does not name one of the 2 options"):
        load_mcq(write_jsonl(tmp_path / "hf.jsonl", [row]))


@needs_shared_data
def test_real_pubmedqa_in_every_setting():
    """PQA-L's 500 labelled questions: the conclusion is given only where the setting gives it, and
    the long-answer target (the conclusion, then the label) is read back as the gold label."""
    path = SHARED_DATA / "pubmedqa" / "pqal_trainval_500.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    rows = {s: load_mcq(path, pubmedqa_setting=s).to_list() for s in PUBMEDQA_CONTEXTS}
    assert all(len(r) == 500 for r in rows.values())
    for required, free, both in zip(
        rows["reasoning_required"], rows["reasoning_free"], rows["reasoning_free_with_abstract"], strict=True
    ):
        entry = raw[required["id"]]
        assert required["context"] == "\n".join(entry["CONTEXTS"]) and entry["LONG_ANSWER"] not in required["context"]
        assert free["context"] == f"Conclusion: {entry['LONG_ANSWER'].strip()}"
        assert both["context"] == f"Abstract: {required['context']}\n{free['context']}"
        target = sft_target(free, with_explanation=True, chain_of_thought=True)
        assert target.startswith(entry["LONG_ANSWER"].strip()) and target.endswith(f"Final Answer: {free['answer']}")
        assert extract_answer(target, "ABC", free["options"]) == free["answer"]
    assert Counter(r["answer"] for r in rows[None]) == {"A": 276, "B": 169, "C": 55}


@pytest.mark.parametrize("count", [0, 1, 2, 10, 11, 27])
@pytest.mark.parametrize("layout", ["list", "dict"])
def test_a_question_has_two_to_ten_options_and_is_told_so(tmp_path, count, layout):
    letters = [chr(ord("A") + i) for i in range(count)]
    texts = [f"option {i}" for i in range(count)]
    options = texts if layout == "list" else dict(zip(letters, texts, strict=True))
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "Which?", "options": options, "answer": "A"}])
    if 2 <= count <= 10:
        assert load_mcq(path)[0]["options"] == texts
    else:
        with pytest.raises(UserError, match=rf"q.jsonl line 1: {count} option\(s\); a question has 2 to 10 options"):
            load_mcq(path)


def _medqa(question: str, options: list[str]) -> dict:
    return {"question": question, "options": dict(zip("ABCDEFGHIJ", options, strict=False)), "answer_idx": "A"}


def test_questions_that_cannot_mean_what_they_say_are_counted_and_named_by_line(tmp_path, caplog):
    """An empty option, two options that read the same and a question asked again (same context,
    text and options) are said at load, each kind counted, its first rows named by the line an editor shows; the same text
    with other options, or under another context, is another question."""
    rows = [
        _medqa("Q1", ["a", "b", "c", "d"]),
        _medqa("Q1", ["a", "b", "c", "e"]),  # other options: another question
        _medqa("Q2", ["a", "", "c", "d"]),
        _medqa("Q1", ["a", "b", "c", "d"]),  # line 4 repeats line 1
        *[_medqa(f"Q{i}", ["a", "b", " ", "d"]) for i in range(3, 7)],  # blank after stripping
        *[_medqa("Q1", ["a", "b", "c", "d"])] * 3,
        _medqa("Q7", ["Aspirin", "aspirin ", "c", "d"]),  # two options that read the same
        _medqa("Q8", ["a", "b", "c"]),  # fewer options than the others: one left out, or null
    ]
    path = write_jsonl(tmp_path / "set.jsonl", rows)
    with caplog.at_level("WARNING", logger="medrecipes.usmle.loading"):
        assert len(load_mcq(path)) == len(rows)  # said, not dropped
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 4, said
    fewer, empty, twins, repeats = said
    assert fewer.startswith(
        f"{path}: 1 question(s) with fewer options than the 4 most of its questions have (line 13 has 3)"
    )
    assert empty.startswith(f"{path}: 5 question(s) with an empty option (line 3, line 5, line 6, ...)")
    assert twins.startswith(f"{path}: 1 question(s) with two options that read the same (line 12)")
    assert repeats.startswith(
        f"{path}: 4 question(s) repeat an earlier one (line 4 repeats line 1, line 9 repeats line 1"
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="medrecipes.usmle.loading"):
        load_mcq(path)  # read again (a run's training data that is also its eval set): said once
    assert not caplog.records
    contexts = [{**PUBMEDQA_ROW, "CONTEXTS": [c]} for c in ("One abstract.", "Another abstract.", "One abstract.")]
    with caplog.at_level("WARNING", logger="medrecipes.usmle.loading"):
        load_mcq(write_jsonl(tmp_path / "contexts.jsonl", contexts))
    assert [r.getMessage().split(": ", 1)[1][:51] for r in caplog.records] == [
        "1 question(s) repeat an earlier one (line 3 repeats"
    ]
    caplog.clear()  # asked again with another gold answer: one of the two is wrong
    other = {**_medqa("Q1", ["a", "b", "c", "d"]), "answer_idx": "C"}
    with caplog.at_level("WARNING", logger="medrecipes.usmle.loading"):
        load_mcq(write_jsonl(tmp_path / "conflict.jsonl", [_medqa("Q1", ["a", "b", "c", "d"]), other]))
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "1 question(s) repeat an earlier one with another gold answer (line 2 answers C where line 1 answers A): "
        "one of each is wrong; fix it or drop the row"
    ]
    caplog.clear()  # options lettered as a prompt letters them: 'A. A. ...'; a sentence that begins with a letter is not
    lettered = [
        _medqa("Q1", ["A. Aspirin", "B. Heparin", "C. Warfarin", "D. None"]),
        _medqa("Q2", ["(A) Aspirin", "(B) Heparin"]),
        _medqa("Q3", ["A) x", "B: y", "C. z"]),
        _medqa("Q4", ["A 45-year-old", "B. Heparin"]),
        _medqa("Q5", ["B. Aspirin", "A. Heparin"]),
    ]
    with caplog.at_level("WARNING", logger="medrecipes.usmle.loading"):
        load_mcq(write_jsonl(tmp_path / "lettered.jsonl", lettered))
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "3 question(s) whose options begin with their own letters (line 1, line 2, line 3): prompts letter each option, "
        "so they read 'A. A. ...'; write the options without their letters"
    ]
    caplog.clear()  # one id for two questions: what is kept by id would mix them; a question asked again under its id is a repeat
    named = [
        {**_medqa(q, ["a", "b", "c", "d"]), "id": i} for q, i in [("Q1", "x"), ("Q2", "y"), ("Q3", "y"), ("Q1", "x")]
    ]
    with caplog.at_level("WARNING", logger="medrecipes.usmle.loading"):
        load_mcq(write_jsonl(tmp_path / "ids.jsonl", named))
    said = [r.getMessage().split(": ", 1)[1] for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("1 question(s) repeat an earlier one (line 4 repeats line 1): ")
    assert said[1].startswith("1 question(s) have the id of another question (line 3 has line 2's id 'y'): ")


@pytest.mark.parametrize("count", [2, 3, 5])
def test_a_benchmark_file_with_another_option_count_is_refused_by_its_name(tmp_path, count):
    """A file given as a benchmark whose questions all have one option count: a row with another
    count is counted and named, and a name of the file's own scores it as it is."""
    from medrecipes.evaluation.tasks import TASKS, load_task

    options = ["a", "b", "c", "d", "e"]
    rows = [_medqa(f"Q{i}", options[:4]) for i in range(3)] + [_medqa("odd", options[:count])]
    path = write_jsonl(tmp_path / "bench.jsonl", rows)
    for name in ("medqa_4opt", "medmcqa", "mmlu_medical"):
        if TASKS[name].subjects:
            continue  # MMLU keeps its subjects only
        with pytest.raises(
            UserError,
            match=rf"1 of the 4 questions in .* have other than the 4 options of {name} \(line 4 has {count}\)",
        ):
            load_task(name, data=path)
    assert len(load_task("my_set", data=path).rows) == 4


@pytest.mark.parametrize("name", ["train[v2].jsonl", "questions*.csv", "what?.parquet"])
def test_a_file_whose_name_holds_pattern_characters_is_read_as_itself(tmp_path, name):
    """`datasets` reads *, ? and [ in data_files as a pattern: a file named with them is read, by a
    command and by a recipe's source, and not the files such a pattern would match."""
    from medrecipes.data.sources import load_documents
    from medrecipes.data_config import SourceConfig

    flat = [{"question": r["question"], **dict(zip("ABCD", r["options"], strict=True)), "answer": r["answer"]}
            for r in usmle.load_mcq(ROOT / "data/usmle_sample/test.jsonl")]  # fmt: skip
    rows, path = Dataset.from_list(flat), tmp_path / name
    {".jsonl": rows.to_json, ".csv": rows.to_csv, ".parquet": rows.to_parquet}[path.suffix](str(path))
    (tmp_path / name.replace("[v2]", "v").replace("*", "x").replace("?", "y")).write_text("")  # what a pattern finds
    assert len(usmle.load_mcq(path)) == len(rows)
    assert len(load_documents(SourceConfig(path=str(path), format="usmle"), streaming=False)) == len(rows)


def test_a_folder_whose_files_name_no_split_is_one_split_whatever_is_asked(tmp_path, caplog):
    """Files named by subject (anatomy.jsonl, cardiology.jsonl) name no split as `datasets` names
    them: the folder is read whole for a task's split, as one file is; a folder whose files do name
    splits gives the one asked."""
    rows = usmle.load_mcq(ROOT / "data/usmle_sample/test.jsonl")
    (tmp_path / "subjects").mkdir()
    for name in ("anatomy", "cardiology"):
        rows.select(range(5)).to_json(str(tmp_path / "subjects" / f"{name}.jsonl"))
    assert len(usmle.load_mcq(tmp_path / "subjects", split="test")) == 10
    (tmp_path / "named").mkdir()
    rows.select(range(3)).to_json(str(tmp_path / "named" / "test.jsonl"))
    rows.select(range(4)).to_json(str(tmp_path / "named" / "train.jsonl"))
    with caplog.at_level("INFO", logger="medrecipes.usmle.loading"):
        assert len(usmle.load_mcq(tmp_path / "named", split="test")) == 3
    assert f"{tmp_path / 'named'}: its test split is read (test.jsonl); train.jsonl left out" in caplog.text
    with pytest.raises(UserError, match="no 'validation' split"):
        usmle.load_mcq(tmp_path / "named", split="validation")


def test_a_parquet_column_of_bytes_is_read_as_the_text_it_holds(tmp_path):
    """Questions written as bytes (a pipeline that kept them encoded): read as their UTF-8 text, not
    as Python's b'...' of them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = load_mcq(str(ROOT / "data/usmle_sample/test.jsonl"))
    table = pa.table({"question": [q.encode() for q in rows["question"]],
                      "options": [dict(zip("ABCD", o, strict=True)) for o in rows["options"]], "answer": rows["answer"]})  # fmt: skip
    pq.write_table(table, tmp_path / "bytes.parquet")
    assert load_mcq(str(tmp_path / "bytes.parquet"))["question"] == rows["question"]


@pytest.mark.parametrize("setting", ["reasoning_required", "reasoning_free_with_abstract"])
def test_a_pubmedqa_row_without_its_abstract_is_refused_where_the_question_is_about_it(tmp_path, setting):
    rows = [PUBMEDQA_ROW, {**PUBMEDQA_ROW, "QUESTION": "Does sleep lower it?", "CONTEXTS": []}]
    path = write_jsonl(tmp_path / "pqal.jsonl", rows)
    with pytest.raises(
        UserError, match=rf"pqal\.jsonl line 2: has no abstract \(CONTEXTS\), which pubmedqa_setting {setting}"
    ):
        load_mcq(path, pubmedqa_setting=setting)
    assert load_mcq(path, pubmedqa_setting="reasoning_free")[1]["context"] == "Conclusion: The evidence is mixed."
