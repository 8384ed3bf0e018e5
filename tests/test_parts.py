"""Questions split between stages (a source's `part`), a model's pass rate on each question
(`medrecipes pass-rate`) and the filter that keeps questions by it (a source's `pass_rate`)."""

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import PYTHON, SHARED_DATA, error_lines, run, run_ok, write_jsonl

from medrecipes.config import SourceConfig, parse_recipe
from medrecipes.data.sources import load_mcq_source, load_source
from medrecipes.data_config import PartConfig, PassRateConfig
from medrecipes.errors import UserError
from medrecipes.locations import SAMPLED, weights_fingerprint

USMLE = "data/usmle_sample/train.jsonl"
PQAL = SHARED_DATA / "pubmedqa" / "pqal_trainval_500.json"
MCQ_SOURCES = [
    pytest.param({"path": USMLE, "format": "usmle"}, id="bundled USMLE"),
    pytest.param(
        {"path": str(PQAL), "format": "usmle", "pubmedqa_setting": "reasoning_free"},
        id="PubMedQA PQA-L",
        marks=pytest.mark.skipif(not PQAL.is_file(), reason="no ../shared/data"),
    ),
]


def _part(fields: dict, share: float, take: str, seed: int = 42):
    return load_mcq_source(SourceConfig(**fields, part=PartConfig(share=share, take=take, seed=seed)))


@pytest.mark.parametrize("fields", MCQ_SOURCES)
@pytest.mark.parametrize("share", [0.3, 0.6])
def test_two_parts_of_one_file_are_disjoint_cover_it_and_keep_its_answer_proportions(fields, share):
    whole = load_mcq_source(SourceConfig(**fields))
    first, rest = _part(fields, share, "first"), _part(fields, share, "rest")
    assert not set(first["id"]) & set(rest["id"])
    assert sorted([*first["id"], *rest["id"]]) == sorted(whole["id"])
    assert len(first) == pytest.approx(share * len(whole), abs=1)
    counts = Counter(whole["answer"])
    for answer, n in Counter(first["answer"]).items():  # stratified: each answer's share within a row
        assert abs(n - share * counts[answer]) <= 1, (answer, n, counts[answer])
    assert list(first["id"]) == [i for i in whole["id"] if i in set(first["id"])]  # the file's order


@pytest.mark.parametrize("fields", MCQ_SOURCES)
def test_the_same_seed_draws_the_same_part_and_another_seed_another(fields):
    drawn = {seed: list(_part(fields, 0.5, "first", seed)["id"]) for seed in (1, 1, 2)}
    assert drawn[1] == list(_part(fields, 0.5, "first", 1)["id"])
    assert drawn[1] != drawn[2]


def test_a_part_of_preference_pairs_and_of_documents_is_a_seeded_split(tmp_path):
    pairs = load_source(SourceConfig(path="data/usmle_sample/pairs_train.jsonl", format="preference"))
    first, rest = (
        load_source(
            SourceConfig(
                path="data/usmle_sample/pairs_train.jsonl", format="preference", part=PartConfig(0.75, take, 3)
            )
        )
        for take in ("first", "rest")
    )
    assert (len(first), len(rest)) == (45, 15) and len(pairs) == 60
    assert not {json.dumps(r) for r in first["chosen"]} & {json.dumps(r) for r in rest["chosen"]}
    unpaired = SourceConfig(path="data/usmle_sample/unpaired_train.jsonl", format="unpaired", part=PartConfig(0.5))
    assert Counter(load_source(unpaired)["label"]) == {True: 30, False: 30}  # stratified by its label


