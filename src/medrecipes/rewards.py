"""Reward functions for GRPO on multiple-choice questions, in a registry filled by `@reward`.

Every reward follows TRL's calling convention: it is called with keyword arguments
`prompts`, `completions`, `completion_ids`, `trainer_state`, `log_extra`, `log_metric` and
one list per dataset column (`answer`, the gold letter; `options`, the option texts), and
returns one float per completion, or None where it does not apply (a row without a gold
answer). Completions are strings for plain prompts and `[{"role": "assistant", "content":
...}]` for chat prompts.

A registered function that takes `completions` is a reward; one that does not is a factory
whose keyword arguments are the reward's settings, and it returns the reward (named like the
factory, so that TRL logs it under that name). A recipe lists rewards with a weight and
their settings nested in the entry:

    rewards:
      - {name: usmle_accuracy, weight: 1.0}
      - {name: answer_format, weight: 0.2, style: final_answer_line}
      - {name: overlong_penalty, weight: 0.1, max_tokens: 512}

`name` may also be a dotted import path (`my_pkg.rewards.fn`) to a reward or a factory.
"""

import importlib
import inspect
import math
import re
from collections.abc import Callable

from medrecipes.errors import UserError, check_choice, did_you_mean
from medrecipes.usmle import extract_answer, is_abstention, letters_of

REWARDS: dict[str, Callable] = {}


def reward(func: Callable) -> Callable:
    """Register a reward (or a factory of one) under its function name."""
    REWARDS[func.__name__] = func
    return func


def _is_factory(func: Callable) -> bool:
    try:
        return "completions" not in inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins and C callables have no signature: use them as they are
        return False


def _import(path: str) -> Callable:
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(
            f"reward '{path}': cannot import module '{module_name}' ({err}); check the dotted path"
        ) from None
    if not callable(getattr(module, attribute, None)):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise UserError(
            f"reward '{path}': module '{module_name}' has no function '{attribute}'{did_you_mean(attribute, names)}"
        )
    return getattr(module, attribute)


def _resolve(name: str) -> Callable:
    if name in REWARDS:
        return REWARDS[name]
    if "." in name:
        return _import(name)
    raise UserError(
        f"unknown reward '{name}'{did_you_mean(name, REWARDS)}; "
        f"use one of {', '.join(sorted(REWARDS))} or a dotted import path (my_pkg.rewards.fn)"
    )


def reward_settings(name: str) -> list[str] | None:
    """The names of the settings reward `name` takes ([] for none), or None when it takes any."""
    func = _resolve(name)
    if not _is_factory(func):
        return []
    parameters = inspect.signature(func).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return None
    return list(parameters)


def _reject_unknown_keys(name: str, keys, also: tuple[str, ...] = ()) -> None:
    accepted = reward_settings(name)
    if accepted is None:
        return
    valid = [*also, *accepted]
    for key in keys:
        if key not in valid:
            hint = f"valid keys: {', '.join(valid)}" if valid else "it takes no settings"
            raise UserError(f"reward '{name}': unknown key '{key}'{did_you_mean(key, valid)}; {hint}")


def get_reward(name: str, **settings) -> Callable:
    """The reward `name` (a registered name or a dotted import path) built with `settings`."""
    func = _resolve(name)
    _reject_unknown_keys(name, settings)
    ours = any(func is registered for registered in REWARDS.values())  # a user's own is held to TRL's scores
    if not _is_factory(func):
        return func if ours else CheckedReward(name, func)
    for key, parameter in inspect.signature(func).parameters.items():
        named = parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        if named and parameter.default is inspect.Parameter.empty and key not in settings:
            raise UserError(
                f"reward '{name}': takes no 'completions' argument, so it is read as a maker of a reward whose "
                f"settings are its arguments, and setting '{key}' is not given; a reward function itself takes "
                f"completions (TRL's name) and **kwargs: rename its argument{did_you_mean(key, ['completions'])}, or "
                f"add '{key}' to the reward's entry"
            )
    built = func(**settings)
    if not callable(built):
        raise UserError(f"reward '{name}': takes no 'completions' argument and does not return a reward function")
    return built if ours else CheckedReward(name, built)


