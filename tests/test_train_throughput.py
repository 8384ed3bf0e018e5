"""benchmarks/train_throughput.py on CPU: every tiny case runs with its baseline and writes its
results file; an ablation switches each speed setting; the GPU cases set up as far as a CPU can
take them. No speed is asserted: the figures of a CPU say nothing about a GPU."""

import dataclasses
import importlib.util
import json
import os
import re
import shutil

import pytest
from conftest import PYTHON, ROOT, run, run_ok

TINY = ("cpt_tiny", "pretrain_tiny", "sft_lora_tiny", "grpo_tiny")
KEYS = (
    "case",
    "device",
    "tokens_per_s",
    "mfu",
    "peak_mem_gb",
    "baseline_tokens_per_s",
    "plain_loop_tokens_per_s",
    "ratio",
    "ratio_to_plain_loop",
    "command",
    "versions",
)


# The cases measured on a GPU, and those at a real small model's size (SmolLM2-135M) for a CPU.
SIZED_CASES = sorted(p.stem for p in (ROOT / "benchmarks" / "configs").glob("*.json") if not p.stem.endswith("_tiny"))


def bench(*args):
    return run_ok(PYTHON, "benchmarks/train_throughput.py", *args, "--device", "cpu", timeout=600)


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-results")
    bench(*TINY, "--out", out)
    return out


@pytest.mark.slow
@pytest.mark.long  # the benchmark's own run, every case against its baseline
def test_every_case_runs_against_its_baseline_and_writes_results(tiny_results):
    tmp_path = tiny_results
    for case in TINY:
        result = json.loads((tmp_path / f"{case}-cpu.json").read_text())
        assert set(KEYS) <= set(result)
        assert (result["case"], result["device"]) == (case, "cpu")
        assert result["ratio"] > 0 and result["tokens_per_s"] > 0 and result["baseline_tokens_per_s"] > 0
        assert result["ratio"] == pytest.approx(result["tokens_per_s"] / result["baseline_tokens_per_s"])
        assert result["ratio_to_plain_loop"] == pytest.approx(
            result["tokens_per_s"] / result["plain_loop_tokens_per_s"]
        )
        assert result["complete"] is True and result["timed_out"] is None
        assert result["mfu"] is None  # no peak FLOP/s for a CPU
        assert result["versions"]["torch"] and result["versions"]["transformers"]
        assert "train_throughput.py" in result["command"] and case in result["command"]
        ours, baseline = result["ours"], result["baseline"]
        # The step split adds up to the step; ours and the baseline train on the same tokens.
        assert sum(ours["split_s"].values()) == pytest.approx(ours["step_s"])
        assert ours["split_s"]["forward_backward"] > 0
        assert ours["model_tflops_per_s"] > 0
        if case != "sft_lora_tiny":  # packed rows and padded batches split the examples differently
            assert ours["tokens"] == baseline["tokens"]
        # The plain loop trains the same rows and positions: the same tokens (SFT: TRL's packing of
        # the same examples, shuffled by another generator than the trainer's sampler; GRPO: the
        # same prompts, completions sampled)
        plain = result["plain_loop"]
        assert plain["settings"]["arm"] == "plain loop" and plain["split_s"]["forward_backward"] > 0
        if case != "grpo_tiny":
            assert plain["tokens"] == pytest.approx(ours["tokens"], rel=0.05 if case == "sft_lora_tiny" else 0)
        assert plain["settings"]["lora"] == (case == "sft_lora_tiny")
    sft = json.loads((tmp_path / "sft_lora_tiny-cpu.json").read_text())
    assert sft["ours"]["settings"]["packing"] is True and sft["baseline"]["settings"]["packing"] is False
    assert sft["ours"]["tokens"] == pytest.approx(sft["baseline"]["tokens"], rel=0.25)
    cpt = json.loads((tmp_path / "cpt_tiny-cpu.json").read_text())
    assert not cpt["ours"]["settings"][
        "fused_lm_head"
    ]  # on a CPU the chunked head costs time and saves nothing needed
    assert not cpt["baseline"]["settings"]["fused_lm_head"]
    grpo = json.loads((tmp_path / "grpo_tiny-cpu.json").read_text())
    for record in (grpo["grpo"], grpo["plain_loop_grpo"]):
        assert record["generated_tokens"] > 0 and record["generation_s"] > 0 and record["training_s"] > 0


