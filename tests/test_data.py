"""Tests for training data: sources, weighted mixtures, upsampling, streaming and packing."""

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SHARED_DATA, write_jsonl
from datasets import Dataset, IterableDataset

from medrecipes.config import MixtureConfig, SourceConfig, parse_recipe
from medrecipes.data import packing
from medrecipes.data.mixture import build_mixture
from medrecipes.data.packing import pack_documents
from medrecipes.data.pretraining import pretraining_data
from medrecipes.data.sources import load_source
from medrecipes.errors import UserError
from medrecipes.usmle import load_mcq

BIG_ROWS, SMALL_ROWS = 10_000, 1_000


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    """A large and a small source whose rows say which source and row they are."""
    folder = tmp_path_factory.mktemp("corpora")
    return {
        "big": write_jsonl(folder / "big.jsonl", [{"text": f"big {i}"} for i in range(BIG_ROWS)]),
        "small": write_jsonl(folder / "small.jsonl", [{"text": f"small {i}"} for i in range(SMALL_ROWS)]),
    }


def mixture(corpora, seed=42, streaming=False, stopping_strategy="all_exhausted", weights=(0.7, 0.3)):
    return MixtureConfig(
        sources=[
            SourceConfig(path="json", data_files=corpora["big"], weight=weights[0]),
            SourceConfig(path="json", data_files=corpora["small"], weight=weights[1]),
        ],
        seed=seed,
        streaming=streaming,
        stopping_strategy=stopping_strategy,
    )


def first_texts(dataset, n: int) -> list[str]:
    return [row["text"] for _, row in zip(range(n), dataset, strict=False)]


def small_share(texts: list[str]) -> float:
    return sum(text.startswith("small ") for text in texts) / len(texts)


# ---------------------------------------------------------------------------
# Mixtures


@pytest.mark.parametrize("stopping_strategy", ["all_exhausted", "first_exhausted"])
def test_mixture_follows_weights(corpora, stopping_strategy):
    mixed = build_mixture(mixture(corpora, stopping_strategy=stopping_strategy))
    assert isinstance(mixed, Dataset)
    assert mixed.column_names == ["text"]
    # first_exhausted ends when the small source runs out, before 5,000 samples.
    texts = first_texts(mixed, 5000)
    assert len(texts) > 3000
    assert small_share(texts) == pytest.approx(0.3, abs=0.03)


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("other", ["csv", "parquet", "txt"])
def test_sources_of_every_file_kind_mix(tmp_path, streaming, other):
    """A JSON Lines source beside a CSV, Parquet or text one: their text columns arrive as Arrow's
    large and plain strings, which interleave_datasets would refuse to align."""
    jsonl = write_jsonl(tmp_path / "a.jsonl", [{"text": f"json {i}"} for i in range(20)])
    rows = Dataset.from_dict({"text": [f"{other} {i}" for i in range(20)]})
    path = tmp_path / f"b.{other}"
    {"csv": rows.to_csv, "parquet": rows.to_parquet}.get(other, lambda p: path.write_text("\n".join(rows["text"])))(
        path
    )
    sources = [SourceConfig(path=str(jsonl)), SourceConfig(path=str(path))]
    texts = first_texts(build_mixture(MixtureConfig(sources=sources, streaming=streaming)), 100)
    assert sorted(texts) == sorted([f"json {i}" for i in range(20)] + [f"{other} {i}" for i in range(20)])


def test_weights_need_not_sum_to_one(corpora):
    texts = first_texts(build_mixture(mixture(corpora, weights=(7, 3))), 5000)
    assert small_share(texts) == pytest.approx(0.3, abs=0.03)


def test_mixture_order_is_set_by_seed(corpora):
    first = first_texts(build_mixture(mixture(corpora, seed=1)), 2000)
    again = first_texts(build_mixture(mixture(corpora, seed=1)), 2000)
    other = first_texts(build_mixture(mixture(corpora, seed=2)), 2000)
    assert first == again
    assert first != other


def test_streaming_mixture_follows_weights(corpora):
    mixed = build_mixture(mixture(corpora, streaming=True))
    assert isinstance(mixed, IterableDataset)
    texts = first_texts(mixed, 5000)
    assert len(texts) == 5000
    assert small_share(texts) == pytest.approx(0.3, abs=0.03)
    assert first_texts(build_mixture(mixture(corpora, streaming=True)), 500) == texts[:500]


def test_small_source_is_upsampled_until_every_source_is_seen(corpora):
    texts = first_texts(build_mixture(mixture(corpora, stopping_strategy="all_exhausted")), 10**6)
    counts = Counter(texts)
    big = [t for t in counts if t.startswith("big ")]
    small = [t for t in counts if t.startswith("small ")]
    assert len(big) == BIG_ROWS  # the large source is read in full
    assert len(small) == SMALL_ROWS
    # 0.3 of ~14,000 samples from 1,000 rows: each small row about four times.
    assert max(counts[t] for t in small) > 1
    assert sum(counts[t] for t in small) > 3 * SMALL_ROWS


def test_first_exhausted_repeats_nothing(corpora):
    texts = first_texts(build_mixture(mixture(corpora, stopping_strategy="first_exhausted")), 10**6)
    assert len(texts) == len(set(texts))


def test_single_source_is_shuffled_and_complete(corpora):
    single = MixtureConfig(sources=[SourceConfig(path="json", data_files=corpora["small"])], seed=3)
    texts = first_texts(build_mixture(single), 10**6)
    assert sorted(texts) == sorted(f"small {i}" for i in range(SMALL_ROWS))
    assert texts != [f"small {i}" for i in range(SMALL_ROWS)]


