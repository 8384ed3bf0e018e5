"""Reading the answer letter out of a model's reply: `extract_answer`."""

import re
from collections.abc import Callable

from medrecipes.usmle.schema import LETTERS

# A candidate letter: upper case standing alone, or either case when wrapped in (), [] or
# markdown, or lower case followed by punctuation/end ("is (c)", "is c."). "A or B" is a hedge,
# not an answer, so a letter followed by "or X" / "/X" is not a candidate.
_HEDGE = r"(?![)\]*_]*\s*(?:or|/)\s*[(\[]?[A-Ja-j]\b)"
_LETTER = r"[*_]*\s*(?:[(\[]([A-Ja-j])[)\]]|\b([A-J])(?![\w'-])|\b([a-j])(?=[*_]*\s*(?:[.):,;!]|$)))" + _HEDGE
# "option C", "choice (b)": the word may stand before the letter wherever a letter is read
_PICK = r"(?:(?i:option|choice)\s*)?" + _LETTER
_SEP = r"[\s*_]*(?:[:=\-\u2013\u2014]|\bis\b|\bwould be\b|\bshould be\b|\bwill be\b)[\s*_:]*"

_FINAL_PATTERNS = [
    re.compile(r"(?i:final\s+answer)[\s*_]*(?:[:=\-\u2013\u2014]|(?i:\bis\b))?[\s*_:]*" + _PICK, re.M),
    re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*([A-J])\b"),
]
_EXPLICIT_PATTERNS = [
    re.compile(r"(?i:\banswer)" + _SEP + _PICK, re.M),
    re.compile(r"(?i:\b(?:correct|right|best)\s+(?:option|choice|response))" + _SEP + _PICK, re.M),
    re.compile(
        r"(?i:\b(?:it'?s|it\s+is|i\s+(?:would\s+|'d\s+)?(?:choose|pick|select|go\s+with)))\s+" + _PICK,
        re.M,
    ),
    # "B is correct", "Option (c) is the right answer"; "B is incorrect" is not one
    re.compile(_PICK + r"[\s*_]+(?i:is\s+(?:the\s+)?(?:correct|right|best)\b)", re.M),
]
_STANDALONE_PATTERNS = [
    # a line that is only the letter: "C", "c", "**C**", "(C)", "C.", "Option C"
    re.compile(r"^[\s*_]*(?:(?i:option|choice)\s*)?[(\[]?([A-Ja-j])[)\]]?[\s*_]*[.:]?[\s*_]*$", re.M),
]
# a line opening with the letter of an option: "C. Start ...", "C) Start ...", "(c) Start ...";
# a reply that lists the options this way ("A. ...\nB. ...") names every one of them
_LIST_ITEM = re.compile(r"^[ \t]*[*_]*(?:[(\[]([A-Ja-j])[)\]]|([A-Ja-j])\)|([A-J])[.:])(?=[\s*_]|$)", re.M)


def _letters_found(patterns: list[re.Pattern], text: str, options: dict[str, str] | None) -> set[str]:
    """The letters the patterns find, and with `options` also the option that the words after
    a letter spell out: "C. Goblet cells" where goblet cells are option A names two options."""
    found = set()
    for pattern in patterns:
        for match in pattern.finditer(text):
            found.add(next(g for g in match.groups() if g).upper())
            after = text[match.end() :]
            if options:
                found |= _options_spelled(after.split("\n")[0], options)
            if "\n" in match.group(0):
                # "The answer is:" and the letter on a line below: the list there is the answer,
                # and a list of several options ("A. ...\nB. ...") names no single one
                found |= _letters_found([_LIST_ITEM], after.split("\n\n")[0], None)
    return found


