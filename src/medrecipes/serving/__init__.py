"""Trying a trained model: one answer (`medrecipes generate`) or an OpenAI-compatible server
(`medrecipes serve`), from a local folder such as output_dir/final (a LoRA adapter's folder too:
its base loaded and the adapter folded in), or a Hub id.

`generate` stands on transformers' text-generation pipeline, which applies the model's chat
template and stops at its end-of-turn tokens. `serve` is a small FastAPI app pinned to the one
model it was started with (docs/serving.md, `app`): chat completions, whole or streamed,
completions of text or token ids with their log-probabilities (what lm-eval's harness asks of a
served model), the model list and a health check, and nothing else; every request field checked
before the model runs (`requests`), every refusal a 4xx and one JSON line; one answer generated at
a time (`model`), requests waiting their turn, a bounded number of them.
"""

import errno
import ipaddress
import logging
import os
import socket
import sys

from medrecipes.errors import UserError
from medrecipes.locations import absent, file_as_model, looks_local, system_prompt_note, trained_system_prompt
from medrecipes.serving.app import create_app, error_body
from medrecipes.serving.model import ServedModel, capped_tokens, served_name
from medrecipes.serving.requests import CHAT_FIELDS, COMPLETION_FIELDS, RequestError  # noqa: F401 (the interface)

__all__ = ["CHAT_FIELDS", "COMPLETION_FIELDS", "RequestError", "ServedModel", "create_app", "generate", "serve",
           "served_name"]  # fmt: skip

API_KEY_ENV = "MEDRECIPES_API_KEY"


def _check_model(model: str) -> None:
    from medrecipes.models.files import check_model_folder, check_tokenizer_files

    if problem := file_as_model(model):
        raise UserError(f"model: {problem}")
    if looks_local(model) and not os.path.isdir(model) and not model.endswith(".gguf"):  # a .gguf: said below
        raise UserError(f"model '{model}': {absent(model)}; pass a trained model's folder (e.g. output_dir/final)")
    check_model_folder(model)
    if not os.path.isfile(os.path.join(os.path.expanduser(model), "adapter_config.json")):  # else its base's
        check_tokenizer_files(model, named_by=None)


def generate(model: str, prompt: str, system: str | None = None, max_new_tokens: int = 256) -> str:
    """The model's greedy answer to `prompt`, as a chat turn when the model has a chat template."""
    from transformers import pipeline

    from medrecipes.models.loading import load_for_inference, positions
    from medrecipes.models.templates import say_dropped_system

    _check_model(model)
    loaded, tokenizer = load_for_inference(model)
    limit = positions(loaded) or tokenizer.model_max_length
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    chat = tokenizer.chat_template is not None
    if chat and system:
        say_dropped_system(tokenizer, "generate --system")
    if chat and (note := system_prompt_note(model, system, "--system")):
        logging.getLogger("medrecipes").warning(note)
    specials = [t for t in tokenizer.all_special_tokens + [str(t) for t in tokenizer.added_tokens_decoder.values()]
                if len(t) > 1 and any(t in text for text in (prompt, system or ""))]  # fmt: skip
    if chat and specials:  # the tokenizer reads them as the markers themselves, not as the user's text
        logging.getLogger("medrecipes").warning(
            "generate: the prompt holds the tokenizer's own marker(s) %s, read as the markers themselves: the text "
            "opens or ends a turn of its own inside the user's; remove them",
            ", ".join(sorted(set(specials))),
        )
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) if chat else prompt
    length = len(tokenizer(text, add_special_tokens=not chat, verbose=False)["input_ids"])
    if length >= limit:  # no room for one token (serve refuses such a request with a 400)
        raise UserError(
            f"generate: the prompt is {length:,} tokens, and {model} has {limit:,} positions for the prompt and the "
            "answer together; shorten the prompt"
        )
    max_new_tokens = capped_tokens(max_new_tokens, limit, "--max-new-tokens", model, "it writes", prompt=length)
    pipe = pipeline("text-generation", model=loaded, tokenizer=tokenizer)
    if not chat:
        output = pipe(prompt, max_new_tokens=max_new_tokens, do_sample=False, return_full_text=False)
        return output[0]["generated_text"]
    output = pipe(messages, max_new_tokens=max_new_tokens, do_sample=False)
    return output[0]["generated_text"][-1]["content"]