def reward_functions(entries: list, where: str = "rewards") -> tuple[list[Callable], list[float]]:
    """The reward functions and weights of a recipe's `rewards` entries ({name, weight, <settings>})."""
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{where}: expected a non-empty list of {{name: ..., weight: ...}} entries")
    functions, weights = [], []
    for i, entry in enumerate(entries):
        try:
            function, weight = _from_entry(entry)
        except UserError as err:
            raise UserError(f"{where}[{i}]: {err}") from None
        repeat = next((j for j, earlier in enumerate(entries[:i]) if earlier == entry), None)
        if repeat is not None:
            raise UserError(
                f"{where}[{i}]: the same reward as {where.rsplit(': ', 1)[-1]}[{repeat}], counted twice; give it once "
                "with the weight it should have"
            )
        functions.append(function)
        weights.append(weight)
    if not any(weights):
        raise UserError(f"{where}: every reward weighs 0, so no answer scores above another and nothing is learned")
    if all(weight <= 0 for weight in weights):
        raise UserError(
            f"{where}: no reward weighs above 0 ({', '.join(f'{w:g}' for w in weights)}), so training moves toward the "
            "answers they score lowest; give the reward to learn from a positive weight"
        )
    return functions, weights


def _from_entry(entry) -> tuple[Callable, float]:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise UserError(f"expected a mapping with 'name' (a reward) and optionally 'weight', got {entry!r}")
    name, weight = entry["name"], entry.get("weight", 1.0)
    settings = {k: v for k, v in entry.items() if k not in ("name", "weight")}
    _reject_unknown_keys(name, settings, also=("name", "weight"))
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise UserError(f"weight must be a number, got {weight!r}")
    return get_reward(name, **settings), float(weight)


class BoundReward:
    """A reward function with its settings bound, called by TRL as a reward and logged under
    `__name__`. A class and not a closure so that it survives a pickle round trip (a module-level
    function and plain settings), as TRL's own configurable rewards do: a spawned process, such
    as an asynchronous rollout worker, receives the reward functions pickled."""

    def __init__(self, name: str, score: Callable, **settings):
        self.__name__, self.score, self.settings = name, score, settings

    def __call__(self, completions, **kwargs) -> list[float]:
        return self.score(completions, **self.settings, **kwargs)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"{self.__name__}({settings})"


class CheckedReward:
    """A reward of the user's own (an import path), its scores held to what TRL takes: a list of one
    number a completion, None for one it does not score. TRL fails on another with a traceback
    inside its step (a float for the batch is "not iterable"); this says which reward in one line, as
    it says an error the reward raises, with the line of the user's code it came from.
    A class, as BoundReward, so that it pickles; logged under the function's own name."""

    def __init__(self, name: str, function: Callable):
        self.path, self.function = name, function
        self.__name__ = getattr(function, "__name__", name.rsplit(".", 1)[-1])

    def __call__(self, completions, **kwargs):
        try:
            scores = self.function(completions, **kwargs)
        except Exception as err:  # noqa: BLE001 - the user's code: its error, where it is, in one line
            import traceback

            frame = traceback.extract_tb(err.__traceback__)[-1]
            raise UserError(
                f"reward '{self.path}' raised {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''} "
                f"({frame.filename} line {frame.lineno}, in {frame.name}); fix the reward (run it on a few "
                "completions alone to see its traceback)"
            ) from err
        wrong = None
        if not isinstance(scores, list | tuple):
            wrong = f"a {type(scores).__name__}"
        elif len(scores) != len(completions):
            wrong = f"{len(scores)} scores for {len(completions)} completions"
        elif bad := [s for s in scores if s is not None and (isinstance(s, bool) or not isinstance(s, int | float))]:
            wrong = f"a score of {type(bad[0]).__name__} ({bad[0]!r})"
        elif bad := [s for s in scores if s is not None and not math.isfinite(s)]:  # TRL reads NaN as no score
            wrong = f"a score of {bad[0]!r}"
        if wrong:
            raise UserError(
                f"reward '{self.path}' returned {wrong}; a reward returns a list of one finite number a completion "
                "(None for one it does not score)"
            )
        return scores

    def __repr__(self) -> str:
        return self.path


