"""`medrecipes preview RECIPE`: the first training examples as the model will see them, before
any training: the rendered text with the trained tokens marked, the token counts, where BOS and
the end-of-turn and EOS tokens fall, and the share of tokens trained. A wrong template or loss
mask shows here, not after an hour of training.

- SFT: each conversation through the chat template the run will use (its `chat_template_path`,
  else the tokenizer's, else the one a tokenizer without a template gets), tokenized as TRL's
  SFTTrainer tokenizes it: `apply_chat_template(return_assistant_tokens_mask=True)` for
  `assistant_only_loss`, the prompt's tokens masked for prompt/completion rows, cut at
  `max_length`. With packing, these examples are then packed; each still attends to itself.
- CPT: the packed blocks, every token trained.
- GRPO: the prompts the model answers; it trains on its own sampled answers, not on these.
- DPO: each pair's prompt with its chosen answer, then with its rejected one, the answer's tokens
  marked (the log-probabilities the loss compares); KTO: each answer with its label. Both cut at
  `max_length` as the run cuts them: a row whose prompt alone fills it trains nothing, and the run
  drops it.
"""

from dataclasses import dataclass, field

from medrecipes.config import method_named
from medrecipes.models.loading import recipe_tokenizer
from medrecipes.runs.settle import chat_turns, prompt_room

TRAINED_OPEN, TRAINED_CLOSE = "[[", "]]"


@dataclass
class Example:
    input_ids: list[int]
    trained: list[bool]
    notes: list[str] = field(default_factory=list)


def _mark(tokenizer, example: Example) -> str:
    """The example's text, each run of trained tokens between [[ and ]]."""
    pieces, start = [], 0
    for i in range(1, len(example.input_ids) + 1):
        if i == len(example.input_ids) or example.trained[i] != example.trained[start]:
            text = tokenizer.decode(example.input_ids[start:i])
            pieces.append(f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}" if example.trained[start] else text)
            start = i
    return "".join(pieces)


def _positions(tokenizer, ids: list[int], token: str | None) -> list[int]:
    token_id = tokenizer.convert_tokens_to_ids(token) if token else None
    if token_id is None or token_id == tokenizer.unk_token_id:
        return []
    return [i for i, t in enumerate(ids) if t == token_id]


def describe(tokenizer, example: Example, end_of_turn: str | None) -> str:
    """The header line and the marked text of one example."""
    n, trained = len(example.input_ids), sum(example.trained)
    header = [f"{n} tokens, {trained} trained ({trained / n:.1%})" if n else "0 tokens"]
    for name, token in (("BOS", tokenizer.bos_token), ("end of turn", end_of_turn), ("EOS", tokenizer.eos_token)):
        where = _positions(tokenizer, example.input_ids, token)
        if token and (where or name != "end of turn"):
            header.append(f"{name} {token} at {where if where else 'no position'}")
    return "; ".join(header + example.notes) + "\n" + _mark(tokenizer, example)


def sft_examples(tokenizer, rows, args) -> list[Example]:
    """Conversations or prompt/completion rows tokenized and masked as SFTTrainer does."""
    examples = []
    for row in rows:
        if "messages" in row:
            out = tokenizer.apply_chat_template(
                row["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=args.assistant_only_loss
            )
            ids = list(out["input_ids"])
            trained = [bool(m) for m in out["assistant_masks"]] if args.assistant_only_loss else [True] * len(ids)
        else:
            prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=True, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True)
            prompt, ids = list(getattr(prompt, "input_ids", prompt)), list(getattr(full, "input_ids", full))
            shared = next((i for i, (a, b) in enumerate(zip(prompt, ids, strict=False)) if a != b), len(prompt))
            trained = [i >= shared for i in range(len(ids))]
        examples.append(cut(Example(ids, trained), args))
    return examples


def cut(example: Example, args) -> Example:
    """The example cut to `max_length` as TRL's trainers cut it: its first tokens, or its last ones
    under `truncation_mode: keep_end`; packed by a strategy that splits (bfd_split, wrapped), whole.
    An example with nothing left to train is one the run drops (or, packed, trains nothing of)."""
    length, n = getattr(args, "max_length", None), len(example.input_ids)
    strategy = getattr(args, "packing_strategy", "bfd")
    if length and n > length and getattr(args, "packing", False) and strategy != "bfd":  # split, not cut
        example.notes.append(
            f"{n} tokens: packing ({strategy}) carries those past max_length {length} into the next sequence"
        )
    elif length and n > length:
        keep_end = getattr(args, "truncation_mode", "keep_start") == "keep_end"
        kept = slice(-length, None) if keep_end else slice(None, length)
        example.input_ids, example.trained = example.input_ids[kept], example.trained[kept]
        example.notes.append(f"cut at max_length {length} from {n} tokens" + (", its end kept" if keep_end else ""))
    if not any(example.trained):
        example.notes.append("NOTHING TRAINED: the template marks no answer, or max_length cut it off")
    return example


