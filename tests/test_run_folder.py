"""Nothing a run wrote is lost: a finished run run again trains nothing, another run is refused
its folder, final/ is written whole, and no command writes over its input or an earlier result."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import NO_EVAL, PYTHON, ROOT, error_lines, run, run_ok, write_jsonl
from safetensors.torch import load_file, save_file

from medrecipes import cli
from medrecipes.errors import UserError
from medrecipes.locations import SAMPLED, weights_fingerprint
from medrecipes.outputs.writes import staged

CPT, SFT = "recipes/tiny_cpt.yaml", "recipes/tiny_sft.yaml"
# A constant learning rate, so that one step more would change the weights.
RUN = ["--max_steps", "6", "--save_steps", "3", "--logging_steps", "3", "--lr_scheduler_type", "constant", *NO_EVAL]


def weights(folder) -> dict:
    return load_file(str(Path(folder) / "model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def errors(result) -> list[str]:
    return error_lines(result.stderr)


@pytest.fixture(scope="module")
def finished_run(tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    run_ok(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", out, *RUN)
    return out


def cpt_again(out, tiny_model, *extra):
    return run(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", out, *RUN, *extra)


def test_a_run_records_what_it_is_and_that_it_finished(finished_run, tiny_model):
    record = json.loads((finished_run / "run.json").read_text())
    assert record["script"] == "recipes/cpt.py" and record["model"] == tiny_model
    assert record["finished"]["global_step"] == 6


@pytest.mark.long  # a finished run started again
def test_a_finished_run_run_again_trains_nothing_and_writes_nothing(finished_run, tiny_model):
    """Run again as it was, or with settings it did not run with: nothing trains or is written,
    and the settings not applied are named (those that only log or save left out)."""
    before = {p: p.stat().st_mtime_ns for p in finished_run.rglob("*") if p.is_file()}
    result = cpt_again(finished_run, tiny_model, "--learning_rate", "1e-4", "--logging_steps", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "holds this run, finished at step 6 (final/ written); nothing to do" in result.stdout
    assert {p: p.stat().st_mtime_ns for p in finished_run.rglob("*") if p.is_file()} == before
    output = result.stdout + result.stderr
    assert "ran with other settings than these (learning_rate 0.003 there, 0.0001 here)" in output
    assert "logging_steps" not in output.split("other settings")[1].split(")")[0]
    # A checkpoint to resume from, named for a run that has nothing left to train: said, not read.
    checkpoint = max(finished_run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    result = cpt_again(finished_run, tiny_model, "--resume_from_checkpoint", str(checkpoint))
    assert result.returncode == 0 and f"resume_from_checkpoint {checkpoint} is not read: the run finished" in (
        result.stdout + result.stderr
    ), result.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in finished_run.rglob("*") if p.is_file()} == before


def test_another_run_in_a_finished_runs_folder_is_refused(finished_run, tiny_model):
    final = weights(finished_run / "final")
    result = run(PYTHON, "recipes/sft.py", SFT, "--model_name_or_path", tiny_model, "--output_dir", finished_run)
    assert result.returncode == 2
    [line] = errors(result)
    assert f"output_dir: {finished_run} holds another run (script recipes/cpt.py, here recipes/sft.py" in line
    assert "overwrite_output_dir: true" in line
    assert same_weights(weights(finished_run / "final"), final)


def test_a_run_whose_starting_model_was_trained_again_is_another_run(tiny_model, tmp_path):
    """A pipeline's stage run again writes its model into the same folder: the next stage's run
    there started from other weights at the same path, and is refused in one line, not resumed nor
    passed over as done. A copy of the folder is the same model."""
    from medrecipes.config import parse_recipe
    from medrecipes.training.run_folder import claim_run_folder

    start, out = tmp_path / "start", tmp_path / "run"
    shutil.copytree(tiny_model, start)

    def claim():
        return claim_run_folder(
            "cpt", *parse_recipe("cpt", [CPT, "--model_name_or_path", str(start), "--output_dir", str(out), *RUN])
        )

    assert not claim()  # recorded
    (out / "final").mkdir()  # what it trained
    assert json.loads((out / "run.json").read_text())["weights"] == weights_fingerprint(str(tiny_model), ends=SAMPLED)
    assert weights_fingerprint("org/model-on-the-hub") is None
    assert not claim()  # the same run: it goes on
    tensors = weights(start)
    name = sorted(tensors)[-1]
    tensors[name] = tensors[name] + 1  # trained again
    save_file(tensors, str(start / "model.safetensors"), metadata={"format": "pt"})
    told = f"holds another run (the weights of model {start} changed since that run started from them)"
    with pytest.raises(UserError, match=re.escape(told)):
        claim()


def test_a_weights_fingerprint_reads_the_weight_files_only(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert weights_fingerprint(str(tmp_path), ends=SAMPLED) is None  # no weights: nothing to tell apart
    data = os.urandom(3 << 20)
    (tmp_path / "model.safetensors").write_bytes(data)
    first = weights_fingerprint(str(tmp_path), ends=SAMPLED)
    (tmp_path / "config.json").write_text('{"other": 1}')
    (tmp_path / "model.safetensors").write_bytes(data)  # written again, the same bytes
    assert weights_fingerprint(str(tmp_path), ends=SAMPLED) == first
    (tmp_path / "model.safetensors").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert weights_fingerprint(str(tmp_path), ends=SAMPLED) != first


def test_a_kill_between_the_two_renames_of_a_checkpoint_loses_nothing(finished_run, tiny_model, tmp_path, monkeypatch):
    # Where two folders cannot be swapped in one step (some network filesystems), a checkpoint
    # that replaces an older one of its name is published in two renames. A run killed between
    # them, as it saved checkpoint-6 again, before final/: the old checkpoint-6 is moved aside,
    # the new one, whole, is still staged.
    from medrecipes.outputs import writes

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    shutil.rmtree(out / "final")
    record = json.loads((out / "run.json").read_text())
    del record["finished"]
    (out / "run.json").write_text(json.dumps(record))
    shutil.copytree(out / "checkpoint-6", out / "_staging" / "checkpoint-6")
    renames, rename = [], os.rename

    def killed_at_the_second(*paths):
        if renames:
            raise KeyboardInterrupt("killed")
        renames.append(paths)
        rename(*paths)

    monkeypatch.setattr(writes, "_exchange", lambda *paths: False)
    monkeypatch.setattr(writes.os, "rename", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        writes.publish(str(out / "_staging" / "checkpoint-6"), str(out / "checkpoint-6"))
    monkeypatch.undo()
    assert not (out / "checkpoint-6").exists() and (out / "_staging" / "checkpoint-6.replaced").is_dir()

    result = cpt_again(out, tiny_model)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "checkpoint-6: completed its save" in result.stdout
    assert "is at max_steps 6: final/ is saved from" in result.stdout  # not resumed from checkpoint-3
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6
    assert same_weights(weights(out / "final"), weights(finished_run / "final"))
    assert not (out / "_staging").exists() and not (out / "checkpoint-7").exists()


def test_overwrite_output_dir_starts_over(finished_run, tiny_model, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "checkpoint-99").mkdir()  # a step this run will never reach: it must not be resumed
    for earlier in ("eval_tasks/step-99.json", "card/README.md"):  # read as the new run's, if left
        (out / earlier).parent.mkdir()
        (out / earlier).write_text("{}")
    result = cpt_again(out, tiny_model, "--overwrite_output_dir", "true")
    assert result.returncode == 0, result.stderr[-2000:]
    assert not (out / "checkpoint-99").exists() and (out / "checkpoint-6").is_dir()
    assert not (out / "eval_tasks").exists() and not (out / "card").exists()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6


def test_a_run_may_not_start_over_by_deleting_its_own_starting_model(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    result = cpt_again(out, str(out / "final"), "--overwrite_output_dir", "true")
    assert (
        result.returncode == 2 and "contains" in errors(result)[0] and "which this command reads" in errors(result)[0]
    )
    assert (out / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("folder", ["empty", "config only"])
def test_a_folder_that_is_not_a_whole_model_is_one_line_for_every_command(finished_run, tmp_path, folder, capsys):
    model = tmp_path / "model"
    model.mkdir()
    if folder == "config only":
        shutil.copy(finished_run / "final" / "config.json", model)
    wanted = f"model: {model} is not a complete model"
    # The commands in this process (their entry point turns the error into its line and exit 2);
    # the recipe script as a user runs it.
    for argv in (
        ["generate", str(model), "--prompt", "hi"],
        ["eval", "--model", str(model), "--data", "data/usmle_sample/test.jsonl", "--limit", "2"],
    ):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        lines = error_lines(capsys.readouterr().err)
        assert info.value.code == 2 and len(lines) == 1 and wanted in lines[0], (argv, lines)
    result = run(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", model, "--output_dir", tmp_path / "out", *RUN)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert errors(result) == [errors(result)[0]] and wanted in errors(result)[0]


def test_decontaminate_never_writes_over_its_input_nor_an_earlier_result(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", [{"text": f"note {i} about anemia and iron"} for i in range(5)])
    original = Path(train).read_bytes()
    base = ["decontaminate", "--train", train, "--eval", str(ROOT / "data/usmle_sample/test.jsonl")]
    with pytest.raises(SystemExit) as info:
        cli.main([*base, "--drop", train])
    assert info.value.code == 2 and "is also what this command reads" in capsys.readouterr().err
    assert Path(train).read_bytes() == original
    mine = tmp_path / "mine.jsonl"
    mine.write_text("a file of the user's\n")
    with pytest.raises(SystemExit):
        cli.main([*base, "--drop", str(mine), "--overwrite"])  # --overwrite replaces only our results
    assert "holds files that medrecipes did not write" in capsys.readouterr().err
    assert mine.read_text() == "a file of the user's\n"
    kept = tmp_path / "kept.jsonl"
    cli.main([*base, "--drop", str(kept)])
    with pytest.raises(SystemExit):
        cli.main([*base, "--drop", str(kept)])
    assert "already exists; name a new path, or pass --overwrite" in capsys.readouterr().err
    cli.main([*base, "--drop", str(kept), "--overwrite"])
    assert len(kept.read_text().splitlines()) == 5


def test_merge_lora_tiny_model_and_eval_output_refuse_an_existing_result(finished_run, tmp_path, capsys):
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.json").write_text("mine")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(finished_run / "final")}))
    data = str(ROOT / "data/usmle_sample/test.jsonl")
    for argv, words in (
        (["merge-lora", str(adapter), str(existing)], "merge-lora OUT_DIR: "),
        (["merge-lora", str(adapter), str(finished_run / "final")], "is also what this command reads"),
        (["tiny-model", str(existing)], "tiny-model OUT_DIR: "),
        (["eval", "--model", str(finished_run / "final"), "--data", data, "--output", data], "is also what"),
        (["eval", "--model", str(finished_run / "final"), "--data", data, "--output", str(existing / "keep.json")], "did not write"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and words in err, (argv, err)
    assert (existing / "keep.json").read_text() == "mine"
    assert sorted(p.name for p in existing.iterdir()) == ["keep.json"]


def test_a_staged_result_replaces_the_old_one_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(RuntimeError), staged(str(target), folder=True) as path:
        (Path(path) / "new").write_text("half")
        raise RuntimeError("killed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (target / "old").exists()
    with staged(str(target), folder=True) as path:
        (Path(path) / "new").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_run_that_saved_nothing_does_not_hold_its_folder(tmp_path):
    from medrecipes.config import parse_recipe
    from medrecipes.runs.record import RECORD
    from medrecipes.training.run_folder import claim_run_folder

    out = tmp_path / "run"
    out.mkdir()
    (out / RECORD).write_text(json.dumps({"script": "recipes/sft.py", "model": "other", "data": "x"}))
    recipe, args, model_args = parse_recipe("cpt", [CPT, "--output_dir", str(out)])
    assert not claim_run_folder("cpt", recipe, args, model_args)  # the record is replaced
    assert json.loads((out / RECORD).read_text())["script"] == "recipes/cpt.py"
    (out / "checkpoint-3").mkdir()  # once there is something to lose, another run is refused
    recipe, args, model_args = parse_recipe("sft", [SFT, "--output_dir", str(out)])
    with pytest.raises(UserError, match="holds another run"):
        claim_run_folder("sft", recipe, args, model_args)


def test_another_runs_data_is_named_by_the_mixture_setting_that_differs():
    """A folder's run of another dataset_mixture is told by the first setting that differs, as the
    recipe writes it, not by two fingerprints; a record without its recipe keeps the fingerprints."""
    from medrecipes.runs.record import first_difference, identity_differences

    then = {"seed": 7, "sources": [{"path": "a.jsonl", "weight": 0.8}, {"path": "b.jsonl", "weight": 0.2}]}
    now = {"seed": 42, "sources": [{"path": "a.jsonl", "weight": 0.8}, {"path": "b.jsonl", "weight": 0.2}]}
    assert first_difference(then, now, "dataset_mixture") == "dataset_mixture.seed 7, here 42"
    now = {**then, "sources": [then["sources"][0], {"path": "b.jsonl", "weight": 0.3}]}
    assert first_difference(then, now, "dataset_mixture") == "dataset_mixture.sources[1].weight 0.2, here 0.3"
    assert first_difference(then, {**then, "streaming": True}, "m") == "m.streaming null, here true"
    assert first_difference(then, {**then, "sources": then["sources"][:1]}, "m").startswith("m.sources [{")
    saved = {"script": "s", "model": "m", "data": "0123456789abcdef", "recipe": {"dataset_mixture": then}}
    ours = {"script": "s", "model": "m", "data": "fedcba9876543210"}
    assert identity_differences(saved, ours, {**then, "seed": 1}) == ["dataset_mixture.seed 7, here 1"]
    assert identity_differences({**saved, "recipe": {}}, ours, then) == [
        "dataset_mixture 0123456789abcdef, here fedcba9876543210"
    ]


def test_a_folder_replaces_another_in_one_step(tmp_path, monkeypatch):
    from medrecipes.outputs import writes

    old, new = tmp_path / "checkpoint-6", tmp_path / "staged"
    for folder, text in ((old, "old"), (new, "new")):
        folder.mkdir()
        (folder / "weights").write_text(text)
    if not writes._exchange(str(new), str(old)):
        pytest.skip("this system cannot swap two folders in one step")
    writes._exchange(str(new), str(old))  # back as they were
    moves = []
    monkeypatch.setattr(writes.os, "rename", lambda *a: moves.append(a))  # the two-rename path
    writes.publish(str(new), str(old))
    assert moves == [] and (old / "weights").read_text() == "new" and not new.exists()


@pytest.mark.long  # three damaged records, each run against a finished run
def test_a_damaged_run_record_is_one_line(finished_run, tiny_model, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    for text in ('{"script": "recipes/cpt.py", ', "[]", "\xff"):
        (out / "run.json").write_bytes(text.encode("latin-1"))
        result = cpt_again(out, tiny_model)
        assert result.returncode == 2 and len(errors(result)) == 1, result.stderr[-2000:]
        assert errors(result)[0].startswith(f"error: {out / 'run.json'}: not a run record (")
        assert "move it aside or set overwrite_output_dir: true" in errors(result)[0]


@pytest.mark.long
def test_a_checkpoint_copied_in_from_another_run_is_not_resumed(finished_run, tiny_model, tmp_path):
    """A checkpoint of another run (here a later step of one with other data) put into this run's
    folder: the run resumes from its own newest and its final/ is its own."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    record = json.loads((out / "run.json").read_text())
    del record["finished"]
    (out / "run.json").write_text(json.dumps(record))
    shutil.rmtree(out / "final")
    foreign = out / "checkpoint-9"
    shutil.copytree(out / "checkpoint-6", foreign)
    stamp = json.loads((foreign / "run.json").read_text())
    (foreign / "run.json").write_text(json.dumps({**stamp, "data": "0123456789abcdef"}))
    tensors = weights(foreign)
    save_file({name: tensor + 1 for name, tensor in tensors.items()}, str(foreign / "model.safetensors"))
    result = cpt_again(out, tiny_model)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"ignoring {foreign}: another run saved it (dataset_mixture 0123456789abcdef, here " in result.stdout
    assert same_weights(weights(out / "final"), weights(finished_run / "final"))


