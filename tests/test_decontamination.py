"""Benchmark contamination: n-gram overlap between training documents and evaluation items."""

import json
import random
from pathlib import Path

import pytest
from conftest import PYTHON, ROOT, SHARED_DATA, run, write_jsonl

from medrecipes.data import decontamination as dc
from medrecipes.usmle import load_mcq

QUESTIONS = [
    {
        "id": "q-valve",
        "question": "A 67-year-old man presents with exertional chest pain, syncope on climbing stairs and a harsh "
        "crescendo-decrescendo systolic murmur radiating to both carotid arteries. What is the diagnosis?",
        "options": ["Aortic stenosis", "Mitral regurgitation", "Hypertrophic cardiomyopathy", "Pericarditis"],
        "answer": "A",
    },
    {
        "id": "q-heparin",
        "question": "During a vascular procedure a patient given unfractionated heparin starts to bleed heavily from "
        "every puncture site and the team needs to reverse the anticoagulant effect at once. Which drug?",
        "options": ["Vitamin K", "Protamine sulfate", "Idarucizumab", "Andexanet alfa"],
        "answer": "B",
    },
    {"id": "q-short", "question": "Which ion flattens T waves?", "options": ["K", "Na"], "answer": "A"},
]


def check(texts: list[str], benchmarks: dict, n: int = 13):
    return dc.decontaminate({"train": iter([texts])}, dc.EvalIndex.of(benchmarks, n))


def test_planted_questions_are_found_through_case_and_punctuation_changes():
    bench = {"mcq": dc.mcq_texts(QUESTIONS)}
    valve = QUESTIONS[0]["question"]
    changed = valve.upper().replace("-", " ").replace(",", " ,,").replace(" ", "\n  ")
    twelve_words = " ".join(dc.words(QUESTIONS[1]["question"])[3:15])  # 12 consecutive words
    texts = [
        "Aortic stenosis is the commonest valve lesion in the elderly.",
        f"Case: {changed} The echo showed a calcified valve.",
        f"An unrelated sentence, then: {twelve_words}.",
    ]
    report, contaminated = check(texts, bench)
    assert contaminated == {"train": [1]}
    assert report["benchmarks"]["mcq"]["contaminated_rows"] == 1
    assert report["benchmarks"]["mcq"]["examples"] == ["q-valve"]
    assert report["benchmarks"]["mcq"]["too_short"] == 1  # q-short has fewer than 13 words
    assert report["sources"]["train"] == {"documents": 3, "contaminated": 1, "by_benchmark": {"mcq": 1}}
    # With 12-word n-grams the shorter overlap counts too.
    report, contaminated = check(texts, bench, n=12)
    assert contaminated == {"train": [1, 2]} and report["benchmarks"]["mcq"]["contaminated_rows"] == 2


def test_hits_are_reported_per_source_and_per_benchmark():
    benchmarks = {"valve": dc.mcq_texts(QUESTIONS[:1]), "heparin": dc.mcq_texts(QUESTIONS[1:2])}
    index = dc.EvalIndex.of(benchmarks)
    both = QUESTIONS[0]["question"] + " " + QUESTIONS[1]["question"]
    report, contaminated = dc.decontaminate(
        {"notes": iter([["clean text", both]]), "forum": iter([[QUESTIONS[1]["question"]], ["clean"]])}, index
    )
    assert report["sources"]["notes"]["by_benchmark"] == {"valve": 1, "heparin": 1}
    assert report["sources"]["forum"] == {
        "documents": 2,
        "contaminated": 1,
        "by_benchmark": {"valve": 0, "heparin": 1},
    }
    assert contaminated == {"notes": [1], "forum": [0]}


def test_no_false_hits_on_disjoint_text():
    # The same 10 words in random orders: real n-grams never repeat across the two sides, so any
    # hit would be a hashing or boundary error (n-grams across two documents must not count).
    words = "aorta valve heparin protamine kidney insulin cortisol sepsis fever anaemia".split()
    rng = random.Random(0)
    evals = [" ".join(rng.choices(words, k=40)) for _ in range(300)]
    train = [" ".join(rng.choices(words, k=rng.randint(5, 60))) for _ in range(20_000)]
    report, contaminated = check(train, {"random": (evals, [str(i) for i in range(300)])})
    assert report["contaminated_documents"] == 0 and contaminated == {"train": []}
    assert report["benchmarks"]["random"]["contaminated_rows"] == 0


@pytest.mark.skipif(not (SHARED_DATA / "medqa").is_dir(), reason="needs ../shared/data/medqa")
def test_a_medqa_test_question_in_a_training_file_is_caught(tmp_path):
    medqa = SHARED_DATA / "medqa" / "medqa_us_4opt_test.jsonl"
    row = load_mcq(str(medqa))[100]
    notes = [json.loads(line)["text"] for line in (Path(__file__).parents[1] / "data/medical_text/train.jsonl").open()]
    planted = f"Forum post: does anyone know this one?? {row['question'].lower()} Thanks!"
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": t} for t in notes[:30]] + [{"text": planted}])
    source = dc.training_file_source(train)
    report, contaminated = dc.check_sources({"train": source}, dc.file_benchmarks([str(medqa)]))
    bench = report["benchmarks"]["medqa_us_4opt_test"]
    assert bench["rows"] == 1273 and row["id"] in bench["examples"]
    assert contaminated == {"train": [30]}


