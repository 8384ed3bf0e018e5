"""What a request to `medrecipes serve` may ask, checked field by field before the model runs: every
value the documented ranges admit and the generation library accepts, every other one a
`RequestError` (a 4xx and one line). Knows no model: `model.ServedModel` turns the checked values
into token ids."""

import email.message
import json

from medrecipes.errors import is_number, quoted
from medrecipes.models.templates import ROLES

# The request fields answered, per endpoint; others (tools, response_format, ...) are refused by name.
CHAT_FIELDS = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
               "stream_options", "seed", "stop", "user")  # fmt: skip
COMPLETION_FIELDS = ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "seed", "stop", "echo",
                     "logprobs", "user")  # fmt: skip
TEXT_FIELDS = ("model", "user")  # fields that are strings, whatever else they say
SEEDS = (-(2**63), 2**64 - 1)  # the seeds torch.manual_seed takes: a signed 64-bit number, or an unsigned one
MAX_STOPS = 4  # stop strings a request may give, as OpenAI's API takes
MAX_LOGPROBS = 5  # the most likely tokens a completion's logprobs may list at each position, as OpenAI's


class RequestError(Exception):
    """A request the server refuses: its HTTP status and the one line it answers."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.kind = status, kind


def body_of(raw: bytes, content_type: str | None):
    """The JSON a request's body holds: text in the charset its Content-Type names (JSON's own
    encodings, UTF-8 and the UTF-16/32 its bytes show, where it names none), each object's fields
    given once (a parser would keep the last of two without a word)."""
    charset = None
    if content_type:
        header = email.message.Message()
        header["content-type"] = content_type
        charset = header.get_content_charset()
    try:
        text = raw.decode(charset) if charset else raw
    except LookupError:
        raise RequestError(
            415, f"Content-Type names charset {charset}, which is no encoding known here; send UTF-8"
        ) from None
    except UnicodeDecodeError as err:
        raise RequestError(
            400, f"the body is not {charset} text as its Content-Type says (byte {err.start + 1})"
        ) from None
    try:
        return json.loads(text, object_pairs_hook=_fields_once)
    except UnicodeDecodeError as err:
        raise RequestError(
            400,
            f"the body is not UTF-8 text (byte {err.start + 1}); send UTF-8 JSON, or name its charset in Content-Type",
        ) from None
    except ValueError:
        raise RequestError(400, "the body is not valid JSON") from None
    except RecursionError:  # arrays or objects nested past what the parser follows
        raise RequestError(400, "the body nests its JSON too deeply") from None


def _fields_once(pairs: list[tuple]) -> dict:
    fields = {}
    for key, value in pairs:
        if key in fields:
            raise RequestError(400, f"field {quoted(key)} is given twice in one object; give it once")
        fields[key] = value
    return fields


def check_fields(payload, fields: tuple[str, ...], what: str) -> dict:
    """`payload` as a mapping of fields the endpoint takes, else the one line that says which are not."""
    if not isinstance(payload, dict):
        raise RequestError(400, f"the body must be a JSON object with '{what}'")
    payload = {key: value for key, value in payload.items() if value is not None}  # null: the default, as OpenAI's
    unknown = sorted(set(payload) - set(fields))
    if unknown:
        raise RequestError(400, f"unsupported field(s) {', '.join(unknown)}; this endpoint takes {', '.join(fields)}")
    for key in TEXT_FIELDS:  # the OpenAI API's strings: a number for a user's id is a client's slip
        if key in payload and not isinstance(payload[key], str):
            raise RequestError(400, f"{key} must be a string, got {quoted(payload[key])}")
    if type(payload.get("n", 1)) is not int or payload.get("n", 1) != 1:  # true is no count, though 1 == True
        raise RequestError(400, f"n must be the number 1 (one answer a request), got {quoted(payload.get('n'))}")
    return payload


def sampling(payload: dict) -> tuple[float, float]:
    """(temperature, top_p) in their documented ranges (0 to 2; above 0 to 1), then as the
    generation library itself validates them (GenerationConfig's strict check), so that a value it
    would refuse mid-request is a 400 here. A top_p with no temperature is refused: OpenAI's API
    samples at temperature 1 then, and this server answers greedily, where top_p does nothing."""
    from transformers import GenerationConfig

    temperature, top_p = payload.get("temperature", 0.0), payload.get("top_p", 1.0)
    for key, value, ok in (
        ("temperature", temperature, lambda v: 0 <= v <= 2),
        ("top_p", top_p, lambda v: 0 < v <= 1),
    ):
        if not is_number(value):
            raise RequestError(400, f"{key} must be a number, got {quoted(value)}")
        if not ok(value):
            raise RequestError(400, f"{key} {quoted(value)} is out of range (temperature 0 to 2, top_p above 0 to 1)")
    temperature, top_p = float(temperature), float(top_p)
    if "temperature" not in payload and top_p != 1:  # OpenAI's default would sample; this server's does not
        raise RequestError(
            400,
            f"top_p {top_p:g} narrows sampling, and with no temperature this server answers greedily "
            "(docs/serving.md); send a temperature above 0 with it, or leave top_p out",
        )
    sample = temperature > 0
    config = GenerationConfig(do_sample=sample, temperature=temperature if sample else None,
                              top_p=top_p if sample else None)  # fmt: skip
    try:
        config.validate(strict=True)
    except ValueError as err:
        raise RequestError(400, f"temperature {temperature:g}, top_p {top_p:g}: {str(err).splitlines()[0]}") from None
    return temperature, top_p


def seed_of(payload: dict) -> int | None:
    seed = payload.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not SEEDS[0] <= seed <= SEEDS[1]):
        raise RequestError(400, f"seed must be a whole number from {SEEDS[0]} to {SEEDS[1]}, got {quoted(seed)}")
    return seed


def stop_of(payload: dict) -> list[str]:
    """The stop strings: one, or a list of up to MAX_STOPS, each non-empty."""
    stop = payload.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(
            400, f"stop must be a non-empty string or a list of up to {MAX_STOPS} of them, got {quoted(stop)}"
        )
    return stops


def token_limit(value, least: int, most: int, name: str = "max_tokens") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise RequestError(400, f"{name} must be a whole number from {least} to {most}, got {quoted(value)}")
    return value


def stream_of(payload: dict) -> tuple[bool, bool]:
    """(stream the answer as server-sent events, end the stream with the usage)."""
    stream, options = payload.get("stream", False), payload.get("stream_options")
    if not isinstance(stream, bool):
        raise RequestError(400, f"stream must be true or false, got {quoted(stream)}")
    if options is not None and (not stream or not isinstance(options, dict) or set(options) - {"include_usage"}
                                or not isinstance(options.get("include_usage", False), bool)):  # fmt: skip
        raise RequestError(
            400, f"stream_options takes {{include_usage: true|false}} with stream: true, got {quoted(options)}"
        )
    return stream, bool((options or {}).get("include_usage"))


def chat_turns(messages) -> list[dict]:
    """The {role, content} turns of `messages`, OpenAI's text content parts joined."""
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "messages must be a non-empty list of {role, content}")
    turns = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise RequestError(400, f"messages[{i}]: expected {{role: {'|'.join(ROLES)}, content: text}}")
        _check_read(message, ("role", "content"), f"messages[{i}]")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: text ones only
            for j, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise RequestError(
                        400, f"messages[{i}].content[{j}]: only text parts are supported, got type {quoted(kind)}"
                    )
                _check_read(part, ("type", "text"), f"messages[{i}].content[{j}]")
                if not isinstance(part.get("text"), str):
                    raise RequestError(
                        400, f"messages[{i}].content[{j}]: a text part needs its text, got {quoted(part.get('text'))}"
                    )
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise RequestError(400, f"messages[{i}].content must be text")
        if any("\ud800" <= c <= "\udfff" for c in content):  # JSON's \ud800 escape alone: no character
            raise RequestError(400, f"messages[{i}].content holds a lone surrogate (\\ud800-\\udfff), no character")
        turns.append({"role": message["role"], "content": content})
    return turns