def _recipe(tmp_path: Path, source: dict, **keys) -> str:
    recipe = {
        "model_name_or_path": keys.pop("model", "m"),
        "use_cpu": True,
        "output_dir": str(tmp_path / "out"),
        "dataset_mixture": {"sources": [source], **keys.pop("mixture", {})},
        **keys,
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.mark.parametrize(
    "part, message",
    [
        ({"share": 1.0}, r"part.share must be above 0 and below 1"),
        ({"share": 0}, r"part.share must be above 0 and below 1"),
        ({"share": 0.5, "take": "second"}, r"take"),
        ({"share": 0.5, "sead": 3}, r"sources\[0\].part: unknown key 'sead' \(did you mean 'seed'\?\)"),
        ({"take": "rest"}, r"sources\[0\].part: missing key 'share'"),
        ({"share": "half"}, r"share must be a number"),
        ("0.5", r"part must be a mapping of share, take, seed"),
    ],
)
def test_a_bad_part_is_one_line_at_parse(tmp_path, part, message):
    with pytest.raises(UserError, match=message):
        parse_recipe("sft", [_recipe(tmp_path, {"path": USMLE, "format": "usmle", "part": part})])


def test_a_part_or_a_pass_rate_of_a_stream_is_refused(tmp_path):
    source = {"path": USMLE, "format": "usmle", "part": {"share": 0.5}}
    with pytest.raises(UserError, match=r"sources\[0\]: part and pass_rate .* set streaming: false"):
        parse_recipe("sft", [_recipe(tmp_path, source, mixture={"streaming": True})])


def test_a_part_too_small_for_every_answer_is_one_line(tmp_path):
    rows = [{"question": f"Q{i}?", "options": {"A": "a", "B": "b"}, "answer": "A" if i else "B"} for i in range(8)]
    source = SourceConfig(path=write_jsonl(tmp_path / "q.jsonl", rows), format="usmle", part=PartConfig(0.5))
    with pytest.raises(UserError, match=r"part share 0.5 of its 8 rows cannot be drawn .*every answer in both parts"):
        load_mcq_source(source)


# ---------------------------------------------------------------------------
# The pass-rate filter


def _rates(path: Path, rates: dict[str, float], fingerprint="sha256:0") -> str:
    return write_jsonl(
        path,
        [{"id": q, "pass_rate": r, "right": 0, "samples": 4, "model": "m", "model_fingerprint": fingerprint}
         for q, r in rates.items()],
    )  # fmt: skip


def test_the_filter_keeps_the_questions_in_its_range_and_counts_the_others(tmp_path, caplog):
    ids = [f"q{i:03d}" for i in range(1, 61)]
    rates = dict(zip(ids[:50], [0.0, 0.25, 0.5, 0.75, 1.0] * 10, strict=True))  # ten questions not measured
    config = PassRateConfig(file=_rates(tmp_path / "rates.jsonl", rates))
    with caplog.at_level("INFO", logger="medrecipes.pass_rates"):
        kept = load_mcq_source(SourceConfig(path=USMLE, format="usmle", pass_rate=config))
    assert list(kept["id"]) == [q for q in ids[:50] if 0 < rates[q] < 1]
    assert "keeps 30 of 60 questions (10 not measured, 10 pass rate 0 or below, 10 pass rate 1 or above)" in (
        caplog.text
    )
    said = [r for r in caplog.records if "keeps 30 of 60" in r.getMessage()]  # questions never measured: a warning
    assert said[0].levelname == "WARNING" and "measure them too with `medrecipes pass-rate`" in said[0].getMessage()
    narrow = PassRateConfig(file=config.file, above=0.3, below=0.8)
    assert len(load_mcq_source(SourceConfig(path=USMLE, format="usmle", pass_rate=narrow))) == 20
    pairs = SourceConfig(path="data/usmle_sample/pairs_train.jsonl", format="preference", pass_rate=config)
    assert sorted(load_source(pairs)["id"]) == sorted(kept["id"])  # pairs carry their question's id


def test_a_missing_pass_rate_file_is_one_line_when_the_data_loads(tmp_path):
    recipe = _recipe(tmp_path, {"path": USMLE, "format": "usmle", "pass_rate": {"file": "missing.jsonl"}})
    args, _, _ = parse_recipe("grpo", [recipe])  # an earlier stage writes it, as it writes a data file
    with pytest.raises(UserError, match=r"missing.jsonl: no such file; measure it with `medrecipes pass-rate"):
        load_mcq_source(args.mixture.sources[0])


def test_a_filter_that_keeps_nothing_or_rows_without_ids_is_one_line(tmp_path):
    config = PassRateConfig(file=_rates(tmp_path / "rates.jsonl", {"q001": 1.0, "q002": 0.0}))
    with pytest.raises(
        UserError, match=r"pass_rate keeps none of its 60 questions \(58 not measured, 1 pass rate 0 or below, 1 pass"
    ):
        load_mcq_source(SourceConfig(path=USMLE, format="usmle", pass_rate=config))
    text = SourceConfig(path=write_jsonl(tmp_path / "docs.jsonl", [{"text": "a"}, {"text": "b"}]), pass_rate=config)
    with pytest.raises(UserError, match=r"pass_rate keeps rows by their question's id and these rows have no 'id'"):
        load_source(text)


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"id": "q1", "pass_rate": 0.5}', '{"id": "q1", "pass_rate": 0.25}'],
            r"rates.jsonl:2: question id 'q1' again",
        ),
        (['{"id": "q1"}'], r"rates.jsonl:1: no 'pass_rate'"),
        (["not json"], r"rates.jsonl:1: not a pass-rate row"),
        ([], r"no rows; measure it"),
    ],
)
def test_a_damaged_pass_rate_file_is_one_line_naming_its_line(tmp_path, lines, message):
    path = tmp_path / "rates.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    source = {"path": USMLE, "format": "usmle", "pass_rate": {"file": str(path)}}
    with pytest.raises(UserError, match=message):
        parse_recipe("grpo", [_recipe(tmp_path, source, model="m")])


