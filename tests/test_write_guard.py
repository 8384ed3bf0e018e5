"""One guard for every write (`outputs.claims.claim_output`): a command writes only into a new path or
over an earlier result of the same kind that medrecipes wrote, never into, over or around what
it reads, and a training run's folder is held by one process at a time."""

import hashlib
import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import NO_EVAL, PYTHON, ROOT, run

from medrecipes import cli
from medrecipes.errors import UserError
from medrecipes.outputs.claims import claim_output, lock_folder
from medrecipes.outputs.records import mark, written_kind
from medrecipes.outputs.writes import staged

CPT = "recipes/tiny_cpt.yaml"
TEST_SET = str(ROOT / "data/usmle_sample/test.jsonl")


def hashes(folder: Path) -> dict:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()}


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def result_of(tmp_path: Path, kind: str, folder: bool) -> Path:
    """An earlier result of ours of `kind`, written as every command writes one."""
    path = tmp_path / ("earlier" if folder else "earlier.json")
    with staged(str(path), folder=folder, kind=kind) as staging:
        Path(staging, "model.safetensors").write_text("w") if folder else Path(staging).write_text("{}")
    return path


# What may be at the output path, and what the guard must do there with and without --overwrite.
STATES = ("missing", "empty folder", "user file", "user folder", "ours", "ours of another kind", "ours, edited since")


def make_state(tmp_path: Path, state: str, folder: bool) -> Path:
    path = tmp_path / "out"
    if state == "empty folder":
        path.mkdir()
    elif state == "user file":
        path.write_text("the user's notes")
    elif state == "user folder":
        path.mkdir()
        (path / "config.json").write_text("{}")
    elif state.startswith("ours"):
        earlier = result_of(tmp_path, "eval" if state == "ours of another kind" else "report", folder)
        os.rename(earlier, path)
        marker = earlier.parent / f".{earlier.name}.medrecipes.json"
        if marker.exists():
            os.rename(marker, tmp_path / ".out.medrecipes.json")
        if state == "ours, edited since":
            target = path / "model.safetensors" if folder else path
            if folder:
                (path / ".medrecipes.json").unlink()  # a folder the user rebuilt by hand
            else:
                target.write_text('{"edited": "by the user"}')
    return path


@pytest.mark.parametrize("state, overwrite, folder", list(itertools.product(STATES, (False, True), (False, True))))
def test_a_result_replaces_only_an_earlier_result_of_its_own_kind(tmp_path, state, overwrite, folder):
    path = make_state(tmp_path, state, folder)
    before = hashes(tmp_path)
    free = state in ("missing", "empty folder")
    allowed = free or (state == "ours" and overwrite)
    if folder and state == "user file":
        allowed = False
    replaces_a_folder = not folder and state in ("empty folder", "user folder")  # a file result: never a folder
    if replaces_a_folder:
        allowed = False
    if allowed:
        claim_output(str(path), "report", "report --output", [], overwrite, folder)
        return
    with pytest.raises(UserError) as info:
        claim_output(str(path), "report", "report --output", [], overwrite, folder)
    message = str(info.value)
    assert "\n" not in message and message.startswith("report --output: ")
    if state == "ours":
        assert "pass --overwrite" in message
    elif replaces_a_folder:
        assert "is a folder; name the file to write" in message
    elif not (folder and state == "user file"):
        assert "did not write" in message or "a 'eval' result" in message
    assert hashes(tmp_path) == before


@pytest.mark.parametrize("relation", ["is", "inside", "contains"])
@pytest.mark.parametrize("input_kind", ["file", "folder"])
def test_no_output_is_inside_around_or_the_same_as_an_input(tmp_path, relation, input_kind):
    source = tmp_path / "data" / ("notes.jsonl" if input_kind == "file" else "notes")
    source.parent.mkdir()
    if input_kind == "file":
        source.write_text('{"text": "x"}\n')
    else:
        source.mkdir()
        (source / "a.jsonl").write_text('{"text": "x"}\n')
    output = {"is": source, "inside": source / "built", "contains": tmp_path / "data"}[relation]
    if relation == "inside" and input_kind == "file":
        output = source.parent / "notes.jsonl" / "x"  # under a file: refused as not creatable
    with pytest.raises(UserError) as info:
        claim_output(str(output), "built-data", "build-data", [str(source)], overwrite=True, folder=True)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "where", ["/sys/medrecipes-out/run", "{file}/below-a-file"], ids=["read-only place", "parent is a file"]
)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, where):
    parent_file = tmp_path / "file.txt"
    parent_file.write_text("x")
    path = where.format(file=parent_file)
    with pytest.raises(UserError) as info:
        claim_output(path, "eval", "eval --output", overwrite=True)
    assert "\n" not in str(info.value) and ("not writable" in str(info.value) or "is a file" in str(info.value))


