"""Which process of a launch prints a user error; how a data file that does not parse is named."""

import pytest

from medrecipes.errors import UserError, bad_lines_named, first_to_report, quoted


def test_the_first_rank_of_a_launch_reports_and_the_others_do_not(tmp_path, monkeypatch):
    attempt = tmp_path / "attempt_0"
    for rank in (0, 1):
        (attempt / str(rank)).mkdir(parents=True)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / "1" / "error.json"))
    assert first_to_report()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(attempt / "0" / "error.json"))
    assert not first_to_report()


def test_a_process_outside_a_launcher_or_without_its_folder_reports(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    assert first_to_report()
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "gone" / "0" / "error.json"))
    assert first_to_report() and first_to_report()


def test_a_parse_error_names_the_first_bad_line_of_the_files_read(tmp_path):
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_text('{"text": "a"}\n')
    bad.write_text('{"text": "a"}\n\n{"text": "b",}\n')
    with pytest.raises(UserError) as info, bad_lines_named([str(good), str(bad)]):
        raise ValueError("JSON parse error: Missing a name for object member. in row 1")
    assert str(info.value).startswith(f"{bad} line 3: not JSON (")
    with pytest.raises(ValueError, match="not a parse error"), bad_lines_named([str(good)]):
        raise ValueError("not a parse error")  # the files parse: the error is not theirs


def test_a_quoted_value_says_where_it_was_cut():
    assert quoted({"A": "Mitral"}) == '{"A": "Mitral"}'
    cut = quoted({"A": "Mitral regurgitation", "B": "Aortic regurgitation"}, 30)
    assert cut == '{"A": "Mitral regurgitation",...' and len(cut) <= 33
    assert quoted("é" * 50, 10) == '"' + "é" * 9 + "..."


def test_a_line_break_in_a_message_is_shown_as_one_line(capsys):
    from medrecipes.errors import exit_on_user_error

    @exit_on_user_error
    def fails():
        raise UserError("data/da\nta.jsonl: no such file")

    with pytest.raises(SystemExit):
        fails()
    assert capsys.readouterr().err == "error: data/da\\nta.jsonl: no such file\n"


def test_a_library_cache_the_environment_points_at_a_file_is_one_line(tiny_model, tmp_path, monkeypatch):
    """HF_HOME (or any cache or temporary folder the environment names) that no folder can be made
    in: datasets fails deep in its builder; the line names the variable, whichever command asked,
    and the innermost variable where several hold the path."""
    from conftest import PYTHON, run

    from medrecipes.errors import environment_folder

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    said = run(PYTHON, "-m", "medrecipes.cli", "preview", "recipes/tiny_sft.yaml", "--model_name_or_path", tiny_model,
               env={"HF_HOME": str(blocker)})  # fmt: skip
    assert said.returncode == 2 and "Traceback" not in said.stderr, said.stderr
    assert said.stderr.splitlines()[-1] == (
        f"error: HF_HOME={blocker} in the environment: a library cannot use {blocker / 'datasets'} (Not a directory); "
        "point HF_HOME at a folder you can write, or unset it"
    )
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(blocker / "datasets"))
    line = environment_folder(NotADirectoryError(20, "Not a directory", str(blocker / "datasets" / "json")))
    assert str(line).startswith(f"HF_DATASETS_CACHE={blocker / 'datasets'} in the environment: a library cannot use")


def test_an_error_outside_the_environments_folders_keeps_its_traceback(monkeypatch, tmp_path):
    from medrecipes.errors import environment_folder

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path))  # a user's own files are not a library's folder
    assert environment_folder(PermissionError(13, "Permission denied", str(tmp_path / "hf" / "hub"))) is not None
    assert environment_folder(PermissionError(13, "Permission denied", str(tmp_path / "runs" / "x"))) is None
    assert environment_folder(ValueError(str(tmp_path / "hf"))) is None


def test_a_library_setting_the_environment_holds_that_the_library_refuses_is_one_line(monkeypatch):
    """A value a library reads from the environment and refuses (huggingface_hub's timeouts as its
    constants load, accelerate's flags as its state is built): the line names the variable, at
    import as later; a refusal of the same text by code that does not read the environment keeps
    its traceback."""
    import os

    from conftest import PYTHON, run

    from medrecipes.errors import environment_value

    said = run(PYTHON, "-m", "medrecipes.cli", "validate", "recipes/tiny_sft.yaml", env={"HF_HUB_ETAG_TIMEOUT": "ten"})
    assert said.returncode == 2 and said.stderr.splitlines() == [
        "error: HF_HUB_ETAG_TIMEOUT='ten' in the environment is refused by a library (invalid literal for int() "
        "with base 10: 'ten'); set it as that library's documentation says, or unset it"
    ], said.stderr

    def flag(name):
        return {"yes": True, "no": False}[os.environ[name]] if os.environ[name] in ("yes", "no") else bad(name)

    def bad(name):
        raise ValueError(f"invalid truth value {os.environ[name]}")

    def unrelated():
        raise ValueError("invalid truth value banana")

    def called_by(call, depth=3):  # the error's innermost frames are the library's, not the caller's
        return call() if depth == 0 else called_by(call, depth - 1)

    monkeypatch.setenv("ACCELERATE_USE_CPU", "banana")
    for call, named in ((lambda: flag("ACCELERATE_USE_CPU"), True), (unrelated, False)):
        try:
            called_by(call)
        except ValueError as err:
            assert (environment_value(err) is not None) is named


