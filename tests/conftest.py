"""Shared test set-up: offline, one thread per process, a tiny model built once per session."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # two torch threads on two loaded cores run far slower
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
# Caches (datasets, DeepSpeed's compiled CPU ops) in the checkout, not under HOME, which may be
# read-only or another user's; kept between runs, so the ops compile once per checkout.
os.environ.setdefault("XDG_CACHE_HOME", str(ROOT / ".cache"))
os.environ.setdefault("HF_HOME", str(ROOT / ".cache" / "huggingface"))


def _home_cache(name: str) -> str | None:
    """`~/.cache/<name>` where HOME takes it (made, and a file written there), else None."""
    folder = Path.home() / ".cache" / name
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        return None
    return str(folder)


# DeepSpeed's CPU ops compile in about 35 s and depend only on torch and DeepSpeed, not on the
# checkout: under a writable HOME they compile once per machine, not once per clone.
if "TORCH_EXTENSIONS_DIR" not in os.environ and (_extensions := _home_cache("torch_extensions")):
    os.environ["TORCH_EXTENSIONS_DIR"] = _extensions
SHARED_DATA = ROOT.parent / "shared" / "data"
CORPUS = ROOT / "data" / "medical_text" / "train.jsonl"


@pytest.fixture(autouse=True, scope="session")
def _no_logger_settings():
    """A developer's own logger settings (WANDB_PROJECT, ...) are said by every recipe that logs
    elsewhere: left out of the tests' environment, and of the commands they run."""
    from medrecipes.config.library_checks import logger_settings

    for name in [name for names in logger_settings([]).values() for name in names]:
        del os.environ[name]


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may use, at most 4. A worker runs recipes as
    subprocesses, some of them two processes at once, each with one thread; more workers than
    cores only make each slower, and many would fill a large machine's memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


# The modules of make test whose runs take the longest, first: xdist hands each module whole to a
# worker in the order collected, so a long one collected last (alphabetically) keeps one worker busy
# while the other waits. An order only: a module missing here or renamed runs in its place.
LONGEST_FIRST = ("test_write_guard", "test_run_folder", "test_long_runs", "test_sft_recipe", "test_cpt_recipe",
                 "test_serving", "test_config", "test_preference_recipes", "test_bad_inputs")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    """The longest modules first (LONGEST_FIRST); tests marked `gpu` run where CUDA is visible
    (`pytest -m gpu` on a GPU machine) and are skipped elsewhere."""
    import torch

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A random 2-layer llama with a tokenizer trained on the bundled medical text."""
    from medrecipes.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("tiny-model")), [str(CORPUS)], "llama")


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    """The tiny model's tokenizer (byte-level BPE, BOS added, EOS and pad tokens)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    """Write rows as JSON Lines; returns the path as a string."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def run(*args: str, cwd: Path = ROOT, timeout: int = 900, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command as a user types it, from the project root, and capture its output; `env`
    adds to the environment (its PYTHONPATH goes before the project's)."""
    env = env or {}
    path = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **env, "PYTHONPATH": path}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


PYTHON = sys.executable
# A command run with this environment meets bitsandbytes as on a CPU with AVX512-BF16 (see the
# folder's sitecustomize.py): its import then prints a line, whatever this machine's CPU.
AVX512_BF16_CPU = {"PYTHONPATH": str(ROOT / "tests" / "avx512_bf16_cpu")}
BNB_LINE = "Failed to load CPU gemm_4bit_forward"
ACCELERATE = Path(sys.executable).parent / "accelerate"
# `accelerate launch` on a free port: two launches of the suite that start together on the
# default 29500 can both find it free, and the later one then fails to listen on it.
LAUNCH = (ACCELERATE, "launch", "--main_process_port", "0")


def error_lines(output: str) -> list[str]:
    """The one-line errors (`error: ...`) in a command's output."""
    return [line for line in output.splitlines() if line.startswith("error: ")]


def run_ok(*args, **kwargs) -> subprocess.CompletedProcess:
    """`run`, requiring exit code 0; a failure shows the tail of the output."""
    result = run(*args, **kwargs)
    # A recipe's own one-line error can sit above a launcher's long report of the exit: shown first.
    errors = error_lines(result.stderr)
    assert result.returncode == 0, "\n".join([*errors, result.stdout[-3000:], result.stderr[-3000:]])
    return result


def run_recipe(script: str, *args, launcher=(PYTHON,)) -> subprocess.CompletedProcess:
    """Run a recipe script (under `launcher`, e.g. `accelerate launch ...`); it must succeed."""
    return run_ok(*launcher, script, *args)


def log_history(output_dir) -> list[dict]:
    """The trainer's log history saved in output_dir."""
    return json.loads((Path(output_dir) / "trainer_state.json").read_text())["log_history"]


# Recipe overrides for runs that train only: no evaluation, so no best model to load back.
NO_EVAL = ["--eval_strategy", "no", "--eval_on_start", "false", "--load_best_model_at_end", "false"]


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory) -> str:
    """A 2-layer llama of width 128: small enough for CPU, large enough to learn 60 questions."""
    from medrecipes.models.tiny import build_tiny_model

    return build_tiny_model(str(tmp_path_factory.mktemp("chat-model")), [str(CORPUS)], "llama", hidden_size=128)


@pytest.fixture(autouse=True)
def _no_progress_bar_left_from_an_earlier_test():
    """Each in-process test starts with no progress bar open. A user error is printed on a line of
    its own where a bar left its line open (`errors.exit_on_user_error`), which is right in a
    command's own process; in a test worker, a bar an earlier test's exception kept alive (its
    traceback holds the frame) would put that newline before another test's one-line error."""
    bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
    if getattr(bars, "_instances", None):
        bars._instances.clear()
    yield


def card_record(method: str, parsed, hardware: str = "1 x CPU, 1 node, one process", command: str = "") -> dict:
    """The run.json record of a finished run of a parsed recipe ((recipe, training args, model
    args)), as far as `hub.card.model_card` reads it."""
    from medrecipes.config import method_named, resolved_recipe
    from medrecipes.runs.described import card_facts

    recipe, args, model_args = parsed
    script = method_named(method).script
    return {
        "script": script,
        "command": command or f"python {script}",
        "recipe": resolved_recipe(recipe, model_args, args),
        "settled": {"method": method},
        "card": card_facts(recipe, model_args, args),
        "finished": {"hardware": hardware},
    }