def test_every_command_refuses_a_users_folder_and_leaves_it_untouched(tmp_path, tiny_model, capsys):
    """The cases that lost files: build-data over a data folder or inside its source, a run into
    a folder that holds a model, eval over a model's config.json and over the recipe it runs,
    report over a run's trainer_state.json; --overwrite given to each."""
    data = tmp_path / "mydata"
    (data / "train").mkdir(parents=True)
    (data / "train" / "notes.jsonl").write_text('{"text": "iron deficiency anemia"}\n' * 20)
    model = Path(tiny_model)
    recipe = tmp_path / "eval.yaml"
    recipe.write_text(f"model_name_or_path: {tiny_model}\ntasks: [usmle]\ndata: [usmle={TEST_SET}]\n")
    run_folder = tmp_path / "run"
    run_folder.mkdir()
    (run_folder / "trainer_state.json").write_text('{"log_history": []}')
    (run_folder / "run.json").write_text('{"script": "recipes/cpt.py"}')
    before = {folder: hashes(folder) for folder in (data, model, run_folder, tmp_path)}
    source = ["--dataset_mixture", f"{{sources: [{{path: {data}/train}}]}}", "--model_name_or_path", tiny_model]
    cases = [
        (["build-data", CPT, "--out", str(data), *source], "contains"),
        (["build-data", CPT, "--out", str(data / "train" / "built"), *source], "lies inside"),
        (["eval", "--model", tiny_model, "--data", TEST_SET, "--output", str(model / "config.json"), "--overwrite"], "lies inside"),
        (["eval", str(recipe), "--output", str(recipe), "--overwrite"], "is also what"),
        (["report", str(run_folder), "--output", str(run_folder / "trainer_state.json"), "--overwrite"], "lies inside"),
        (["tiny-model", str(model), "--overwrite"], "did not write"),
    ]  # fmt: skip
    for argv, words in cases:
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        lines = errors(capsys.readouterr().err)
        assert info.value.code == 2 and len(lines) == 1 and words in lines[0], (argv, lines)
    result = run(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", str(model),
                 "--overwrite_output_dir", "true", timeout=300)  # fmt: skip
    assert result.returncode == 2 and "is also what this command reads" in errors(result.stderr)[0]
    other = tmp_path / "someone's model"
    other.mkdir()
    (other / "model.safetensors").write_text("weights")
    result = run(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", str(other),
                 "--overwrite_output_dir", "true", timeout=300)  # fmt: skip
    assert result.returncode == 2 and "did not write" in errors(result.stderr)[0]
    assert (other / "model.safetensors").read_text() == "weights"
    for folder, saved in before.items():
        if folder is not tmp_path:
            assert hashes(folder) == saved, folder


HOLD = """
import sys, time
from medrecipes.outputs.claims import lock_folder
lock_folder(sys.argv[1], "output_dir")
print("held", flush=True)
time.sleep(120)
"""


