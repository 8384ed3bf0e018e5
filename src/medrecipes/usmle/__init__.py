"""One multiple-choice-question (MCQ) schema for SFT, GRPO, evaluation and pretraining data.

`load_mcq` reads MedQA, MedMCQA, MMLU, PubMedQA and the project's own seed files (local files,
directories or Hub ids) into a `datasets.Dataset` whose columns are exactly `COLUMNS`:

    id: str, question: str, options: list[str], answer: str | None (gold letter),
    subject: str, explanation: str, context: str

Option i carries the letter ``LETTERS[i]``. Options stay a list because Arrow cannot store dicts
whose keys vary from row to row (4- and 5-option MedQA). The prompt builders and
`extract_answer` are written together: every target `sft_target` produces is read back
by `extract_answer`, and `completion_prompt` matches lm-evaluation-harness `medqa_4options`.

The package: `schema` (the row's columns and letters), `loading` (`load_mcq` and the formats it
reads; `scored_split`, the split a task scores of a folder; `load_saved`, a folder save_to_disk wrote; `keyed_rows`, a JSON object of rows keyed by id; `document_rows`, a JSON document's rows held in
another shape), `prompts` (prompts and targets from a row) and `answers` (`extract_answer`); the
names below are its interface.
"""

from medrecipes.usmle.answers import extract_answer, is_abstention
from medrecipes.usmle.loading import FORMATS, document_rows, keyed_rows, load_mcq, load_saved, scored_split
from medrecipes.usmle.prompts import (
    chat_messages,
    completion_prompt,
    options_block,
    preference_pair,
    pretraining_text,
    sft_target,
)
from medrecipes.usmle.schema import COLUMNS, LETTERS, Row, letters_for, letters_of, option_map, question_key

__all__ = [
    "COLUMNS",
    "FORMATS",
    "LETTERS",
    "Row",
    "chat_messages",
    "document_rows",
    "keyed_rows",
    "completion_prompt",
    "extract_answer",
    "scored_split",
    "is_abstention",
    "letters_for",
    "letters_of",
    "load_mcq",
    "load_saved",
    "option_map",
    "options_block",
    "preference_pair",
    "pretraining_text",
    "question_key",
    "sft_target",
]