# The rewards that score whether an answer is right (the others score its form or its length): a
# question's pass rate counts the answers they score 1, and GRPO's share of groups without a
# learning signal is read on them.
CORRECTNESS = ("usmle_accuracy", "accuracy_or_abstain")
# GRPO's logged share of a step's groups whose correctness reward did not vary (the weighted sum
# where a recipe has no correctness reward): their advantages are 0 and they teach nothing.
NO_SIGNAL = "frac_correctness_zero_std"


def signal_share(logs: list[dict]) -> dict | None:
    """{steps, with_signal, share}: of the training steps that logged NO_SIGNAL, those in which some
    group's correctness reward varied; None for a run that logged none (not GRPO)."""
    shares = [entry[NO_SIGNAL] for entry in logs if NO_SIGNAL in entry and "eval_runtime" not in entry]
    if not shares:
        return None
    with_signal = sum(share < 1 for share in shares)
    return {"steps": len(shares), "with_signal": with_signal, "share": with_signal / len(shares)}


def correctness_index(functions: list[Callable]) -> int | None:
    """The position of the first correctness reward (CORRECTNESS) among a recipe's reward functions."""
    names = [getattr(function, "__name__", None) for function in functions]
    return next((i for i, name in enumerate(names) if name in CORRECTNESS), None)