@pytest.mark.parametrize(
    "rates, message",
    [
        (
            {"above": 0.5, "below": 0.5},
            r"pass_rate keeps pass rates above 0.5 and below 0.5, which no rate \(0 to 1\) is",
        ),
        ({"above": 1}, r"above 1 and below 1, which no rate \(0 to 1\) is; use above < below"),
        ({"below": 0}, r"above 0 and below 0, which no rate"),
        ({"above": None, "below": 0}, r"above -1 and below 0, which no rate"),
        ({"below": 80}, r"pass_rate.below 80 is no pass rate \(.*, 0 to 1\); write 0.8 for 80%, or null for no upper"),
        ({"above": -0.5}, r"pass_rate.above -0.5 is no pass rate \(.*\); null for no lower bound"),
    ],
)
def test_a_bad_pass_rate_range_or_file_is_one_line_at_parse(tmp_path, rates, message):
    source = {"path": USMLE, "format": "usmle", "pass_rate": {"file": str(tmp_path / "r.jsonl"), **rates}}
    _rates(tmp_path / "r.jsonl", {"q001": 0.5})
    with pytest.raises(UserError, match=message):
        parse_recipe("grpo", [_recipe(tmp_path, source)])


def test_a_pass_rate_file_of_another_model_is_refused_at_parse(tmp_path, tiny_model):
    ours = weights_fingerprint(tiny_model, ends=SAMPLED)
    source = {"path": USMLE, "format": "usmle", "pass_rate": {"file": _rates(tmp_path / "r.jsonl", {"q001": 0.5})}}
    recipe = _recipe(tmp_path, source, model=tiny_model)
    with pytest.raises(UserError, match=rf"pass_rate: .*r.jsonl was measured on other weights \(sha256:0\) than "
                                        rf".* \({ours}\), the model this recipe starts from; measure it again"):  # fmt: skip
        parse_recipe("grpo", [recipe])
    _rates(tmp_path / "r.jsonl", {"q001": 0.5}, fingerprint=ours)
    parse_recipe("grpo", [recipe])