# ---------------------------------------------------------------------------
# Sources


def test_text_field_is_renamed_and_other_columns_dropped(tmp_path):
    path = write_jsonl(tmp_path / "notes.jsonl", [{"id": 1, "body": "first note"}, {"id": 2, "body": "second"}])
    documents = load_source(SourceConfig(path=path, text_field="body"))
    assert documents.column_names == ["text"]
    assert list(documents["text"]) == ["first note", "second"]


def test_local_folder_source(tmp_path):
    folder = tmp_path / "corpus"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", [{"text": "one"}])
    write_jsonl(folder / "b.jsonl", [{"text": "two"}])
    (folder / "README").write_text("not data")
    assert sorted(load_source(SourceConfig(path=str(folder)))["text"]) == ["one", "two"]


def test_local_folder_keeps_its_splits_apart(tmp_path):
    # Held-out files beside the training file must not leak into training data.
    write_jsonl(tmp_path / "train.jsonl", [{"text": "train one"}, {"text": "train two"}])
    write_jsonl(tmp_path / "test.jsonl", [{"text": "held out"}])
    assert sorted(load_source(SourceConfig(path=str(tmp_path)))["text"]) == ["train one", "train two"]
    assert list(load_source(SourceConfig(path=str(tmp_path), split="test"))["text"]) == ["held out"]


def test_a_json_document_of_columns_or_of_rows_under_a_key_is_a_text_source(tmp_path):
    (tmp_path / "columns.json").write_text(json.dumps({"text": ["one", "two"], "id": [1, 2]}), encoding="utf-8")
    assert list(load_source(SourceConfig(path=str(tmp_path / "columns.json")))["text"]) == ["one", "two"]
    held = {"version": 2, "data": [{"text": "one", "id": 1}, {"text": "two", "id": 2}]}  # rows under one key
    (tmp_path / "held.json").write_text(json.dumps(held), encoding="utf-8")
    assert list(load_source(SourceConfig(path=str(tmp_path / "held.json")))["text"]) == ["one", "two"]
    (tmp_path / "lists.json").write_text(json.dumps({"text": [["a long first text"], ["b"]]}), encoding="utf-8")
    with pytest.raises(UserError, match=r"lists.json': column 'text' holds lists in every row, not text; set text_field "
                       r"to a column of text \(it has none\)"):  # fmt: skip
        load_source(SourceConfig(path=str(tmp_path / "lists.json")))
    mixed = {"text": ["one", ["a long second text"]]}  # a column of two kinds, which no dataset column holds
    (tmp_path / "mixed.json").write_text(json.dumps(mixed), encoding="utf-8")
    with pytest.raises(UserError, match=r"mixed.json': its column 'text' holds values of several kinds \(list, str\)"):
        load_source(SourceConfig(path=str(tmp_path / "mixed.json")))


def test_a_folder_save_to_disk_wrote_is_a_source(tmp_path):
    import datasets

    datasets.Dataset.from_dict({"text": ["one", "two", "three"]}).save_to_disk(tmp_path / "saved")
    source = SourceConfig(path=str(tmp_path / "saved"), split="train[:2]")
    assert list(load_source(source)["text"]) == ["one", "two"]
    assert [row["text"] for row in load_source(SourceConfig(path=str(tmp_path / "saved")), streaming=True)] == [
        "one",
        "two",
        "three",
    ]


def test_usmle_format_renders_questions_as_text(tmp_path):
    rows = [
        {
            "id": "q1",
            "question": "Which valve lesion causes exertional syncope?",
            "options": {"A": "Mitral stenosis", "B": "Aortic stenosis", "C": "Tricuspid regurgitation"},
            "answer": "B",
        },
        {
            "id": "q2",
            "question": "Which drug reverses heparin?",
            "options": {"A": "Vitamin K", "B": "Naloxone", "C": "Flumazenil", "D": "Protamine"},
            "answer": "D",
            "explanation": "Protamine binds heparin.",
        },
    ]
    path = write_jsonl(tmp_path / "mcq.jsonl", rows)
    documents = load_source(SourceConfig(path="json", data_files=path, format="usmle"))
    assert documents.column_names == ["text"]
    texts = list(documents["text"])
    assert len(texts) == 2
    assert "Question: Which valve lesion causes exertional syncope?" in texts[0]
    assert "B. Aortic stenosis" in texts[0]
    assert "Answer: B" in texts[0]
    assert "Answer: D" in texts[1]
    assert "Protamine binds heparin." in texts[1]
    streamed = load_source(SourceConfig(path="json", data_files=path, format="usmle"), streaming=True)
    assert isinstance(streamed, IterableDataset)
    assert [row["text"] for row in streamed] == texts


def test_usmle_format_reads_several_data_files(tmp_path):
    row = {"question": "Which drug reverses heparin?", "options": ["Vitamin K", "Protamine"], "answer": "B"}
    files = [write_jsonl(tmp_path / f"part{i}.jsonl", [row] * (i + 1)) for i in range(2)]
    documents = load_source(SourceConfig(path="json", data_files=files, format="usmle"))
    assert len(documents) == 3
    assert all("Answer: B" in text for text in documents["text"])


def test_missing_data_file(tmp_path):
    missing = str(tmp_path / "nowhere.jsonl")
    with pytest.raises(UserError, match="nowhere.jsonl") as info:
        load_source(SourceConfig(path="json", data_files=missing))
    assert "does not exist" in str(info.value)


def test_missing_local_path(tmp_path):
    missing = str(tmp_path / "absent.jsonl")
    with pytest.raises(UserError, match="no such file or folder") as info:
        load_source(SourceConfig(path=missing))
    assert missing in str(info.value)