@pytest.mark.slow
def test_command_reports_json_and_drops_contaminated_rows(tmp_path):
    evals = write_jsonl(tmp_path / "bench.jsonl", QUESTIONS)
    rows = [{"id": i, "text": f"Note {i}: potassium and T waves."} for i in range(5)]
    rows[3]["text"] += " " + QUESTIONS[1]["question"]
    train = write_jsonl(tmp_path / "notes.jsonl", rows)
    kept = tmp_path / "kept.jsonl"
    medrecipes = Path(PYTHON).parent / "medrecipes"
    result = run(medrecipes, "decontaminate", "--train", train, "--eval", evals, "--json", "--drop", kept)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["sources"]["notes"]["contaminated"] == 1
    assert report["benchmarks"]["bench"]["examples"] == ["q-heparin"]
    assert [json.loads(line)["id"] for line in kept.read_text().splitlines()] == [0, 1, 2, 4]
    missing = run(medrecipes, "decontaminate", "--train", train)
    assert missing.returncode == 2 and "--eval" in missing.stderr and "Traceback" not in missing.stderr


def test_at_most_64_evaluation_sets_at_once():
    with pytest.raises(dc.UserError, match="at most 64 evaluation sets at once, got 65; run it in parts"):
        dc.EvalIndex({f"set{i}": ["the same words in every set"] for i in range(65)})


def test_a_benchmark_folder_of_questions_and_passages_is_read_file_by_file(tmp_path):
    """A benchmark folder holding its questions (multiple choice) and its passages (a text column):
    the texts of both, each item named by its file."""
    questions = load_mcq("data/usmle_sample/test.jsonl").select(range(3)).to_list()
    folder = tmp_path / "bench"
    folder.mkdir()
    write_jsonl(folder / "test.jsonl", [{k: q[k] for k in ("id", "question", "options", "answer")} for q in questions])
    write_jsonl(folder / "passages.jsonl", [{"text": "Iron deficiency is the commonest cause of anaemia."}])
    texts, ids = dc.benchmark_texts(str(folder))
    assert len(texts) == 4 and any("Iron deficiency" in t for t in texts)
    assert {i.split(":")[0] for i in ids} == {"passages.jsonl", "test.jsonl"}


def test_overwrite_without_a_file_to_replace_is_said(capsys):
    from medrecipes import cli

    test = str(ROOT / "data/usmle_sample/test.jsonl")
    cli.main(["decontaminate", "--train", test, "--eval", test, "--overwrite"])
    assert "warning: decontaminate --overwrite lets --drop replace its file, and no --drop is given" in (
        capsys.readouterr().err
    )


def test_a_pubmedqa_file_keyed_by_id_is_read_as_training_data(tmp_path, capsys):
    """PubMedQA's PQA-L layout (one object of questions keyed by PubMed id) as a training file: its
    rows, not 'line 1: not JSON' (the json builder has no mode for it), as --eval reads it."""
    from medrecipes import cli

    keyed = tmp_path / "ori_pqal.json"
    abstract = "Aspirin taken daily for five years lowered the rate of a first ischaemic stroke in older adults"
    question = {"QUESTION": "Does daily aspirin prevent a first stroke in adults over seventy years of age in the community?", "CONTEXTS": [abstract],
                "LABELS": ["BACKGROUND"], "final_decision": "yes", "LONG_ANSWER": "Yes, in some."}  # fmt: skip
    keyed.write_text(
        json.dumps(
            {
                "101": question,
                "102": {
                    **question,
                    "QUESTION": "Does daily aspirin prevent a first fall in adults over seventy years of age in the community?",
                },
            }
        )
    )
    cli.main(["decontaminate", "--train", str(keyed), "--eval", str(keyed)])
    assert "ori_pqal: 2 of 2 items found in training data" in capsys.readouterr().out


def test_pubmedqa_questions_kept_by_drop_say_the_context_their_setting_gave(tmp_path, caplog):
    from medrecipes import cli

    question = {"QUESTION": "Does aspirin prevent stroke?", "CONTEXTS": ["An abstract."], "final_decision": "yes",
                "LONG_ANSWER": "Yes."}  # fmt: skip
    keyed = tmp_path / "ori_pqal.json"
    keyed.write_text(json.dumps({"101": question}))
    with caplog.at_level("WARNING", logger="medrecipes.data.decontamination"):
        cli.main(["decontaminate", "--train", str(keyed), "--eval", str(ROOT / "data/usmle_sample/test.jsonl"),
                  "--drop", str(tmp_path / "kept.jsonl")])  # fmt: skip
    assert f"--drop {tmp_path}/kept.jsonl: the kept questions are written in medrecipes' own layout" in caplog.text
    assert json.loads((tmp_path / "kept.jsonl").read_text())["context"] == "An abstract."