def _check_address(host: str, port: int) -> bool:
    """Bind the address once, as the server will, so that an unknown host or a port in use is one
    line here rather than the server's log; returns whether every address it names is loopback."""
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
            fixes = {
                errno.EADDRNOTAVAIL: "this machine has no such address: pass --host 127.0.0.1 (this machine only), "
                "0.0.0.0 (all its addresses) or one of its own",
                errno.EACCES: "ports below 1024 need administrator rights: pass a --port from 1024 up",
            }
            fix = fixes.get(err.errno, "stop what uses that port or pass another --port")
            raise UserError(f"serve: cannot listen on {host}:{port} ({err.strerror}); {fix}") from None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_body_bytes: int = 2**20,
    max_tokens: int = 1024,
    name: str | None = None,
) -> None:
    """Answer for `model` at host:port, under `name` (default: its run's), until stopped; needs the
    `serve` extra."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("serve: needs fastapi and uvicorn; pip install 'medrecipes[serve]'") from None
    _check_model(model)
    loopback = _check_address(host, port)
    if api_key is not None and os.environ.get(API_KEY_ENV) not in (None, api_key):
        print(f"warning: serve: --api-key and {API_KEY_ENV} differ; requests must carry --api-key's, and the "
              f"environment's is refused", file=sys.stderr, flush=True)  # fmt: skip
    api_key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
    if api_key is not None and not api_key.strip():
        raise UserError(
            f"serve: the API key is empty (--api-key or {API_KEY_ENV}), which would leave the server open; "
            f"give a key, or leave both unset for a server without one"
        )
    if api_key is not None and any(c.isspace() for c in api_key):
        raise UserError(
            f"serve: the API key (--api-key or {API_KEY_ENV}) holds a space or other whitespace, "
            "which an Authorization header drops at its ends and splits at in its middle, so no client's request "
            "would carry it as given; remove the whitespace"
        )
    if api_key is not None and not (api_key.isascii() and api_key.isprintable()):
        raise UserError(
            f"serve: the API key (--api-key or {API_KEY_ENV}) holds a character other than printable ASCII, which "
            "an Authorization header does not carry alike from every client (the OpenAI SDK refuses it); use "
            "letters, digits and punctuation"
        )
    if not loopback:
        print(
            f"warning: serve: {host} is reachable from other machines; "
            + ("requests must carry the API key" if api_key else f"anyone who reaches port {port} can use the model: "
               f"set {API_KEY_ENV} (or --api-key) to require a key, and put TLS in front of it"),
            file=sys.stderr, flush=True,
        )  # fmt: skip
    if name is not None and (not name.strip() or name != name.strip()):
        raise UserError(
            f"serve: --served-model-name {name!r} is empty or has whitespace at an end, which each client would have "
            "to send as is; give the name without it"
        )
    _, trained = trained_system_prompt(model)
    if trained:  # a server has no system turn of its own to add: its clients send theirs, or none
        print(f"note: serve: {model} was trained with the system prompt {trained!r} (its run's run.json); clients "
              "get answers as it was trained where they send it as their system message", file=sys.stderr, flush=True)  # fmt: skip
    served = ServedModel(model, name=name, max_tokens=max_tokens)
    app = create_app(served, api_key=api_key, max_body_bytes=max_body_bytes)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address is bracketed in a URL
    print(f"serving {model} at http://{shown}:{port}/v1 (model name: {served.name})", flush=True)
    run_server(app, host, port)


def run_server(app, host: str, port: int) -> None:
    """uvicorn until stopped: at most 256 connections at once (503 beyond), idle keep-alive closed
    after 5 s, HTTP read by h11 (`_protocol`)."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False, limit_concurrency=256,
                timeout_keep_alive=5, http=_protocol())  # fmt: skip


def _protocol():
    """uvicorn's h11 protocol with its answer to bytes that are no HTTP request (no Host header, a
    malformed request line or header) in the API's JSON error shape: uvicorn's own is plain text,
    which clients that read the error's message cannot parse. The connection is closed after it."""
    import json

    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    message = (
        "the request is no valid HTTP/1.1 (its request line, a Host header and each header must be well-formed); "
        "send it with an HTTP client"
    )
    body = json.dumps(error_body(message)).encode()

    class JSONErrorProtocol(H11Protocol):
        def send_400_response(self, msg: str) -> None:
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                       (b"connection", b"close")]  # fmt: skip
            for event in (h11.Response(status_code=400, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

    return JSONErrorProtocol