def test_a_link_that_leads_nowhere_says_which_way(tmp_path):
    """A link to a file that is gone names where it points; links that lead to each other say so
    (both read as "no such file" before: os.path.exists is False for all three)."""
    (tmp_path / "dangling.jsonl").symlink_to(tmp_path / "moved.jsonl")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    with pytest.raises(UserError, match=r"a symbolic link to .*moved\.jsonl, which does not exist"):
        load_source(SourceConfig(path=str(tmp_path / "dangling.jsonl")))
    for loader in (lambda p: load_source(SourceConfig(path=p)), load_mcq):
        with pytest.raises(UserError, match="a symbolic link that leads back to itself"):
            loader(str(tmp_path / "a.jsonl"))


def test_folder_without_data_files(tmp_path):
    (tmp_path / "notes.md").write_text("# nothing to train on")
    with pytest.raises(UserError, match=r"no \.json"):
        load_source(SourceConfig(path=str(tmp_path)))


def test_missing_text_field_names_it_and_the_columns(tmp_path):
    path = write_jsonl(tmp_path / "notes.jsonl", [{"title": "t", "body": "b"}])
    with pytest.raises(UserError) as info:
        load_source(SourceConfig(path="json", data_files=path))
    message = str(info.value)
    assert "'text'" in message
    assert "title" in message and "body" in message
    assert "text_field" in message


def test_rows_without_their_text_are_named_before_training(tmp_path):
    # Named by the line an editor shows: a blank line is not a row, but it is a line.
    path = tmp_path / "notes.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{"title": "no text"}\n{"text": null}\n')
    with pytest.raises(UserError) as info:
        load_source(SourceConfig(path="json", data_files=str(path)))
    assert str(info.value) == f"{path} line 4: no 'text' (the first of 2 row(s) without it); fix or drop them"
    csv = tmp_path / "notes.csv"
    csv.write_text('id,text\n1,"a note\nover two lines"\n2,\n')
    with pytest.raises(UserError, match=f"{csv} line 4: no 'text'"):  # the header, then a row of two lines
        load_source(SourceConfig(path="csv", data_files=str(csv)))


def test_chat_rows_without_their_messages_are_named_before_training(tmp_path):
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turn}, {"messages": None}])
    with pytest.raises(UserError, match=r"chat.jsonl line 2: no 'messages' \(the first of 1 row\(s\) without it\)"):
        load_source(SourceConfig(path=path, format="chat"))
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q"}])
    with pytest.raises(
        UserError, match="no column 'completion' .*a chat source has messages, or prompt and completion"
    ):
        load_source(SourceConfig(path=path, format="chat"))


def test_streamed_rows_without_their_fields_are_named_as_they_are_read(tmp_path):
    rows = [{"body": f"note {i}"} for i in range(2500)]
    rows[1733] = {"body": None}
    path = write_jsonl(tmp_path / "notes.jsonl", rows)
    documents = load_source(SourceConfig(path=path, text_field="body"), streaming=True)
    read = []
    with pytest.raises(UserError) as info:
        read.extend(row["text"] for row in documents)
    assert str(info.value) == f"{path} line 1734: no 'body' (found as it streamed); fix or drop the row"
    assert read == [f"note {i}" for i in range(1000)]  # checked a batch of 1,000 rows at a time
    turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": turn}, {"messages": turn}, {"id": 3}])
    with pytest.raises(UserError, match="chat.jsonl line 3: no 'messages'"):
        list(load_source(SourceConfig(path=path, format="chat"), streaming=True))