def answer_example(tokenizer, prompt, answer, note: str, args) -> Example:
    """A prompt and one answer as TRL's DPO and KTO trainers tokenize them: a conversation through
    the chat template, the prompt's turns with the generation prompt, the answer after them; plain
    text joined as it is, the answer ended with EOS (both trainers add it to plain text), cut to
    `max_length`. The answer's tokens are what the loss scores."""
    if isinstance(prompt, list):
        head = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(prompt + answer, tokenize=True)
        head, ids = list(getattr(head, "input_ids", head)), list(getattr(full, "input_ids", full))
    else:
        eos = tokenizer.eos_token or ""
        answer = answer if answer.endswith(eos) else answer + eos
        head = tokenizer(prompt)["input_ids"]
        ids = head + tokenizer(answer, add_special_tokens=False)["input_ids"]
    shared = next((i for i, (a, b) in enumerate(zip(head, ids, strict=False)) if a != b), len(head))
    return cut(Example(ids, [i >= shared for i in range(len(ids))], [note]), args)


def training_examples(method: str, recipe, args, model_args, count: int = 3):
    """(title, tokenizer, end-of-turn token, the first `count` training examples) of a parsed recipe."""
    tokenizer = recipe_tokenizer(recipe, model_args)
    # The template the run will use (set on the tokenizer, as the run sets it) and its end of turn.
    _, end_of_turn = chat_turns(method, args, tokenizer, recipe.system_prompt)
    trains = method_named(method)  # its examples are built as the data of a method of its kind
    name = method.upper()
    if trains.chat == "none":
        from medrecipes.data.pretraining import pretraining_data

        train, _ = pretraining_data(recipe, tokenizer, args.max_length)
        examples = [Example(list(b["input_ids"]), [True] * len(b["input_ids"])) for b in _first(train, count)]
        title = f"{name}: the first {len(examples)} packed blocks of max_length {args.max_length}, every token trained"
    elif trains.chat == "trains":
        from medrecipes.data.sft import sft_data

        train, _, _ = sft_data(recipe, tokenizer=tokenizer)
        examples = sft_examples(tokenizer, _first(train, count), args)
        what = "the answer turns" if args.assistant_only_loss else "every token"
        title = f"{name}: the first {len(examples)} examples; trained: {what}, marked {TRAINED_OPEN} {TRAINED_CLOSE}"
        if args.packing:  # shown one by one, as each is tokenized; the run then packs them
            title += (
                f"; packing: the run packs them into sequences of up to max_length {args.max_length} tokens "
                f"(packing_strategy {args.packing_strategy})"
            )
    elif trains.preference:
        from medrecipes.data.preference import preference_data

        train, _ = preference_data(
            recipe, unpair=trains.preference == "answers", args=args, start=model_args.model_name_or_path
        )
        examples = []
        for row in _first(train, count):
            if "chosen" in row:
                examples.append(answer_example(tokenizer, row["prompt"], row["chosen"], "chosen", args))
                examples.append(answer_example(tokenizer, row["prompt"], row["rejected"], "rejected", args))
            else:
                label = "desirable" if row["label"] else "undesirable"
                examples.append(answer_example(tokenizer, row["prompt"], row["completion"], label, args))
        what = (
            "each pair's chosen, then rejected answer"
            if trains.preference == "pairs"
            else "each answer with its label"
        )
        title = f"{name}: the first rows, {what}; scored: the answer, marked {TRAINED_OPEN} {TRAINED_CLOSE}"
    else:  # a method that generates its answers (GRPO)
        from medrecipes.data.grpo import fit_prompts, grpo_data

        train, _, _ = grpo_data(recipe, args.prompt_format)
        train = fit_prompts(train, tokenizer, prompt_room(recipe, model_args, args), "dataset_mixture")  # as the run
        examples = []
        for row in _first(train, count):
            prompt = row["prompt"]
            text = (
                prompt
                if isinstance(prompt, str)
                else tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            )
            ids = tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
            examples.append(Example(ids, [False] * len(ids), [f"gold answer {row['answer']}"]))
        title = f"{name}: the first {len(examples)} prompts; the model trains on its own sampled answers to them"
    return title, tokenizer, end_of_turn, examples


def preview(method: str, recipe, args, model_args, count: int = 3) -> str:
    """The first `count` training examples of a parsed recipe, as text for the terminal."""
    title, tokenizer, end_of_turn, examples = training_examples(method, recipe, args, model_args, count)
    blocks = [f"--- example {i + 1}: {describe(tokenizer, e, end_of_turn)}" for i, e in enumerate(examples)]
    total = sum(len(e.input_ids) for e in examples)
    trained = sum(sum(e.trained) for e in examples)
    share = f"{trained / total:.1%}" if total else "0%"
    summary = (
        f"{len(examples)} examples, {total} tokens, {trained} trained ({share}); tokenizer {tokenizer.name_or_path}"
    )
    if len(examples) < count:  # --examples past the data
        summary += f"; all the training data holds, of the {count} asked"
    return "\n".join([title, *blocks, summary])


def _first(dataset, count: int) -> list[dict]:
    return [row for _, row in zip(range(count), dataset, strict=False)]