def test_a_short_question_copied_with_lettered_options_is_found_and_a_stock_phrase_is_not(tmp_path):
    """A question of fewer than n words is checked with its options; a copy that letters them ("A.
    yes") is found however its labels are written, while two questions that share a 12-word stock
    phrase before their lettered options are not taken for one."""
    short = {"question": "Does daily aspirin prevent a first ischaemic stroke in adults over seventy?", "options":
             {"A": "yes", "B": "no", "C": "maybe"}, "answer": "A"}  # fmt: skip
    stock = "Which of the following investigations is most appropriate to confirm the diagnosis?"
    other = {"question": f"A woman has a cough. {stock}", "options": {"A": "Spirometry", "B": "CT"}, "answer": "B"}
    test = write_jsonl(tmp_path / "test.jsonl", [short, other])
    for labels in ("{L}. {o}", "({L}) {o}", "{L}) {o}"):
        copied = "\n".join(labels.format(L=k, o=v) for k, v in short["options"].items())
        train = write_jsonl(tmp_path / "train.jsonl", [
            {"text": f"Notes. Question: {short['question']}\n{copied}\nAnswer: A"},
            {"text": f"A man has chest pain. {stock}\nA. D-dimer\nB. Chest radiograph"},
        ])  # fmt: skip
        report, contaminated = dc.check_sources(
            {"train": dc.training_file_source(str(train))}, dc.file_benchmarks([str(test)])
        )
        assert report["benchmarks"]["test"]["contaminated_rows"] == 1, (labels, report)
        assert contaminated["train"] == [0], (labels, contaminated)


@pytest.mark.parametrize("layout", ["pairs", "unpaired"])
def test_preference_data_is_checked_by_its_questions_and_a_shared_system_prompt_is_no_overlap(tmp_path, layout):
    """DPO and KTO data (what `medrecipes pairs` writes, a system prompt before every question): as
    training data, its benchmark questions are found and dropped; as an evaluation set, its questions
    are what is looked for, and pairs of other questions behind the same system prompt match none."""
    from medrecipes import cli

    test, train = write_jsonl(tmp_path / "test.jsonl", QUESTIONS[:2]), ROOT / "data/usmle_sample/train.jsonl"
    made = {}
    for name, mcq in (("mixed", [train, test]), ("held_out", [test]), ("train_only", [train])):
        made[name] = tmp_path / f"{name}.jsonl"
        cli.main(["pairs", "--mcq", *map(str, mcq), "--out", str(made[name]), "--layout", layout,
                  "--system-prompt", "You are a careful medical expert. Answer the multiple-choice question."])  # fmt: skip
    source = dc.training_file_source(str(made["mixed"]))
    assert source.format == {"pairs": "preference", "unpaired": "unpaired"}[layout]
    report, contaminated = dc.check_sources({"mixed": source}, dc.file_benchmarks([str(test)]))
    assert report["benchmarks"]["test"]["contaminated_rows"] == 2
    rows = [json.loads(line) for line in made["mixed"].read_text().splitlines()]
    assert {rows[i]["prompt"][-1]["content"].split("\n")[0] for i in contaminated["mixed"]} == {
        q["question"] for q in QUESTIONS[:2]
    }
    for training, found in (("mixed", 2), ("train_only", 0)):
        against = dc.file_benchmarks([str(made["held_out"])])
        report, _ = dc.check_sources({training: dc.training_file_source(str(made[training]))}, against)
        assert report["benchmarks"]["held_out"]["rows"] == 2  # its questions, each once
        assert report["benchmarks"]["held_out"]["contaminated_rows"] == found, (training, report)


@pytest.mark.parametrize(
    "recipe", sorted(p.name for p in (ROOT / "recipes").glob("tiny_*.yaml") if p.stem != "tiny_eval")
)
def test_every_training_recipe_is_checked_against_its_eval_sets(recipe, capsys):
    """decontaminate takes a recipe of each training method: its sources against its eval sets."""
    from medrecipes import cli

    cli.main(["decontaminate", "--train", str(ROOT / "recipes" / recipe), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["sources"] and report["benchmarks"], report


def test_an_n_past_every_item_is_said(tmp_path, capsys):
    """An n longer than every evaluation item checks nothing and finds nothing: said, not reported
    as clean in silence; an n that checks some says nothing more than its report."""
    from medrecipes import cli

    evals = write_jsonl(tmp_path / "bench.jsonl", QUESTIONS)
    for n, said in (("100000", True), ("13", False)):
        cli.main(
            ["decontaminate", "--train", str(ROOT / "data/medical_text/train.jsonl"), "--eval", str(evals), "--n", n]
        )
        assert ("every evaluation item is shorter than" in capsys.readouterr().err) == said
