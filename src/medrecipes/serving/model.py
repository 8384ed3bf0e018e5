"""The one model a server answers with: loaded once, a request's checked fields turned into token
ids, and its answers generated one request at a time: a chat answer whole or as a stream of
pieces, a completion of text or token ids with the log-probabilities of its tokens (lm-eval's
loglik scoring asks for those of the prompt itself: `echo`, `max_tokens: 0`)."""

import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import medrecipes.serving.requests as fields
from medrecipes.errors import UserError, quoted
from medrecipes.runs.record import FINAL
from medrecipes.serving.requests import RequestError


def served_name(path: str) -> str:
    """The name a model is served under by default: its run's (output_dir/final: the output_dir's
    name), else its folder's or file's, not the path on this machine."""
    path = os.path.normpath(path)
    name = os.path.basename(os.path.dirname(path)) if os.path.basename(path) == FINAL else os.path.basename(path)
    return name.removesuffix(".gguf") or path


def capped_tokens(requested: int, positions: int, flag: str, model: str, what: str, prompt: int = 1) -> int:
    """`requested` new tokens, at most the model's `positions` less the `prompt`'s (at least one:
    past them it writes on positions it never trained on), said in one line where `flag` asked for
    more: "`model` `what`"."""
    most = positions - prompt
    if requested > most:
        after = f" after a prompt of {prompt:,} tokens" if prompt > 1 else ""
        print(f"# note: {flag} {requested} is past the {positions:,} positions of {model}{after}; {what} {most} at most",
              file=sys.stderr)  # fmt: skip
    return min(requested, most)


