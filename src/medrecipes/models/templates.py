"""Chat templates: the ones shipped with the package, a tokenizer's own, the one an SFT recipe trains
with, where a turn ends, and the model's generation config stopping there."""

import logging
import re
from pathlib import Path

from medrecipes.errors import UserError
from medrecipes.locations import shipped_template, shipped_templates

ROLES = ("system", "user", "assistant")  # the roles every chat template we train with knows

logger = logging.getLogger(__name__)


# The end of a turn in the chat templates shipped with the package, by the token that opens one.
TURN_TOKENS = {"gemma": ("<start_of_turn>", "<end_of_turn>"), "chatml": ("<|im_start|>", "<|im_end|>")}


def chat_template(name: str = "chatml") -> str:
    """A chat template shipped with the package, medrecipes/templates/<name>.jinja."""
    path = shipped_template(name)
    if path is None:
        raise UserError(
            f"chat template '{name}': not shipped with medrecipes; one of {', '.join(shipped_templates())}"
        )
    return Path(path).read_text()


def native_template(tokenizer) -> str | None:
    """The shipped template whose turn tokens the tokenizer has as single tokens: a model trained
    with that turn format (Gemma's <start_of_turn>, ChatML's <|im_start|>) that came without a
    template, as the Gemma 3 base models and their GGUF files do; else None."""
    vocab = tokenizer.get_vocab()
    for name, tokens in TURN_TOKENS.items():
        if all(token in vocab for token in tokens):
            return name
    return None


TEMPLATE_FILES = (".jinja", ".j2")  # what TRL reads as a template file; another chat_template_path is a tokenizer


def sft_template(training_args, tokenizer) -> tuple[str | None, frozenset[str]]:
    """(the chat template an SFT run trains with, the tokens TRL adds with it), decided here alone
    and the template set on the tokenizer, which TRL applies: the recipe's chat_template_path file
    (a shipped name was resolved to its file when the recipe was read); the template of the
    tokenizer it names, which TRL clones with that tokenizer's added tokens (trl's
    clone_chat_template, in the trainer); else the tokenizer's own (one in a shipped turn format
    that came without one was given it when loaded, `loading.load_tokenizer`), else the shipped
    ChatML template."""
    path, added = training_args.chat_template_path, frozenset()
    if path and path.endswith(TEMPLATE_FILES):
        tokenizer.chat_template = Path(path).read_text(encoding="utf-8")
    elif path:
        tokenizer.chat_template, added = _cloned_template(path)
    elif tokenizer.chat_template is None:
        tokenizer.chat_template = chat_template("chatml")
        logger.info("the tokenizer has no chat template; using the shipped chatml template")
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    check_turn_tokens(template, tokenizer, path or "the tokenizer's chat template", added)
    if getattr(training_args, "assistant_only_loss", False) and template and not GENERATION_MARK.search(template):
        source = path or "the tokenizer's chat template"
        raise UserError(
            f"chat_template_path: {source} has no {{% generation %}} block, which assistant_only_loss needs to tell "
            f"the assistant's tokens from the rest; use a template that marks them ({', '.join(shipped_templates())} "
            "are shipped with it), or set assistant_only_loss: false"
        )
    return template, added


def _cloned_template(path: str) -> tuple[str, frozenset[str]]:
    """(the template, the added tokens) of the tokenizer at `path`, as TRL's clone_chat_template
    takes them; one line where it has no template (TRL's ValueError, in the trainer)."""
    from transformers import AutoTokenizer

    source = AutoTokenizer.from_pretrained(path)
    try:
        template = source.get_chat_template()
    except ValueError:
        raise UserError(
            f"chat_template_path: {path} is a tokenizer with no chat template, which the run would clone one from; "
            f"name a .jinja file, a tokenizer that has a template, or a template shipped with medrecipes "
            f"({', '.join(shipped_templates())})"
        ) from None
    return template, frozenset(token.content for token in source.added_tokens_decoder.values())


def check_turn_tokens(template: str | None, tokenizer, source: str, added: frozenset[str] = frozenset()) -> None:
    """A template in a shipped turn format whose turn tokens the tokenizer has as single tokens (or
    gets, `added` with a cloned template): without them each marker is cut into pieces of text, the
    model learns those, and generation never stops at the end of a turn (the recipe's eos_token is
    not where the turn ends)."""
    end = turn_end(template)
    name = next((n for n, (_, last) in TURN_TOKENS.items() if last == end), None)
    vocab = set(tokenizer.get_vocab()) | added
    if name is None or all(token in vocab for token in TURN_TOKENS[name]):
        return
    own = native_template(tokenizer)
    instead = f"{own}, the tokenizer's turn format" if own else "a template in the tokenizer's turn format"
    raise UserError(
        f"chat_template_path: {source} marks turns with {' and '.join(TURN_TOKENS[name])}, which this tokenizer "
        f"does not have as tokens (they would be trained as pieces of text, and no turn would end); use {instead}, "
        "or a tokenizer that has them"
    )