def test_one_process_at_a_time_trains_in_a_folder_and_a_killed_one_leaves_no_lock(tmp_path, tiny_model):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        result = run(PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", str(out),
                     "--max_steps", "1", timeout=300)  # fmt: skip
        assert result.returncode == 2, result.stderr[-2000:]
        assert errors(result.stderr) == [
            f"error: {CPT}: output_dir: another process is training in {out}; wait for it to end, "
            "or give this run its own output_dir"
        ]
        assert written_kind(str(out)) is None and os.listdir(out) == [".medrecipes.lock"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    lock_folder(str(out), "output_dir")  # the OS dropped the killed holder's lock


def test_ctrl_c_is_one_line_that_says_what_was_kept_and_exit_130(tmp_path, tiny_model):
    import time

    out = tmp_path / "run"
    command = [PYTHON, "recipes/cpt.py", CPT, "--model_name_or_path", tiny_model, "--output_dir", str(out),
               "--max_steps", "100000", "--save_steps", "2", "--logging_steps", "1", *NO_EVAL]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # A process started with SIGINT ignored (as pytest-xdist's workers may run, and every background
    # job of a shell) keeps it ignored: Python then raises no KeyboardInterrupt. A user's Ctrl-C
    # reaches a foreground process whose SIGINT has its default action, as here.
    process = subprocess.Popen(
        command, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.time() + 240
    while not list(out.glob("checkpoint-*/trainer_state.json")) and time.time() < deadline and process.poll() is None:
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted:")]  # tqdm's bar may follow
    assert len(lines) == 1 and lines[0].startswith(f"interrupted: {out}/checkpoint-"), stderr[-2000:]
    assert lines[0].endswith("is kept whole, and the same command resumes from it")
    assert (out / lines[0].split("/")[-1].split(" ")[0] / "trainer_state.json").is_file()


@pytest.mark.parametrize("folder", [False, True], ids=["file", "folder"])
def test_a_result_that_fills_the_disk_is_one_line_and_leaves_the_earlier_one(tmp_path, folder):
    import errno

    from medrecipes.errors import UserError
    from medrecipes.outputs.writes import staged

    final = tmp_path / "result"
    if folder:
        final.mkdir()
        (final / "earlier.json").write_text("{}")
    else:
        final.write_text("earlier")
    with pytest.raises(UserError) as raised, staged(str(final), folder=folder) as path:
        Path(path, "part").write_text("part") if folder else Path(path).write_text("part")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert f"{final}: cannot write it, the disk holding {tmp_path} is full" in str(raised.value)
    assert "nothing was replaced" in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result"]  # the part is gone
    assert (final / "earlier.json").exists() if folder else final.read_text() == "earlier"


def test_a_writer_error_is_taken_for_a_full_disk_only_when_the_disk_is_nearly_full(tmp_path, monkeypatch):
    import shutil

    from medrecipes.errors import UserError
    from medrecipes.outputs.writes import LOW_SPACE, full_disk_is_one_line

    failure = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 960")
    with pytest.raises(RuntimeError, match="unexpected pos"), full_disk_is_one_line(str(tmp_path), "checkpoint-2"):
        raise failure  # a disk with room: the error is not about space, and passes unchanged
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=LOW_SPACE - 1))
    with pytest.raises(UserError, match="checkpoint-2: cannot write it, the disk holding .* is full"):
        with full_disk_is_one_line(str(tmp_path), "checkpoint-2"):
            raise failure
    with pytest.raises(ValueError), full_disk_is_one_line(str(tmp_path), "checkpoint-2"):
        raise ValueError("not a write")  # not an error a write raises: passes, whatever the space


def test_a_disk_out_of_file_entries_or_quota_is_said_for_what_it_is(tmp_path, monkeypatch):
    """ENOSPC where bytes are left (no inodes: a new file cannot be made), and EDQUOT (the user's
    quota, not the disk): each line names what is lacking, not a full disk."""
    import errno
    import os

    from medrecipes.errors import UserError
    from medrecipes.outputs.writes import full_disk_is_one_line

    found = os.statvfs(tmp_path)
    no_entries = os.statvfs_result((*found[:5], 1000, 0, 0, *found[8:]))
    monkeypatch.setattr(os, "statvfs", lambda path: no_entries)
    with pytest.raises(UserError, match=r"run.json: cannot write it, the disk holding .* has no file entries \(inodes\) "
                                        r"left, with [\d.]+ MiB free; nothing was replaced. Remove files there"):  # fmt: skip
        with full_disk_is_one_line(str(tmp_path), "run.json"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "statvfs", lambda path: os.statvfs_result((*found[:5], 0, 0, 0, *found[8:])))
    with pytest.raises(
        UserError, match=r"your quota on the disk holding .* is used up \([\d.]+ MiB free on the disk\)"
    ):
        with full_disk_is_one_line(str(tmp_path), "run.json"):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))


# ---------------------------------------------------------------------------
# The output claimed whole: its name, a link there, a second command, a killed one's staging


CLAIM = "import sys; from medrecipes.outputs.claims import claim_output; claim_output(sys.argv[1], 'eval', 'eval: output', folder=sys.argv[2] == '1')"


