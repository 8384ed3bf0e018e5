"""medrecipes.rewards: every reward on literal completions, called the way TRL calls them, and
the registry's errors."""

import pickle
import re

import pytest

from medrecipes import rewards
from medrecipes.errors import UserError
from medrecipes.rewards import REWARDS, get_reward, reward_functions

OPTIONS = ["Aortic stenosis", "Mitral stenosis", "Aortic regurgitation", "Mitral regurgitation"]


def call(func, completions, answer="A", options=OPTIONS, completion_ids=None, **columns):
    """Call a reward exactly as GRPOTrainer does: keyword arguments, one value per completion."""
    n = len(completions)
    return func(
        prompts=["Question?"] * n,
        completions=completions,
        completion_ids=completion_ids or [[1] * 3 for _ in completions],
        trainer_state=None,
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
        answer=[answer] * n,
        options=[options] * n,
        **columns,
    )


def chat(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


# ---------------------------------------------------------------------------
# usmle_accuracy


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("A. Aortic stenosis", 1.0),
        ("The murmur radiates to the carotids.\n\nFinal Answer: A", 1.0),
        ("Aortic stenosis", 1.0),  # the text of the gold option, without its letter
        ("Final Answer: B", 0.0),
        ("A or B", 0.0),  # a hedge is not an answer
        ("I am not sure.", 0.0),
        ("", 0.0),
    ],
)
def test_accuracy_on_plain_and_chat_completions(completion, expected):
    func = get_reward("usmle_accuracy")
    assert call(func, [completion]) == [expected]
    assert call(func, [chat(completion)]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("A. Aortic stenosis", 1.0),
        ("I don't know.", 0.25),
        ("I do not know which of these it is", 0.25),
        ("I am not sure.", 0.25),
        ("I can't answer this without an echocardiogram.", 0.25),
        ("I don't know, but A", 0.0),  # a hedge that names a letter: not an abstention
        ("I'm not sure, probably B", 0.0),
        ("B. Mitral stenosis", 0.0),
        ("A or B", 0.0),  # a hedge is neither
        ("", 0.0),
    ],
)
def test_accuracy_or_abstain_pays_a_set_amount_for_an_explicit_abstention(completion, expected):
    func = get_reward("accuracy_or_abstain", abstain_reward=0.25)
    assert call(func, [completion]) == [expected]
    assert call(func, [chat(completion)]) == [expected]
    assert func.__name__ == "accuracy_or_abstain"
    assert call(func, [completion], answer=None) == [None]


@pytest.mark.parametrize("value", [1.0, -0.1, "0.25", True, 2])
def test_accuracy_or_abstain_refuses_an_abstention_reward_outside_0_to_1(value):
    with pytest.raises(UserError, match="abstain_reward must be a number from 0 up to 1"):
        get_reward("accuracy_or_abstain", abstain_reward=value)


def test_accuracy_is_none_where_a_row_has_no_gold_letter():
    func = get_reward("usmle_accuracy")
    out = func(completions=["A", "A", "B"], answer=[None, "A", ""], options=[OPTIONS] * 3)
    assert out == [None, 1.0, None]


def test_accuracy_reads_letters_beyond_d_for_five_options():
    options = [*OPTIONS, "Tricuspid regurgitation"]
    assert call(get_reward("usmle_accuracy"), ["Final Answer: E"], answer="E", options=options) == [1.0]
    assert call(get_reward("usmle_accuracy"), ["Final Answer: E"], answer="E", options=OPTIONS) == [0.0]


# ---------------------------------------------------------------------------
# answer_format


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("Slow-rising pulse and an ejection murmur.\nFinal Answer: A", 1.0),
        ("Final Answer: C.\n", 1.0),
        ("Final Answer: A\nBut maybe B.", 0.0),  # not the last line
        ("final answer a", 0.0),
        ("Final Answer: Z", 0.0),  # not an option letter
        ("A", 0.0),
        ("", 0.0),
    ],
)
def test_final_answer_line_style(completion, expected):
    func = get_reward("answer_format", style="final_answer_line")
    assert call(func, [completion]) == [expected]
    assert call(func, [chat(completion)]) == [expected]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("C", 1.0),
        (" C\nThe slow-rising pulse points to it.", 1.0),  # a plain prompt ending in "Answer:"
        ("C. Aortic regurgitation", 1.0),
        ("C) Aortic regurgitation", 1.0),
        ("A 60-year-old man has it.", 0.0),  # the article, not a letter
        ("The answer is C", 0.0),
        ("", 0.0),
    ],
)
def test_letter_style(completion, expected):
    func = get_reward("answer_format", style="letter")
    assert call(func, [completion]) == [expected]
    assert call(func, [chat(completion)]) == [expected]