def _normalise_text(text: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _option_form(option: str) -> Callable[[str], str]:
    """How an option's text is compared: punctuation-blind, except for an option made only of
    symbols ("↓ ↑"), which that would leave empty and is compared as written."""
    return _normalise_text if _normalise_text(option) else lambda t: " ".join(t.casefold().split())


def _by_letter(options: list[str] | dict) -> dict[str, str]:
    pairs = options.items() if isinstance(options, dict) else zip(LETTERS, options, strict=False)
    return {str(k).upper(): str(v) for k, v in pairs if v}


def _letter_from_option_text(text: str, by_letter: dict[str, str]) -> str | None:
    forms = {k: _option_form(v) for k, v in by_letter.items()}
    said = {k: form(text) for k, form in forms.items()}
    option = {k: forms[k](v) for k, v in by_letter.items()}
    exact = [k for k in by_letter if option[k] == said[k]]
    if len(exact) == 1:
        return exact[0]
    if _ANY_LETTER.search(text):
        return None
    inside = [k for k in by_letter if f" {option[k]} " in f" {said[k]} "]
    return inside[0] if len(inside) == 1 else None


# A reply that names an option by its letter anywhere ("Option A: ...", "(B)", "C. ...") is
# not read by an option's text found inside it: its letters say what it discusses, and they
# named no answer. A reply that is an option's whole text still names it.
_ANY_LETTER = re.compile(
    r"\b(?i:option|choice)\s*[(\[]?[A-Ja-j]\b|[(\[][A-Ja-j][)\]]|(?:^|\s)[A-J][.):](?=\s|$)", re.M
)


# A reply cut off by max_new_tokens spells an option's start; this many characters of it
# (normalised) are enough to tell which option, and too few to be a word two options share.
_SPELLED_PREFIX = 20


def _options_spelled(words: str, by_letter: dict[str, str]) -> set[str]:
    """The one option whose whole text `words` is, or whose start it is when cut short."""
    said = _normalise_text(words)
    if not said:
        return set()
    texts = {k: _normalise_text(v) for k, v in by_letter.items()}
    same = {k for k, v in texts.items() if v == said}
    if not same and len(said) >= _SPELLED_PREFIX:
        same = {k for k, v in texts.items() if v.startswith(said)}
    return same if len(same) == 1 else set()


def extract_answer(text: str | None, letters: str = "ABCD", options: list[str] | dict | None = None) -> str | None:
    """The answer letter a model gave in `text`, or None when there is none or it is ambiguous.

    Tiers, most explicit first; the first tier that finds any letter decides, and it gives
    an answer only when it found exactly one distinct letter and that letter is in `letters`:
      1. "Final Answer: X" (also bold or in parentheses) and LaTeX "\\boxed{X}";
      2. explicit phrases: "answer is X", "Answer: X", "Answer - option X", "**Answer:** X",
         "correct option is (X)", "it's X", "I choose X", "X is correct";
      3. a line that is only the letter ("C", "**C**", "(C)", "Option C"), or lines opening
         with "C. text", "C) text" or "(C) text" (a reply listing the options names none);
      4. with `options`: the whole text of one option, or the text of exactly one option
         inside a reply that names no letter.
    The word "option" or "choice" may stand before the letter. With `options`, a letter
    followed by the text of another option ("C. <option A's text>") names two options: no
    answer. "A or B" is never an answer, and a sentence opening with the article "A" is not
    one either.
    """
    if not text or not text.strip():
        return None
    letters = letters.upper()
    by_letter = _by_letter(options) if options else None
    tiers = [
        _letters_found(_FINAL_PATTERNS, text, by_letter),
        _letters_found(_EXPLICIT_PATTERNS, text, by_letter),
        _letters_found(_STANDALONE_PATTERNS + [_LIST_ITEM], text, by_letter),
    ]
    for found in tiers:
        if found:
            return found.pop() if len(found) == 1 and found <= set(letters) else None
    said = _letter_from_option_text(text, by_letter) if by_letter else None
    return said if said and said in letters else None


# An explicit refusal to answer: "I don't know", "I do not know", "I am not sure", "unsure",
# "cannot answer", "cannot tell", as a model that may abstain says it.
_ABSTENTION = re.compile(
    r"\b(?:I\s+(?:do\s+not|don'?t|dont)\s+know|I'?m\s+not\s+sure|I\s+am\s+not\s+sure|(?:I\s+)?(?:am\s+)?unsure|"
    r"(?:I\s+)?(?:cannot|can'?t|can\s+not)\s+(?:answer|tell))\b",
    re.IGNORECASE,
)


def is_abstention(text: str | None, letters: str = "ABCD", options: list[str] | dict | None = None) -> bool:
    """Whether `text` declines to answer ("I don't know", "I am not sure", ...) and names no option:
    `extract_answer` finds none and no option letter stands alone in it ("I'm not sure, probably
    B" is a hedged answer). An abstention, which a model may be rewarded for where it would be
    wrong, and which evaluation counts apart from unparseable replies."""
    if not text or not _ABSTENTION.search(text) or extract_answer(text, letters, options) is not None:
        return False
    rest = _ABSTENTION.sub(" ", text)  # its own "I" is not option I
    return re.search(rf"\b[{re.escape(letters.upper())}]\b", rest) is None