@pytest.mark.parametrize("kind, folder", [("eval", False), ("tiny-model", True)])
def test_a_second_command_on_the_same_output_is_refused_while_the_first_writes(tmp_path, kind, folder):
    out = tmp_path / ("result" if folder else "result.json")
    claim_output(str(out), kind, "first", folder=folder)
    second = subprocess.run(
        [PYTHON, "-c", CLAIM.replace("'eval'", repr(kind)), str(out), str(int(folder))], capture_output=True, text=True
    )
    assert second.returncode != 0 and f"another medrecipes command is writing {out}" in second.stderr
    with staged(str(out), folder=folder, kind=kind) as path:  # the first one's result, then its lock let go
        Path(path, "x").write_text("1") if folder else Path(path).write_text("{}")
    again = subprocess.run(
        [PYTHON, "-c", CLAIM.replace("'eval'", repr(kind)), str(out), str(int(folder))], capture_output=True, text=True
    )
    assert "another medrecipes command" not in again.stderr and "already exists" in again.stderr


def test_staging_left_by_a_killed_command_is_removed_by_the_next_claim(tmp_path):
    out = tmp_path / "model"
    killed = subprocess.Popen([PYTHON, "-c", "import time; time.sleep(60)"])
    stale = tmp_path / f".model.partial-{killed.pid}"
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "weights.bin").write_bytes(b"0" * 1024)
    killed.kill()
    killed.wait()
    other = tmp_path / ".other.partial-1"  # another output's staging is not this claim's to remove
    other.mkdir()
    claim_output(str(out), "convert-gguf", "convert-gguf OUT_DIR", folder=True)
    assert not stale.exists() and other.exists()


@pytest.mark.parametrize("how", ["to a file", "to nothing", "in a loop"])
def test_a_link_at_the_output_is_never_replaced(tmp_path, how):
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": true}')
    link = tmp_path / "out.json"
    if how == "to a file":
        link.symlink_to(mine)
    elif how == "to nothing":
        link.symlink_to(tmp_path / "gone.json")
    else:
        link.symlink_to(tmp_path / "loop.json")
        (tmp_path / "loop.json").symlink_to(link)
    for overwrite in (False, True):
        with pytest.raises(UserError, match=rf"eval: output: {link} is a symbolic link"):
            claim_output(str(link), "eval", "eval: output", overwrite=overwrite)
    assert link.is_symlink() and mine.read_text() == '{"mine": true}'


def test_a_run_may_write_into_a_linked_folder(tmp_path):
    real = tmp_path / "disk" / "run"
    real.mkdir(parents=True)
    (tmp_path / "run").symlink_to(real)
    claim_output(str(tmp_path / "run"), "run", "output_dir", overwrite=True, folder=True)


@pytest.mark.parametrize("length", [200, 300])
def test_a_name_too_long_to_stage_is_refused_before_the_work(tmp_path, length):
    out = tmp_path / ("r" * (length - 5) + ".json")
    if length <= 200:
        claim_output(str(out), "eval", "eval: output")
    else:
        with pytest.raises(
            UserError, match=rf"eval: output: the name r+\.\.\. is {length} bytes long; name it in at most \d+"
        ):
            claim_output(str(out), "eval", "eval: output")


def test_overwrite_refuses_an_earlier_result_that_holds_a_users_file(tmp_path):
    out = tmp_path / "tiny"
    claim_output(str(out), "tiny-model", "tiny-model OUT_DIR", folder=True)
    with staged(str(out), folder=True, kind="tiny-model") as path:
        Path(path, "config.json").write_text("{}")
    (out / "notes.txt").write_text("the user's notes")
    with pytest.raises(UserError, match=r"is an earlier 'tiny-model' result, but notes.txt in it was put there since"):
        claim_output(str(out), "tiny-model", "tiny-model OUT_DIR", overwrite=True, folder=True)
    (out / "notes.txt").unlink()
    (out / "x.html").write_text("<html></html>")  # another command's result put there, with its marker
    mark(str(out / "x.html"), "report")
    with pytest.raises(UserError, match=r"but x.html in it was put there since"):  # the file, not its marker
        claim_output(str(out), "tiny-model", "tiny-model OUT_DIR", overwrite=True, folder=True)
    for name in ("x.html", ".x.html.medrecipes.json"):
        (out / name).unlink()
    claim_output(str(out), "tiny-model", "tiny-model OUT_DIR", overwrite=True, folder=True)
    assert (out / "config.json").exists()