def test_format_does_not_need_a_gold_letter():
    func = get_reward("answer_format", style="letter")
    assert func(completions=["B", "no"], answer=[None, None], options=[OPTIONS] * 2) == [1.0, 0.0]


# ---------------------------------------------------------------------------
# overlong_penalty and reasoning_present


def test_overlong_penalty_is_zero_then_linear_then_minus_one():
    func = get_reward("overlong_penalty", max_tokens=8, buffer_tokens=4)
    lengths = [0, 3, 4, 5, 6, 7, 8, 12]
    out = call(func, ["x"] * len(lengths), completion_ids=[[7] * n for n in lengths])
    assert out == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0]


def test_overlong_penalty_default_buffer_is_a_quarter():
    func = get_reward("overlong_penalty", max_tokens=512)
    out = call(func, ["x"] * 3, completion_ids=[[0] * 384, [0] * 448, [0] * 512])
    assert out == [0.0, -0.5, -1.0]


def test_reasoning_present_counts_words_before_the_answer():
    func = get_reward("reasoning_present", min_words=5)
    completions = [
        "The pulse is slow rising and the murmur radiates.\nFinal Answer: A",
        "Final Answer: A because the pulse is slow rising and the murmur radiates",
        "Short. Final Answer: A",
        "",
    ]
    assert call(func, completions) == [1.0, 0.0, 0.0, 0.0]
    assert call(func, [chat(c) for c in completions]) == [1.0, 0.0, 0.0, 0.0]


# ---------------------------------------------------------------------------
# The registry


def test_factories_keep_the_reward_name_trl_logs():
    assert set(REWARDS) >= {"usmle_accuracy", "answer_format", "overlong_penalty", "reasoning_present"}
    for name in REWARDS:
        assert get_reward(name).__name__ == name


def test_registered_by_the_decorator():
    @rewards.reward
    def always_one(completions, **kwargs):
        return [1.0] * len(completions)

    try:
        assert get_reward("always_one") is always_one
    finally:
        del REWARDS["always_one"]


def test_dotted_import_path():
    assert get_reward("medrecipes.rewards.usmle_accuracy") is rewards.usmle_accuracy
    built = get_reward("medrecipes.rewards.overlong_penalty", max_tokens=4, buffer_tokens=0)
    assert call(built, ["x", "y"], completion_ids=[[1] * 3, [1] * 4]) == [0.0, -1.0]


