"""Trying a trained model: one answer (`medrecipes generate`) or an OpenAI-compatible chat
endpoint (`medrecipes serve`), from a local folder such as output_dir/final (a LoRA adapter's
folder too: its base loaded and the adapter folded in), or a Hub id.

`generate` stands on transformers' text-generation pipeline, which applies the model's chat
template and stops at its end-of-turn tokens. `serve` is a small FastAPI app pinned to the one
model it was started with (docs/serving.md): it answers `POST /v1/chat/completions`, `GET
/v1/models` and `GET /health`, and nothing else (no model loading or unloading, no API docs);
it refuses, with a 4xx and a one-line JSON error, a body over its size limit, anything but a JSON
body (a page in a browser cannot send one across origins without asking first), a prompt that
leaves `max_tokens` no room in the model's positions, and every malformed field; with an API key
it answers only requests that carry it. One answer is generated at a time; requests wait their
turn, a bounded number of them.
"""

import ipaddress
import json
import os
import socket
import sys
import threading
import time
import uuid

from medrecipes.errors import UserError
from medrecipes.locations import looks_local

API_KEY_ENV = "MEDRECIPES_API_KEY"


def _check_model(model: str) -> None:
    from medrecipes.models.files import check_model_folder, check_tokenizer_files

    if looks_local(model) and not os.path.isdir(model):
        raise UserError(f"model '{model}': no such folder; pass a trained model's folder (e.g. output_dir/final)")
    check_model_folder(model)
    if not os.path.isfile(os.path.join(os.path.expanduser(model), "adapter_config.json")):  # else its base's
        check_tokenizer_files(model)


def generate(model: str, prompt: str, system: str | None = None, max_new_tokens: int = 256) -> str:
    """The model's greedy answer to `prompt`, as a chat turn when the model has a chat template."""
    from transformers import pipeline

    from medrecipes.models.loading import load_for_inference

    _check_model(model)
    loaded, tokenizer = load_for_inference(model)
    pipe = pipeline("text-generation", model=loaded, tokenizer=tokenizer)
    if pipe.tokenizer.chat_template is None:
        output = pipe(prompt, max_new_tokens=max_new_tokens, do_sample=False, return_full_text=False)
        return output[0]["generated_text"]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    output = pipe(messages, max_new_tokens=max_new_tokens, do_sample=False)
    return output[0]["generated_text"][-1]["content"]


# --------------------------------------------------------------------------- the chat server


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the one line it answers."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


ROLES = ("system", "user", "assistant")
# The request fields answered; others (tools, logprobs, response_format, ...) are refused by name.
FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream", "seed",
          "user")  # fmt: skip


