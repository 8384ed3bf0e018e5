"""What a user does with a trained model beyond evaluating it, as a real check runs it: one
question answered with `medrecipes generate` and over HTTP with `medrecipes serve`, a GRPO run
killed and resumed, a run pushed to (a local stand-in for) the Hub."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from checks.stages import ROOT, run


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


def grpo_resume(out: Path, report: Path, recipe: str) -> None:
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
            sys.executable, "recipes/grpo.py", recipe, "--output_dir", str(folder),
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


def push(out: Path, report: Path, recipe: str, repo: str) -> None:
    """The SFT recipe for 2 steps with push_to_hub, against the project's local stand-in for the
    Hub's HTTP API (benchmarks/checks/hub_standin.py; nothing here reaches the network): what was pushed,
    and the model card's record of the data."""
    from checks.hub_standin import HubStandIn

    folder = out / "push-run"
    args = ["--output_dir", str(folder), "--max_steps", "2", "--save_strategy", "no", "--logging_steps", "1"]
    args += ["--push_to_hub", "true", "--hub_model_id", repo, "--hub_token", "hf_local_stand_in"]
    with HubStandIn() as hub:
        env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
        print("$ HF_ENDPOINT=<local stand-in>", sys.executable, "recipes/sft.py", recipe, *args, flush=True)
        result = subprocess.run([sys.executable, "recipes/sft.py", recipe, *args], cwd=ROOT, env=env)
    if result.returncode != 0:
        sys.exit(f"real check: the SFT run with push_to_hub failed with exit code {result.returncode}")
    pushed = hub.repos[repo]["main"]
    card = pushed["README.md"].decode()
    (out / "push-card.md").write_text(card)
    data = str(out / "data" / "medmcqa_sft.jsonl")
    report.write_text(json.dumps({
        "repo": repo,
        "files": sorted(pushed),
        "card_names_the_data_file": data in card,
        "card_data_rows": [line for line in card.splitlines() if data in line and line.startswith("|")],
        "card_names_the_base_model": str(out / "base") in card,
        "card": str(out / "push-card.md"),
    }, indent=1) + "\n")  # fmt: skip