class ServedModel:
    """The one model a server answers with; a request is parsed by `parse_chat` or
    `parse_completion`, and answered by `complete`, `stream` or `completion`."""

    def __init__(self, path: str, name: str | None = None, max_tokens: int = 1024):
        from medrecipes.models.loading import load_for_inference, positions

        self.model, self.tokenizer = load_for_inference(path)
        self.model.eval()
        self.path, self.name = path, name or served_name(path)
        self.created = int(time.time())
        self.positions = positions(self.model) or self.tokenizer.model_max_length
        self.max_tokens = capped_tokens(max_tokens, self.positions, "--max-tokens", path, "a request may ask for")
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

    # ------------------------------------------------------------------ requests

    def answers_to(self, name: str | None) -> bool:
        """Whether a request naming model `name` (none: this one) is for this server: its served
        name, or the path it was started with (written with a slash at its end, or ./ before it)."""
        if name in (None, self.name, self.path):
            return True
        return isinstance(name, str) and bool(name) and os.path.normpath(name) == os.path.normpath(self.path)

    def _common(self, payload: dict) -> dict:
        if not self.answers_to(payload.get("model")):
            raise RequestError(404, f"model '{payload['model']}' is not served here; this server serves '{self.name}'",
                               "not_found_error")  # fmt: skip
        temperature, top_p = fields.sampling(payload)
        return {"temperature": temperature, "top_p": top_p, "seed": fields.seed_of(payload),
                "stop": fields.stop_of(payload)}  # fmt: skip

    def _fits(self, ids: list[int], limit: int) -> None:
        if len(ids) + limit > self.positions:
            raise RequestError(
                400,
                f"the prompt is {len(ids)} tokens and max_tokens {limit}: together over the model's "
                f"{self.positions} positions; shorten the prompt or lower max_tokens",
            )

    def parse_chat(self, payload) -> dict:
        """The generation a chat request asks for, or the RequestError that refuses it."""
        payload = fields.check_fields(payload, fields.CHAT_FIELDS, "messages")
        turns = fields.chat_turns(payload.get("messages"))
        self._check_special_tokens(turns)
        request = self._common(payload)
        limits = {key: payload[key] for key in ("max_tokens", "max_completion_tokens") if payload.get(key) is not None}
        if len(set(map(repr, limits.values()))) > 1:  # OpenAI's newer name and its older one
            raise fields.RequestError(400, f"max_tokens {quoted(limits['max_tokens'])} and max_completion_tokens "
                                      f"{quoted(limits['max_completion_tokens'])} disagree; give one of them")  # fmt: skip
        named = next((key for key in ("max_completion_tokens", "max_tokens") if key in limits), "max_tokens")
        limit = limits.get(named)
        limit = fields.token_limit(min(256, self.max_tokens) if limit is None else limit, 1, self.max_tokens, named)
        request["stream"], request["include_usage"] = fields.stream_of(payload)
        try:
            ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True, return_dict=True)["input_ids"]
        except Exception as err:  # the template's own refusal (e.g. roles out of order)
            raise RequestError(400, f"messages: the chat template refuses them ({str(err).splitlines()[0]})") from None
        self._fits(ids, limit)
        return {**request, "ids": ids, "max_tokens": limit}

    def _check_special_tokens(self, turns: list[dict]) -> None:
        """A 400 for a message that writes one of the model's special tokens (<|im_end|>,
        <end_of_turn>): the rendered prompt is tokenized with them read as tokens, so a message's
        text would end its own turn and open another in the client's words. A completion prompt is
        the client's own whole text, special tokens and all, and is not checked."""
        if getattr(self, "_special", None) is None:  # the tokenizer's, read once
            added = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special]
            self._special = sorted({t for t in [*self.tokenizer.all_special_tokens, *added] if len(t) > 1})
        for i, turn in enumerate(turns):
            if found := next((t for t in self._special if t in turn["content"]), None):
                raise RequestError(
                    400,
                    f"messages[{i}].content holds {quoted(found)}, a special token of the model's chat format, which would "
                    "end the turn it is in and start another in the message's words; remove it",
                )

    def parse_completion(self, payload) -> dict:
        """The completions a /v1/completions request asks for: each prompt's ids (text is tokenized
        as the model's tokenizer does by default), how many tokens to add (0 with `echo`: the
        prompt's log-probabilities only), whether to give the prompt back and its log-probabilities."""
        payload = fields.check_fields(payload, fields.COMPLETION_FIELDS, "prompt")
        if payload.get("stream"):
            raise RequestError(400, "stream: true is taken by /v1/chat/completions; ask /v1/completions without it")
        request = self._common(payload)
        echo = payload.get("echo", False)
        if not isinstance(echo, bool):
            raise RequestError(400, f"echo must be true or false, got {quoted(echo)}")
        limit = fields.token_limit(payload.get("max_tokens", 16), 0 if echo else 1, self.max_tokens)
        prompts, added = [], []
        for prompt in fields.prompts_of(payload.get("prompt"), len(self.tokenizer)):
            ids = prompt if isinstance(prompt, list) else self.tokenizer(prompt)["input_ids"]
            prompts.append(ids)
            added.append(0 if isinstance(prompt, list) else _added_ahead(ids, self.tokenizer, prompt))
        for ids in prompts:
            self._fits(ids, limit)
        return {**request, "prompts": prompts, "added": added, "max_tokens": limit, "echo": echo,
                "logprobs": fields.logprobs_of(payload)}  # fmt: skip

    # ------------------------------------------------------------------ answers

    def _generate(self, ids: list[int], request: dict, streamer=None, cancelled=None) -> list[int]:
        """The tokens generated after `ids`, as `request` asks (greedy unless a temperature, up to
        its stop strings or the model's stop tokens); stops early once `cancelled` is set."""
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        stops, tokenizer, start = request["stop"], self.tokenizer, len(ids)
        # The answer's last tokens, enough to hold the longest stop string (a token is at least one
        # character but a byte piece; twice over): transformers' stop_strings match across the end
        # of the prompt too, and stopped an answer on text the prompt wrote.
        window = 2 * max((len(s) for s in stops), default=0) + 8

        class Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                done = cancelled is not None and cancelled.is_set()
                if stops and not done:
                    tail = tokenizer.decode(
                        input_ids[0, max(start, input_ids.shape[1] - window) :], skip_special_tokens=True
                    )
                    done = any(s in tail for s in stops)
                return torch.full((input_ids.shape[0],), done)

        if request["seed"] is not None:
            torch.manual_seed(request["seed"])
        sample = request["temperature"] > 0
        tensor = torch.tensor([ids], device=self.model.device)
        with torch.no_grad():
            out = self.model.generate(
                input_ids=tensor, attention_mask=torch.ones_like(tensor), max_new_tokens=request["max_tokens"],
                do_sample=sample, temperature=request["temperature"] if sample else None,
                top_p=request["top_p"] if sample else None, top_k=None, eos_token_id=self.stop_ids or None,
                pad_token_id=self.tokenizer.pad_token_id, streamer=streamer,
                stopping_criteria=StoppingCriteriaList([Stop()]),
            )  # fmt: skip
        return out[0, tensor.shape[1] :].tolist()

    def _text(self, out: list[int], request: dict) -> tuple[str, str]:
        """(the answer's text, its finish_reason): cut at a stop token or the first stop string."""
        stopped = bool(out) and out[-1] in self.stop_ids
        text = self.tokenizer.decode(out[:-1] if stopped else out, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in request["stop"]) if i >= 0), default=None)
        if cut is not None:
            return text[:cut], "stop"
        return text, "stop" if stopped or len(out) < request["max_tokens"] else "length"

    def _head(self, kind: str) -> dict:
        prefix = "chatcmpl" if kind.startswith("chat.completion") else "cmpl"  # its chunks too, as OpenAI's
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": self.name}

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def complete(self, request: dict) -> dict:
        """The chat.completion answer to a parsed chat request."""
        with self.lock:
            out = self._generate(request["ids"], request)
        text, finish = self._text(out, request)
        return {**self._head("chat.completion"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": self._usage(len(request["ids"]), len(out))}  # fmt: skip

    def stream(self, request: dict, cancelled: threading.Event) -> Iterator[dict]:
        """The chat.completion.chunk events of a streamed answer: the role, the text as it is
        generated (never past a stop string: the last characters a stop string could begin are held
        back until it cannot), the finish reason, then the usage where asked. Setting `cancelled` (a
        client gone) stops the generation at its next token."""
        from transformers import TextIteratorStreamer

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        result: dict = {}

        def work():
            with self.lock:
                try:
                    result["out"] = self._generate(request["ids"], request, streamer, cancelled)
                except Exception as err:  # noqa: BLE001 - ended below, in the stream's own words
                    result["error"] = err
                    streamer.end()
                    return
            if cancelled.is_set() and "stop_string" not in result:  # the client went away: said in the log
                print(f"a client closed its stream: its answer stopped after {len(result['out'])} of at most "
                      f"{request['max_tokens']} tokens", file=sys.stderr, flush=True)  # fmt: skip

        thread = threading.Thread(target=work, daemon=True)
        head = {**self._head("chat.completion.chunk")}

        def chunk(delta: dict, finish=None) -> dict:
            return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

        thread.start()
        yield chunk({"role": "assistant", "content": ""})
        held, sent, hold = "", "", max((len(s) for s in request["stop"]), default=1) - 1
        stopped_at = None
        for piece in streamer:
            held += piece
            found = [i for i in (held.find(s) for s in request["stop"]) if i >= 0]
            if found:
                stopped_at = min(found)
                result["stop_string"] = True
                cancelled.set()
                break
            ready, held = (held[: len(held) - hold], held[len(held) - hold :]) if hold else (held, "")
            if ready:
                sent += ready
                yield chunk({"content": ready})
        thread.join()
        if "error" in result:
            raise result["error"]
        last = held[:stopped_at] if stopped_at is not None else held
        if last:
            sent += last
            yield chunk({"content": last})
        out = result.get("out", [])
        finish = "stop" if stopped_at is not None else self._text(out, request)[1]
        yield chunk({}, finish)
        if request["include_usage"]:
            yield {**head, "choices": [], "usage": self._usage(len(request["ids"]), len(out))}

    def completion(self, request: dict) -> dict:
        """The text_completion answer: each prompt's completion, with `echo` the prompt before it,
        and with `logprobs` each token's log-probability and the `logprobs` likeliest at its place."""
        choices, prompt_tokens, completion_tokens = [], 0, 0
        with self.lock:
            for index, (ids, added) in enumerate(zip(request["prompts"], request["added"], strict=True)):
                out = self._generate(ids, request) if request["max_tokens"] else []
                text, finish = self._text(out, request) if out else ("", "length")
                shown = ids[added:] + out if request["echo"] else out  # the prompt as sent: no BOS added to it
                choice = {"index": index, "text": (self.tokenizer.decode(ids[added:]) if request["echo"] else "") + text,
                          "finish_reason": finish, "logprobs": None}  # fmt: skip
                if request["logprobs"] is not None:
                    choice["logprobs"] = self._logprobs(ids + out, len(ids + out) - len(shown), request["logprobs"])
                choices.append(choice)
                prompt_tokens, completion_tokens = prompt_tokens + len(ids), completion_tokens + len(out)
        return {**self._head("text_completion"), "choices": choices,
                "usage": self._usage(prompt_tokens, completion_tokens)}  # fmt: skip

    def _logprobs(self, ids: list[int], start: int, top: int) -> dict:
        """OpenAI's logprobs of `ids[start:]`: each token, its log-probability given those before it
        (None for the first, which nothing predicts) and the `top` likeliest tokens there (at least
        the likeliest one, which tells lm-eval whether the token was the greedy choice)."""
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([ids], device=self.model.device)).logits[0].float()
        scores = torch.log_softmax(logits, dim=-1)
        tokens, token_logprobs, top_logprobs, offsets, offset = [], [], [], [], 0
        for position in range(start, len(ids)):
            piece = self.tokenizer.decode([ids[position]])
            tokens.append(piece)
            offsets.append(offset)
            offset += len(piece)
            if position == 0:
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            row = scores[position - 1]
            token_logprobs.append(row[ids[position]].item())
            values, indices = row.topk(max(top, 1))
            likeliest: dict[str, float] = {}
            for value, index in zip(values.tolist(), indices.tolist(), strict=True):  # two ids may read alike
                likeliest.setdefault(self.tokenizer.decode([index]), value)
            top_logprobs.append(likeliest)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": offsets,
        }


def _added_ahead(ids: list[int], tokenizer, text: str) -> int:
    """How many tokens the tokenizer put ahead of a text prompt's own (a BOS): the model reads them,
    and an echo leaves them out, as the client sent none."""
    own = tokenizer(text, add_special_tokens=False)["input_ids"]
    ahead = len(ids) - len(own)
    return ahead if ahead > 0 and ids[ahead:] == own else 0
