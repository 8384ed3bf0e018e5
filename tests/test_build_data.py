"""`medrecipes build-data`: built folders train like the sources, the manifest, the content cache,
object-storage sources and checkpoint copies."""

import json
import os
import re
from pathlib import Path

import datasets
import fsspec
import pytest
import torch
import yaml
from conftest import PYTHON, ROOT, run, write_jsonl
from transformers import AutoModelForCausalLM
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from medrecipes.cli import main
from medrecipes.config import SourceConfig, parse_recipe
from medrecipes.data.build import build_data
from medrecipes.data.manifest import decontamination_summary
from medrecipes.data.pretraining import pretraining_data
from medrecipes.data.sources import load_source
from medrecipes.data.stream import TokenStream
from medrecipes.errors import UserError
from medrecipes.mirror import COMPLETE, copy_to_url, mark_complete
from medrecipes.training.trainers import CausalLMTrainer

MEDQA_TEST = ROOT.parent / "shared" / "data" / "medqa" / "medqa_us_4opt_test.jsonl"
QUESTION = (
    "A 67-year-old man with long-standing hypertension presents with exertional chest pain, syncope on climbing "
    "stairs and a harsh crescendo-decrescendo systolic murmur radiating to both carotid arteries."
)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    notes = [json.loads(line) for line in (ROOT / "data" / "medical_text" / "train.jsonl").open()]
    mcq = {"id": "q1", "question": QUESTION, "options": ["Aortic stenosis", "Mitral stenosis"], "answer": "A"}
    # One training note repeats the eval question, in other case and punctuation.
    planted = {"text": "Case report. " + QUESTION.upper().replace(",", " ;").replace("-", " ") + " Echo followed."}
    return {
        "notes": write_jsonl(tmp_path / "notes.jsonl", [{"text": n["text"]} for n in notes[:40]] + [planted]),
        "mcq": write_jsonl(tmp_path / "mcq.jsonl", [mcq]),
        "held_out": str(ROOT / "data" / "medical_text" / "eval.jsonl"),
        "usmle": str(ROOT / "data" / "usmle_sample" / "train.jsonl"),
    }


def recipe_file(tmp_path, model, files, streaming: bool, **keys) -> str:
    data = {
        "model_name_or_path": model,
        "use_cpu": True,
        "report_to": "none",
        "output_dir": str(tmp_path / "out"),
        "max_length": 64,
        "max_steps": 6,
        "per_device_train_batch_size": 4,
        "built_data": str(tmp_path / "built"),
        "dataset_mixture": {
            "seed": 7,
            "streaming": streaming,
            "shuffle_buffer": 8,
            "sources": [
                {"path": "json", "data_files": files["notes"], "weight": 0.7},
                {"path": "json", "data_files": files["usmle"], "format": "usmle", "weight": 0.3},
            ],
        },
        "eval_sets": {"held_out": {"path": "json", "data_files": files["held_out"]}},
        "decontaminate_against": [files["mcq"]],
        **keys,
    }
    path = tmp_path / f"recipe-{int(streaming)}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def build(path: str, *overrides: str):
    recipe, args, model_args = parse_recipe("cpt", [path, *overrides])
    return build_data(recipe, args, model_args, path)


def batches(path: str, model: str, tokenizer, *overrides: str, n: int = 6) -> list[torch.Tensor]:
    recipe, args, _ = parse_recipe("cpt", [path, *overrides])
    train, evals = pretraining_data(recipe, tokenizer, args.max_length)
    trainer = CausalLMTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        args=args,
        train_dataset=train,
        eval_dataset=evals,
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id),
    )
    return [batch["input_ids"] for _, batch in zip(range(n), trainer.get_train_dataloader(), strict=False)]


@pytest.mark.parametrize("streaming", [False, True])
def test_training_from_built_data_sees_the_same_batches(tmp_path, files, tiny_model, tokenizer, streaming):
    path = recipe_file(tmp_path, tiny_model, files, streaming)
    manifest, built = build(path)
    assert built
    from_sources = batches(path, tiny_model, tokenizer, "--built_data", "")
    from_built = batches(path, tiny_model, tokenizer)
    assert len(from_built) == 6
    assert all(torch.equal(a, b) for a, b in zip(from_sources, from_built, strict=True))
    recipe, args, _ = parse_recipe("cpt", [path])
    train, evals = pretraining_data(recipe, tokenizer, args.max_length)
    assert isinstance(train, TokenStream) == streaming
    if streaming:  # exactly the blocks the run consumes: max_steps x batch on one process
        assert manifest["train"]["blocks"] == 6 * 4
    assert list(evals) == ["held_out"] and len(evals["held_out"]) == manifest["eval_sets"]["held_out"]["blocks"]


