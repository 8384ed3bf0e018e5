"""The FastAPI app of `medrecipes serve`: its five documented doors and nothing else, every refusal
a 4xx in OpenAI's error shape, a key checked where one is set, and a bounded queue in front of
the one model."""

import hmac
import json
import threading

from medrecipes.errors import quoted
from medrecipes.serving.model import ServedModel
from medrecipes.serving.requests import RequestError, body_of

DOORS = (
    "POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /v1/models/{model} and GET /health "
    "(HEAD too, where GET)"
)


def error_body(message: str, kind: str = "invalid_request_error") -> dict:
    """OpenAI's error shape, which every refusal of the server takes."""
    return {"error": {"message": message, "type": kind}}


def bearer_token(header: str) -> str | None:
    """The token of an Authorization header of the Bearer scheme, whose name HTTP reads in any case."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def create_app(served: ServedModel, api_key: str | None = None, max_body_bytes: int = 2**20, max_waiting: int = 64):
    """The app that answers for `served`: the documented endpoints, every refusal a 4xx with
    `{"error": {"message", "type"}}` (OpenAI's shape)."""
    from fastapi import FastAPI, Request
    from fastapi.concurrency import run_in_threadpool
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    # No door but the ones below; a path with a slash added is no door either (not a 307 to one).
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)
    waiting = [0]

    def refuse(status: int, message: str, kind: str = "invalid_request_error", headers=None) -> JSONResponse:
        return JSONResponse(error_body(message, kind), status_code=status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request, err):  # 404 and 405 in the same shape as the others, 405's Allow kept
        return refuse(err.status_code, f"{request.method} {request.url.path}: {err.detail}; this server answers "
                      f"{DOORS}", "not_found_error", err.headers)  # fmt: skip

    @app.middleware("http")
    async def guard(request: Request, call_next):
        version = str(request.scope.get("http_version", "1.1"))
        if not version.startswith("1"):  # h11 reads HTTP/2's preface as a request line: its answer first
            answer = refuse(
                400, f"the request is HTTP/{version}, and this server speaks HTTP/1.1; send it as HTTP/1.1"
            )
            answer.headers["connection"] = "close"  # the rest of what it sends is no request either
            return answer
        if api_key and request.url.path != "/health":
            given = bearer_token(request.headers.get("authorization", ""))
            if given is None or not _same(given, api_key):
                return refuse(  # WWW-Authenticate: the scheme a 401 asks for (RFC 9110)
                    401,
                    "missing or wrong API key: send Authorization: Bearer <key>",
                    "authentication_error",
                    {"WWW-Authenticate": "Bearer"},
                )
        if request.method == "POST" and request.url.path in posted:  # another path's answer is its 404 or 405
            if request.url.query:  # a field there (?stream=true) would be passed over without a word
                names = (
                    ", ".join(dict.fromkeys(key for key, _ in request.query_params.multi_items())) or request.url.query
                )
                return refuse(400, f"the address holds query parameters ({quoted(names, 60)}), and this server takes "
                                   "a request's fields in its JSON body only; move them into the body")  # fmt: skip
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return refuse(415, f"the body must be JSON (Content-Type: application/json), not '{kind or 'none'}'")
            encoding = request.headers.get("content-encoding", "identity").strip().lower()
            if encoding != "identity":  # the body would be read as its compressed bytes
                return refuse(415, f"the body is sent with Content-Encoding {encoding}, which this server does not "
                                   "decode; send it uncompressed")  # fmt: skip
            length = request.headers.get("content-length", "")
            if not length.isdigit():
                return refuse(411, "send the body with its Content-Length (chunked bodies are not taken)")
            if int(length) > max_body_bytes:
                return refuse(413, f"the body is {int(length):,} bytes; this server takes at most {max_body_bytes:,}")
        return await call_next(request)

    # A GET door takes HEAD too (HTTP asks it of every GET; health checks send it), its body left out.
    def get(path: str):
        return app.api_route(path, methods=["GET", "HEAD"])

    @get("/health")
    async def health():
        return {"status": "ok", "model": served.name}

    described = {"id": served.name, "object": "model", "created": served.created, "owned_by": "medrecipes"}

    @get("/v1/models")
    async def models():
        return {"object": "list", "data": [described]}

    @get("/v1/models/{name:path}")  # a served name may hold a slash, as a Hub id does
    async def model(name: str):
        if not served.answers_to(name):
            return refuse(404, f"model '{name}' is not served here; this server serves '{served.name}'",
                          "not_found_error")  # fmt: skip
        return described

    async def answer(request: Request, parse, work):
        """`work(parsed)` for a body `parse` takes, in the queue's turn; the refusals on the way."""
        try:
            raw = await request.body()
        except ClientDisconnect:  # the body ended before the length it announced
            return refuse(400, "the body is shorter than its Content-Length; send the whole body")
        try:
            parsed = parse(body_of(raw, request.headers.get("content-type")))
        except RequestError as err:
            return refuse(err.status, str(err), err.kind)
        if waiting[0] >= max_waiting:
            return refuse(503, f"{waiting[0]} requests are waiting for the model; try again shortly", "server_error")
        return await work(parsed)

    async def queued(function, *args):
        waiting[0] += 1
        try:
            return await run_in_threadpool(function, *args)
        finally:
            waiting[0] -= 1

    def events(parsed: dict):
        """Server-sent events of a streamed answer, then [DONE]; once the stream is closed, at its end
        or early, the generation is told to stop at its next token."""
        cancelled = threading.Event()
        waiting[0] += 1
        try:
            for event in served.stream(parsed, cancelled):
                yield f"data: {json.dumps(event)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            cancelled.set()
            waiting[0] -= 1

    async def chat_work(parsed: dict):
        if parsed["stream"]:
            return StreamingResponse(events(parsed), media_type="text/event-stream")
        return await queued(served.complete, parsed)

    async def completion_work(parsed: dict):
        return await queued(served.completion, parsed)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answer(request, served.parse_chat, chat_work)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, served.parse_completion, completion_work)

    posted = {route.path for route in app.routes if "POST" in getattr(route, "methods", ())}  # the guard's bodies
    return app
