"""The layouts of multiple-choice rows that `load_mcq` reads (MedQA, its Hub layout, MedMCQA, MMLU,
PubMedQA, seed files), each a converter of one raw row into a normalised row, and the layout of a
file told from its first row's keys."""

import re
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from datasets import Dataset

from medrecipes.errors import UserError, quoted
from medrecipes.usmle.schema import (
    LETTERS,
    MMLU_COLUMNS,
    PUBMEDQA_OPTIONS,
    Row,
    Where,
    _gold,
    _index_gold,
    _options,
    _row,
    _text,
)


def _null(where: Where, keys: list[str]) -> UserError:
    """A row's keys of its file's layout with no value: null, or left out of a row of a file whose
    other rows have them (the reader fills them with null); what it lacks is their value."""
    return UserError(
        f"{where}: {', '.join(repr(k) for k in keys)} {'has' if len(keys) == 1 else 'have'} no value (null, or left "
        "out of this row); give every row its value, or leave the row out"
    )


def _require(row: Row, keys: Iterable[str], fmt: str, where: Where) -> None:
    missing = [k for k in keys if row.get(k) is None]
    if empty := [k for k in missing if k in row]:  # written, as null
        raise _null(where, empty)
    if missing:
        layout = ", ".join(CONVERTERS[fmt].keys)
        raise UserError(
            f"{where}: no {', '.join(repr(k) for k in missing)}, which the file's rows have in the layout its first "
            f"row set ({fmt}: {layout}); fix the row, or give every row that layout"
        )


def _from_medqa(row: Row, where: Where, **_: Any) -> Row:
    _require(row, ["question", "options", "answer_idx"], "medqa", where)
    options = _options(row["options"], where)
    subject = row.get("meta_info") or row.get("subject")
    gold = _gold(row["answer_idx"], options, where)
    # MedQA writes the answer twice, its letter and its text: a row whose two disagree (one edited)
    # would be scored by the letter alone. A letter in `answer` is the same answer written once more.
    answer = _text(row.get("answer"))
    if gold and answer and answer.upper() != gold and answer.casefold() != options[LETTERS.index(gold)].casefold():
        raise UserError(
            f"{where}: answer_idx {gold} is option {quoted(options[LETTERS.index(gold)])}, and answer is "
            f"{quoted(answer)}: they disagree; fix one of them (answer_idx is the letter scored)"
        )
    return _row(
        row["question"],
        options,
        gold,
        id=row.get("realidx", row.get("id")),
        subject=subject,
    )


def _from_medqa_hf(row: Row, where: Where, **_: Any) -> Row:
    endings = sorted(k for k in row if re.fullmatch(r"ending\d", k) and row[k] is not None)
    _require(row, ["sent1", "ending0", "ending1", "label"], "medqa_hf", where)
    options = [_text(row[k]) for k in endings]
    return _row(row["sent1"], options, _index_gold(row["label"], options, where), id=row.get("id"))


def _from_medmcqa(row: Row, where: Where, one_based: bool = False, **_: Any) -> Row:
    _require(row, ["question", "opa", "opb", "opc", "opd", "cop"], "medmcqa", where)
    options = [_text(row[k]) for k in ("opa", "opb", "opc", "opd")]
    cop = row["cop"]
    if isinstance(cop, str) and cop.strip().upper() in LETTERS[:4]:  # a letter reads one way
        answer = cop.strip().upper()
    else:
        answer = _index_gold(cop, options, where, base=1 if one_based else 0)
    return _row(
        row["question"],
        options,
        answer,
        id=row.get("id"),
        subject=row.get("subject_name"),
        explanation=row.get("exp"),
    )


def _from_mmlu(row: Row, where: Where, subject: str = "", **_: Any) -> Row:
    if row.get("choices") is not None:  # the Hub's cais/mmlu layout
        _require(row, ["question", "answer"], "mmlu", where)
        options = _options(row["choices"], where)
        return _row(
            row["question"],
            options,
            _index_gold(row["answer"], options, where),
            subject=row.get("subject") or subject,
        )
    _require(row, MMLU_COLUMNS, "mmlu", where)
    options = [_text(row[k]) for k in "ABCD"]
    return _row(row["question"], options, _gold(row["answer"], options, where), subject=subject)


def _pubmedqa_context(row: Row, setting: str, where: Where) -> str:
    """The text the question is asked about in `setting`: the abstract's sections, one a line (as
    lm-evaluation-harness's pubmedqa prompt joins them), its conclusion, or both, each named."""
    context = row.get("context")  # the Hub copy's {"contexts": [...]}, or the abstract as one text
    contexts = row.get("CONTEXTS") or (context.get("contexts") if isinstance(context, dict) else context) or []
    abstract = "\n".join(contexts) if isinstance(contexts, list) else _text(contexts)
    if not abstract.strip() and setting != "reasoning_free":
        raise UserError(
            f"{where}: has no abstract (CONTEXTS), which pubmedqa_setting {setting} asks the question about; fill it "
            "in, or use pubmedqa_setting reasoning_free (the conclusion alone)"
        )
    if setting == "reasoning_required":
        return abstract
    conclusion = _text(row.get("LONG_ANSWER", row.get("long_answer")))
    if not conclusion:
        raise UserError(
            f"{where}: has no LONG_ANSWER (the abstract's conclusion), which pubmedqa_setting {setting} "
            "gives the model; fill it in, or use pubmedqa_setting reasoning_required"
        )
    if setting == "reasoning_free":
        return f"Conclusion: {conclusion}"
    return f"Abstract: {abstract}\nConclusion: {conclusion}"