# The callbacks ours adds that act at every step, each a few Python comparisons: the NaN guard's
# decision and the preemption handler's check for a signal.
OUR_STEP_CALLBACKS = 2


@pytest.mark.slow
@pytest.mark.long  # reads the benchmark's run above
def test_ours_reads_the_device_no_more_often_than_the_plain_trainer(tiny_results):
    """Per optimizer step, ours reads tensor values on the host (a wait for the GPU each) no more
    often than the plain trainer, and calls no more callback methods than it plus ours. Counts,
    not timings: the same on any machine."""
    for case in TINY:
        result = json.loads((tiny_results / f"{case}-cpu.json").read_text())
        ours, baseline = result["ours"], result["baseline"]
        assert ours["host_reads_per_step"] <= baseline["host_reads_per_step"], case
        assert ours["callback_calls_per_step"] <= baseline["callback_calls_per_step"] + OUR_STEP_CALLBACKS, case


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("arms", [[], ["--no-baseline"]], ids=["plain-trainer-first", "plain-loop-first"])
def test_a_time_limit_is_written_as_a_timeout_with_the_runs_it_finished(tmp_path, arms):
    """The SIGTERM of the `timeout` that bounds a case (gpu_session.sh), in the middle of any arm,
    ours included (whose recipe callbacks would take it for a preemption and stop cleanly): the
    results file keeps every run that finished, says the case timed out, and the exit code is 124."""
    import signal
    import subprocess
    import time

    case = json.loads((ROOT / "benchmarks" / "configs" / "cpt_tiny.json").read_text())
    case["steps"] = 600  # long enough to be cut in the middle of the second arm
    (tmp_path / "cpt_long.json").write_text(json.dumps(case))
    out = tmp_path / "out"
    command = [PYTHON, "benchmarks/train_throughput.py", str(tmp_path / "cpt_long.json"), "--device", "cpu"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    process = subprocess.Popen([*command, *arms, "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    results = out / "cpt_long-cpu.json"
    deadline = time.monotonic() + 300
    while not results.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # written when the first arm ends
    time.sleep(3)  # into the second arm's training
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 124, output[-3000:]
    result = json.loads(results.read_text())
    assert result["complete"] is False and "SIGTERM" in result["timed_out"] and "TIMED OUT" in output
    first = "plain_loop" if arms else "baseline"
    assert result[first]["measured_steps"] == 599 and result["ours"] is None
    assert not list(out.glob("*.partial"))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped exception, on purpose
def test_a_time_limit_that_comes_during_garbage_collection_still_ends_the_run_as_a_timeout():
    """Python drops the exception of a signal handler that runs inside a weakref's callback: the
    run goes on to its end, and is then ended as a timeout all the same."""
    import gc
    import signal
    import weakref

    measure = load_script("throughput.measure")

    class Held:
        pass

    held = Held()
    weakref.finalize(held, lambda: signal.raise_signal(signal.SIGTERM))  # the handler runs in the callback
    previous = signal.signal(signal.SIGTERM, measure.raise_timed_out)
    try:
        del held
        gc.collect()  # the run went on: nothing was raised here
        with pytest.raises(measure.TimedOut, match="SIGTERM received"):
            measure.check_timed_out()
    finally:
        signal.signal(signal.SIGTERM, previous)
        measure._received.clear()


@pytest.mark.slow
@pytest.mark.long
def test_repeats_pair_baseline_and_ours_run_back_to_back(tmp_path):
    bench("cpt_tiny", "--repeats", "2", "--out", tmp_path)
    result = json.loads((tmp_path / "cpt_tiny-cpu.json").read_text())
    repeats = result["repeats"]
    assert len(repeats["pairs"]) == 2
    first = repeats["pairs"][0]
    assert (first["ours_tokens_per_s"], first["baseline_tokens_per_s"]) == (
        result["tokens_per_s"],
        result["baseline_tokens_per_s"],
    )
    ratios = [pair["ours_tokens_per_s"] / pair["baseline_tokens_per_s"] for pair in repeats["pairs"]]
    assert [pair["ratio"] for pair in repeats["pairs"]] == pytest.approx(ratios)
    assert repeats["median"] == pytest.approx(sum(ratios) / 2)
    assert repeats["min"] == min(ratios) and repeats["max"] == max(ratios)
    assert repeats["window_min"] <= repeats["window_median"] <= repeats["window_max"]


@pytest.mark.slow
@pytest.mark.long  # a benchmark's check
def test_ablation_switches_each_speed_setting(tmp_path):
    bench("pretrain_tiny", "--ablate", "--no-baseline", "--out", tmp_path)
    result = json.loads((tmp_path / "pretrain_tiny-cpu.json").read_text())
    assert result["baseline"] is None and result["ratio"] is None
    changes = {key: value for run in result["ablation"] for key, value in run["changes"].items()}
    assert changes == {
        "fused_lm_head": True,
        "activation_checkpointing": True,
        "logging_nan_inf_filter": True,
        "optim": "adamw_torch",
    }
    for run_record in result["ablation"]:
        ((key, value),) = run_record["changes"].items()
        assert run_record["settings"][key] == value
        assert run_record["ratio_to_ours"] > 0


def gpu_session(*args, timeout: int = 300, **env):
    """benchmarks/gpu_session.sh with this environment's python3 first on PATH and no wheels to install."""
    path = f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}"
    return run(
        "bash",
        "benchmarks/gpu_session.sh",
        *args,
        env={"PATH": path, "WHEELS": "/nonexistent", **env},
        timeout=timeout,
    )


def test_gpu_session_stops_without_a_gpu_and_checks_its_grpo_data(tmp_path):
    for script in ("gpu_session.sh", "download_wheels.sh"):
        assert run("bash", "-n", f"benchmarks/{script}").returncode == 0
    result = gpu_session("grpo-usmle", OUT=str(tmp_path))
    assert result.returncode != 0 and "error: no GPU visible" in result.stdout + result.stderr
    result = gpu_session("grpo-usmle", OUT=str(tmp_path), REQUIRE_GPU="0", MEDQA=str(tmp_path / "none.jsonl"))
    assert result.returncode == 1 and f"error: no {tmp_path / 'none.jsonl'}; make wheels copies it" in result.stdout
    assert "error: no GPU visible" in (tmp_path / "gpu_session.log").read_text()
    result = gpu_session("cases", "pretrain_0p4b", OUT=str(tmp_path), REQUIRE_GPU="0", SESSION_SECONDS="30")
    assert result.returncode == 1
    assert "case pretrain_0p4b not started" in result.stdout and "run it with: " in result.stdout


def load_script(name: str):
    """A benchmark script's module, imported as it runs: from benchmarks/ (pytest's pythonpath)."""
    return importlib.import_module(name)


def test_greedy_answers_that_part_say_where_and_whether_the_dtype_decides_it():
    """A path whose greedy tokens part from generate's is told apart: a token swapped for a worse
    one in a float32 model is a real difference (margin above an error of 0), an answer cut short
    a difference of length, and in bf16 the same swap is measured against bf16's error."""
    import torch

    generation = load_script("grpo_generation")
    model = generation.build_model("tiny", "cpu")
    check = generation.prompts(2, 6, model.config.vocab_size, 1)
    expected = generation.run_path("generate", model, check, 6, sample=False)
    assert generation.divergences(model, check, expected, [list(a) for a in expected]) == []
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([check[1] + expected[1][:3]])).logits[0, -1]
    runner_up = logits.topk(2).indices[1].item()
    found = [expected[0][:4], expected[1][:3] + [runner_up] + expected[1][4:]]
    short, swapped = generation.divergences(model, check, expected, found)
    assert short == {"prompt": 0, "position": 4, "within_dtype_error": False}
    assert swapped["prompt"] == 1 and swapped["position"] == 3 and swapped["path_token"] == runner_up
    assert swapped["generate_token"] == expected[1][3] and swapped["margin"] > 0
    assert swapped["dtype_error"] == 0 and swapped["within_dtype_error"] is False
    half = generation.divergences(model.to(torch.bfloat16), check, expected, found)[1]
    assert half["dtype_error"] > 0 and half["within_dtype_error"] == (half["margin"] <= half["dtype_error"])


@pytest.mark.long  # four generation paths, one compiled
def test_gpu_session_measures_the_grpo_generation_paths_side_by_side(tmp_path):
    tiny = "--preset tiny --prompts 2 --generations 2 --prompt-tokens 6 --completion 6 --device cpu --compile-backend aot_eager"
    result = gpu_session("generation", OUT=str(tmp_path), REQUIRE_GPU="0", GEN_ARGS=tiny)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    found = json.loads((tmp_path / "grpo_generation-cpu.json").read_text())
    paths = {record["path"]: record for record in found["paths"]}
    assert list(paths) == ["generate", "continuous_batching", "static_cache", "static_compiled"]
    for record in paths.values():  # each path ran, generated every token asked, and answers as generate does
        assert record["tokens"] == 2 * 2 * 6 and record["greedy_same_as_generate"] is True, record
    assert paths["generate"]["ratio_to_generate"] == 1.0


TINY_LEVERS = {
    "LORA_CASE": "sft_lora_tiny",
    "CPT_CASE": "cpt_tiny",
    "GEN_ARGS": "--preset tiny --prompts 2 --generations 2 --prompt-tokens 16 --completion 16 --device cpu "
    "--compile-backend aot_eager",
    "ARCH": "tiny",
    "STEPS": "1",
    "EVAL_QUESTIONS": "4",
    "GRPO_ARGS": "--num_generations 2 --prompts_per_step 2 --per_device_train_batch_size 2 --max_completion_length 8 "
    "--num_generations_eval 2 --per_device_eval_batch_size 2 --rewards '[{name: usmle_accuracy}, "
    "{name: answer_format, weight: 0.2, style: letter}, {name: overlong_penalty, weight: 0.1, max_tokens: 8}]'",
    "REQUIRE_GPU": "0",
}
LEVERS_PARTS = ("lora", "generation", "cpt", "grpo-usmle")


def test_gpu_session_levers_starts_no_part_it_has_no_time_for(tmp_path):
    result = gpu_session("levers", OUT=str(tmp_path), SESSION_SECONDS="30", **TINY_LEVERS)
    assert result.returncode == 1
    for name in LEVERS_PARTS:
        assert f"levers: part {name} not started: " in result.stdout
    assert "levers summary" in result.stdout and not list(tmp_path.glob("*.json"))


@pytest.mark.slow
@pytest.mark.long
def test_gpu_session_levers_runs_every_part_at_tiny_size_and_times_each(tmp_path):
    """The GPU session's one call, at tiny size on a CPU: every part runs to its end within its
    limit, says how long it took, and leaves its results in $OUT."""
    medqa = ROOT.parent / "shared" / "data" / "medqa" / "medqa_us_4opt_test.jsonl"
    if not medqa.is_file():
        pytest.skip("grpo-usmle's part reads MedQA from ../shared/data")
    # The parts' limits of a GPU call (150 s each, 540 in all) are the tiny parts' running time on a
    # loaded 2-core machine; what this checks is that each part runs to its end, so they get room here
    # (the limits themselves: test_gpu_session_levers_starts_no_part_it_has_no_time_for).
    room = {"PART_SECONDS": "600", "SESSION_SECONDS": "2400"}
    result = gpu_session("levers", OUT=str(tmp_path), MEDQA=str(medqa), timeout=2400, **TINY_LEVERS, **room)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = result.stdout[result.stdout.index("levers summary") :]
    for name in LEVERS_PARTS:
        assert re.search(rf"^  {name}: done in \d+s$", summary, re.M), summary
    for found in ("sft_lora_tiny-cpu.json", "cpt_tiny-cpu.json", "grpo_generation-cpu.json"):
        assert json.loads((tmp_path / found).read_text())["complete"] is True, found
    lora = json.loads((tmp_path / "sft_lora_tiny-cpu.json").read_text())
    assert lora["profile_gap_to_plain_loop"] and lora["ratio_to_plain_loop"] > 0
    for arm in ("baseline", "plain_loop", "ours"):  # each profile's figures are per profiled step
        steps = {row["operator"]: row["calls_per_step"] for row in lora[arm]["profile"]}
        assert steps["ProfilerStep*"] == 1.0, arm
    paths = json.loads((tmp_path / "grpo_generation-cpu.json").read_text())["paths"]
    assert [p["path"] for p in paths] == ["generate", "static_compiled"]
    assert all(p["greedy_same_as_generate"] for p in paths)
    assert (tmp_path / "grpo-usmle-trainer_state.json").is_file()


def test_gpu_session_stages_a_model_one_part_a_call_and_checks_it_whole(tmp_path):
    """learn's model comes in four calls of one part each (a call carries at most 64 MiB): each part
    is kept outside the checkout while the machine is up, and the parts are joined and their hash
    checked before anything trains; a part missing or a hash that differs is one line."""
    import hashlib

    checkout, stage, out = tmp_path / "checkout", tmp_path / "stage", tmp_path / "out"
    (checkout / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "gpu_session.sh", checkout / "benchmarks")
    parts = [os.urandom(1000 + i) for i in range(4)]
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    env = {"PATH": f"{os.path.dirname(PYTHON)}:{os.environ['PATH']}", "STAGE": str(stage), "OUT": str(out),
           "WHEELS": "/nonexistent", "REQUIRE_GPU": "0", "LEARN_STAGES": "assemble"}  # fmt: skip

    def session(*args, **more):
        script = checkout / "benchmarks" / "gpu_session.sh"
        return run("bash", script, *args, env={**env, **more}, cwd=checkout, timeout=300)

    name = "gemma-3-270m-q4_k_m.gguf"
    assert session("stage-model", "7").returncode == 2
    missing = session("stage-model", "0")
    assert missing.returncode == 1 and f'carry=[".stage/{name}.part00"]' in missing.stdout
    for number, part in enumerate(parts):
        (checkout / ".stage").mkdir(exist_ok=True)
        (checkout / ".stage" / f"{name}.part0{number}").write_bytes(part)  # what the call carried
        if number == 3:
            early = session("learn", GGUF_SHA256=digest)
            assert early.returncode == 1 and "parts 3 of" in early.stdout and "not staged" in early.stdout
        kept = session("stage-model", str(number))
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert not (checkout / ".stage" / f"{name}.part0{number}").exists()
        assert (stage / f"{name}.part0{number}").read_bytes() == part
    wrong = session("learn", GGUF_SHA256="0" * 64)
    assert wrong.returncode == 1 and f"not {'0' * 64}; stage its parts again" in wrong.stdout
    assert not (stage / name).exists()
    joined = session("learn", GGUF_SHA256=digest)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    assert "sha256 as expected" in joined.stdout and (stage / name).read_bytes() == b"".join(parts)


def test_gpu_session_runs_the_grpo_recipe_without_installing(tmp_path):
    """The lent GPU machine has the image's python3 and carried wheels, no venv and no network:
    the script's own `make ... grpo-usmle` line, dry-run in a checkout with no .venv, runs the
    recipe and no install step."""
    script = (ROOT / "benchmarks/gpu_session.sh").read_text()
    (line,) = re.findall(r"^ *(make (?:[^\n]*\\\n)*[^\n]*?) *\|\| return 1$", script, re.M)
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    command = "work=/tmp/w; steps=2; " + line.replace("make ", "make -n ", 1)
    result = run("bash", "-c", command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pip" not in result.stdout and "venv" not in result.stdout
    assert "python3 recipes/grpo.py /tmp/w/grpo_usmle.yaml --model_name_or_path /tmp/w/pretrain/final" in result.stdout


@pytest.mark.parametrize("name", SIZED_CASES)
def test_every_sized_case_sets_up_on_a_cpu(name, tmp_path):
    """What a long session would otherwise find first: each case's recipe, keys and architecture
    parse, its data is made and its model counted (on the meta device), every ablation's change
    parses, and the baseline's keys are the plain trainer's."""
    throughput = load_script("train_throughput")
    from transformers import TrainingArguments
    from trl import GRPOConfig, SFTConfig

    case = throughput.load_case(name)
    bench = throughput.Bench(case, "cpu", str(tmp_path))
    assert bench.shape.num_parameters > (1.3e8 if name.endswith("_cpu") else 3e8) and len(bench.data) > 0
    for change in bench.knobs():
        bench.parse(change)
    plain = {"cpt": TrainingArguments, "sft": SFTConfig, "grpo": GRPOConfig}[case["method"]]
    assert set(case.get("baseline", {})) <= {f.name for f in dataclasses.fields(plain)}