def test_a_command_whose_reader_went_away_ends_quietly(tiny_model):
    """`medrecipes validate ... | head -1`: the pipe closes before the command writes; it ends as a
    closed pipe ends a process (141), with nothing on stderr."""
    import subprocess

    from conftest import PYTHON, ROOT

    command = [PYTHON, "-m", "medrecipes.cli", "validate", "recipes/tiny_sft.yaml", "--model_name_or_path", tiny_model]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # the reader is gone before the recipe is read
    _, stderr = process.communicate(timeout=300)
    assert (process.returncode, stderr.decode()) == (141, "")


def test_a_runs_output_whose_reader_went_away_is_dropped_and_the_run_goes_on(monkeypatch):
    """`python recipes/sft.py ... | head`: the trainer's metrics and the log lines then go nowhere;
    the run goes on to its final weights (a closed pipe would end it past its last checkpoint)."""
    import logging
    import os
    import sys
    from types import SimpleNamespace

    from medrecipes.logs import setup_logging

    read, write = os.pipe()
    os.close(read)
    stdout = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stdout)
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # wrapped too: put back after
    monkeypatch.setattr(logging.root, "handlers", [])  # basicConfig's handler, on this stdout
    setup_logging(SimpleNamespace(get_process_log_level=lambda: logging.INFO, should_log=True))
    print("{'loss': 2.5}" * 10_000)  # past a pipe's buffer: the write itself meets the closed pipe
    logging.getLogger("medrecipes").info("saved")
    sys.stdout.flush()
    assert sys.stdout is not stdout and sys.stdout.stream is not stdout  # its stand-in now


def test_memory_running_out_is_one_line_that_says_what_ran_out():
    """torch's allocator refusal on a CPU (a RuntimeError), Python's MemoryError and torch's GPU
    OutOfMemoryError, raised as they are or under another error: one line; other errors: none."""
    import torch

    from medrecipes.errors import out_of_memory

    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] . DefaultCPUAllocator: can't allocate memory: you tried to "
                       "allocate 134217728 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip
    gpu = torch.OutOfMemoryError(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    )
    try:
        raise ValueError("building the model failed") from cpu
    except ValueError as wrapped:
        under = wrapped
    said = {name: str(out_of_memory(err)) for name, err in {"cpu": under, "python": MemoryError(), "gpu": gpu}.items()}
    assert said["cpu"].startswith("this machine ran out of memory (asking for 134217728 bytes more): ")
    assert said["python"].startswith("this machine ran out of memory: ")
    assert said["gpu"].startswith("this machine ran out of a GPU's memory (asking for 2.00 GiB more): ")
    assert out_of_memory(RuntimeError("shape mismatch")) is None


def test_a_warning_before_logging_is_set_up_is_marked_as_one():
    """A recipe script's parse warns before it sets up logging: Python's handler of last resort
    would print the bare message, not marked beside the `error:` lines."""
    import subprocess
    import sys

    code = (
        "import logging; from medrecipes.errors import exit_on_user_error; "
        "exit_on_user_error(lambda: logging.getLogger('medrecipes.config').warning('bf16 is true'))()"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "warning: bf16 is true\n", result.stderr


def test_a_command_refuses_a_closed_output_and_escapes_what_its_encoding_lacks():
    """Started with standard output closed (>&-), what a command prints would be lost without a
    word: one line. An output encoding without a name's characters (PYTHONIOENCODING=ascii) gets
    them escaped, not a traceback after the work is done."""
    import os
    import subprocess
    import sys

    code = "from medrecipes.errors import exit_on_user_error; exit_on_user_error(lambda: print('anatomie_é'))()"
    closed = subprocess.run([sys.executable, "-c", code], capture_output=False, stdout=None, stderr=subprocess.PIPE,
                            text=True, timeout=120, pass_fds=(), close_fds=True,
                            preexec_fn=lambda: os.close(1))  # fmt: skip
    assert closed.returncode == 2 and closed.stderr.startswith("error: standard output is closed"), closed.stderr
    ascii_out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120,
                               env={**os.environ, "PYTHONIOENCODING": "ascii"})  # fmt: skip
    assert ascii_out.returncode == 0 and ascii_out.stdout == b"anatomie_\\xe9\n", ascii_out.stderr