@pytest.mark.parametrize("change", ["edited", "same size", "removed"])
def test_overwrite_refuses_an_earlier_result_whose_file_a_person_changed(tmp_path, change):
    """Every file of a folder result written whole (a model card's README.md, its plots), changed
    each way after it was written: --overwrite refuses in one line naming it; put back, it replaces."""
    out = tmp_path / "card"
    names = ["README.md", "recipe.yaml", "plots/loss.png"]
    claim_output(str(out), "card", "card --output", folder=True)
    with staged(str(out), folder=True, kind="card") as path:
        for name in names:
            Path(path, name).parent.mkdir(exist_ok=True)
            Path(path, name).write_text(f"written: {name}")
    for name in names:
        file, kept = out / name, (out / name).read_text()
        if change == "removed":
            file.unlink()
        else:
            file.write_text("written: edited!" if change == "edited" else kept.upper())
        with pytest.raises(UserError, match=rf"but {name} in it was changed \(or removed\) since it was written"):
            claim_output(str(out), "card", "card --output", overwrite=True, folder=True)
        file.write_text(kept)
        os.utime(file, ns=(file.stat().st_atime_ns, json_mtime(out, name)))
    claim_output(str(out), "card", "card --output", overwrite=True, folder=True)


def json_mtime(folder: Path, name: str) -> int:
    """The modification time the result's record holds for `name` (what the guard wrote)."""
    import json

    return json.loads((folder / ".medrecipes.json").read_text())["stats"][name][1]


def test_a_claim_under_folders_not_made_yet_leaves_none_when_nothing_is_written(tmp_path):
    from medrecipes.outputs.claims import release

    out = tmp_path / "a" / "b" / "result.json"
    claim_output(str(out), "eval", "eval: output")
    assert (tmp_path / "a" / "b").is_dir()  # its lock lies there while the command works
    release(str(out))
    assert list(tmp_path.iterdir()) == []
    claim_output(str(out), "eval", "eval: output")
    with staged(str(out), folder=False, kind="eval") as path:
        Path(path).write_text("{}")
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == [".result.json.medrecipes.json", "result.json"]


# tokenizers (Rust) reports a full disk as a plain Exception with the system's words, no errno.
FULL_DISK_TOKENIZER = """
import tokenizers
def save(self, path, *args, **kwargs):
    raise Exception("No space left on device (os error 28)")
tokenizers.Tokenizer.save = save
"""