# How a chat template marks the assistant's tokens for assistant_only_loss: {% generation %}.
GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def turn_end(template: str | None) -> str | None:
    """The token that ends a turn of a chat template in a shipped turn format (<end_of_turn>,
    <|im_end|>), else None."""
    return next((end for _, end in TURN_TOKENS.values() if template and end in template), None)


def answer_end(tokenizer, template: str) -> str:
    """What `template` renders after an assistant's answer, up to its next turn: where SFT's
    trained answer must end with a token for the model to learn to stop (TRL adds none to
    conversations)."""
    answer = "\x00answer\x00"
    turns = [{"role": "user", "content": "question"}, {"role": "assistant", "content": answer},
             {"role": "user", "content": "next"}]  # fmt: skip
    try:
        text = tokenizer.apply_chat_template(turns, chat_template=template, tokenize=False)
    except Exception:  # a template that takes no second question: the answer's turn alone
        text = tokenizer.apply_chat_template(turns[:2], chat_template=template, tokenize=False)
    after = text.partition(answer)[2]
    return after.partition("next")[0]


def _rendered(tokenizer, turns: list[dict], **kwargs) -> str | None:
    try:
        return tokenizer.apply_chat_template(turns, tokenize=False, **kwargs)
    except Exception:  # noqa: BLE001 - a template's refusal is said where a prompt is rendered
        return None


def check_renders_question(tokenizer, name_or_path: str) -> None:
    """One line where the tokenizer's chat template renders a question's turn without its text (an
    empty chat_template.jinja, a template that writes no message): every prompt would be the same
    empty or fixed text, answered as if it were the question. A template that fails to render
    is left to the command's own line for it (`errors.template_refusal`). One that opens no
    assistant turn for add_generation_prompt is said: answers would go on the question's turn."""
    mark = "\x00question\x00"
    if tokenizer.chat_template is None:
        return
    turn = [{"role": "user", "content": mark}]
    text = _rendered(tokenizer, turn, add_generation_prompt=True)
    if text is None:  # its refusal is said where a prompt is rendered; an empty template renders nothing
        text = "" if not str(tokenizer.chat_template).strip() else mark
    if mark in str(text) and text == _rendered(tokenizer, turn, add_generation_prompt=False):
        logger.warning(
            "%s: its chat template writes nothing for add_generation_prompt (no assistant turn is opened after the "
            "question), so answers are generated as more of the question's turn; add the template's "
            "{%% if add_generation_prompt %%} block",
            name_or_path,
        )
    if mark not in str(text):
        shown = repr(tokenizer.chat_template[:60]) if isinstance(tokenizer.chat_template, str) else "its template"
        raise UserError(
            f"{name_or_path}: its chat template ({shown}) renders a question's turn without the question, so every "
            "prompt would be the same; fix chat_template.jinja (or tokenizer_config.json's chat_template), or remove "
            "it to ask the model with plain completion prompts"
        )


def say_dropped_system(tokenizer, key: str, template: str | None = None) -> None:
    """A system prompt (`key`) given to a model whose chat template leaves the system turn out of
    what it renders (some drop it rather than refuse it): the model would never see it, said. A
    template that refuses it raises its own error, which the command reports in one line
    (`errors.template_refusal`)."""
    mark = "\x00system\x00"
    turns = [{"role": "system", "content": mark}, {"role": "user", "content": "question"}]
    text = tokenizer.apply_chat_template(turns, chat_template=template, add_generation_prompt=True, tokenize=False)
    if mark not in text:
        logger.warning(
            "%s: the chat template of %s leaves the system turn out of the prompt, so the model never sees it; put "
            "the instruction in the question, or use a template that keeps it",
            key, tokenizer.name_or_path,
        )  # fmt: skip


def say_dropped_bos(tokenizer, own: str, template: str, key: str = "chat_template_path") -> None:
    """A template (`key`) that renders no BOS where the model's own template starts each conversation
    with it: the run trains on text without the token the model always saw first, said."""
    bos = tokenizer.bos_token
    if not bos:
        return
    turns = [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]
    starts = tokenizer.apply_chat_template(turns, chat_template=own, tokenize=False).lstrip().startswith(bos)
    if starts and bos not in tokenizer.apply_chat_template(turns, chat_template=template, tokenize=False):
        logger.warning(
            "%s: the template renders no %s, which %s's own template starts each conversation with, so the model "
            "trains on text without the token it always saw first; start the template with {{ bos_token }}",
            key, bos, tokenizer.name_or_path,
        )  # fmt: skip


def align_generation_eos(model, tokenizer, end_of_turn: str | None) -> None:
    """Make generation stop at the chat template's end of turn as well as at EOS.

    A model fine-tuned on Gemma's template ends its answers with <end_of_turn>; without it in
    generation_config.eos_token_id, generation would run on to max_new_tokens.
    """
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    for token in (tokenizer.eos_token, end_of_turn):
        token_id = tokenizer.convert_tokens_to_ids(token) if token else None
        if token_id is not None and token_id != tokenizer.unk_token_id and token_id not in ids:
            ids.append(token_id)
    model.generation_config.eos_token_id = ids