def _check_read(fields: dict, read: tuple[str, ...], where: str) -> None:
    """A field of a message or of a content part that the answer would not read (a name, a
    provider's cache_control) is refused, as a field the endpoint does not take is."""
    if unread := sorted(set(fields) - set(read)):
        raise RequestError(400, f"{where}: unsupported field(s) {', '.join(unread)}; it takes {', '.join(read)}")


def prompts_of(prompt, vocabulary: int) -> list:
    """A completion request's prompts: text, token ids (from 0 to `vocabulary` - 1), or a list of
    either (a batch, as lm-eval sends). A list whose first entry is no text and no list is one
    prompt of token ids; what is wrong is named as the request wrote it (prompt[1], prompt[0][2])."""
    single = isinstance(prompt, str) or (isinstance(prompt, list) and prompt and not isinstance(prompt[0], str | list))
    prompts = [prompt] if single else prompt
    if not isinstance(prompts, list) or not prompts:
        raise RequestError(400, "prompt must be text, a list of token ids, or a non-empty list of either")
    for i, one in enumerate(prompts):
        where = "prompt" if single else f"prompt[{i}]"
        if not (isinstance(one, str) and one) and not (isinstance(one, list) and one):
            raise RequestError(400, f"{where} must be non-empty text or a non-empty list of token ids")
        for j, token in enumerate(one if isinstance(one, list) else []):
            if not isinstance(token, int) or isinstance(token, bool):
                raise RequestError(400, f"{where}[{j}] is {quoted(token)}, not a token id (a whole number)")
            if not 0 <= token < vocabulary:
                raise RequestError(
                    400, f"{where}[{j}] is {token}, not a token id of the model (0 to {vocabulary - 1})"
                )
    return prompts


def logprobs_of(payload: dict) -> int | None:
    value = payload.get("logprobs")
    if value is None:
        return None
    return token_limit(value, 0, MAX_LOGPROBS, "logprobs")
