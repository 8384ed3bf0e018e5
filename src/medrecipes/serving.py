"""Trying a trained model: one answer (`medrecipes generate`) or an OpenAI-compatible chat
endpoint (`medrecipes serve`), from a local folder such as output_dir/final, or a Hub id.

Both stand on transformers: the text-generation pipeline, which applies the model's chat
template and stops at its end-of-turn tokens, and `transformers serve`, which answers
/v1/chat/completions (and /v1/responses) for the model it is started with.
"""

import os
import sys

from medrecipes.errors import UserError
from medrecipes.locations import looks_local


def _check_model(model: str) -> None:
    from medrecipes.models.files import check_model_folder, check_tokenizer_files

    if looks_local(model) and not os.path.isdir(model):
        raise UserError(f"model '{model}': no such folder; pass a trained model's folder (e.g. output_dir/final)")
    check_model_folder(model)
    check_tokenizer_files(model)


def generate(model: str, prompt: str, system: str | None = None, max_new_tokens: int = 256) -> str:
    """The model's greedy answer to `prompt`, as a chat turn when the model has a chat template."""
    from transformers import pipeline

    _check_model(model)
    pipe = pipeline("text-generation", model=model, dtype="auto")
    if pipe.tokenizer.chat_template is None:
        output = pipe(prompt, max_new_tokens=max_new_tokens, do_sample=False, return_full_text=False)
        return output[0]["generated_text"]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    output = pipe(messages, max_new_tokens=max_new_tokens, do_sample=False)
    return output[0]["generated_text"][-1]["content"]


def _check_address(host: str, port: int) -> None:
    """Bind the address once, as the server will, so that an unknown host or a port in use is one
    line here rather than the server's log and exit code 3."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise UserError(
            f"serve: --host {host}: unknown host ({err.strerror}); use 127.0.0.1, 0.0.0.0 or a name this machine has"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as err:
            raise UserError(
                f"serve: cannot listen on {host}:{port} ({err.strerror}); stop what uses that port or pass another --port"
            ) from None


def serve(model: str, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Replace this process with `transformers serve MODEL`; it needs the `serve` extra."""
    from transformers.utils.import_utils import is_serve_available

    _check_model(model)
    if not is_serve_available():
        raise UserError("serve: needs fastapi, uvicorn and openai; pip install 'medrecipes[serve]'")
    _check_address(host, port)
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", model]
    print(f"serving {model} at http://{host}:{port}/v1/chat/completions (model name: {model})", flush=True)
    os.execv(sys.executable, [*command, "--host", host, "--port", str(port)])
