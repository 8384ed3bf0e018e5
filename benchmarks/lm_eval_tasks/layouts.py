"""Map local benchmark files onto the Hub layouts that lm-evaluation-harness's tasks read.

Outer whitespace is stripped from questions and options, as `medrecipes.usmle.load_mcq` does
(9 of the 1,273 MedQA test questions and one MMLU option carry stray spaces), so that both
harnesses score exactly the same text.
"""

LETTERS = "ABCD"


def medqa_as_hub_layout(dataset):
    """MedQA JSONL (question, options {A..D}, answer_idx) -> GBaker/MedQA-USMLE-4-options-hf
    (sent1, ending0..3, label)."""

    def convert(doc):
        endings = {f"ending{i}": doc["options"][letter].strip() for i, letter in enumerate(LETTERS)}
        return {"sent1": doc["question"].strip(), **endings, "label": LETTERS.index(doc["answer_idx"])}

    return dataset.map(convert)


def mmlu_as_hub_layout(dataset):
    """MMLU CSV (question, A, B, C, D, answer) -> cais/mmlu's question and choices; the answer
    stays a letter, which `doc_to_target` finds among the choices "A".."D"."""

    def convert(doc):
        choices = [str(doc[letter]).strip() for letter in LETTERS]
        return {"question": str(doc["question"]), "choices": choices, "answer": doc["answer"].strip()}

    return dataset.map(convert, remove_columns=list(LETTERS))
