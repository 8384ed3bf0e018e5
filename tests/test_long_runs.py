"""Runs that survive: a tiny CPT run killed, preempted or killed while saving a checkpoint or
final/ resumes to the losses and weights of an uninterrupted run, step for step; so does a GRPO
run killed between steps. A constant learning rate: a step too many would change the weights."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import LAUNCH, NO_EVAL, PYTHON, ROOT, error_lines, run, run_recipe
from safetensors.torch import load_file

from medrecipes.runs.resume import last_checkpoint
from medrecipes.training.callbacks import checkpoint_steps

pytestmark = pytest.mark.slow

STEPS = 12


def recipe_args(model, output_dir, *extra):
    return [
        "recipes/tiny_cpt.yaml",
        "--model_name_or_path",
        model,
        "--output_dir",
        output_dir,
        "--max_steps",
        str(STEPS),
        "--save_steps",
        "4",
        "--logging_steps",
        "1",
        "--lr_scheduler_type",
        "constant",
        *NO_EVAL,
        *extra,
    ]


def finish(model, output_dir, *extra) -> str:
    return run_recipe("recipes/cpt.py", *recipe_args(model, output_dir, *extra)).stdout


def start(model, output_dir, *extra, hook_dir=None, script="recipes/cpt.py", args=None) -> subprocess.Popen:
    """The recipe (CPT unless named) as a background process, its output in output_dir.log."""
    path = [str(hook_dir)] if hook_dir else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT / "src")])}
    log = open(f"{output_dir}.log", "w")
    args = [str(a) for a in (args or recipe_args(model, output_dir, *extra))]
    return subprocess.Popen([PYTHON, script, *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def output_of(output_dir) -> str:
    return Path(f"{output_dir}.log").read_text()


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared:\n" + output_of(path.parent)[-3000:]
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.005)


def state(output_dir) -> dict:
    return json.loads((Path(output_dir) / "trainer_state.json").read_text())


def losses(output_dir) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in state(output_dir)["log_history"] if "loss" in e}


@pytest.fixture(scope="module")
def straight(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    finish(tiny_model, out)
    return out


def same_weights(a: Path, b: Path) -> bool:
    """Whether two model folders hold equal tensors, bit for bit."""
    a, b = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def assert_same_run(resumed, straight, steps=STEPS):
    assert losses(resumed) == losses(straight)  # exact floats, every step
    assert sorted(losses(resumed)) == list(range(1, steps + 1))
    assert state(resumed)["global_step"] == steps  # not one step past max_steps
    assert same_weights(Path(resumed) / "final", Path(straight) / "final")


# Makes the save of checkpoint-8 hang in torch.save of its optimizer state, after the model
# weights are written, and says so with a marker file: a process killed now dies mid-save.
SLOW_SAVE = """
import os, time, torch
_save = torch.save
def save(obj, f, *args, **kwargs):
    if str(f).endswith(os.path.join("checkpoint-8", "optimizer.pt")):
        open({marker!r}, "w").close()
        time.sleep(600)
    return _save(obj, f, *args, **kwargs)
torch.save = save
"""


def kill_when_it_hangs(model, out: Path, hook: str) -> int:
    """Run the CPT recipe into `out` with `hook` (a sitecustomize that makes a save hang once it
    has written the file named `marker`), SIGKILL it then; returns its exit status."""
    hook_dir, marker = out.parent / "hook", out.parent / "hanging"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(hook.format(marker=str(marker)))
    proc = start(model, out, hook_dir=hook_dir)
    wait_for(marker, proc)
    proc.send_signal(signal.SIGKILL)
    return proc.wait()


@pytest.fixture(scope="module")
def killed_while_saving(tiny_model, tmp_path_factory):
    """A run killed with SIGKILL in the middle of saving checkpoint-8: what it left, then resumed."""
    out = tmp_path_factory.mktemp("killed") / "run"
    left = {
        "returncode": kill_when_it_hangs(tiny_model, out, SLOW_SAVE),
        "staged": sorted(p.name for p in (out / "_staging" / "checkpoint-8").iterdir()),
        "checkpoints": checkpoint_steps(out),
        "last_checkpoint": last_checkpoint(str(out)),
        "final": (out / "final").exists(),
    }
    return out, left, finish(tiny_model, out)


def test_kill_during_save_leaves_nothing_half_written_to_resume(killed_while_saving):
    out, left, _ = killed_while_saving
    assert left["returncode"] == -signal.SIGKILL and not left["final"]
    # The weights of checkpoint-8 were written, its trainer state not: it stayed in staging.
    assert "model.safetensors" in left["staged"] and "trainer_state.json" not in left["staged"]
    assert left["checkpoints"] == [4]
    assert left["last_checkpoint"] == str(out / "checkpoint-4")


def test_resume_after_sigkill_repeats_the_uninterrupted_run(killed_while_saving, straight):
    out, _, stdout = killed_while_saving
    assert f"resuming from {out}/checkpoint-4" in stdout
    assert not (out / "_staging").exists()
    assert_same_run(out, straight)
    assert state(out)["num_input_tokens_seen"] == state(straight)["num_input_tokens_seen"] == STEPS * 8 * 128


# Makes the write of final/'s weights hang (transformers imports safetensors' save_file when it
# loads, after this has run) and says so with a marker file.
SLOW_FINAL = """
import os, time, safetensors.torch
_save_file = safetensors.torch.save_file
def save_file(tensors, filename, *args, **kwargs):
    if os.path.join("_staging", "final") in str(filename):
        open({marker!r}, "w").close()
        time.sleep(600)
    return _save_file(tensors, filename, *args, **kwargs)