def test_a_data_file_replaced_between_a_kill_and_the_rerun_is_another_run(tmp_path):
    """The run's identity fingerprints its data files' contents, not only the mixture as written:
    80 documents replaced by 12 others under the same name is another run's data, refused in one
    line, where resuming would train the rest of the run on other data."""
    import yaml

    from medrecipes.config import parse_recipe
    from medrecipes.training.run_folder import claim_run_folder

    data = write_jsonl(tmp_path / "notes.jsonl", [{"text": f"note {i} on iron deficiency"} for i in range(80)])
    recipe_file = tmp_path / "cpt.yaml"
    recipe = yaml.safe_load(open(CPT))
    recipe["dataset_mixture"] = {"sources": [{"path": data}]}
    recipe_file.write_text(yaml.safe_dump({**recipe, "output_dir": str(tmp_path / "run")}))

    def claim():
        return claim_run_folder("cpt", *parse_recipe("cpt", [str(recipe_file)]))

    assert not claim()
    (tmp_path / "run" / "checkpoint-3").mkdir()  # something of it to lose
    assert not claim()  # the same data: the same run, which resumes
    write_jsonl(tmp_path / "notes.jsonl", [{"text": f"other text {i}"} for i in range(12)])
    with pytest.raises(UserError, match=r"holds another run \(the data files changed since that run read them\)"):
        claim()