def test_a_file_that_does_not_parse_is_named(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text('{"text": "a"}\nnot json\n')
    with pytest.raises(UserError) as info:
        load_source(SourceConfig(path=str(path)))
    assert str(info.value) == f"{path} line 2: not JSON (Expecting value at column 1); fix or drop that line"
    path.write_text('{"text": "a"}\n["a list"]\n')
    with pytest.raises(UserError, match="line 2: a JSON list, not an object with named fields"):
        load_source(SourceConfig(path=str(path)))


# ---------------------------------------------------------------------------
# Packing


DOCUMENTS = [
    "Aortic stenosis presents with angina, syncope and heart failure.",
    "Heparin is reversed by protamine.",
    "ECG",
    "Community-acquired pneumonia in adults is most often caused by Streptococcus pneumoniae, "
    "and the first-line outpatient treatment depends on comorbidities and local resistance.",
    "Hypokalaemia flattens T waves.",
    "Metformin is first-line therapy for type 2 diabetes.",
    "Ok.",
]


def expected_tokens(tokenizer, texts: list[str]) -> list[int]:
    ids = []
    for text in texts:
        ids += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    return ids


def expected_blocks(stream: list[int], max_length: int, bos: int | None) -> list[list[int]]:
    """The blocks of one packing batch, built token by token: a block that does not start at a
    document's BOS gets one in front of it, counted in max_length."""
    blocks, position = [], 0
    while position < len(stream):
        inserted = [bos] if bos is not None and stream[position] != bos else []
        taken = stream[position : position + max_length - len(inserted)]
        blocks.append(inserted + taken)
        position += len(taken)
    return blocks


@pytest.mark.parametrize("max_length", [2, 3, 16, 17])
def test_packing_starts_every_block_with_bos_and_loses_no_token(tokenizer, monkeypatch, max_length):
    # Small pack batches so the test sees several batch boundaries, each ending in a short block.
    monkeypatch.setattr(packing, "PACK_BATCH_DOCUMENTS", 3)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    blocks = list(pack_documents(Dataset.from_dict({"text": DOCUMENTS}), tokenizer, max_length)["input_ids"])
    assert all(block[0] == bos for block in blocks)
    reference, last_of_batch = [], set()
    for start in range(0, len(DOCUMENTS), 3):
        reference += expected_blocks(expected_tokens(tokenizer, DOCUMENTS[start : start + 3]), max_length, bos)
        last_of_batch.add(len(reference) - 1)
    assert blocks == reference
    assert all(len(block) == max_length for i, block in enumerate(blocks) if i not in last_of_batch)
    # Dropping the BOS put in front of blocks that continue a document gives the documents back.
    flat = []
    for block in blocks:
        continues = bool(flat) and flat[-1] != eos
        flat += block[1:] if continues else block
    assert flat == expected_tokens(tokenizer, DOCUMENTS)
    assert flat.count(eos) == len(DOCUMENTS)


def test_packing_without_bos_cuts_every_max_length(tokenizer, monkeypatch):
    # A tokenizer that adds no BOS (SmolLM2, GPT-2) packs as before: cut every max_length tokens.
    monkeypatch.setattr(packing, "adds_bos", lambda tokenizer: None)
    documents = Dataset.from_dict({"text": DOCUMENTS * 4})
    blocks = list(pack_documents(documents, tokenizer, 32)["input_ids"])
    stream = expected_tokens(tokenizer, DOCUMENTS * 4)
    assert blocks == [stream[i : i + 32] for i in range(0, len(stream), 32)]


def test_packing_default_batch_gives_full_blocks(tokenizer):
    documents = Dataset.from_dict({"text": DOCUMENTS * 4})
    blocks = list(pack_documents(documents, tokenizer, 32)["input_ids"])
    assert all(len(block) == 32 for block in blocks[:-1])
    assert 0 < len(blocks[-1]) <= 32
    assert blocks == expected_blocks(expected_tokens(tokenizer, DOCUMENTS * 4), 32, tokenizer.bos_token_id)


def test_packing_a_stream(tokenizer):
    documents = Dataset.from_dict({"text": DOCUMENTS * 4}).to_iterable_dataset()
    blocks = [list(row["input_ids"]) for row in pack_documents(documents, tokenizer, 32)]
    assert blocks == expected_blocks(expected_tokens(tokenizer, DOCUMENTS * 4), 32, tokenizer.bos_token_id)


def test_packing_counts_each_sources_tokens_and_documents_with_inserted_bos(tokenizer):
    texts = DOCUMENTS * 3
    sources = [i % 2 for i in range(len(texts))]
    batch = {"text": texts, "source": sources}
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    out = packing.pack_batch(batch, tokenizer, eos, 20, num_sources=2, bos=bos)
    # The source of every token, the BOS put in front of a block counting for the token after it.
    token_sources = [s for text, s in zip(texts, sources, strict=True) for _ in expected_tokens(tokenizer, [text])]
    stream = expected_tokens(tokenizer, texts)
    position = 0
    for block, tokens, documents in zip(out["input_ids"], out["source_tokens"], out["source_documents"], strict=True):
        inserted = stream[position] != bos
        taken = len(block) - inserted
        owners = ([token_sources[position]] if inserted else []) + token_sources[position : position + taken]
        assert list(tokens) == [owners.count(0), owners.count(1)]
        ended = [token_sources[i] for i in range(position, position + taken) if stream[i] == eos]
        assert list(documents) == [ended.count(0), ended.count(1)]
        position += taken
    assert position == len(stream)


def test_packing_needs_room_beside_bos(tokenizer):
    with pytest.raises(UserError, match="max_length: 1 leaves no room beside BOS"):
        pack_documents(Dataset.from_dict({"text": ["a"]}), tokenizer, 1)


def test_packing_needs_an_eos_token(tokenizer):
    class NoEos:
        eos_token_id = None
        name_or_path = "some/tokenizer"

    with pytest.raises(UserError, match="tokenizer some/tokenizer: no EOS token"):
        pack_documents(Dataset.from_dict({"text": ["a"]}), NoEos(), 8)


# ---------------------------------------------------------------------------
# pretraining_data


def write_recipe(tmp_path: Path, **keys) -> str:
    data = {"model_name_or_path": "m", "use_cpu": True, "report_to": "none", "output_dir": str(tmp_path / "out")}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**data, **keys}))
    return str(path)


def test_pretraining_data_packs_train_and_each_eval_set(tmp_path, tokenizer):
    notes = write_jsonl(tmp_path / "notes.jsonl", [{"text": f"{d} Note {i}."} for i, d in enumerate(DOCUMENTS * 6)])
    held_out = write_jsonl(tmp_path / "held_out.jsonl", [{"text": d} for d in DOCUMENTS])
    mcq = write_jsonl(
        tmp_path / "mcq.jsonl",
        [{"question": "Which drug reverses heparin?", "options": ["Vitamin K", "Protamine"], "answer": "B"}] * 3,
    )
    path = write_recipe(
        tmp_path,
        max_length=24,
        dataset_mixture={
            "seed": 0,
            "sources": [
                {"path": "json", "data_files": notes, "weight": 0.8},
                {"path": "json", "data_files": mcq, "format": "usmle", "weight": 0.2},
            ],
        },
        eval_sets={
            "notes": {"path": "json", "data_files": held_out},
            "usmle": {"path": "json", "data_files": mcq, "format": "usmle"},
        },
    )
    recipe, args, _ = parse_recipe("cpt", [path])
    train, evals = pretraining_data(recipe, tokenizer, args.max_length)
    assert train.column_names == ["input_ids", "source_tokens", "source_documents"]
    lengths = [len(block) for block in train["input_ids"]]
    assert [sum(counts) for counts in train["source_tokens"]] == lengths
    assert len(lengths) > 5
    assert all(n == 24 for n in lengths[:-1])
    assert sorted(evals) == ["notes", "usmle"]
    assert list(evals["notes"]["input_ids"]) == expected_blocks(
        expected_tokens(tokenizer, DOCUMENTS), 24, tokenizer.bos_token_id
    )
    usmle_ids = [t for block in evals["usmle"]["input_ids"] for t in block[1:]]  # each block's BOS dropped
    assert tokenizer.decode(usmle_ids).count("Answer: B") == 3