safetensors.torch.save_file = save_file
"""


@pytest.mark.long
def test_a_kill_while_final_is_written_leaves_no_final_and_the_next_start_saves_it(tiny_model, straight, tmp_path):
    out = tmp_path / "run"
    assert kill_when_it_hangs(tiny_model, out, SLOW_FINAL) == -signal.SIGKILL
    assert not (out / "final").exists() and (out / "_staging" / "final" / "config.json").is_file()
    # What the user met: eval on the half-written folder. Now there is none to read.
    result = run(
        PYTHON, "-m", "medrecipes.cli", "eval", "--model", out / "final", "--data", "data/usmle_sample/test.jsonl"
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]

    stdout = finish(tiny_model, out)
    assert f"is at max_steps {STEPS}: final/ is saved from {out}/checkpoint-{STEPS}, no step trained" in stdout
    assert not (out / f"checkpoint-{STEPS + 1}").exists() and not (out / "_staging").exists()
    assert_same_run(out, straight)


# A disk that fills during a save: checkpoint-8's optimizer state meets ENOSPC, as Python's own
# writes report it; or final/'s weights meet torch's and safetensors' way, an error that does
# not say why, on a disk with 1 MiB left.
FULL_DISK = """
import errno, os, shutil, safetensors.torch, torch
_save, _save_file, _disk_usage = torch.save, safetensors.torch.save_file, shutil.disk_usage
full = []
def save(obj, f, *args, **kwargs):
    if {where!r} == "checkpoint" and str(f).endswith(os.path.join("checkpoint-8", "optimizer.pt")):
        open(f, "wb").write(b"part of it")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
    return _save(obj, f, *args, **kwargs)
def save_file(tensors, filename, *args, **kwargs):
    if {where!r} == "final" and os.path.join("_staging", "final") in str(filename):
        full.append(True)
        open(filename, "wb").write(b"part of it")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1024 vs 960")
    return _save_file(tensors, filename, *args, **kwargs)
def disk_usage(path):
    usage = _disk_usage(path)
    return usage._replace(free=2**20) if full else usage
