"""A source's rows as messages name them (its files, and the line an editor shows where its rows
are lines) and the checks of what a row says: a conversation's turns, a preference row's
answers, and rows given twice."""

import glob
import json
import logging
import os
from collections.abc import Iterable

from medrecipes.data_config import SourceConfig
from medrecipes.errors import UserError, quoted, row_in_files
from medrecipes.models.templates import ROLES, TURN_TOKENS

logger = logging.getLogger(__name__)


def named(source: SourceConfig) -> str:
    """How an error names a source: its path, and its data files when a builder reads them."""
    files = [source.data_files] if isinstance(source.data_files, str) else source.data_files
    return f"source '{source.path}'" + (f" ({', '.join(files)})" if files else "")


def row_of(source: SourceConfig, index: int) -> str:
    """A record of a source, counted from 0, as messages name it: its file and line where the
    records are lines, else the source and the record's number from 1."""
    return row_in_files(files_of([source]), index, name=named(source))


def line_of(source: SourceConfig, index: int) -> str:
    """ "line 4" (or "row 4") of a source already named in the message."""
    return " ".join(row_of(source, index).split(" ")[-2:])


def files_of(sources: Iterable[SourceConfig]) -> list[str]:
    """The local files of these sources, source by source, each one's in the order `datasets` reads them."""
    return [file for source in sources for file in sorted(local_files(source))]


def local_files(source: SourceConfig) -> list[str]:
    """The files on this machine that a source reads (its data_files, or its path; patterns and
    folders expanded)."""
    patterns = source.data_files if source.data_files is not None else [source.path]
    patterns = [patterns] if isinstance(patterns, str) else patterns
    files = []
    for pattern in patterns:
        for match in glob.glob(pattern, recursive=True):
            if os.path.isdir(match):
                files += [os.path.join(d, n) for d, _, names in os.walk(match) for n in names]
            else:
                files.append(match)
    return files


ANSWER_COLUMNS = ("prompt", "chosen", "rejected", "completion", "label")  # a preference row's question and answers


def check_answers(rows: Iterable[dict], indices: Iterable[int], source: SourceConfig) -> None:
    """Each preference row says something of an answer: a pair's chosen and rejected differ (a
    pair that does not teaches nothing and TRL's loss is flat on it), a conversational answer is
    the assistant's turn, and an unpaired answer's label is true (desirable) or false (TRL's
    collator would take 1, 0 or "yes" for a tensor of something else)."""
    first = None  # the first row's layout (conversation turns or plain text) and its index
    for row, index in zip(rows, indices, strict=False):
        problem = None
        odd = next((k for k in ANSWER_COLUMNS[:4] if k in row and not isinstance(row[k], str | list)), None)
        if odd is not None:
            raise UserError(
                f"{row_of(source, index)}: {odd} is {quoted(row[odd])}, neither text nor conversation turns; "
                "fix or drop the row"
            )
        layouts = {isinstance(row[key], list) for key in ANSWER_COLUMNS[:4] if key in row}
        if len(layouts) > 1:
            problem = "its prompt and answers mix plain text and conversation turns"
        elif layouts:
            turns = layouts.pop()
            first = first or (turns, index)
            if turns != first[0]:
                kind = {True: "conversation turns", False: "plain text"}
                problem = (
                    f"it is {kind[turns]} and {line_of(source, first[1])} is "
                    f"{kind[first[0]]}; give every row one layout"
                )
        text = next(
            (
                t
                for key in ANSWER_COLUMNS[:4]
                if isinstance(row.get(key), list)
                for t in [_text_problem(row[key])]
                if t
            ),
            None,
        )
        problem = problem or text
        prompt = row.get("prompt")
        turns = prompt if isinstance(prompt, list) else [{"content": prompt}]
        if "prompt" in row and not any(isinstance(t, dict) and str(t.get("content") or "").strip() for t in turns):
            problem = "prompt is empty: its answers answer no question"
        elif isinstance(prompt, list) and _roles(prompt)[-1:] != ["user"]:
            problem = "the last turn of prompt is not the user's: its answers answer no question of the user's"
        if "chosen" in row and _words(row["chosen"]) == _words(row["rejected"]):
            problem = "chosen and rejected are the same answer (spaces aside)"
        for key in ("chosen", "rejected", "completion"):
            roles = _roles(row[key]) if isinstance(row.get(key), list) else []
            if None in roles:
                problem = (
                    f"{key} is a list of other things than turns ({{role, content}}), neither text nor a conversation"
                )
            elif set(roles) - {"assistant"}:
                problem = (
                    f"{key} holds a {next(r for r in roles if r != 'assistant')} turn, and an answer is the assistant's "
                    "turns alone (the question belongs in prompt)"
                )
            elif isinstance(row.get(key), list) and roles[-1:] != ["assistant"]:
                problem = f"the last turn of {key} is not the assistant's"
            elif twice := next((a for a, b in zip(roles, roles[1:], strict=False) if a == b), None):
                problem = f"{key} has two {twice} turns in a row; an answer is one turn: join them"
            elif key in row and not _answer_text(row[key]).strip():
                problem = f"{key} is empty: there is no answer to prefer or avoid"
        if "label" in row and not isinstance(row["label"], bool):
            problem = f"label {json.dumps(row['label'])} is not true or false (true: a desirable answer)"
        if problem:
            raise UserError(f"{row_of(source, index)}: {problem}; fix or drop the row")