@pytest.mark.parametrize(
    "name, settings, message",
    [
        ("usmle_acuracy", {}, "unknown reward 'usmle_acuracy' (did you mean 'usmle_accuracy'?)"),
        ("answer_format", {"styl": "letter"}, "unknown key 'styl' (did you mean 'style'?); valid keys: style"),
        ("answer_format", {"style": "leter"}, "style 'leter' is unknown (did you mean 'letter'?)"),
        ("usmle_accuracy", {"style": "letter"}, "unknown key 'style'; it takes no settings"),
        ("overlong_penalty", {"max_tokens": 0}, "max_tokens must be a positive whole number"),
        ("overlong_penalty", {"max_tokens": 8, "buffer_tokens": 9}, "buffer_tokens must be a whole number from 0"),
        ("no_such_pkg.rewards.fn", {}, "cannot import module 'no_such_pkg.rewards'"),
        ("medrecipes.rewards.usmle_acuracy", {}, "has no function 'usmle_acuracy' (did you mean 'usmle_accuracy'?)"),
    ],
)
def test_registry_errors_are_one_line(name, settings, message):
    with pytest.raises(UserError) as err:
        get_reward(name, **settings)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_recipe_entries_give_functions_and_weights():
    funcs, weights = reward_functions(
        [
            {"name": "usmle_accuracy", "weight": 1.0},
            {"name": "answer_format", "weight": 0.2, "style": "final_answer_line"},
            {"name": "overlong_penalty", "weight": 0.1, "max_tokens": 512},
        ]
    )
    assert [f.__name__ for f in funcs] == ["usmle_accuracy", "answer_format", "overlong_penalty"]
    assert weights == [1.0, 0.2, 0.1]


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            {"name": "answer_format", "wieght": 0.2},
            "rewards[0]: reward 'answer_format': unknown key 'wieght' (did you mean 'weight'?)",
        ),
        (
            {"name": "usmle_accuracy", "stlye": "x"},
            "rewards[0]: reward 'usmle_accuracy': unknown key 'stlye'; valid keys: name, weight",
        ),
        ({"weight": 1.0}, "rewards[0]: expected a mapping with 'name'"),
        ({"name": "usmle_accuracy", "weight": "high"}, "rewards[0]: weight must be a number"),
        ({"name": "answer_format", "style": "boxd"}, "rewards[0]: reward 'answer_format': style 'boxd' is unknown"),
    ],
)
def test_bad_recipe_entries(entry, message):
    with pytest.raises(UserError, match=re.escape(message)):
        reward_functions([entry])


@pytest.mark.parametrize(
    "name, settings",
    [
        ("usmle_accuracy", {}),
        ("answer_format", {"style": "letter"}),
        ("overlong_penalty", {"max_tokens": 8, "buffer_tokens": 4}),
        ("reasoning_present", {"min_words": 3}),
    ],
)
def test_rewards_survive_a_pickle_round_trip(name, settings):
    """A spawned process (TRL's asynchronous rollout worker) receives the reward functions pickled."""
    built = get_reward(name, **settings)
    again = pickle.loads(pickle.dumps(built))
    assert again.__name__ == name
    completions = ["B. Lung", "Final Answer: C", "The pulse is slow. Final Answer: A", "x"]
    columns = {
        "answer": ["B", "C", "B", None],
        "options": [OPTIONS] * 4,
        "completion_ids": [[1] * n for n in (2, 6, 8, 9)],
    }
    assert again(completions=completions, **columns) == built(completions=completions, **columns)


def test_a_reward_of_ones_own_is_held_to_the_scores_trl_takes(tmp_path, monkeypatch):
    """A reward by import path that returns one float for the batch, too few scores or a text
    score: one line naming it, where TRL fails in its step; a list of numbers and None passes, and
    the reward pickles and keeps its own name for the logs."""
    import pickle

    from medrecipes.rewards import get_reward

    (tmp_path / "my_scores.py").write_text(
        "def batch(completions, **kw):\n    return 1.0\n"
        "def short(completions, **kw):\n    return [1.0]\n"
        "def text(completions, **kw):\n    return ['1'] * len(completions)\n"
        "def fine(completions, **kw):\n    return [1.0, None]\n"
        "def nan(completions, **kw):\n    return [float('nan')] * len(completions)\n"
        "def misnamed(completion, **kw):\n    return [1.0] * len(completion)\n"
        "def raises(completions, **kw):\n    return [1 / 0 for _ in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=r"reward 'my_scores.misnamed': takes no 'completions' argument, so .* rename its "
                       r"argument \(did you mean 'completions'\?\), or add 'completion' to the reward's entry"):  # fmt: skip
        get_reward("my_scores.misnamed")
    for name, said in (("batch", "returned a float"), ("short", "returned 1 scores for 2 completions"),
                       ("text", "returned a score of str ('1')"), ("nan", "returned a score of nan"),
                       ("raises", f"raised ZeroDivisionError: division by zero ({tmp_path}/my_scores.py line 14, in ")):  # fmt: skip
        with pytest.raises(UserError, match=re.escape(f"reward 'my_scores.{name}' {said}")):
            get_reward(f"my_scores.{name}")(["A", "B"])
    fine = pickle.loads(pickle.dumps(get_reward("my_scores.fine")))
    assert fine(["A", "B"]) == [1.0, None] and fine.__name__ == "fine"