torch.save, safetensors.torch.save_file, shutil.disk_usage = save, save_file, disk_usage
"""


@pytest.mark.parametrize("where, kept", [("checkpoint", 4), pytest.param("final", STEPS, marks=pytest.mark.long)])
def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(
    tiny_model, straight, tmp_path, where, kept
):
    out = tmp_path / "run"
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(FULL_DISK.format(where=where))
    assert start(tiny_model, out, hook_dir=hook_dir).wait() == 2, output_of(out)[-3000:]
    output = output_of(out)
    errors = error_lines(output)
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert f"the disk holding {out} is full" in errors[0], errors[0]
    assert f"{out}/checkpoint-{kept} is kept whole, and the same command resumes from it" in errors[0]
    # The part written is gone (it would only hold the space); what was saved before is whole.
    assert not (out / "_staging").exists() and not (out / "final").exists()
    assert checkpoint_steps(out)[-1] == kept
    if where == "checkpoint":  # a resume from a checkpoint at max_steps has a test of its own, above
        finish(tiny_model, out)
        assert_same_run(out, straight)


# The TensorBoard writer meets a full disk once checkpoint-4 is saved: its thread keeps the error,
# which the next logged value raises in the training loop.
FULL_DISK_LOGS = """
import errno, os
from tensorboard.summary.writer import record_writer
_write = record_writer.RecordWriter.write
def write(self, data):
    if os.path.isdir(os.path.join(os.environ["FULL_DISK_RUN"], "checkpoint-4")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return _write(self, data)
record_writer.RecordWriter.write = write
"""


def test_a_full_disk_under_the_tensorboard_writer_is_the_same_one_line(tiny_model, tmp_path, monkeypatch):
    out = tmp_path / "run"
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(FULL_DISK_LOGS)
    monkeypatch.setenv("FULL_DISK_RUN", str(out))
    assert start(tiny_model, out, "--report_to", "tensorboard", hook_dir=hook_dir).wait() == 2
    output = output_of(out)
    errors = error_lines(output)
    assert len(errors) == 1 and "Traceback" not in output, output[-3000:]
    assert f"the disk holding {out} is full" in errors[0] and "the run's logs and checkpoints" in errors[0]
    assert f"{out}/checkpoint-4 is kept whole, and the same command resumes from it" in errors[0], errors[0]


GRPO_STEPS = 6


def grpo_args(model, output_dir) -> list:
    """The tiny GRPO recipe from the tiny model for 6 steps, a checkpoint every 2; a learning
    rate high enough that every step moves the weights."""
    return [
        "recipes/tiny_grpo.yaml",
        *("--model_name_or_path", model, "--output_dir", output_dir, "--max_steps", GRPO_STEPS),
        *("--save_strategy", "steps", "--save_steps", "2", "--learning_rate", "1e-3", "--report_to", "none"),
        *NO_EVAL,
    ]


@pytest.mark.long  # the CPT runs' kills stay in make test
def test_grpo_killed_between_steps_resumes_to_the_same_weights(tiny_model, tmp_path):
    straight, out = tmp_path / "straight", tmp_path / "killed"
    run_recipe("recipes/grpo.py", *grpo_args(tiny_model, straight))
    proc = start(tiny_model, out, script="recipes/grpo.py", args=grpo_args(tiny_model, out))
    wait_for(out / "checkpoint-4", proc)
    proc.send_signal(signal.SIGKILL)  # in step 5: sampling, rewards and the update
    assert proc.wait() == -signal.SIGKILL
    assert checkpoint_steps(out) == [2, 4] and not (out / "final").exists()

    result = run_recipe("recipes/grpo.py", *grpo_args(tiny_model, out))
    assert f"resuming from {out}/checkpoint-4" in result.stdout
    assert_same_run(out, straight, steps=GRPO_STEPS)
    rewards = {e["step"]: e["reward"] for e in state(straight)["log_history"] if "reward" in e}
    assert rewards == {e["step"]: e["reward"] for e in state(out)["log_history"] if "reward" in e}
    assert not same_weights(out / "checkpoint-4", out / "final")  # the steps after the kill changed them


@pytest.mark.long  # a run signalled mid-training
@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGHUP])  # SLURM's notice; a closed terminal
def test_a_signal_saves_a_checkpoint_and_exits_0(tiny_model, straight, tmp_path, sig):
    out = tmp_path / "run"
    proc = start(tiny_model, out, "--preemption_grace_seconds", "60")
    wait_for(out / "checkpoint-4", proc)
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 0, output_of(out)[-3000:]
    stopped = checkpoint_steps(out)[-1]
    assert 4 < stopped < STEPS and not (out / "final").exists()
    assert f"{sig.name}: stopped at step {stopped} with checkpoint-{stopped}" in output_of(out)

    finish(tiny_model, out)
    assert_same_run(out, straight)


# A process whose checkpoint never comes: SIGTERM, then the grace time runs out.
HANGS = """
import os, signal, time
from medrecipes.training.callbacks import PreemptionHandler
PreemptionHandler(grace_seconds=1).on_train_begin(None, None, None)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(60)
"""


def test_grace_time_bounds_a_run_that_cannot_checkpoint():
    result = run(PYTHON, "-c", HANGS, timeout=60)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr[-2000:]
    assert "SIGTERM: no checkpoint within preemption_grace_seconds (1 s)" in result.stdout + result.stderr


# Two processes end a run through end_run; the script's argument is the status to end with.
ENDS = """
import atexit, sys, threading, time
from pathlib import Path
from types import SimpleNamespace
import torch
from accelerate import Accelerator, PartialState
from medrecipes.training.run import end_run

out, status = Path(sys.argv[1]), sys.argv[2]
PartialState(backend="gloo")  # as the trainer's arguments set it up on CPU
accelerator = Accelerator()
torch.distributed.all_reduce(torch.ones(1))
rank = accelerator.process_index
atexit.register(lambda: (out / f"atexit-{rank}").touch())
threading.Thread(target=lambda: (time.sleep(1), (out / f"thread-{rank}").touch())).start()
print(f"rank {rank} ended", end="")  # no newline: still in the buffer of a piped stdout
end_run(SimpleNamespace(accelerator=accelerator), int(status) if status.isdigit() else status)
print("not reached")
"""


@pytest.mark.long  # two launches of two processes each
@pytest.mark.parametrize("status, code", [("0", 0), ("error: the run stopped", 1)], ids=["ok", "message"])
def test_several_processes_end_with_the_status_after_exit_handlers_threads_and_output(tmp_path, status, code):
    script = tmp_path / "ends.py"
    script.write_text(ENDS)
    launch = (*LAUNCH, "--multi_gpu", "--num_processes", "2")
    result = run(*launch, script, tmp_path, status, timeout=120)
    assert result.returncode == code, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} ended" in result.stdout
        assert (tmp_path / f"atexit-{rank}").exists() and (tmp_path / f"thread-{rank}").exists()
    assert "not reached" not in result.stdout
    assert result.stderr.count("error: the run stopped") == (code == 1)  # printed once, by the first rank