@pytest.mark.long
def test_resuming_with_a_setting_the_checkpoint_overrides_is_refused(finished_run, tiny_model, tmp_path):
    """A stopped run started again with another learning rate or batch size: the restored
    scheduler and data position would override them in silence. One line names them; settings
    that only log or save, or a longer run, resume."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    record = json.loads((out / "run.json").read_text())
    del record["finished"]
    (out / "run.json").write_text(json.dumps(record))
    shutil.rmtree(out / "final")  # stopped after its last checkpoint, before final/
    for changed, named in ((["--learning_rate", "1e-4"], "learning_rate 0.003 there, 0.0001 here"),
                           (["--per_device_train_batch_size", "2"], "per_device_train_batch_size ")):  # fmt: skip
        result = cpt_again(out, tiny_model, *changed)
        assert result.returncode == 2 and len(errors(result)) == 1, result.stderr[-2000:]
        assert f"holds this run, saved with other settings than these ({named}" in errors(result)[0]
        assert "set them back to resume, or set overwrite_output_dir: true" in errors(result)[0]
    result = cpt_again(out, tiny_model, "--logging_steps", "1")
    assert result.returncode == 0 and f"resuming from {out}/checkpoint-6" in result.stdout, result.stderr[-2000:]


@pytest.mark.long  # three runs in a row: make test-long
def test_raising_max_steps_of_a_finished_run_trains_on_the_new_schedule_and_records_it(tiny_model, tmp_path):
    """A finished cosine run given more steps: the restored optimizer held the rate its schedule
    ended at (0), which the first new step took without a word. It trains at the new schedule's
    rate, says so, and the settings changed on the way (max_steps, a system prompt) are said and
    recorded, so that running the same command again is simply done."""
    out = tmp_path / "run"
    cosine = [*NO_EVAL, "--lr_scheduler_type", "cosine", "--warmup_steps", "0", "--learning_rate", "0.004"]

    def sft(steps, *extra):
        return run(PYTHON, "recipes/sft.py", SFT, "--model_name_or_path", tiny_model, "--output_dir", out,
                   "--max_steps", str(steps), "--save_steps", "2", *cosine, *extra)  # fmt: skip

    assert sft(2).returncode == 0
    found = (out / "run.json").read_bytes()
    refused = sft(4, "--use_peft", "true")  # an adapter over a full fine-tune's checkpoint: refused before a step
    assert refused.returncode == 2 and "does not fit its model" in refused.stderr, refused.stderr[-2000:]
    assert (out / "run.json").read_bytes() == found and "other settings" not in refused.stdout + refused.stderr
    result = sft(4, "--system_prompt", "Answer briefly.")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-2000:]
    assert "resuming at step 2 with a schedule of 4 steps: the learning rate is 0.002, the new schedule's" in output
    assert "resuming the run there with other settings than it last ran with (" in output
    assert "max_steps 2 there, 4 here" in output and "'Answer briefly.' here" in output
    assert not same_weights(weights(out / "final"), weights(out / "checkpoint-2"))
    record = json.loads((out / "run.json").read_text())
    assert record["recipe"]["max_steps"] == 4 and len(record["resumed_with"]) == 1
    assert record["settled"]["resume_from"] == str(out / "checkpoint-2")  # the start settled since is kept
    again = sft(4, "--system_prompt", "Answer briefly.")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert "other settings" not in again.stdout + again.stderr


def test_a_checkpoint_resumed_not_as_it_was_saved_is_said(finished_run, tmp_path, caplog, monkeypatch):
    """The trainer resumes a checkpoint without its optimizer state, or one saved by another number
    of processes, without a word: each is a warning as the run resumes (the checkpoint's stamp
    counts the processes that saved it)."""
    import logging

    from medrecipes.runs.resume import last_checkpoint

    out = tmp_path / "run"
    shutil.copytree(finished_run / "checkpoint-6", out / "checkpoint-6")
    shutil.copy(finished_run / "run.json", out / "run.json")
    stamp = json.loads((out / "checkpoint-6" / "run.json").read_text())
    assert stamp["processes"] == 1
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with caplog.at_level(logging.WARNING):
        assert last_checkpoint(str(out)) == str(out / "checkpoint-6")
    assert caplog.records == []  # as it was saved: nothing to say
    scheduler = (out / "checkpoint-6" / "scheduler.pt").read_bytes()
    (out / "checkpoint-6" / "scheduler.pt").unlink()  # transformers then skips the optimizer's too
    with caplog.at_level(logging.WARNING):
        last_checkpoint(str(out))
    assert "holds its optimizer state but no scheduler.pt" in caplog.text and "start again" in caplog.text
    (out / "checkpoint-6" / "scheduler.pt").write_bytes(scheduler)
    caplog.clear()
    (out / "checkpoint-6" / "optimizer.pt").unlink()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with caplog.at_level(logging.WARNING):
        last_checkpoint(str(out))
    said = [r.getMessage() for r in caplog.records]
    assert any(
        "holds no optimizer state (save_only_model, or a copy that left it out): the run resumes its weights and step, and the optimizer and the learning-rate schedule start again"
        in m
        for m in said
    ), said
    assert any("was saved by a run of WORLD_SIZE 1 and resumes in one of 2" in m for m in said), said


def test_an_accumulation_longer_than_an_epoch_is_said(caplog):
    """transformers ends an optimizer step at the epoch's end: more accumulation steps than an
    epoch's batches is a smaller batch than asked, said with the figures; a stream has no length."""
    from types import SimpleNamespace

    from medrecipes.training.run import say_accumulation_past_an_epoch

    def said(rows, accumulation, drop_last=False, dataset=None):
        args = SimpleNamespace(per_device_train_batch_size=8, world_size=1, dataloader_drop_last=drop_last,
                               gradient_accumulation_steps=accumulation)  # fmt: skip
        caplog.clear()
        with caplog.at_level("WARNING"):
            say_accumulation_past_an_epoch(SimpleNamespace(args=args, train_dataset=dataset or list(range(rows))))
        return [r.getMessage() for r in caplog.records]

    assert said(60, 1000) == [
        "gradient_accumulation_steps 1000 is more than the 8 batches an epoch holds: each step ends at the epoch's "
        "end, a batch of 64 rows, not 8000; lower it to 8 or less, or lower per_device_train_batch_size"
    ]
    assert said(64, 8) == [] and said(63, 8, drop_last=True)  # 7 whole batches when the last is dropped
    assert said(0, 4, dataset=iter(range(60))) == []  # a stream