def _from_pubmedqa(row: Row, where: Where, pubmedqa_setting: str = "reasoning_required", **_: Any) -> Row:
    # PQA-L files use upper-case keys; the Hub's pqa_labeled uses lower case and nests contexts.
    question = row.get("QUESTION", row.get("question"))
    _require({"QUESTION": question, **row}, ["QUESTION", "final_decision"], "pubmedqa", where)
    decision = _text(row["final_decision"]).lower()
    if decision not in PUBMEDQA_OPTIONS:
        raise UserError(f"{where}: final_decision {row['final_decision']!r} is not yes, no or maybe; fix the row")
    answer = LETTERS[PUBMEDQA_OPTIONS.index(decision)]
    return _row(
        question,
        list(PUBMEDQA_OPTIONS),
        answer,
        id=row.get("id", row.get("pubid")),
        explanation=row.get("LONG_ANSWER", row.get("long_answer")),
        context=_pubmedqa_context(row, pubmedqa_setting, where),
    )


def _from_seed(row: Row, where: Where, **_: Any) -> Row:
    _require(row, ["question", "options"], "seed", where)
    options = _options(row["options"], where)
    return _row(
        row["question"],
        options,
        _gold(row.get("answer"), options, where),
        id=row.get("id"),
        subject=row.get("subject"),
        explanation=row.get("explanation"),
        context=row.get("context"),
    )


class Format(NamedTuple):
    keys: tuple[str, ...]  # the keys that identify the format in "auto" mode, its gold answer's last
    convert: Callable[..., Row]

    @property
    def gold(self) -> str:
        return self.keys[-1]


# Order matters in "auto": medqa rows also carry seed's keys (question, options, answer).
CONVERTERS: dict[str, Format] = {
    "medqa": Format(("question", "options", "answer_idx"), _from_medqa),
    "medqa_hf": Format(("sent1", "ending0", "label"), _from_medqa_hf),
    "medmcqa": Format(("question", "opa", "cop"), _from_medmcqa),
    "mmlu": Format(("question", "A", "B", "answer"), _from_mmlu),
    "pubmedqa": Format(("QUESTION", "final_decision"), _from_pubmedqa),
    "seed": Format(("question", "options", "answer"), _from_seed),
}
FORMATS = tuple(CONVERTERS)
# Hub layouts that share a format's converter but not its identifying keys.
_ALIASES = [
    (("question", "choices", "answer"), "mmlu"),
    (("question", "final_decision"), "pubmedqa"),
]


def detect_format(row: Row, where: Where) -> str:
    present = {k for k, v in row.items() if v is not None}
    for name, fmt in CONVERTERS.items():
        if present.issuperset(fmt.keys):
            return name
    for keys, name in _ALIASES:
        if present.issuperset(keys):
            return name
    layouts = [*((name, f.keys) for name, f in CONVERTERS.items()), *((name, keys) for keys, name in _ALIASES)]
    # What the row is nearest to: a format's key written but empty (null), or written with spaces
    # around it (a CSV header 'question, A, B'): said as that, not as no format at all.
    empty = next(([k for k in keys if k not in present] for _, keys in layouts if set(keys) <= set(row)), None)
    if empty:
        raise _null(where, empty)
    spaced = {k.strip(): k for k in present if isinstance(k, str) and k != k.strip()}
    if spaced and any(set(keys) <= present | set(spaced) for _, keys in layouts):
        header = f"{where.source} line 1" if where.source.lower().endswith(".csv") and where.header else where
        named = ", ".join(repr(k) for k in sorted(spaced.values()))
        raise UserError(
            f"{header}: the column names {named} begin or end with spaces, so no MCQ format's keys are found; "
            "write them without the spaces (a CSV header 'question,A,B,C,D,answer' has none after its commas)"
        )
    accepted = "; ".join(f"{name} ({', '.join(f.keys)})" for name, f in CONVERTERS.items())
    raise UserError(
        f"{where}: keys {sorted(present)} fit no MCQ format; accepted formats: {accepted}; "
        "write the rows in one of them"
    )


def medmcqa_one_based(raw: Dataset, source: str) -> bool:
    """MedMCQA's Hub release numbers `cop` 0-3, the original JSON 1-4, per whole dataset.

    The dataset is 1-based when any row has cop 4, 0-based when any has cop 0; -1, missing values
    (unanswered test rows) and letters take no part. Numbers that are all 1-3 read both ways (a
    few rows, or a subset with no answer A or D), so they are refused rather than guessed.
    """
    cops = {int(c) for c in list(raw["cop"]) if c is not None and str(c).strip().isdigit()}
    if cops and cops <= {1, 2, 3}:
        raise UserError(
            f"{source}: every numbered 'cop' is 1, 2 or 3, which MedMCQA's Hub release (0-3) reads as B-D and its "
            "original JSON (1-4) as A-C, and no row's 0 or 4 tells which; write each cop as its answer's letter "
            "(A-D), which reads one way"
        )
    return 4 in cops