def _text_problem(turns: list) -> str | None:
    """A turn whose content is not text (a list of parts, as multimodal chats write it, or nothing):
    the chat templates render a turn's content as text."""
    for number, turn in enumerate(turns, 1):
        content = turn.get("content") if isinstance(turn, dict) else None
        if (
            isinstance(turn, dict)
            and not isinstance(content, str)
            and (content is not None or turn.get("role") != "assistant")
        ):
            what = (
                "a list of parts"
                if isinstance(content, list)
                else "missing"
                if content is None
                else type(content).__name__
            )
            return f"turn {number}'s content is {what}, not text; write it as one text"
    return None


def say_repeats(rows: list[dict], source: SourceConfig) -> None:
    """Rows given twice (the same document, conversation, or question and answers) are counted and
    the first named by line: each copy trains again, as if it weighed twice. Said, not refused."""
    _say_twins(
        rows, source, lambda row: row, lambda first, row: True,
        "row(s) repeat an earlier one", "repeats", "each copy trains again; drop the repeats",
    )  # fmt: skip


def say_contradictions(rows: list[dict], source: SourceConfig) -> None:
    """Unpaired answers given twice with both labels (the same prompt and answer, desirable and
    not): KTO pulls the answer up and down at once. Counted and named by line; said, not refused."""
    _say_twins(
        rows, source, lambda row: {k: v for k, v in row.items() if k != "label"},
        lambda first, row: first.get("label") != row.get("label"),
        "answer(s) labelled both desirable and undesirable", "against", "the two cancel out; keep one label",
    )  # fmt: skip


def _say_twins(rows: list[dict], source: SourceConfig, key, counts, what: str, word: str, advice: str) -> None:
    """One warning for the rows whose `key` an earlier row has and which `counts(earlier, row)`:
    how many, the first three by line (line 5 `word` line 2), and the `advice`."""
    first, found = {}, []
    for index, row in enumerate(rows):
        seen = first.setdefault(json.dumps(key(row), sort_keys=True), index)
        if seen != index and counts(rows[seen], row):
            found.append((index, seen))
    if found:
        pairs = ", ".join(f"{line_of(source, i)} {word} {line_of(source, seen)}" for i, seen in found[:3])
        more = ", ..." if len(found) > 3 else ""
        logger.warning("%s: %d %s (%s%s): %s", named(source), len(found), what, pairs, more, advice)


def _words(answer) -> list[str]:
    """An answer's words: two answers that differ only in spaces teach nothing."""
    return _answer_text(answer).split()


def _answer_text(answer) -> str:
    """An answer's text: the answer itself, or the content of its last (the assistant's) turn."""
    if isinstance(answer, list):
        answer = answer[-1].get("content") if answer and isinstance(answer[-1], dict) else None
    return answer if isinstance(answer, str) else ""


def check_turns(conversations: Iterable, indices: Iterable[int], source: SourceConfig) -> None:
    """Each conversation is a list of {role, content} turns that a chat template renders and SFT
    can train on: roles among ROLES, a system turn only first, the user speaking first, the
    assistant last (its answer is what is trained). A row that breaks this is one line naming
    it; templates would otherwise raise mid-run (Gemma's) or render a turn the model never sees
    in use (ChatML)."""
    for messages, index in zip(conversations, indices, strict=False):
        problem = _turn_problem(messages)
        if problem:
            raise UserError(f"{row_of(source, index)}: {problem}; fix or drop the row")


# A turn's keys in OpenAI's chat format, which chat templates read; others are rendered by none.
TURN_KEYS = ("role", "content", "name", "tool_calls", "tool_call_id")