@pytest.mark.long  # three refused runs
def test_a_run_refused_after_it_claimed_a_new_folder_leaves_no_folder(tiny_model, tmp_path):
    """A refusal that comes once the folder is made (a data row read after the claim) leaves no
    folder holding only a record: a rerun starts as new. An existing folder is left as it was."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        '{"question": "a", "options": {"A": "a", "B": "b"}, "answer": "A"}\n'
        '{"question": "b", "options": {"A": "a", "B": "b"}, "answer": ""}\n'
    )
    recipe = tmp_path / "sft.yaml"
    recipe.write_text((ROOT / SFT).read_text().replace("data/usmle_sample/train.jsonl", str(rows)))
    out = tmp_path / "runs" / "sft"
    result = run(PYTHON, "recipes/sft.py", recipe, "--model_name_or_path", tiny_model, "--output_dir", out)
    assert result.returncode == 2 and "rows.jsonl line 2: has no gold answer" in error_lines(result.stderr)[0]
    assert not out.exists() and not (tmp_path / "runs").exists()  # the folders above it the start made too
    (tmp_path / "runs").mkdir()
    result = run(PYTHON, "recipes/sft.py", recipe, "--model_name_or_path", tiny_model, "--output_dir", out)
    assert result.returncode == 2 and not out.exists() and (tmp_path / "runs").is_dir()  # one of the user's, kept
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run(PYTHON, "recipes/sft.py", recipe, "--model_name_or_path", tiny_model, "--output_dir", out)
    assert result.returncode == 2 and sorted(p.name for p in out.iterdir()) == ["notes.txt"], result.stderr[-1000:]


def test_a_starting_model_by_another_path_is_no_changed_setting():
    """A run resumed or restarted with its model written by another path (the run's identity found
    the same weights there) is not told its settings changed, nor offered a start over for it."""
    from medrecipes.training.run_folder import _changed_settings

    saved = {"model_name_or_path": "/models/tiny", "learning_rate": 0.001}
    assert _changed_settings(saved, {**saved, "model_name_or_path": "../models/tiny/"}) == ""
    changed = _changed_settings(saved, {"model_name_or_path": "/links/tiny", "learning_rate": 0.002})
    assert changed == "learning_rate 0.001 there, 0.002 here"


def test_the_same_starting_weights_by_another_path_are_the_same_run():
    """A run started from /m is resumed from ../m, /m/, a link to /m or a copy of it: the path as
    written differs, the weights it records are the same (docs/long-runs.md). Other weights, or a
    record without them, are another model."""
    from medrecipes.runs.record import WEIGHTS, identity_differences

    saved = {"script": "recipes/sft.py", "model": "/models/tiny", "data": "d1", WEIGHTS: "sha256:aa"}
    for path in ("../models/tiny", "/models/tiny/", "/links/tiny", "/copies/tiny"):
        assert identity_differences(saved, {**saved, "model": path}) == [], path
    other = {**saved, "model": "/models/other", WEIGHTS: "sha256:bb"}
    assert identity_differences(saved, other) == ["model /models/tiny, here /models/other"]
    unweighed = {k: v for k, v in saved.items() if k != WEIGHTS}
    assert identity_differences(unweighed, {**unweighed, "model": "../models/tiny"}) == [
        "model /models/tiny, here ../models/tiny"
    ]


@pytest.mark.long  # a finished run trained on
def test_a_run_trained_on_logs_and_saves_at_the_intervals_it_is_given_now(finished_run, tiny_model, tmp_path):
    """transformers takes a resumed run's logging and save steps from the checkpoint's trainer state;
    the run takes the ones it is started with, and transformers' raw mismatch lines are not shown."""
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    result = run(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", out,
                 *RUN[:1], "8", *RUN[2:], "--save_steps", "1", "--logging_steps", "1")  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    state = json.loads((out / "checkpoint-8" / "trainer_state.json").read_text())  # (retention keeps the last)
    assert state["save_steps"] == state["logging_steps"] == 1
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [3, 6, 7, 8]
    assert "do not match the ones in the `trainer_state.json`" not in result.stderr + result.stdout
    output = result.stdout + result.stderr
    said = re.search(r"resuming the run there with other settings than it last ran with \((.*)\)", output)
    assert said and "logging_steps 3 there, 1 here" in said[1] and "save_steps 3 there, 1 here" in said[1], output
