"""The streaming pretraining mixture: proportions, windows, and a position that survives resume."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import write_jsonl
from transformers import AutoModelForCausalLM
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from medrecipes.config import parse_recipe
from medrecipes.data import packing
from medrecipes.data.mixture import mean_document_tokens
from medrecipes.data.pretraining import pretraining_data
from medrecipes.data.sources import load_source
from medrecipes.data.stream import STATE_FILE, TokenStream
from medrecipes.errors import UserError
from medrecipes.training.trainers import CausalLMTrainer

WORDS = "aorta valve heparin protamine kidney insulin cortisol sepsis fever anaemia".split()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, str]:
    """Short documents (3 words) and long ones (30 words), each naming its source and row."""
    folder = tmp_path_factory.mktemp("stream-corpora")
    short = [{"text": f"short {i:05d} {WORDS[i % 10]}"} for i in range(20_000)]
    long = [{"text": f"long {i:05d} " + " ".join(WORDS[(i + k) % 10] for k in range(28))} for i in range(3_000)]
    return {"short": write_jsonl(folder / "short.jsonl", short), "long": write_jsonl(folder / "long.jsonl", long)}


def first_blocks(stream, n: int) -> list[dict]:
    return [block for _, block in zip(range(n), stream, strict=False)]


def stream_recipe(tmp_path, corpora, tokenizer_path, *overrides, **mixture):
    """The parsed recipe of a two-source streaming mixture (written to tmp_path/stream.yaml)."""
    data = {
        "model_name_or_path": tokenizer_path,
        "use_cpu": True,
        "report_to": "none",
        "output_dir": str(tmp_path / "out"),
        "max_length": 32,
        "dataloader_num_workers": 0,
        "max_steps": 100_000,  # a stream has no length: the run ends at max_steps
        "dataset_mixture": {
            "seed": 3,
            "streaming": True,
            "shuffle_buffer": 8,
            "sources": [
                {"path": "json", "data_files": corpora["short"], "weight": 0.5},
                {"path": "json", "data_files": corpora["long"], "weight": 0.5},
            ],
            **mixture,
        },
    }
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump(data))
    return parse_recipe("cpt", [str(path), *overrides])


@pytest.mark.parametrize("unit", ["documents", "tokens"])
def test_weights_in_documents_or_tokens_hold_over_10k_documents(tmp_path, corpora, tiny_model, tokenizer, unit):
    # Equal weights: in documents, each source gives half the documents (so the long one most
    # tokens); in tokens, each gives half the tokens. Measured over the blocks of 10k documents.
    recipe, args, _ = stream_recipe(tmp_path, corpora, tiny_model, "--max_length", "128", weight_unit=unit)
    train, _ = pretraining_data(recipe, tokenizer, args.max_length)
    assert isinstance(train, TokenStream)
    blocks = documents = 0
    for block in train:
        blocks, documents = blocks + 1, documents + block["input_ids"].count(tokenizer.eos_token_id)
        if documents >= 10_000:
            break
    shares = train.tokens_at(blocks)
    long_share = next(n for name, n in shares.items() if name.endswith("/long")) / sum(shares.values())
    if unit == "tokens":
        assert long_share == pytest.approx(0.5, abs=0.03)
    else:
        short, long = (mean_document_tokens(load_source(s), tokenizer) for s in recipe.mixture.sources)
        assert long_share == pytest.approx(long / (long + short), abs=0.03)


def test_resumed_stream_continues_with_the_next_unseen_block(tmp_path, corpora, tiny_model, tokenizer, monkeypatch):
    # Small pack batches and a small source, so that positions fall inside and between pack
    # batches, windows of 8 and passes over the data.
    monkeypatch.setattr(packing, "PACK_BATCH_DOCUMENTS", 7)
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": f"small {i} " + WORDS[i % 10] * 3} for i in range(40)])
    recipe, args, _ = stream_recipe(
        tmp_path, {**corpora, "long": small}, tiny_model, stopping_strategy="first_exhausted"
    )
    straight, _ = pretraining_data(recipe, tokenizer, args.max_length)
    expected = first_blocks(straight, 120)
    ends_first_pass = 0
    for position in (0, 5, 8, 13, 40, 77):
        stream, _ = pretraining_data(recipe, tokenizer, args.max_length)
        iterator = iter(stream)
        for _ in range(position + 9):  # read ahead past the position, as a DataLoader does
            next(iterator)
        state = json.loads(json.dumps(stream.state_at(position)))  # as saved in a checkpoint
        resumed, _ = pretraining_data(recipe, tokenizer, args.max_length)
        resumed.load_state(state)
        assert [b["input_ids"] for b in first_blocks(resumed, 120 - position)] == [
            b["input_ids"] for b in expected[position:]
        ]
        assert resumed.tokens_at(position) == stream.tokens_at(position)
        ends_first_pass = max(ends_first_pass, state["pass"])
    assert ends_first_pass >= 1  # one of the positions was in the second pass over the data


def test_state_from_other_settings_is_refused(tmp_path, corpora, tiny_model, tokenizer, monkeypatch):
    monkeypatch.setattr(packing, "PACK_BATCH_DOCUMENTS", 50)  # the first blocks come sooner
    recipe, args, _ = stream_recipe(tmp_path, corpora, tiny_model)
    stream, _ = pretraining_data(recipe, tokenizer, args.max_length)
    first_blocks(stream, 10)
    state = stream.state_at(10)
    other, _ = pretraining_data(stream_recipe(tmp_path, corpora, tiny_model, shuffle_buffer=4)[0], tokenizer, 32)
    with pytest.raises(UserError, match="shuffle_buffer"):
        other.load_state(state)


class RecordingTrainer(CausalLMTrainer):
    """Keeps every batch it trains on."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen.append(inputs["input_ids"].clone())
        return super().training_step(model, inputs, num_items_in_batch)