def test_pretraining_data_without_mixture(tmp_path, tokenizer):
    recipe, args, _ = parse_recipe("cpt", [write_recipe(tmp_path)])
    with pytest.raises(UserError, match="dataset_mixture"):
        pretraining_data(recipe, tokenizer, args.max_length)


def test_an_sft_recipe_reads_pubmedqa_in_its_setting_and_writes_the_conclusion_first(tmp_path):
    """The recipe's data source picks the setting for training and eval rows alike; with_explanation
    and chain_of_thought make the target PubMedQA's long answer, then the label."""
    from medrecipes.data.sft import sft_data

    row = {"QUESTION": "Does it work?", "CONTEXTS": ["Methods.", "Results."], "final_decision": "no",
           "LONG_ANSWER": "It did not work."}  # fmt: skip
    path = tmp_path / "pqal.json"
    path.write_text(json.dumps({"1": row}), encoding="utf-8")
    source = {"path": str(path), "format": "usmle", "pubmedqa_setting": "reasoning_free"}
    recipe_file = tmp_path / "sft.yaml"
    recipe_file.write_text(yaml.safe_dump({
        "model_name_or_path": "m", "use_cpu": True, "report_to": "none", "output_dir": str(tmp_path / "out"),
        "dataset_mixture": {"sources": [source]}, "eval_sets": {"dev": source},
        "chain_of_thought": True, "with_explanation": True,
    }))  # fmt: skip
    recipe, _, _ = parse_recipe("sft", [str(recipe_file)])
    train, evals, mcq = sft_data(recipe)
    user, answer = train[0]["messages"][-2]["content"], train[0]["messages"][-1]["content"]
    assert user.startswith("Context: Conclusion: It did not work.\n\nDoes it work?") and "Methods." not in user
    assert answer == "It did not work.\n\nFinal Answer: B"
    assert (
        evals["dev"][0]["messages"] == train[0]["messages"]
        and mcq["dev"][0]["context"] == "Conclusion: It did not work."
    )


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"prompt": "Q?", "chosen": "", "rejected": "B. no"}, "chosen is empty"),
        ({"prompt": "Q?", "chosen": "A. yes", "rejected": "  "}, "rejected is empty"),
        ({"prompt": "Q?", "completion": [{"role": "assistant", "content": ""}], "label": True}, "completion is empty"),
        (
            {"prompt": "Q?", "completion": [{"role": "assistant", "content": None}], "label": False},
            "completion is empty",
        ),
    ],
)
def test_an_empty_answer_in_preference_data_is_one_line(row, problem):
    from medrecipes.data.rows import check_answers

    with pytest.raises(UserError, match=f"{problem}: there is no answer to prefer or avoid"):
        check_answers([row], [0], SourceConfig(path="pairs.jsonl", format="preference"))


def _drawn(fields: dict, balance: bool, seed: int = 42) -> list[tuple[str, str]]:
    """(question id, gold answer) of each row a training source gives, in order."""
    source = SourceConfig(**fields, balance_answers=balance)
    rows = load_source(source, render=lambda row: {"id": row["id"], "answer": row["answer"]}, seed=seed)
    return list(zip(rows["id"], rows["answer"], strict=True))


BALANCED_SOURCES = [
    pytest.param({"path": "data/usmle_sample/train.jsonl", "format": "usmle"}, id="bundled USMLE"),
    pytest.param(
        {"path": str(SHARED_DATA / "pubmedqa" / "pqal_trainval_500.json"), "format": "usmle",
         "pubmedqa_setting": "reasoning_free"},
        id="PubMedQA PQA-L",
        marks=pytest.mark.skipif(not (SHARED_DATA / "pubmedqa").is_dir(), reason="no ../shared/data"),
    ),
]  # fmt: skip


@pytest.mark.parametrize("fields", BALANCED_SOURCES)
def test_balance_answers_draws_every_answer_as_often_as_the_commonest(fields):
    """Every gold answer of a training source as often as the commonest one; each question kept at
    least once, and within an answer no question drawn twice more than another; the same rows for
    the same seed."""
    plain = _drawn(fields, balance=False)
    written = Counter(answer for _, answer in plain)
    drawn = _drawn(fields, balance=True)
    assert Counter(answer for _, answer in drawn) == dict.fromkeys(written, max(written.values()))
    assert {question for question, _ in drawn} == {question for question, _ in plain}
    for answer in written:
        times = Counter(question for question, a in drawn if a == answer)
        assert max(times.values()) - min(times.values()) <= 1, answer
    assert _drawn(fields, balance=True) == drawn


def test_balance_answers_repeats_other_rows_for_another_seed(tmp_path):
    rows = [{"question": f"Q{i}?", "options": {"A": "a", "B": "b"}, "answer": "A" if i < 7 else "B"} for i in range(9)]
    fields = {"path": write_jsonl(tmp_path / "q.jsonl", rows), "format": "usmle"}
    seeds = {tuple(_drawn(fields, balance=True, seed=seed)) for seed in range(6)}
    assert len(seeds) > 1  # the 2 B questions are each drawn 3 or 4 times: which one more follows the seed
    assert all(Counter(a for _, a in drawn) == {"A": 7, "B": 7} for drawn in seeds)