def test_a_full_disk_while_tiny_model_writes_its_tokenizer_is_one_line_and_leaves_nothing(tmp_path):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FULL_DISK_TOKENIZER)
    out = tmp_path / "tiny"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT / "src")])}
    result = subprocess.run(
        [PYTHON, "-m", "medrecipes.cli", "tiny-model", str(out)], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert f"the disk holding {tmp_path} is full" in line and "nothing was replaced" in line
    assert os.listdir(tmp_path) == ["hook"]  # no staging left, no half-written model


# The plain writes and deletes the package keeps outside `outputs/`, each with why it may: a new
# one fails the test below until it goes through `outputs.writes.staged` or is added here.
PLAIN_WRITES = {
    (
        "data/build.py",
        "_clear",
    ): "built data may live in object storage (fsspec), where there is no rename to stage by",
    ("data/build.py", "_save_stream"): "built data may live in object storage; removes the datasets cache it made",
    (
        "data/build.py",
        "build_data",
    ): "built data may live in object storage; the manifest, written last, marks it whole",
    ("data/manifest.py", "write_manifest"): "object storage through fsspec: a .tmp then a rename of its own",
    ("logs.py", "_gone"): "opens os.devnull, a run's stdout once its reader went away: no file is written",
    ("hub/checkpoints.py", "_push"): "removes its own temporary snapshot of final/ after the upload",
    ("mirror.py", "_link_or_copy"): "the checkpoint mirror: copies into a snapshot marked complete last",
    ("mirror.py", "snapshot_folder"): "the checkpoint mirror: copies into a snapshot marked complete last",
    ("mirror.py", "copy_to_url"): "the checkpoint mirror: object storage, the copy marked complete last",
    ("mirror.py", "_work"): "the checkpoint mirror: removes a snapshot it failed to complete",
    ("mirror.py", "mark_complete"): "the checkpoint mirror: the marker, written after every file of the copy",
    ("training/callbacks.py", "on_save"): "checkpoint retention deletes the run's own older checkpoints",
    ("training/transformers_seams.py", "_save_checkpoint"): "checkpoints: their own staging folder renamed into place",
    ("training/mixins.py", "write_into_checkpoint"): "the stream's position, into a checkpoint's staging folder",
    ("training/run.py", "save_final"): "final/: the staging of checkpoints, renamed into place",
    ("runs/folder.py", "start_over"): "overwrite_output_dir: deletes the earlier run's state in its claimed folder",
    (
        "training/run_folder.py",
        "claim_run_folder",
    ): "makes the run's folder, claimed and locked for it, before it is marked",
    (
        "training/run_folder.py",
        "_remove_unused",
    ): "removes the new run folder a refused start made, where it holds only its own record",
}

# What writes, removes, moves or links a file or folder: Python's and the libraries' own calls (a
# method of an fsspec filesystem, `fs`, for those whose names say other things elsewhere).
WRITING_CALLS = {
    "write_text", "write_bytes", "unlink", "rmtree", "copy2", "copytree", "copyfile", "move", "mkdir", "makedirs",
    "rmdir", "removedirs", "symlink", "link", "symlink_to", "hardlink_to", "touch", "truncate",
    "save_to_disk", "save_pretrained", "save_model", "save", "to_json", "to_parquet", "to_csv",
}  # fmt: skip
OS_CALLS = {"remove", "replace", "rename", "copy"}  # of os and shutil: str.replace is not a write
FS_CALLS = {"rm", "rm_file", "put", "put_file", "mv", "pipe", "pipe_file", "cp_file", "makedirs"}


def _plain_writes() -> list[tuple[str, str, int]]:
    """(file, function, line) of every call in src/medrecipes outside outputs/ and in recipes/ that
    writes, moves, links or deletes a file or folder and is not inside a `with staged(...)` block,
    nor in a function every call of which is inside one (or in another such function)."""
    import ast

    def writes(call: ast.Call) -> bool:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        owner = getattr(func.value, "id", None) if isinstance(func, ast.Attribute) else None
        if name == "open":  # Python's, Path's or a filesystem's: a write where its mode says so
            modes = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "mode")]
            return any(isinstance(m, ast.Constant) and set(str(m.value)) & set("wax+") for m in modes)
        return (
            name in WRITING_CALLS
            or (owner in ("os", "shutil") and name in OS_CALLS)
            or (owner == "fs" and name in FS_CALLS)
        )

    def staged(node) -> bool:
        return isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call)
            and getattr(item.context_expr.func, "attr", getattr(item.context_expr.func, "id", None)) == "staged"
            for item in node.items
        )

    def called(call: ast.Call) -> str | None:
        return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", None)

    found, calls = [], []  # calls: (name called, calling function, inside a staged block)

    def walk(node, inside_staged: bool, function: str, file: str):
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            inside = inside_staged or staged(node)
            if isinstance(child, ast.Call):
                calls.append((called(child), function, inside))
                if writes(child) and not inside:
                    found.append((file, name, child.lineno))
            walk(child, inside, name, file)

    for root in (ROOT / "src" / "medrecipes", ROOT / "recipes"):
        for path in sorted(root.rglob("*.py")):
            file = path.relative_to(root).as_posix()
            if not file.startswith("outputs/"):
                walk(ast.parse(path.read_text(encoding="utf-8")), False, "<module>", file)
    # A function whose every call is staged (or made from such a function) writes into staging.
    into_staging: set[str] = set()
    while True:
        sites: dict[str, list[bool]] = {}
        for name, caller, inside in calls:
            sites.setdefault(name, []).append(inside or caller in into_staging)
        grown = {name for name, staged_calls in sites.items() if all(staged_calls)}
        if grown <= into_staging:
            break
        into_staging |= grown
    return [(file, function, line) for file, function, line in found if function not in into_staging]