def test_validate_takes_grpos_data_step_as_its_run_does(tmp_path, capsys, chat_model):
    """A GRPO recipe's questions are few: validate takes the run's data step before its model loads,
    so a pass_rate file of other questions, or a max_completion_length that leaves no prompt room,
    is its line there. A pass_rate file not measured yet is left to the run, as a model not there is."""
    from transformers import AutoConfig

    from medrecipes.cli import main

    ours = weights_fingerprint(chat_model, ends=SAMPLED)
    rates = tmp_path / "r.jsonl"
    source = {"path": USMLE, "format": "usmle", "pass_rate": {"file": str(rates)}}
    recipe = _recipe(tmp_path, source, model=chat_model)
    main(["validate", recipe, "--method", "grpo"])  # not measured yet
    _rates(rates, {"other": 0.5}, fingerprint=ours)
    with pytest.raises(SystemExit, match="2"):
        main(["validate", recipe, "--method", "grpo"])
    assert "pass_rate keeps none of its 60 questions (60 not measured" in capsys.readouterr().err
    _rates(rates, {"q001": 0.5, "q002": 0.25}, fingerprint=ours)
    main(["validate", recipe, "--method", "grpo"])
    positions = AutoConfig.from_pretrained(chat_model).max_position_embeddings
    with pytest.raises(SystemExit, match="2"):
        main(["validate", recipe, "--method", "grpo", "--max_completion_length", str(positions - 8)])
    assert "every one of its 2 prompts is longer than the 8 tokens" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# medrecipes pass-rate


@pytest.mark.long  # sampled answers of every question
def test_pass_rate_measures_the_recipes_part_with_its_prompt_and_reward(tmp_path, chat_model):
    """The command as a user types it on a GRPO recipe whose filter names the file it writes: one
    row a question of the recipe's part (not the SFT's), its pass rate the share of right samples,
    the model's fingerprint in each; then the recipe reads it."""
    rates = tmp_path / "rates.jsonl"
    part = {"share": 0.5, "take": "rest", "seed": 7}
    source = {
        "path": USMLE,
        "format": "usmle",
        "part": part,
        "pass_rate": {"file": str(rates), "above": None, "below": None},  # every measured rate
    }
    recipe = _recipe(tmp_path, source, model=chat_model, rewards=[{"name": "usmle_accuracy"}],
                     prompt_format="chat", max_completion_length=6, temperature=1.5)  # fmt: skip
    result = run_ok(PYTHON, "-m", "medrecipes.cli", "pass-rate", recipe, "--samples", "3", "--seed", "5")
    rows = [json.loads(line) for line in rates.read_text().splitlines()]
    sft_part = load_mcq_source(SourceConfig(path=USMLE, format="usmle", part=PartConfig(0.5, "first", 7)))
    assert len(rows) == 30 and not {r["id"] for r in rows} & set(sft_part["id"])
    assert all(r["samples"] == 3 and r["pass_rate"] == r["right"] / 3 for r in rows)
    assert {r["model_fingerprint"] for r in rows} == {weights_fingerprint(chat_model, ends=SAMPLED)}
    assert f"30 pass rates written to {rates}" in result.stdout
    assert "kept by pass_rate above 0 and below 1: " in result.stdout
    recipe_args, _, _ = parse_recipe("grpo", [recipe])  # measured on the model it starts from
    kept = load_mcq_source(recipe_args.mixture.sources[0])
    assert sorted(kept["id"]) == sorted(r["id"] for r in rows)  # a random model: every rate kept, whatever it is
    again = run(PYTHON, "-m", "medrecipes.cli", "pass-rate", recipe)
    assert again.returncode == 2 and "--overwrite" in error_lines(again.stderr)[0]


def test_pass_rate_needs_a_correctness_reward_and_an_output(tmp_path):
    recipe = _recipe(
        tmp_path, {"path": USMLE, "format": "usmle"}, rewards=[{"name": "answer_format", "style": "letter"}]
    )
    result = run(PYTHON, "-m", "medrecipes.cli", "pass-rate", recipe)
    assert result.returncode == 2
    assert error_lines(result.stderr) == [
        f"error: {recipe}: no reward scores whether an answer is right (usmle_accuracy or accuracy_or_abstain); "
        "a pass rate counts the answers it scores 1"
    ]