@pytest.mark.parametrize(
    "where, source, problem",
    [
        ("dataset_mixture", {"path": "data/medical_text/train.jsonl", "format": "text"}, "this source is format text"),
        ("eval_sets", {"path": "data/usmle_sample/test.jsonl", "format": "usmle"}, "an eval set is scored as it is"),
    ],
)
def test_balance_answers_is_a_key_of_training_multiple_choice_sources_only(tmp_path, where, source, problem):
    usmle = {"path": "data/usmle_sample/train.jsonl", "format": "usmle"}
    data = {
        "dataset_mixture": {"sources": [{**source, "balance_answers": True} if where == "dataset_mixture" else usmle]},
        "eval_sets": {"dev": {**source, "balance_answers": True}} if where == "eval_sets" else {},
    }
    recipe_file = tmp_path / "sft.yaml"
    recipe_file.write_text(
        yaml.safe_dump({"model_name_or_path": "m", "use_cpu": True, "output_dir": str(tmp_path / "o"), **data})
    )
    with pytest.raises(UserError, match=rf"{where}.*balance_answers.*{problem}; set it on format: usmle sources"):
        parse_recipe("sft", [str(recipe_file)])


def test_preference_rows_given_twice_are_counted_and_named(tmp_path, caplog):
    """A pair (or an unpaired answer) that repeats an earlier one, whatever its id, is said once
    with the lines an editor shows; the rows stay (the user decides)."""
    lines = (Path(__file__).resolve().parents[1] / "data/usmle_sample/pairs_train.jsonl").read_text().splitlines()
    repeated = [{**json.loads(line), "id": f"copy-{i}"} for i, line in enumerate(lines[:2])]
    path = write_jsonl(tmp_path / "pairs.jsonl", [json.loads(line) for line in lines] + repeated)
    with caplog.at_level("WARNING", logger="medrecipes.data.sources"):
        rows = load_source(SourceConfig(path=str(path), format="preference"))
    assert len(rows) == len(lines) + 2
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"source '{path}': 2 row(s) repeat an earlier one (line {len(lines) + 1} repeats line 1, "
        f"line {len(lines) + 2} repeats line 2): each copy trains again; drop the repeats"
    ]


@pytest.mark.parametrize("form", ["text", "chat"])
def test_documents_and_conversations_given_twice_are_counted_and_named(tmp_path, caplog, form):
    """A document or a conversation that repeats an earlier one is said once with its lines; a blank
    document is said as blank, not as a repeat."""
    rows = [{"text": t} for t in ("Aspirin.", "", "Heparin.", "Aspirin.", "")]
    if form == "chat":
        rows = [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": r["text"] or "-"}]}
                for r in rows]  # fmt: skip
    path = write_jsonl(tmp_path / "rows.jsonl", rows)
    with caplog.at_level("WARNING"):
        load_source(SourceConfig(path=str(path), format=form))
    said = [r.getMessage() for r in caplog.records if "repeat" in r.getMessage()]
    repeats = "line 4 repeats line 1" + (", line 5 repeats line 2" if form == "chat" else "")
    count = 2 if form == "chat" else 1
    assert said == [
        f"source '{path}': {count} row(s) repeat an earlier one ({repeats}): each copy trains again; drop the repeats"
    ]


def test_an_answer_labelled_both_ways_is_said(tmp_path, caplog):
    """The same unpaired prompt and answer, desirable on one line and not on another: said with both
    lines; a repeat with the same label is a repeat, not a contradiction."""
    rows = [{"prompt": "q", "completion": "a", "label": True}, {"prompt": "q", "completion": "b", "label": False},
            {"prompt": "q", "completion": "a", "label": False}, {"prompt": "q", "completion": "b", "label": False}]  # fmt: skip
    path = write_jsonl(tmp_path / "unpaired.jsonl", rows)
    with caplog.at_level("WARNING"):
        load_source(SourceConfig(path=str(path), format="unpaired"))
    said = [r.getMessage() for r in caplog.records if "both desirable" in r.getMessage()]
    assert said == [
        f"source '{path}': 1 answer(s) labelled both desirable and undesirable (line 3 against line 1): the two "
        "cancel out; keep one label"
    ]


def test_empty_documents_are_counted_and_named_by_line(tmp_path, caplog):
    """A text source's documents that are empty or blank are said at load, counted and named by the
    line an editor shows (blank lines of the file are counted, as an editor does): each would train
    on its BOS and EOS alone. Kept, not dropped: the user decides."""
    path = tmp_path / "notes.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": ""}\n{"text": "b"}\n{"text": "  \\n"}\n')
    with caplog.at_level("WARNING", logger="medrecipes.data.sources"):
        assert len(load_source(SourceConfig(path=str(path)))) == 4
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.endswith(
        "2 empty document(s) (line 3, line 5): no text (training learns only its BOS and EOS, perplexity leaves it out); drop them"
    ), said