def test_every_write_goes_through_the_guard_or_says_why():
    """Each file a command writes goes through `outputs/` (claimed, staged, renamed into place),
    where a kill or a full disk leaves the earlier result whole; the few plain writes left are
    listed above with their reason, and a new one is found here, whatever call makes it."""
    found = _plain_writes()
    unlisted = [
        f"{file}:{line} in {function}" for file, function, line in found if (file, function) not in PLAIN_WRITES
    ]
    assert not unlisted, (
        "plain writes outside outputs/ (use outputs.writes.staged, or list with a reason): " + ", ".join(unlisted)
    )
    assert {(file, function) for file, function, _ in found} == set(PLAIN_WRITES)  # no entry outlives its write
    assert all(len(reason) > 20 for reason in PLAIN_WRITES.values())


@pytest.mark.parametrize("kind", ["run", "report"])
def test_another_process_checking_the_same_folder_is_not_taken_for_a_users_file(tmp_path, kind):
    """Every process of a launch checks that output_dir takes a file (a probe, there for an instant)
    while it parses the recipe; the writing process, claiming the folder at that instant, must not
    take that probe for a user's file. A user's file beside it is still refused."""
    from medrecipes.outputs.claims import check_writable
    from medrecipes.outputs.records import PROBE, mark, not_written

    out = tmp_path / "out"
    out.mkdir()
    probe = out / f"{PROBE}k2x9"
    probe.write_text("")  # the other rank's, mid-check
    claim_output(str(out), kind, "recipe: output_dir", overwrite=True, folder=True)
    check_writable(str(out), "recipe: output_dir", folder=True)  # its own probe leaves nothing behind
    assert sorted(p.name for p in out.iterdir() if p.name != ".medrecipes.lock") == [probe.name]
    mark(str(out), kind, whole=True)
    (out / f"{PROBE}later").write_text("")
    assert not_written(str(out)) is None
    (out / "notes.txt").write_text("the user's")
    (out / ".medrecipes.json").unlink()
    with pytest.raises(UserError, match="did not write"):
        claim_output(str(out), kind, "recipe: output_dir", overwrite=True, folder=True)


def test_a_run_folders_own_names_are_not_another_commands_output(tmp_path):
    """Another command may write beside a run (an evaluation in its folder), but not under the names
    the run writes itself: its final model, a checkpoint (a resume would take it for the run's) or its
    staging; a folder the run wrote is named as part of that run, not as a user's."""
    from medrecipes.outputs.claims import release
    from medrecipes.outputs.records import mark

    run_folder = tmp_path / "run"
    run_folder.mkdir()
    mark(str(run_folder), "run")
    (run_folder / "final").mkdir()
    (run_folder / "final" / "config.json").write_text("{}")
    for name, kept in (("final", "final model"), ("checkpoint-40", "checkpoint-40"), ("_staging", "_staging")):
        with pytest.raises(UserError) as refused:
            claim_output(str(run_folder / name), "tiny-model", "tiny-model OUT_DIR", overwrite=True, folder=True)
        assert str(refused.value).endswith(f"is where the run in {run_folder} keeps its {kept}; write it elsewhere")
        assert not (run_folder / name).exists() or name == "final"
    (run_folder / "runs").mkdir()  # the run's logs, below its folder
    (run_folder / "runs" / "events").write_text("")
    with pytest.raises(UserError, match=f"runs is part of the 'run' result in {run_folder}; name a new path"):
        claim_output(str(run_folder / "runs"), "tiny-model", "tiny-model OUT_DIR", folder=True)
    for inside in ("final/eval.json", "checkpoint-2/scores/p.json"):  # a file put into the run's own
        with pytest.raises(UserError, match=f"is inside where the run in {run_folder} keeps its"):
            claim_output(str(run_folder / inside), "eval", "eval --output")
    claim_output(str(run_folder / "eval.json"), "eval", "eval --output")  # beside the run: its own name
    release(str(run_folder / "eval.json"))
    (tmp_path / "link").symlink_to(run_folder / "final")  # a way into final/ by another name
    with pytest.raises(UserError, match="is where the run in .* keeps its final model"):
        claim_output(str(tmp_path / "link"), "run", "recipe: output_dir", overwrite=True, folder=True)
    with pytest.raises(UserError, match="is inside where the run in .* keeps its final model"):
        claim_output(str(tmp_path / "link" / "nested"), "run", "recipe: output_dir", overwrite=True, folder=True)
    assert sorted(p.name for p in (run_folder / "final").iterdir()) == ["config.json"]