class ServedModel:
    """The one model a server answers with, loaded once; `complete` generates one answer at a time."""

    def __init__(self, path: str, name: str | None = None, max_tokens: int = 1024):

        from medrecipes.models.loading import load_for_inference, positions

        self.model, self.tokenizer = load_for_inference(path)
        self.model.eval()
        self.name = name or path
        self.created = int(time.time())
        self.positions = positions(self.model) or self.tokenizer.model_max_length
        self.max_tokens = min(max_tokens, self.positions - 1)
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos] if eos is not None else []
        self.stop_ids = sorted(
            {*eos, *([self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else [])}
        )
        self.lock = threading.Lock()
        if self.tokenizer.chat_template is None:
            raise UserError(
                f"serve: {path} has no chat template, so messages cannot become a prompt; train it with one "
                "(chat_template_path) or add one to its tokenizer_config.json"
            )

    def parse(self, payload) -> dict:
        """The generation a request asks for, or the RequestError that refuses it."""
        if not isinstance(payload, dict):
            raise RequestError(400, "the body must be a JSON object with 'messages'")
        unknown = sorted(set(payload) - set(FIELDS))
        if unknown:
            raise RequestError(
                400, f"unsupported field(s) {', '.join(unknown)}; this server takes {', '.join(FIELDS)}"
            )
        if payload.get("model") not in (None, self.name):
            raise RequestError(404, f"model '{payload['model']}' is not served here; this server serves '{self.name}'",
                               "not_found_error")  # fmt: skip
        if payload.get("stream"):
            raise RequestError(400, "stream: true is not supported; ask without it for the whole answer at once")
        if payload.get("n", 1) != 1:
            raise RequestError(400, f"n must be 1, got {payload.get('n')!r}")
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages must be a non-empty list of {role, content}")
        turns = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ROLES:
                raise RequestError(400, f"messages[{i}]: expected {{role: {'|'.join(ROLES)}, content: text}}")
            content = message.get("content")
            if isinstance(content, list):  # OpenAI's content parts: text ones only
                if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                           for p in content):  # fmt: skip
                    raise RequestError(400, f"messages[{i}].content: only text parts are supported")
                content = "".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise RequestError(400, f"messages[{i}].content must be text")
            turns.append({"role": message["role"], "content": content})
        limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
        limit = min(256, self.max_tokens) if limit is None else limit
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= self.max_tokens:
            raise RequestError(400, f"max_tokens must be a whole number from 1 to {self.max_tokens}, got {limit!r}")
        temperature, top_p = payload.get("temperature", 0.0), payload.get("top_p", 1.0)
        for key, value, ok in (
            ("temperature", temperature, lambda v: 0 <= v <= 2),
            ("top_p", top_p, lambda v: 0 < v <= 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not ok(value):
                raise RequestError(400, f"{key} {value!r} is out of range (temperature 0 to 2, top_p above 0 to 1)")
        temperature, top_p = float(temperature), float(top_p)
        _check_sampling(temperature, top_p)
        seed = payload.get("seed")
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, int) or not SEEDS[0] <= seed <= SEEDS[1]
        ):
            raise RequestError(400, f"seed must be a whole number from {SEEDS[0]} to {SEEDS[1]}, got {seed!r}")
        try:
            ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_dict=True)["input_ids"]
        except Exception as err:  # the template's own refusal (e.g. roles out of order)
            raise RequestError(400, f"messages: the chat template refuses them ({str(err).splitlines()[0]})") from None
        if len(ids) + limit > self.positions:
            raise RequestError(
                400,
                f"the prompt is {len(ids)} tokens and max_tokens {limit}: together over the model's "
                f"{self.positions} positions; shorten the messages or lower max_tokens",
            )
        return {"ids": ids, "max_tokens": limit, "temperature": temperature, "top_p": top_p, "seed": seed}

    def complete(self, request: dict) -> dict:
        """The chat.completion answer to a parsed request."""
        import torch

        with self.lock, torch.no_grad():
            if request["seed"] is not None:
                torch.manual_seed(request["seed"])
            sample = request["temperature"] > 0
            ids = torch.tensor([request["ids"]], device=self.model.device)
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=request["max_tokens"],
                do_sample=sample, temperature=request["temperature"] if sample else None,
                top_p=request["top_p"] if sample else None, top_k=None, eos_token_id=self.stop_ids or None,
                pad_token_id=self.tokenizer.pad_token_id,
            )[0, ids.shape[1] :].tolist()  # fmt: skip
        stopped = bool(out) and out[-1] in self.stop_ids
        text = self.tokenizer.decode(out[:-1] if stopped else out, skip_special_tokens=True)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop" if stopped or len(out) < request["max_tokens"] else "length"}],
            "usage": {"prompt_tokens": len(request["ids"]), "completion_tokens": len(out),
                      "total_tokens": len(request["ids"]) + len(out)},
        }  # fmt: skip


# The seeds torch.manual_seed takes: a signed 64-bit number, or an unsigned one.
SEEDS = (-(2**63), 2**64 - 1)


def _check_sampling(temperature: float, top_p: float) -> None:
    """The sampling settings as the generation library itself validates them (GenerationConfig's
    strict check), so that a value it would refuse mid-request is a 400 here."""
    from transformers import GenerationConfig

    sample = temperature > 0
    config = GenerationConfig(do_sample=sample, temperature=temperature if sample else None,
                              top_p=top_p if sample else None)  # fmt: skip
    try:
        config.validate(strict=True)
    except ValueError as err:
        raise RequestError(400, f"temperature {temperature:g}, top_p {top_p:g}: {str(err).splitlines()[0]}") from None