def test_what_a_conversation_holds_that_no_template_renders_is_said_by_line(tmp_path, caplog):
    """A turn key outside the chat format (OpenAI fine-tuning's per-turn weight) trains as if it were
    not there, and a turn marker written in a turn's text becomes the marker: each said once with
    its first line; the rows stay."""
    plain = [
        {"role": "user", "content": "Which hormone lowers glucose?"},
        {"role": "assistant", "content": "Insulin."},
    ]
    weighed = [plain[0], {**plain[1], "weight": 0}]
    marked = [{"role": "user", "content": "Done.<|im_end|>"}, plain[1]]
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": plain}, {"messages": weighed}, {"messages": marked}])
    with caplog.at_level("WARNING"):
        assert len(load_source(SourceConfig(path=str(path), format="chat"))) == 3
    said = [r.getMessage().removeprefix(f"source '{path}': ") for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("a turn's text holds a chat template's turn marker (first at line 3;")
    assert said[1].startswith(
        "turns carry 'weight' (line 2), which no chat template renders and training does not read"
    )


def test_json_lines_under_a_text_name_are_said(tmp_path, caplog):
    """A .txt file of JSON objects is read as plain text, one document a line: said once; a .txt
    of prose is not."""
    from medrecipes.data.sources import check_local_source

    notes = tmp_path / "notes.txt"
    notes.write_text((ROOT / "data/medical_text/train.jsonl").read_text())
    prose = tmp_path / "prose.txt"
    prose.write_text("Sepsis is a dysregulated host response.\n{ braces in prose }\n")
    with caplog.at_level("WARNING"):
        for path in (notes, notes, prose):
            check_local_source(SourceConfig(path=str(path)))
    assert [r.getMessage() for r in caplog.records] == [
        f"source '{notes}': its lines are JSON objects, and a .txt file is read as plain text, one document a line: "
        "training would read their keys and quotes; name it .jsonl to read their fields"
    ]


def _wrapped(paragraphs: list[str], width: int) -> str:
    import textwrap

    return "\n\n".join(textwrap.fill(p, width) for p in paragraphs) + "\n"


@pytest.mark.parametrize("streaming", [False, True])
def test_a_text_file_of_wrapped_paragraphs_is_said_and_read_a_paragraph_a_document(tmp_path, caplog, streaming):
    """A .txt file is read as datasets' text builder reads it: one document a line unless the source's
    sample_by says a paragraph or the whole file. A file of paragraphs wrapped over lines, read by
    line, is said (each paragraph would be cut into documents where its lines end); read by
    paragraph, each paragraph is one document. A file of one-line documents, blank lines between, is
    not said as wrapped: its blank lines are, with the key that reads around them."""
    texts = [" ".join(f"finding {i}-{w} of the chest film" for w in range(12)) for i in range(4)]
    book = tmp_path / "book.txt"
    book.write_text(_wrapped(texts, 60))
    lines = tmp_path / "lines.txt"
    lines.write_text("\n\n".join(texts) + "\n")

    def documents(path, sample_by=None):
        rows = load_source(SourceConfig(path=str(path), sample_by=sample_by), streaming=streaming)
        return [row["text"] for row in rows]

    with caplog.at_level("WARNING"):
        by_line = documents(book)
    lines_each = sum(len(_wrapped([t], 60).splitlines()) for t in texts) / len(texts)
    said = [r.getMessage() for r in caplog.records if "run over several lines" in r.getMessage()]
    assert said == [
        f"source '{book}': its paragraphs run over several lines ({lines_each:.1f} lines a paragraph, blank lines "
        "between), and a .txt file is read one document a line; set sample_by: paragraph to read a paragraph a "
        "document (perplexity: --sample-by paragraph), or sample_by: line to keep lines"
    ]
    assert len([d for d in by_line if d.strip()]) == sum(len(_wrapped([t], 60).splitlines()) for t in texts)
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert [d.replace("\n", " ") for d in documents(book, "paragraph")] == texts
        assert documents(book, "document") == [book.read_text()]
        assert documents(lines) == [texts[0], "", texts[1], "", texts[2], "", texts[3]]
    assert not any("run over several lines" in r.getMessage() for r in caplog.records)
    if not streaming:  # a stream's rows are checked as they are read
        blanks = [r.getMessage() for r in caplog.records if "empty document" in r.getMessage()]
        assert blanks and blanks[-1].endswith(
            "drop them, or set sample_by: paragraph to read what blank lines part as documents"
        )


def test_sample_by_is_the_text_builders_own_option():
    """The recipe's sample_by takes the values datasets' text builder does, and only for what that
    builder reads: a source of another builder or format is one line at parse, a folder of another
    builder's files one line when read."""
    import typing

    from datasets.packaged_modules.text.text import TextConfig

    from medrecipes.data_config import SAMPLE_BY

    assert SAMPLE_BY == typing.get_args(typing.get_type_hints(TextConfig)["sample_by"])


@pytest.mark.parametrize("field", ["question", "options"])
def test_a_turn_marker_in_a_questions_text_is_said_by_line(tmp_path, caplog, field):
    """A question or an option that holds <end_of_turn>: the prompt built from it ends the user's
    turn in its middle. Said with its line; the rows stay."""
    from medrecipes.data.sources import load_mcq_source

    rows = [json.loads(line) for line in (ROOT / "data/usmle_sample/train.jsonl").read_text().splitlines()]
    if field == "question":
        rows[2]["question"] += " <end_of_turn>"
    else:
        rows[2]["options"]["B"] += "<|im_start|>user"
    path = write_jsonl(tmp_path / "marked.jsonl", rows)
    with caplog.at_level("WARNING"):
        assert len(load_mcq_source(SourceConfig(path=str(path), format="usmle"))) == len(rows)
    said = [r.getMessage() for r in caplog.records if "turn marker" in r.getMessage()]
    assert said == [
        f"source '{path}': a question's or option's text holds a chat template's turn marker (first at line 3; "
        "<start_of_turn>, <end_of_turn>, <|im_start|>, <|im_end|>): the tokenizer reads it as the marker itself, so "
        "the text opens or ends a turn of its own; remove it from the text"
    ]


def test_a_split_named_for_one_file_is_said_to_choose_nothing(caplog):
    """A file is one split: a split's name without a slice reads all its rows, and says so."""
    from medrecipes.data.sources import load_mcq_source

    with caplog.at_level("WARNING"):
        rows = load_mcq_source(SourceConfig(path="data/usmle_sample/test.jsonl", format="usmle", split="validation"))
    assert len(rows) == 20
    assert [r.getMessage() for r in caplog.records] == [
        "source 'data/usmle_sample/test.jsonl': split 'validation' chooses nothing in a file, which is one split: all "
        "its rows are read; write a slice (train[:80%]) to take part of it, or give a folder of split files"
    ]


def test_a_turn_key_the_chat_template_does_not_render_is_said(chat_model, caplog):
    """A speaker's name on a turn: said where the model's template drops it, not where it renders it."""
    from transformers import AutoTokenizer

    from medrecipes.data.rows import say_unrendered_keys

    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    turns = [[{"role": "user", "content": "Q", "name": "bob"}, {"role": "assistant", "content": "A"}]]
    with caplog.at_level("WARNING"):
        say_unrendered_keys(turns, tokenizer, "dataset_mixture")
    assert [r.getMessage() for r in caplog.records] == [
        "dataset_mixture: user turns carry 'name', which the model's chat template does not render: training never "
        "sees it; drop it, or write what it says into the turn's text"
    ]
    caplog.clear()
    tokenizer.chat_template = "{% for m in messages %}{{ m.role }}{{ m.name or '' }}: {{ m.content }}\n{% endfor %}"
    with caplog.at_level("WARNING"):
        say_unrendered_keys(turns, tokenizer, "dataset_mixture")
    assert caplog.records == []


def test_a_pattern_is_data_files_and_not_a_path(tmp_path):
    """A source's path names one file or folder: a pattern there is named as one, with the keys that
    take it; as data_files a multiple-choice source reads its files, as datasets reads the others'."""
    from medrecipes.data.sources import check_local_source, load_mcq_source

    pattern = str(ROOT / "data/usmle_sample/t*.jsonl")
    with pytest.raises(UserError, match=r"a pattern \(2 files match it\), where path names one file or folder; write "
                       r"path: json and data_files: .*t\*\.jsonl"):  # fmt: skip
        check_local_source(SourceConfig(path=pattern, format="usmle"))
    rows = load_mcq_source(SourceConfig(path="json", data_files=pattern, format="usmle"))
    assert len(rows) == 80  # train.jsonl's 60 and test.jsonl's 20


@pytest.mark.parametrize("streaming", [False, True])
def test_a_text_files_byte_order_mark_is_no_text(tmp_path, streaming):
    """Windows' Notepad starts a UTF-8 file with a byte-order mark: not a character of its first document."""
    marked = tmp_path / "notes.txt"
    marked.write_bytes("Scurvy follows a lack of vitamin C.\nRickets, of vitamin D.\n".encode("utf-8-sig"))
    rows = load_source(SourceConfig(path=str(marked)), streaming=streaming)
    assert [row["text"] for row in rows] == ["Scurvy follows a lack of vitamin C.", "Rickets, of vitamin D."]


@pytest.mark.parametrize("width", [2, 3, 5])
def test_a_csv_quote_left_open_that_a_later_row_closes_is_said_with_its_line(tmp_path, caplog, width):
    """A quote opened in a cell and closed by a later row's joins the rows between into one cell
    (every text still read, the rows miscounted): said once, naming the line it opens on, where a
    joined line has the shape of the file's rows (its width, a number in its id column, an id no
    row has). A cell whose lines are text is not named, commas in them or not, nor one whose lines
    are numbered as the rows are."""
    import csv
    import io
    import random

    from medrecipes.data.sources import check_local_source

    rng = random.Random(width)
    words = ["iron", "scurvy", "heparin"]
    rows = [[str(i), *(" ".join(rng.choice(words) for _ in range(3)) for _ in range(width - 1))] for i in range(8)]
    rows[2][-1] = "A note\nover two lines, " + ", ".join(words[: width - 1]) + "\nof text"  # commas: still text
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([["id", *(f"col{j}" for j in range(1, width))], *rows])
    whole = tmp_path / "whole.csv"
    whole.write_text(out.getvalue())
    lines = out.getvalue().splitlines(keepends=True)
    opened = 7  # a data line after the note's three: a quote opened before its last cell, never closed there
    head, _, tail = lines[opened - 1].rstrip("\n").rpartition(",")
    lines[opened - 1] = f'{head},"{tail}\n'
    lines[opened] = lines[opened].rstrip("\n") + '"\n'  # closed at the end of the next row
    broken = tmp_path / "broken.csv"
    broken.write_text("".join(lines))
    # A note whose points are numbered as the rows are: its lines repeat ids that rows have, so no row is missing.
    numbered = tmp_path / "numbered.csv"
    numbered.write_text(f'id{",x" * (width - 2)},body\n0{",a" * (width - 2)},"Plan:\n1{",b" * (width - 2)}, rest\n'
                        f'2{",c" * (width - 2)}, fluids"\n' + "".join(f"{i}{',d' * (width - 2)},row {i}\n" for i in (1, 2, 3)))  # fmt: skip
    assert len(list(csv.reader(numbered.open()))) == 5  # valid: a header and four rows
    with caplog.at_level("WARNING"):
        for path in (whole, numbered, broken, broken, tmp_path / "." / "broken.csv"):
            check_local_source(SourceConfig(path=str(path)))
    said = [r.getMessage() for r in caplog.records if "quote opened" in r.getMessage()]
    assert said == [
        f"source {broken} line {opened}: a quote opened on this line closes on line {opened + 1}, so the lines "
        "between, some of which read as rows of their own, are text of this row's cell; if they are rows, close the "
        'quote on its line (a quote inside a cell is written "")'
    ]
