"""Answer extraction measured on real replies: the project's extractor next to lm-eval's and
OpenAI simple-evals' multiple-choice regexes, on labels set by rules a reader can check.

Usage:

    python benchmarks/answer_extraction.py outputs/real-check/eval/*-generate.json \
        --questions outputs/real-check/data/medqa_held_out.jsonl

Each input is a `medrecipes eval --mode generate` result (its predictions keep every reply);
`--questions` is the file the replies answer, for each question's options. `make real-check`
runs it on the replies of all its generate evaluations.

The labels. A reader asks of each reply "which one option does it name as its answer?", and
the rules below answer the same way, most telling evidence first:

  1. Conclusions. A phrase that states the answer ("answer is", "Answer:", "final answer",
     "correct option is", "I choose", "X is correct") names what follows it (or, for "X is
     correct", what precedes it): a letter, "option X", or an option's text. All the
     conclusions of a reply together name its answer; two different options named is a reply
     that contradicts itself: no single option. A conclusion ending its line ("The correct
     answer is:") names what opens the next line, or, when the lines below list several
     options, all of them: no single option.
  2. Otherwise, a reply whose lines open with two or more letters as list items ("A. ...",
     "B) ...") lists the options: no single option. Else its first and last lines: a line that
     opens with a letter as a list item ("C. ...", "C) ...", "(C) ..."), is only a letter, or is
     only an option's text names that option. Both lines together name the answer, as in 1.
  3. Otherwise, a reply without any option letter or conclusion phrase that contains exactly
     one option's text names it.
  4. Otherwise, the reply names no single option.
In every rule, a letter followed by another option's text ("C. <the text of option A>") names
both options, and an option's text cut off by the token limit names the option whose text it
begins, when it is long enough (20 characters) to tell which.

These rules are written apart from the extractor (`medrecipes.usmle.extract_answer`) and read
a reply differently: by its conclusions and its first and last lines, where the extractor
reads tiers of patterns anywhere. Where the two disagree, the replies are written to
<out>/extraction-disagreements.jsonl for a person to read; they stay out of the committed
report, which names questions by id only (MedQA's text is not ours to publish).

The baselines, reimplemented from their published definitions to run on the same replies:
  - lm-eval strict-match: the first "The answer is (.*)." (lm-eval's gpqa/mmlu CoT tasks),
    scored by lm-eval's exact match ignoring case and punctuation against the letter;
  - lm-eval flexible-extract: the last "(X)"; else the last option text found in the reply
    (case and punctuation ignored); else the last ": X" (lm-eval's multi_choice_regex filter);
  - simple-evals: the first "Answer: X" (case-insensitive) after removing markdown bold and
    LaTeX wrappers (simple-evals' ANSWER_PATTERN_MULTICHOICE).
"""

import argparse
import json
import re
import sys
import unicodedata
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PREFIX = 20  # characters of an option's text that name it when the reply is cut off

# ---------------------------------------------------------------------------
# The labelling rules


def _plain(text: str) -> str:
    """Markdown emphasis and LaTeX wrappers off, so that "**C**" and "\\boxed{C}" read as "C"."""
    text = re.sub(r"\\(?:boxed|text|mathrm|mathbf)\{([^{}]*)\}", r"\1", text)
    return re.sub(r"[*_$]", "", text)


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def _named_by_text(words: str, options: dict[str, str], whole: bool) -> set[str]:
    """The option `words` spell: the whole text of one option (or, cut off, its start); with
    `whole` False, any option whose text appears in `words`."""
    said = _norm(words)
    if not said:
        return set()
    texts = {k: _norm(v) for k, v in options.items() if _norm(v)}
    if not whole:
        return {k for k, v in texts.items() if f" {v} " in f" {said} "}
    same = {k for k, v in texts.items() if v == said}
    if not same and len(said) >= PREFIX:
        same = {k for k, v in texts.items() if v.startswith(said)}
    return same if len(same) == 1 else set()


_ITEM = re.compile(r"^\s*(?:(?i:option|choice)\s+)?(?:\(([A-Za-z])\)|([A-Za-z])[.):](?=\s|$)|([A-Z])$|([a-z])$)")


# a letter at the start of a clause: "C", "(c)", "c.", "option C", "Choice (b)"
_LEAD = re.compile(r"^(?:(?i:option|choice)\s+)?(?:\(([A-Za-z])\)|([A-Z])(?=$|[\s.:),;])|([a-z])(?=$|[.:),;]))(.*)$")