def test_manifest_records_sources_tokens_and_contamination(tmp_path, files, tiny_model, tokenizer):
    manifest, _ = build(recipe_file(tmp_path, tiny_model, files, False))
    names = [s["name"] for s in manifest["sources"]]
    assert names[0].endswith("/notes") and names[1] == "usmle_sample/train"
    assert [s["weight"] for s in manifest["sources"]] == [0.7, 0.3]
    assert manifest["tokenizer"]["name"] == tiny_model and len(manifest["tokenizer"]["hash"]) == 64
    assert manifest["max_length"] == 64 and manifest["seed"] == 7
    assert sum(manifest["tokens_per_source"].values()) == manifest["train"]["tokens"] > 0
    report = manifest["decontamination"]
    assert set(report["benchmarks"]) == {"held_out", "mcq"}
    assert report["benchmarks"]["mcq"]["contaminated_rows"] == 1
    assert report["benchmarks"]["mcq"]["examples"] == ["q1"]
    notes = names[0]
    assert report["sources"][notes]["contaminated"] == 1
    assert report["sources"][notes]["by_benchmark"]["mcq"] == 1
    summary = decontamination_summary(str(tmp_path / "built"))
    assert "mcq: 1 of 1 items found in the training data" in summary
    assert "held_out: 0 of 12" in summary


def test_build_is_skipped_until_the_data_changes(tmp_path, files, tiny_model, tokenizer, caplog):
    """Data changed since: built again. A build for other recipe settings: built again in its place, said."""
    path = recipe_file(tmp_path, tiny_model, files, False)
    first, built = build(path)
    assert built
    again, built = build(path)
    assert not built and again == first
    with open(files["notes"], "a") as f:  # same path, new content
        f.write(json.dumps({"text": "A new note about hypokalaemia and flattened T waves."}) + "\n")
    with caplog.at_level("WARNING"):
        changed, built = build(path)
    assert built and changed["key"] != first["key"] and "held a build for" not in caplog.text
    with caplog.at_level("WARNING"):
        _, built = build(path, "--max_length", "32")
    assert built and f"held a build for max_length 64, and this recipe has 32 (built from {path})" in caplog.text
    # The folder now holds 32-token blocks: a run at 64 tokens must not train on it.
    recipe, args, _ = parse_recipe("cpt", [path])
    with pytest.raises(UserError, match="max_length"):
        pretraining_data(recipe, tokenizer, args.max_length)


def test_a_run_from_a_build_whose_sources_changed_since_is_refused(tmp_path, files, tiny_model, tokenizer):
    """A source file edited after the build: the run would train on the old build while its record
    fingerprints the new file. One line, until it is built again; a file only touched is the same."""
    path = recipe_file(tmp_path, tiny_model, files, False)
    build(path)
    recipe, args, _ = parse_recipe("cpt", [path])
    later = os.stat(files["notes"]).st_mtime + 10
    os.utime(files["notes"], (later, later))  # touched: the same bytes
    pretraining_data(recipe, tokenizer, args.max_length)
    lines = Path(files["notes"]).read_text().splitlines(keepends=True)
    Path(files["notes"]).write_text("".join(lines[:5]))
    with pytest.raises(UserError, match=rf"{files['notes']} changed \([\d,]+ bytes then, [\d,]+ now\) since; build"):
        pretraining_data(recipe, tokenizer, args.max_length)
    _, built = build(path)
    assert built
    pretraining_data(recipe, tokenizer, args.max_length)


def test_validate_refuses_a_build_made_for_another_recipe_and_waits_for_one_not_made(
    tmp_path, capsys, files, tiny_model
):
    """validate reads a built folder's manifest as the run does, for what the recipe alone decides:
    another max_length or changed sources is the run's line, before a model loads; a folder not built
    yet passes, as build-data may come next."""
    path = recipe_file(tmp_path, tiny_model, files, False)
    main(["validate", path])
    build(path)
    main(["validate", path])
    with pytest.raises(SystemExit, match="2"):
        main(["validate", path, "--max_length", "32"])
    assert "was built for max_length 64, and this recipe has 32; build it again" in capsys.readouterr().err
    Path(files["notes"]).write_text(Path(files["notes"]).read_text()[:200].rsplit("\n", 1)[0] + "\n")
    with pytest.raises(SystemExit, match="2"):
        main(["validate", path])
    assert re.search(rf"{files['notes']} changed \(.* since; build it again", capsys.readouterr().err)