def train(recipe, args, tokenizer, tiny_model, resume=None) -> RecordingTrainer:
    stream, _ = pretraining_data(recipe, tokenizer, args.max_length)
    torch.manual_seed(0)
    trainer = RecordingTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=args,
        train_dataset=stream,
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id),
    )
    trainer.seen = []
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def test_trainer_resumes_the_stream_without_replay_or_skip(tmp_path, corpora, tiny_model, tokenizer, monkeypatch):
    monkeypatch.setattr(packing, "PACK_BATCH_DOCUMENTS", 200)  # the first blocks come sooner
    overrides = ["--max_steps", "8", "--save_steps", "4", "--logging_steps", "1"]
    overrides += ["--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "2"]
    recipe, args, _ = stream_recipe(tmp_path, corpora, tiny_model, *overrides)
    straight = train(recipe, args, tokenizer, tiny_model)
    assert len(straight.seen) == 16
    saved = json.loads((Path(args.output_dir) / "checkpoint-4" / STATE_FILE).read_text())
    assert saved["samples"] == 4 * 2 * 2 and saved["step"] == 4

    resumed_args = stream_recipe(tmp_path, corpora, tiny_model, *overrides)[1]
    resumed = train(recipe, resumed_args, tokenizer, tiny_model, resume=str(Path(args.output_dir) / "checkpoint-4"))
    assert len(resumed.seen) == 8
    assert all(torch.equal(a, b) for a, b in zip(resumed.seen, straight.seen[8:], strict=True))
    logged = [e for e in resumed.state.log_history if "loss" in e]
    straight_logged = {e["step"]: e for e in straight.state.log_history if "loss" in e}
    for entry in logged:
        tokens = {k: v for k, v in entry.items() if k.startswith("data/tokens/")}
        assert len(tokens) == 2
        assert tokens == {k: v for k, v in straight_logged[entry["step"]].items() if k.startswith("data/tokens/")}
        assert entry["loss"] == pytest.approx(straight_logged[entry["step"]]["loss"], abs=1e-6)
    assert sum(v for k, v in logged[-1].items() if k.startswith("data/tokens/")) == 16 * 2 * 32

    # A checkpoint without the position (an older run's) resumes by reading the stream again.
    (Path(args.output_dir) / "checkpoint-4" / STATE_FILE).unlink()
    again_args = stream_recipe(tmp_path, corpora, tiny_model, *overrides)[1]
    again = train(recipe, again_args, tokenizer, tiny_model, resume=str(Path(args.output_dir) / "checkpoint-4"))
    assert all(torch.equal(a, b) for a, b in zip(again.seen, straight.seen[8:], strict=True))


def test_streaming_needs_the_stream_in_the_training_process(tmp_path, corpora, tiny_model, tokenizer):
    recipe, args, _ = stream_recipe(tmp_path, corpora, tiny_model, "--dataloader_num_workers", "2", "--max_steps", "2")
    with pytest.raises(UserError, match="dataloader_num_workers"):
        train(recipe, args, tokenizer, tiny_model)


@pytest.mark.parametrize(
    "line, message, trained",
    [
        ('{"title": "no text"}', "line 1501: no 'text' (found as it streamed); fix or drop the row", True),
        # Found when datasets reads the file's first block to learn its columns, before a step.
        (
            '{"text": "cut off',
            "line 1501: not JSON (Unterminated string starting at column 10); fix or drop that line",
            False,
        ),
    ],
    ids=["no text", "not JSON"],
)
def test_a_bad_streamed_row_stops_the_run_there_and_keeps_its_checkpoints(
    tmp_path, tiny_model, tokenizer, monkeypatch, line, message, trained
):
    monkeypatch.setattr(packing, "PACK_BATCH_DOCUMENTS", 200)
    rows = [{"text": f"note {i:05d} " + " ".join(WORDS[(i + k) % 10] for k in range(8))} for i in range(3000)]
    notes = Path(write_jsonl(tmp_path / "notes.jsonl", rows))
    lines = notes.read_text().splitlines()
    lines[1500] = line  # pyarrow reads the file in blocks and counts rows within its block
    notes.write_text("\n".join(lines) + "\n")
    clean = write_jsonl(tmp_path / "clean.jsonl", rows)  # a second source, without the bad row
    overrides = ["--max_steps", "1000", "--save_steps", "10", "--per_device_train_batch_size", "8"]
    recipe, args, _ = stream_recipe(tmp_path, {"short": str(notes), "long": str(clean)}, tiny_model, *overrides)
    with pytest.raises(UserError) as info:
        train(recipe, args, tokenizer, tiny_model)
    assert str(info.value) == f"{notes} {message}"
    assert (Path(args.output_dir) / "checkpoint-10").is_dir() == trained  # trained on the rows before it