def _named_at_start(clause: str, options: dict[str, str]) -> set[str]:
    """What a clause names at its start: a letter of the options (with what follows it, which
    may be another option's text), or an option's text."""
    clause = clause.strip().rstrip(".;,!")
    m = _LEAD.match(clause)
    letter = m and next(g for g in m.groups()[:3] if g).upper()
    if letter in options:
        rest = m.group(4)
        if re.match(r"\W*is\s+(?:not|incorrect|wrong|false)\b", rest, re.I):
            return set()  # "Answer A is incorrect because ..."
        return {letter} | _named_by_text(rest.lstrip(" .:),;-"), options, whole=True)
    return _named_by_text(clause, options, whole=True)


_CONCLUSION = re.compile(
    r"\b(?:final answer|correct answer|right answer|best answer|the answer|my answer|answer|correct option"
    r"|correct choice|best option|best choice)\b(?:\s+(?:is|would be|should be|will be)\b)?[ \t]*[:=\-\u2013\u2014]?[ \t]*"
    r"|\bi(?: would|'d)? (?:choose|pick|select|go with)\s+",
    re.I,
)
_IS_CORRECT = re.compile(
    r"(?:\b(?i:option|choice)\s+)?\(?\b([A-Z])\)?\s+(?i:is\s+(?:the\s+)?(?:correct|right|best))\b"
)


def label(reply: str, options: dict[str, str]) -> str | None:
    """The one option `reply` names as its answer by the rules above, or None."""
    text = _plain(reply or "")
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    named: set[str] = set()
    concluded = False
    for m in _CONCLUSION.finditer(text):
        concluded = True
        clause = text[m.end() :].split("\n")[0]
        if re.match(r"\s*(?:is\s+)?(?:not|incorrect|wrong)\b", clause, re.I):
            continue  # "answer A is not right", "the answer is not clear"
        if not clause.strip():  # "The answer is:" and what it is on the lines below
            block = text[m.end() :].strip("\n").split("\n\n")[0]
            listed = {x.upper() for x in re.findall(r"^\s*\(?([A-Za-z])[.):]", block, re.M)} & set(options)
            clause = block.split("\n")[0] if len(listed) < 2 else ""
            named |= listed if len(listed) > 1 else set()
        named |= _named_at_start(clause, options)
    named |= {m.group(1).upper() for m in _IS_CORRECT.finditer(text) if m.group(1).upper() in options}
    items = {m.group(1).upper() for m in re.finditer(r"^\s*\(?([A-Za-z])[.):]\s", text, re.M)} & set(options)
    if not named and len(items) > 1:
        return None  # the reply lists the options
    if not named:
        for line in {lines[0], lines[-1]}:
            m = _ITEM.match(line)
            letter = m and next(g for g in m.groups() if g).upper()
            if letter in options:
                named |= {letter} | _named_by_text(line[m.end() :], options, whole=True)
            else:
                named |= _named_by_text(line, options, whole=True)
    if not named and not concluded and not re.search(r"(?:^|[\s(])[A-D](?:[.):]|\s*$)", text):
        named = _named_by_text(text, options, whole=False)
    return named.pop() if len(named) == 1 else None


# ---------------------------------------------------------------------------
# The baselines

_PUNCT = {i: None for i in range(sys.maxunicode) if unicodedata.category(chr(i)).startswith("P")}


def _as_letter(extracted: str | None, letters: str) -> str | None:
    """lm-eval's exact_match with ignore_case and ignore_punctuation, against each letter."""
    if extracted is None:
        return None
    said = extracted.translate(_PUNCT).strip().upper()
    return said if said in letters else None


def lm_eval_strict(reply: str, options: dict[str, str]) -> str | None:
    found = re.findall(r"(?<=The answer is )(.*)(?=.)", reply)
    return _as_letter(found[0].strip() if found else None, "".join(options))


def lm_eval_flexible(reply: str, options: dict[str, str]) -> str | None:
    letters = "".join(options)
    found = re.findall(r"(\([A-Z]\))", reply)
    if found:
        return _as_letter(found[-1], letters)

    def ignore(s: str) -> str:
        return s.lower().translate(_PUNCT)

    texts = {ignore(v.strip()): k for k, v in options.items()}
    found = re.findall("|".join(re.escape(t) for t in texts), ignore(reply))
    if found and found[-1] in texts:
        return texts[found[-1]]
    found = re.findall(r":[\s]*(" + "|".join(letters) + ")", reply)
    return found[-1] if found else None