def test_folders_to_write_that_are_files_are_refused(tmp_path, files, tiny_model):
    path = recipe_file(tmp_path, tiny_model, files, False)
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(UserError, match=f"build-data: {taken} is a file; name a folder to write into"):
        build(path, "--built_data", str(taken))
    with pytest.raises(UserError, match=f"output_dir: {taken} is a file; name a folder to write into"):
        parse_recipe("cpt", [path, "--output_dir", str(taken)])


def test_training_from_a_folder_that_was_never_built(tmp_path, files, tiny_model, tokenizer):
    recipe, args, _ = parse_recipe("cpt", [recipe_file(tmp_path, tiny_model, files, False)])
    with pytest.raises(UserError, match="medrecipes build-data"):
        pretraining_data(recipe, tokenizer, args.max_length)


def test_object_storage_sources_through_fsspec(tmp_path, monkeypatch):
    fs, bucket = fsspec.filesystem("memory"), tmp_path.name  # datasets caches downloads by URL and size
    for name, rows in {"a": ["first note", "second note"], "b": ["third note"]}.items():
        with fs.open(f"/{bucket}/corpus/{name}.jsonl", "w") as f:
            f.write("".join(json.dumps({"text": t}) + "\n" for t in rows))
    streamed = load_source(SourceConfig(path=f"memory://{bucket}/corpus/*.jsonl"), streaming=True)
    assert [row["text"] for row in streamed] == ["first note", "second note", "third note"]
    # datasets copies a URL's files into its cache first, which it counts as going online.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    assert list(load_source(SourceConfig(path=f"memory://{bucket}/corpus"))["text"]) == [
        "first note",
        "second note",
        "third note",
    ]
    local = write_jsonl(tmp_path / "local.jsonl", [{"text": "on disk"}])
    assert list(load_source(SourceConfig(path=f"file://{local}"))["text"]) == ["on disk"]
    with pytest.raises(UserError, match="no such file"):
        load_source(SourceConfig(path=f"memory://{bucket}/missing.jsonl"))


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_checkpoint_folder_copied_to_a_url(tmp_path, scheme):
    checkpoint = tmp_path / "checkpoint-4"
    (checkpoint / "nested").mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"\0" * 1000)
    (checkpoint / "nested" / "trainer_state.json").write_text("{}")
    url = "memory://bucket/run/checkpoint-4" if scheme == "memory" else f"file://{tmp_path}/mirror/checkpoint-4"
    copy_to_url(str(checkpoint), url)
    fs, root = fsspec.core.url_to_fs(url)
    assert not fs.exists(f"{root}/{COMPLETE}")  # the marker is the caller's last write
    mark_complete(url)
    assert fs.cat(f"{root}/nested/trainer_state.json") == b"{}"
    assert fs.size(f"{root}/model.safetensors") == 1000 and fs.exists(f"{root}/{COMPLETE}")


@pytest.mark.slow
@pytest.mark.long  # a build and two runs
def test_recipe_builds_its_data_once_and_trains_from_the_folder(tmp_path, tiny_model):
    built, out = tmp_path / "built", tmp_path / "run"
    keys = ["--model_name_or_path", tiny_model, "--built_data", built]
    result = run(Path(PYTHON).parent / "medrecipes", "build-data", "recipes/tiny_cpt.yaml", *keys, "--num-gpus", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "built" in result.stdout and "usmle: 0 of 20 items" in result.stdout
    # Not streamed: the same build for any number of processes, said.
    assert "warning: build-data --num-gpus 2 sets the blocks a streamed build holds" in result.stderr
    manifest = json.loads((built / "manifest.json").read_text())
    steps = ["--max_steps", "4", "--eval_steps", "2", "--save_steps", "2"]
    result = run(PYTHON, "recipes/cpt.py", "recipes/tiny_cpt.yaml", *keys, "--output_dir", out, *steps)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"training data from {built}" in result.stdout
    assert (out / "final" / "config.json").is_file()
    assert manifest["train"]["blocks"] > 1000


def test_a_number_of_gpus_that_changes_no_build_is_said(tmp_path, capsys, tiny_model):
    """build-data's --num-gpus sets the blocks of a streamed build; a recipe that does not stream
    builds the same blocks for any number, its token budget only checked to divide over them."""

    for gpus in ("1", "2"):
        keys = ["--tokenizer_name_or_path", str(tiny_model), "--out", str(tmp_path / gpus), "--num-gpus", gpus]
        main(["build-data", "recipes/tiny_pretrain.yaml", *keys])
        said = capsys.readouterr().err
        assert ("warning: build-data --num-gpus" in said) is (gpus == "2")
    assert "does not stream: the build is the same for any number of processes, its token budget only checked" in said
    one, two = (sorted((p.name, p.read_bytes()) for p in (tmp_path / g / "train").iterdir()) for g in ("1", "2"))
    assert one == two