def say_turn_markers(texts: Iterable[list], source: SourceConfig, what: str) -> None:
    """A row's text (each row's texts in turn: a question and its options, a turn's content) that
    holds a shipped chat template's turn marker (`<|im_end|>`): the tokenizer reads it as the marker
    itself, so the text opens or ends a turn of its own in the middle of a prompt or an answer.
    The first such row is said, not refused."""
    markers = [token for pair in TURN_TOKENS.values() for token in pair]
    for index, row in enumerate(texts):
        if any(isinstance(text, str) and marker in text for text in row for marker in markers):
            logger.warning(
                "%s: %s holds a chat template's turn marker (first at %s; %s): the tokenizer reads it as the marker "
                "itself, so the text opens or ends a turn of its own; remove it from the text",
                named(source), what, line_of(source, index), ", ".join(markers),
            )  # fmt: skip
            return


def say_turn_oddities(conversations: list, source: SourceConfig) -> None:
    """Turn keys outside the chat format (OpenAI fine-tuning's per-turn `weight`, a tool's notes):
    no template renders them and SFT reads none of them, so a turn marked `weight: 0` trains as
    any other; and a turn's text that holds a shipped turn marker (`say_turn_markers`). The keys
    and the first line of each are said, not refused."""
    first: dict[str, int] = {}
    for index, turns in enumerate(conversations):
        for turn in turns if isinstance(turns, list) else []:
            for key, value in turn.items() if isinstance(turn, dict) else ():
                if key not in TURN_KEYS and value is not None:
                    first.setdefault(key, index)
    say_turn_markers(
        ([t.get("content") for t in turns if isinstance(t, dict)] if isinstance(turns, list) else [] for turns in conversations),
        source, "a turn's text",
    )  # fmt: skip
    if first:
        keys = ", ".join(f"'{key}' ({line_of(source, index)})" for key, index in first.items())
        logger.warning(
            "%s: turns carry %s, which no chat template renders and training does not read: every assistant turn "
            "trains%s; drop the key, or the turns not to train",
            named(source), keys, " whatever its weight" if "weight" in first else "",
        )  # fmt: skip


def say_unrendered_keys(conversations: list, tokenizer, where: str) -> None:
    """The chat format's own turn keys besides role and content (a speaker's `name`, a tool call's)
    that the model's chat template does not render: a conversation of a user and an assistant turn,
    one of them with the key, renders the same without it. Said once per key, not refused."""
    seen: dict[str, dict] = {}
    for turns in conversations:
        for turn in turns if isinstance(turns, list) else []:
            for key in TURN_KEYS[2:]:
                if isinstance(turn, dict) and turn.get(key) is not None and turn.get("role") in ("user", "assistant"):
                    seen.setdefault(key, turn)
    for key, turn in seen.items():
        base = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
        keyed = [{**t, key: turn[key]} if t["role"] == turn["role"] else t for t in base]
        try:
            same = tokenizer.apply_chat_template(base, tokenize=False) == tokenizer.apply_chat_template(
                keyed, tokenize=False
            )
        except Exception:  # noqa: BLE001 - a template that refuses the key renders it in its own way
            continue
        if same:
            logger.warning(
                "%s: %s turns carry '%s', which the model's chat template does not render: training never sees it; "
                "drop it, or write what it says into the turn's text",
                where, turn["role"], key,
            )  # fmt: skip


def _roles(turns: list) -> list:
    """The role of each turn (None for a turn that is not a mapping)."""
    return [turn.get("role") if isinstance(turn, dict) else None for turn in turns]


def _turn_problem(messages) -> str | None:
    if not isinstance(messages, list) or not messages:
        return "'messages' is not a list of turns"
    roles = _roles(messages)
    for number, role in enumerate(roles, 1):
        if role not in ROLES:
            return f"turn {number} has role {role!r}; use {', '.join(ROLES)}"
        if role == "system" and number > 1:
            return f"turn {number} is a system turn; only the first turn may be"
    spoken = roles[1:] if roles[0] == "system" else roles
    if not spoken or spoken[0] != "user":
        return "the first turn after any system turn is not the user's"
    if roles[-1] != "assistant":
        return "the last turn is not the assistant's, so there is no answer to train on"
    if problem := _text_problem(messages):
        return problem
    blank = next((n for n, t in enumerate(messages[:-1], 1) if not str(t.get("content") or "").strip()), None)
    if blank is not None:
        return f"turn {blank} ({roles[blank - 1]}) is empty: nothing is said in it"
    if not _answer_text(messages).strip():
        return "the assistant's answer is empty, so there is nothing to train on"
    return None