def simple_evals(reply: str, options: dict[str, str]) -> str | None:
    text = reply
    for wrapper in (
        "**",
        "$\\boxed{",
        "}$",
        "\\$",
        "$\\text{",
        "$",
        "\\mathrm{",
        "\\{",
        "\\text",
        "\\(",
        "\\mathbf{",
        "{",
        "\\boxed",
    ):
        text = text.replace(wrapper, "")
    m = re.search(r"(?i)Answer[ \t]*:[ \t]*\$?([A-D])\$?", text)
    return m.group(1) if m else None  # simple-evals compares as written: "c" is not "C"


def ours(reply: str, options: dict[str, str]) -> str | None:
    from medrecipes.usmle import extract_answer

    return extract_answer(reply, "".join(options), options)


EXTRACTORS = {
    "medrecipes": ours,
    "lm-eval strict-match": lm_eval_strict,
    "lm-eval flexible-extract": lm_eval_flexible,
    "simple-evals": simple_evals,
}

# ---------------------------------------------------------------------------
# The measure


def replies(results: list[Path], questions: Path) -> list[dict]:
    """Every reply of the given evaluations, with its question's options and gold letter."""
    from medrecipes.usmle import load_mcq, option_map

    rows = {str(row["id"]): row for row in load_mcq(str(questions))}
    found = []
    for path in results:
        task = next(iter(json.loads(path.read_text())["tasks"].values()))
        source = path.stem.removesuffix("-generate")
        for p in task["predictions"]:
            row = rows[str(p["id"])]
            found.append({
                "source": source, "id": str(p["id"]), "reply": p["completion"],
                "options": option_map(row), "gold": row["answer"],
            })  # fmt: skip
    return found


def score(items: list[dict], extractor) -> dict:
    """Agreement with the labels, split by the kind of disagreement."""
    counts = Counter()
    for item in items:
        said, truth = extractor(item["reply"], item["options"]), item["label"]
        counts["answered"] += said is not None
        counts["correct"] += said == item["gold"]
        if said == truth:
            counts["agree"] += 1
        elif truth is None:
            counts["letter where none is named"] += 1
        elif said is None:
            counts["missed"] += 1
        else:
            counts["other letter"] += 1
    n = len(items)
    return {
        "n": n,
        "agreement": counts["agree"] / n,
        "letter_where_none_is_named": counts["letter where none is named"],
        "other_letter": counts["other letter"],
        "missed": counts["missed"],
        "abstention": 1 - counts["answered"] / n,
        "accuracy_vs_gold": counts["correct"] / n,
    }


def markdown(report: dict) -> str:
    lines = [
        f"{report['n']} real replies ({', '.join(f'{k} {v}' for k, v in report['sources'].items())}); "
        f"labels: {report['labels']['named']} name one option, {report['labels']['none']} name none.",
        "",
        "| extractor | agrees with the label | a letter where none is named | another letter | missed | abstains | accuracy vs gold |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in report["extractors"].items():
        lines.append(
            f"| {name} | {s['agreement']:.1%} | {s['letter_where_none_is_named']} | {s['other_letter']} "
            f"| {s['missed']} | {s['abstention']:.1%} | {s['accuracy_vs_gold']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("evaluations", nargs="+", type=Path, help="`medrecipes eval --mode generate` result files")
    parser.add_argument("--questions", type=Path, required=True, help="the questions the replies answer")
    parser.add_argument("--out", type=Path, default=Path("outputs/real-check"), help="for the disagreements")
    parser.add_argument("--report-dir", type=Path, default=RESULTS, help="folder for the report (JSON and markdown)")
    args = parser.parse_args(argv)
    items = replies(args.evaluations, args.questions)
    for item in items:
        item["label"] = label(item["reply"], item["options"])
        item["medrecipes"] = ours(item["reply"], item["options"])
    report = {
        "n": len(items),
        "sources": dict(Counter(item["source"] for item in items)),
        "labels": {
            "named": sum(item["label"] is not None for item in items),
            "none": sum(item["label"] is None for item in items),
        },
        "extractors": {name: score(items, fn) for name, fn in EXTRACTORS.items()},
    }
    keep = ("source", "id", "label", "medrecipes", "reply")
    differ = [{k: i[k] for k in keep} for i in items if i["medrecipes"] != i["label"]]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "extraction-disagreements.jsonl").write_text("".join(json.dumps(d) + "\n" for d in differ))
    args.report_dir.mkdir(parents=True, exist_ok=True)
    (args.report_dir / "answer_extraction.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.report_dir / "answer_extraction.md").write_text(markdown(report))
    print(markdown(report))
    print(
        f"{len(differ)} replies where medrecipes and the labels differ: {args.out / 'extraction-disagreements.jsonl'}"
    )
    return report


if __name__ == "__main__":
    main()
