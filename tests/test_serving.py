"""`medrecipes generate` and `medrecipes serve` on a tiny model that has learnt one answer."""

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import torch
from conftest import PYTHON, ROOT
from transformers import AutoModelForCausalLM, AutoTokenizer

from medrecipes import cli

QUESTION = "Which vitamin deficiency causes scurvy?"
ANSWER = "Vitamin C deficiency causes scurvy."


@pytest.fixture(scope="module")
def memorised_model(tiny_model, tmp_path_factory) -> str:
    """The tiny model trained on one chat exchange until it answers it word for word."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    chat = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]
    ids = tokenizer.apply_chat_template(chat, return_tensors="pt", return_dict=True)["input_ids"]
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(80):
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    out = tmp_path_factory.mktemp("memorised")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def test_generate_prints_the_models_answer(memorised_model, capsys):
    cli.main(["generate", memorised_model, "--prompt", QUESTION, "--max-new-tokens", "32"])
    assert capsys.readouterr().out.strip() == ANSWER


def test_generate_names_a_missing_model_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", str(tmp_path / "absent"), "--prompt", "hi"])
    assert exit_.value.code == 2
    assert f"error: model '{tmp_path / 'absent'}': no such folder" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_answers_openai_chat_completions(memorised_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [PYTHON, "-m", "medrecipes.cli", "serve", memorised_model, "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(
            {"model": memorised_model, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 32}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, "the server exited"
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    reply = json.loads(response.read())
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the server did not answer"
                time.sleep(0.5)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert reply["object"] == "chat.completion"
    message = reply["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"].strip() == ANSWER
    assert reply["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("taken", [True, False], ids=["port in use", "unknown host"])
def test_serve_names_an_address_it_cannot_listen_on_in_one_line(memorised_model, taken, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        host = "127.0.0.1" if taken else "no-such-host.invalid"
        with pytest.raises(SystemExit) as exit:
            cli.main(["serve", memorised_model, "--host", host, "--port", str(port)])
    lines = capsys.readouterr().err.splitlines()
    assert exit.value.code == 2 and len(lines) == 1, lines
    assert ("cannot listen on" if taken else "unknown host") in lines[0]