def bearer_token(header: str) -> str | None:
    """The token of an Authorization header of the Bearer scheme, whose name HTTP reads in any case."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def create_app(served: ServedModel, api_key: str | None = None, max_body_bytes: int = 2**20, max_waiting: int = 64):
    """The FastAPI app that answers for `served`: the three documented endpoints, every refusal a
    4xx with `{"error": {"message", "type"}}` (OpenAI's shape)."""
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)  # no door but the three below
    waiting = [0]

    def refuse(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)

    @app.exception_handler(HTTPException)
    async def http_error(request, err):  # 404 and 405 in the same shape as the others
        return refuse(err.status_code, f"{request.method} {request.url.path}: {err.detail}; this server answers "
                      "POST /v1/chat/completions, GET /v1/models and GET /health", "not_found_error")  # fmt: skip

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if api_key and request.url.path != "/health":
            given = bearer_token(request.headers.get("authorization", ""))
            if given is None or not _same(given, api_key):
                return refuse(
                    401, "missing or wrong API key: send Authorization: Bearer <key>", "authentication_error"
                )
        if request.method == "POST":
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return refuse(415, f"the body must be JSON (Content-Type: application/json), not '{kind or 'none'}'")
            length = request.headers.get("content-length", "")
            if not length.isdigit():
                return refuse(411, "send the body with its Content-Length (chunked bodies are not taken)")
            if int(length) > max_body_bytes:
                return refuse(413, f"the body is {int(length):,} bytes; this server takes at most {max_body_bytes:,}")
        return await call_next(request)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": served.name}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": served.created,
                                            "owned_by": "medrecipes"}]}  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        try:
            payload = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            return refuse(400, "the body is not valid JSON")
        except RecursionError:  # arrays or objects nested past what the parser follows
            return refuse(400, "the body nests its JSON too deeply")
        try:
            parsed = served.parse(payload)
        except RequestError as err:
            return refuse(err.status, str(err), err.kind)
        if waiting[0] >= max_waiting:
            return refuse(503, f"{waiting[0]} requests are waiting for the model; try again shortly", "server_error")
        waiting[0] += 1
        try:
            return await run_in_threadpool(served.complete, parsed)
        finally:
            waiting[0] -= 1

    return app


def _same(given: str, expected: str) -> bool:
    import hmac

    return hmac.compare_digest(given.encode(), expected.encode())


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
            raise UserError(
                f"serve: cannot listen on {host}:{port} ({err.strerror}); stop what uses that port or pass another --port"
            ) from None
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    max_body_bytes: int = 2**20,
    max_tokens: int = 1024,
) -> None:
    """Answer chat completions for `model` at host:port until stopped; needs the `serve` extra."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("serve: needs fastapi and uvicorn; pip install 'medrecipes[serve]'") from None
    _check_model(model)
    loopback = _check_address(host, port)
    api_key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
    if api_key is not None and not api_key.strip():
        raise UserError(
            f"serve: the API key is empty (--api-key or {API_KEY_ENV}), which would leave the server open; "
            f"give a key, or leave both unset for a server without one"
        )
    if not loopback:
        print(
            f"warning: serve: {host} is reachable from other machines; "
            + ("requests must carry the API key" if api_key else f"anyone who reaches port {port} can use the model: "
               f"set {API_KEY_ENV} (or --api-key) to require a key, and put TLS in front of it"),
            file=sys.stderr, flush=True,
        )  # fmt: skip
    served = ServedModel(model, max_tokens=max_tokens)
    app = create_app(served, api_key=api_key, max_body_bytes=max_body_bytes)
    print(f"serving {model} at http://{host}:{port}/v1/chat/completions (model name: {served.name})", flush=True)
    run_server(app, host, port)


def run_server(app, host: str, port: int) -> None:
    """uvicorn until stopped: at most 256 connections at once (503 beyond), idle keep-alive closed after 5 s."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False, limit_concurrency=256,
                timeout_keep_alive=5)  # fmt: skip