def completion_text(completion) -> str:
    """The text of a plain completion, or of the assistant turns of a chat completion."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion if m.get("role") == "assistant")


def _per_row(values, n: int) -> list:
    return list(values) if values is not None else [None] * n


@reward
def usmle_accuracy(completions, answer, options=None, **kwargs) -> list[float | None]:
    """1 when the letter read from the completion (the shared extractor, which also recognises
    the text of an option) is the gold letter, else 0; None for a row without a gold letter."""
    rewards = []
    for completion, gold, opts in zip(completions, answer, _per_row(options, len(completions)), strict=True):
        if not gold:
            rewards.append(None)
            continue
        given = extract_answer(completion_text(completion), letters_of(opts), options=opts)
        rewards.append(1.0 if given == gold else 0.0)
    return rewards


@reward
def accuracy_or_abstain(abstain_reward: float = 0.25):
    """1 for the gold letter, `abstain_reward` for an explicit "I don't know" that names no option
    (`usmle.is_abstention`), 0 for a wrong or unreadable answer; None for a row without gold. Paying
    less for abstaining than for a right answer and more than for a wrong one lets a model learn to
    abstain where it would likely be wrong (its expected reward for answering is its chance of
    being right), as abstention-aware rewards for medical QA propose."""
    if isinstance(abstain_reward, bool) or not isinstance(abstain_reward, int | float) or not 0 <= abstain_reward < 1:
        raise UserError(
            f"reward 'accuracy_or_abstain': abstain_reward must be a number from 0 up to 1 (a right answer's "
            f"reward), got {abstain_reward!r}"
        )
    return BoundReward("accuracy_or_abstain", _accuracy_or_abstain, abstain_reward=float(abstain_reward))


def _accuracy_or_abstain(completions, answer, abstain_reward: float, options=None, **kwargs) -> list[float | None]:
    rewards = []
    right = usmle_accuracy(completions, answer, options)
    for completion, score, opts in zip(completions, right, _per_row(options, len(completions)), strict=True):
        if score == 0.0 and is_abstention(completion_text(completion), letters_of(opts), opts):
            score = abstain_reward
        rewards.append(score)
    return rewards


# The forms the project's prompts ask for (medrecipes.usmle): a last line "Final Answer: X"
# after reasoning, or the letter first ("C", "C. <option text>", " C" after "Answer:").
ANSWER_STYLES = {
    "final_answer_line": r"(?:^|\n)[ \t]*Final Answer:[ \t]*([A-J])[ \t]*\.?\s*\Z",
    "letter": r"\A\s*([A-J])(?:[.)][ \t]*(?:\S[^\n]*)?)?(?:\n|\Z)",
}


@reward
def answer_format(style: str = "final_answer_line"):
    """1 when the completion gives an option letter in the form `style` names, else 0:

    - final_answer_line: its last line is "Final Answer: X" (the chain-of-thought prompt);
    - letter: it opens with the letter, alone or as "X. <option text>" on the first line.
    """
    check_choice(style, list(ANSWER_STYLES), "reward 'answer_format': style")
    return BoundReward("answer_format", _answer_format, pattern=re.compile(ANSWER_STYLES[style]))


def _answer_format(completions, pattern: re.Pattern, options=None, **kwargs) -> list[float]:
    rewards = []
    for completion, opts in zip(completions, _per_row(options, len(completions)), strict=True):
        match = pattern.search(completion_text(completion))
        rewards.append(1.0 if match and match.group(1) in letters_of(opts) else 0.0)
    return rewards


@reward
def overlong_penalty(max_tokens: int = 512, buffer_tokens: int | None = None):
    """0 up to `max_tokens - buffer_tokens` completion tokens, then falling linearly to -1 at
    `max_tokens` and staying there (DAPO's soft overlong punishment). `buffer_tokens`
    defaults to a quarter of `max_tokens`; set `max_tokens` to the run's max_completion_length.

    Ours and not TRL's `get_soft_overlong_punishment`: the two agree wherever the buffer is
    positive, but with no buffer TRL's gives 0 to a completion of exactly the maximum length, and a
    completion cut at max_completion_length has exactly that many tokens, never more: the truncated
    completions it is meant for would never be penalised. Here reaching `max_tokens` gives -1."""
    buffer_tokens = max_tokens // 4 if buffer_tokens is None else buffer_tokens
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise UserError(f"reward 'overlong_penalty': max_tokens must be a positive whole number, got {max_tokens!r}")
    if not isinstance(buffer_tokens, int) or not 0 <= buffer_tokens <= max_tokens:
        raise UserError(
            f"reward 'overlong_penalty': buffer_tokens must be a whole number from 0 to max_tokens ({max_tokens}), "
            f"got {buffer_tokens!r}"
        )
    return BoundReward("overlong_penalty", _overlong_penalty, max_tokens=max_tokens, buffer_tokens=buffer_tokens)


def _overlong_penalty(completions, completion_ids, max_tokens: int, buffer_tokens: int, **kwargs) -> list[float]:
    start = max_tokens - buffer_tokens
    rewards = []
    for ids in completion_ids:
        over = len(ids) - start
        rewards.append(-1.0 if len(ids) >= max_tokens else 0.0 if over <= 0 else -over / buffer_tokens)
    return rewards


_FINAL_ANSWER = re.compile(r"Final Answer\s*:", re.IGNORECASE)


def form_rewarded(function: Callable) -> str | None:
    """The answer form (`ANSWER_STYLES`) a reward scores, where it scores one: answer_format's
    style; reasoning_present's reasoning before "Final Answer: X" (the chain-of-thought prompt's)."""
    if isinstance(function, BoundReward) and function.__name__ == "answer_format":
        return next(
            style for style, pattern in ANSWER_STYLES.items() if pattern == function.settings["pattern"].pattern
        )
    return "final_answer_line" if getattr(function, "__name__", None) == "reasoning_present" else None


@reward
def reasoning_present(min_words: int = 20):
    """1 when at least `min_words` words of reasoning come before the answer ("Final Answer:",
    or the end of a completion without one), else 0: for chain-of-thought prompts."""
    if not isinstance(min_words, int) or min_words < 1:
        raise UserError(f"reward 'reasoning_present': min_words must be a positive whole number, got {min_words!r}")
    return BoundReward("reasoning_present", _reasoning_present, min_words=min_words)


def _reasoning_present(completions, min_words: int, **kwargs) -> list[float]:
    rewards = []
    for completion in completions:
        text = completion_text(completion)
        match = _FINAL_ANSWER.search(text)
        reasoning = text[: match.start()] if match else text
        rewards.append(1.0 if len(re.findall(r"\w+", reasoning)) >= min_words else 0.0)
    return rewards
