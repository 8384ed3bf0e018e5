"""N-gram overlap between training documents and evaluation sets (benchmark contamination).

Text is normalised (lowercase, punctuation and single letters stripped, whitespace collapsed: words
are runs of letters and digits in any script, one letter alone left out as an option's label) and cut into n-grams of `n` words, 13 by default as in the
GPT-3 and lm-evaluation-harness decontamination. A training document is contaminated when one
of its n-grams appears in an evaluation item; an evaluation item is contaminated when one of
its n-grams appears in the training data. Multiple-choice items are checked on their question
and options (medrecipes.usmle.load_mcq reads MedQA, MedMCQA, PubMedQA, MMLU and local files).
Items shorter than `n` words cannot be checked and are counted as such.

Speed: every word becomes a 64-bit hash once (a dictionary per scan), the n-gram hashes of a
whole batch of documents come from numpy arithmetic on those, and membership is a binary
search in the sorted hashes of the evaluation sets, so no Python loop runs per n-gram.
"""

import logging
import os
import re
from collections.abc import Iterable, Iterator
from itertools import chain

import numpy as np
import xxhash

from medrecipes.data.rows import files_of
from medrecipes.data.sources import PREFERENCE_FIELDS, MissingColumn, load_documents, load_mcq_source, load_source
from medrecipes.data_config import SourceConfig
from medrecipes.errors import UserError, bad_lines_named
from medrecipes.locations import BUILDERS

DEFAULT_N = 13
NORMALISATION = "lowercase, punctuation and single letters stripped, whitespace collapsed"
BATCH_DOCUMENTS = 2000
# Multiplier of the polynomial n-gram hash; odd, so no information is lost modulo 2**64.
_MULTIPLIER = np.uint64(0x100000001B3)
_WORD = re.compile(r"[^\W_]{2,}|\d")  # a run of letters and digits; of one character, a digit only


def words(text: str) -> list[str]:
    """The normalised words of a text. A word of one letter is left out: an option's label ("A.",
    "(B)") where a copy of a benchmark letters its options and the item does not, which otherwise
    breaks every n-gram across two options (a question shorter than n words was never found), or
    adds a word to a stock phrase where both letter them. Digits stay: "grade 3" is not "grade 4"."""
    return _WORD.findall(text.lower())


class _WordHashes(dict):
    """Word -> 64-bit hash, computed once per distinct word."""

    def __missing__(self, word: str) -> int:
        value = self[word] = xxhash.xxh64_intdigest(word.encode())
        return value


def ngram_hashes(texts: list[str], n: int, word_hashes: _WordHashes) -> tuple[np.ndarray, np.ndarray]:
    """(hash of every n-gram of every text, index of the text it is in), as numpy arrays."""
    per_text = [words(text) for text in texts]
    lengths = np.fromiter(map(len, per_text), dtype=np.int64, count=len(per_text))
    flat = np.fromiter(map(word_hashes.__getitem__, chain.from_iterable(per_text)), dtype=np.uint64)
    count = len(flat) - n + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    grams = np.zeros(count, dtype=np.uint64)
    for j in range(n):  # h = sum of word[i + j] * M**(n - 1 - j), wrapping modulo 2**64
        grams = grams * _MULTIPLIER + flat[j : j + count]
    text_of_word = np.repeat(np.arange(len(texts)), lengths)
    within = text_of_word[:count] == text_of_word[n - 1 :]  # the n-gram does not cross into the next text
    return grams[within], text_of_word[:count][within]


class EvalIndex:
    """The n-grams of named evaluation sets, sorted, each with a bit per set it occurs in."""

    def __init__(self, benchmarks: dict[str, list[str]], n: int = DEFAULT_N, ids: dict[str, list[str]] | None = None):
        if len(benchmarks) > 64:
            raise UserError(
                f"decontaminate: at most 64 evaluation sets at once, got {len(benchmarks)}; run it in parts"
            )
        self.n, self.names, self.word_hashes = n, list(benchmarks), _WordHashes()
        self.rows = {name: len(texts) for name, texts in benchmarks.items()}
        self.ids = ids or {name: [str(i) for i in range(len(texts))] for name, texts in benchmarks.items()}
        self.grams, self.row_of = {}, {}
        for name, texts in benchmarks.items():
            self.grams[name], self.row_of[name] = ngram_hashes(texts, n, self.word_hashes)
        self.too_short = {name: self.rows[name] - len(np.unique(self.row_of[name])) for name in self.names}
        hashes = np.concatenate([self.grams[name] for name in self.names] + [np.empty(0, dtype=np.uint64)])
        bits = np.concatenate(
            [np.full(len(self.grams[name]), 1 << b, dtype=np.uint64) for b, name in enumerate(self.names)]
            + [np.empty(0, dtype=np.uint64)]
        )
        order = np.argsort(hashes, kind="stable")
        hashes, bits = hashes[order], bits[order]
        self.hashes, first = np.unique(hashes, return_index=True)
        self.bits = np.bitwise_or.reduceat(bits, first) if len(bits) else bits

    @classmethod
    def of(cls, benchmarks: dict[str, tuple[list[str], list[str]]], n: int = DEFAULT_N) -> "EvalIndex":
        """The index of {name: (texts, item ids)}."""
        return cls({k: v[0] for k, v in benchmarks.items()}, n, {k: v[1] for k, v in benchmarks.items()})

    def lookup(self, grams: np.ndarray) -> np.ndarray:
        """Per n-gram: the bits of the sets it occurs in (0 where none)."""
        if not len(self.hashes):
            return np.zeros(len(grams), dtype=np.uint64)
        at = np.minimum(np.searchsorted(self.hashes, grams), len(self.hashes) - 1)
        return np.where(self.hashes[at] == grams, self.bits[at], np.uint64(0))


class SourceScan:
    """The contaminated documents of one training source, and the n-grams that matched."""

    def __init__(self, index: EvalIndex):
        self.index, self.documents, self.matched = index, 0, []
        self.contaminated: dict[int, int] = {}  # document number -> bits of the sets it overlaps

    def add(self, texts: list[str]) -> None:
        grams, text = ngram_hashes(texts, self.index.n, self.index.word_hashes)
        bits = self.index.lookup(grams)
        hit = bits != 0
        if hit.any():
            self.matched.append(grams[hit])
            for document, mask in zip(text[hit] + self.documents, bits[hit], strict=True):
                self.contaminated[int(document)] = self.contaminated.get(int(document), 0) | int(mask)
        self.documents += len(texts)

    def report(self) -> dict:
        by_benchmark = {
            name: sum(1 for mask in self.contaminated.values() if mask >> b & 1)
            for b, name in enumerate(self.index.names)
        }
        return {"documents": self.documents, "contaminated": len(self.contaminated), "by_benchmark": by_benchmark}


def text_batches(documents, limit: int | None = None, batch_size: int = BATCH_DOCUMENTS) -> Iterator[list[str]]:
    """Batches of the `text` column of a Dataset or IterableDataset, at most `limit` documents."""
    seen = 0
    for batch in documents.iter(batch_size=batch_size):
        texts = list(batch["text"])
        if limit is not None:
            texts = texts[: limit - seen]
        seen += len(texts)
        if texts:
            yield texts
        if limit is not None and seen >= limit:
            return


def decontaminate(sources: dict[str, Iterable[list[str]]], index: EvalIndex) -> tuple[dict, dict[str, list[int]]]:
    """(report, {source: contaminated document numbers}) for batches of training texts per source."""
    scans = {}
    for name, batches in sources.items():
        scans[name] = SourceScan(index)
        for texts in batches:
            scans[name].add(texts)
    matched = np.unique(np.concatenate([g for s in scans.values() for g in s.matched] + [np.empty(0, np.uint64)]))
    benchmarks = {}
    for name in index.names:
        rows = np.unique(index.row_of[name][np.isin(index.grams[name], matched)])
        benchmarks[name] = {
            "rows": index.rows[name],
            "too_short": index.too_short[name],
            "contaminated_rows": len(rows),
            "examples": [index.ids[name][r] for r in rows[:10]],
        }
    report = {
        "n": index.n,
        "normalisation": NORMALISATION,
        "benchmarks": benchmarks,
        "sources": {name: scan.report() for name, scan in scans.items()},
        "contaminated_documents": sum(len(s.contaminated) for s in scans.values()),
    }
    return report, {name: sorted(scan.contaminated) for name, scan in scans.items()}


def format_report(report: dict) -> str:
    """The report as lines for a terminal."""
    lines = [f"{report['n']}-word overlap ({report['normalisation']})", "evaluation sets:"]
    for name, b in report["benchmarks"].items():
        short = f", {b['too_short']} too short to check" if b["too_short"] else ""
        lines.append(f"  {name}: {b['contaminated_rows']} of {b['rows']} items found in training data{short}")
    lines.append("training sources:")
    for name, s in report["sources"].items():
        hits = ", ".join(f"{b}: {c}" for b, c in s["by_benchmark"].items() if c)
        lines.append(
            f"  {name}: {s['contaminated']} of {s['documents']} documents overlap" + (f" ({hits})" if hits else "")
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# What is checked: evaluation items and training sources, as texts


def mcq_texts(rows) -> tuple[list[str], list[str]]:
    """(question and options of each multiple-choice row, row ids)."""
    texts = [row["question"] + "\n" + "\n".join(row["options"]) for row in rows]
    return texts, [row["id"] or str(i) for i, row in enumerate(rows)]


def eval_set_texts(source: SourceConfig) -> tuple[list[str], list[str]]:
    """The texts of a recipe's eval set: question and options for `format: usmle`, the prompts of
    pairs or unpaired answers, else the documents as training reads them (a conversation's turns)."""
    if source.format == "usmle":
        return mcq_texts(load_mcq_source(source))
    texts = _questions(source) if source.format in PREFERENCE_FIELDS else list(training_documents(source)["text"])
    return texts, [str(i) for i in range(len(texts))]


def benchmark_texts(path: str) -> tuple[list[str], list[str]]:
    """The texts of a benchmark file or folder: MCQ rows when load_mcq reads it, else a `text` column
    or the questions of TRL's layouts; a folder of both (questions and their passages), file by file."""
    from medrecipes.usmle import load_mcq

    try:
        return mcq_texts(load_mcq(path))
    except UserError:
        pass
    if os.path.isdir(path):
        files = sorted(
            os.path.join(d, n) for d, _, names in os.walk(path) for n in names if n.endswith(tuple(BUILDERS))
        )
        if not files:
            raise UserError(f"{path}: a folder with no {', '.join(BUILDERS)} files; give a benchmark's files")
        texts, ids = [], []
        for file in files:
            read, named = benchmark_texts(file)
            texts += read
            ids += [f"{os.path.relpath(file, path)}:{item}" for item in named]
        return texts, ids
    source = training_file_source(path)  # text, or TRL's layouts by their columns
    if source.format == "usmle":  # load_mcq did not read it: no layout fits
        raise UserError(
            f"{path}: neither multiple-choice questions, documents with a 'text' column, conversations nor "
            "preference pairs; give a benchmark's questions, or its text as JSON Lines with a 'text' key"
        )
    return eval_set_texts(source)


def benchmark_name(path: str) -> str:
    return os.path.splitext(os.path.basename(path.rstrip("/")))[0]


Benchmarks = dict[str, tuple[list[str], list[str]]]  # name -> (texts, item ids)


def recipe_benchmarks(recipe) -> Benchmarks:
    """A recipe's eval sets and its `decontaminate_against` files."""
    benchmarks = {name: eval_set_texts(source) for name, source in recipe.eval_sources.items()}
    try:
        benchmarks.update(file_benchmarks(recipe.decontaminate_against or []))
    except UserError as err:  # a file's own line, with the key that named it
        raise UserError(
            f"decontaminate_against: {err} (it takes benchmark files of questions, or Hub dataset ids)"
        ) from None
    return benchmarks


def file_benchmarks(paths: list[str]) -> Benchmarks:
    benchmarks = {}
    for path in paths:
        name = benchmark_name(path)
        if name in benchmarks:  # test.jsonl of two benchmarks: name them by folder too
            name = f"{benchmark_name(os.path.dirname(path.rstrip('/')))}/{name}"
        benchmarks[name] = benchmark_texts(path)
    return benchmarks


def training_file_source(path: str) -> SourceConfig:
    """A training file as a source: its `text` column; else TRL's layouts a recipe reads (preference
    pairs, unpaired answers, conversations) by their columns; else its multiple-choice rows."""
    source = SourceConfig(path=path)
    try:
        load_source(source)
    except MissingColumn:
        columns = set(load_documents(source, streaming=False).column_names)
        layouts = [*PREFERENCE_FIELDS.items(), ("chat", ["messages"]), ("chat", ["prompt", "completion"])]
        fitting = next((layout for layout, fields in layouts if columns.issuperset(fields)), "usmle")
        return SourceConfig(path=path, format=fitting)
    return source


def check_sources(
    sources: dict[str, SourceConfig],
    benchmarks: Benchmarks,
    n: int = DEFAULT_N,
    streaming: bool = False,
    limits: dict[str, int] | None = None,
) -> tuple[dict, dict[str, list[int]]]:
    """(report, contaminated document numbers per source) for training sources against benchmarks;
    `limits` checks only the first documents of a source (those a stream used)."""
    index = EvalIndex.of(benchmarks, n)
    with bad_lines_named(files_of(sources.values())):
        batches = {
            name: text_batches(training_documents(source, streaming), (limits or {}).get(name))
            for name, source in sources.items()
        }
        return decontaminate(batches, index)  # a stream is parsed here, as it is read


def _turns_text(value) -> str:
    """A field of TRL's layouts as text: a string, or a conversation's turns' contents, one a line.
    A system turn is left out: the same words before every question of a file (and of the file its
    test questions were made with), they would make every question match its neighbours."""
    if isinstance(value, list):
        turns = [m for m in value if not (isinstance(m, dict) and m.get("role") == "system")]
        return "\n".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in turns)
    return str(value)


def training_documents(source: SourceConfig, streaming: bool = False):
    """A training source as documents with a `text` column, as the recipes train on them."""
    documents = load_source(source, streaming)
    # Conversations, pairs and unpaired answers are trained on as their fields' text (a prompt, its
    # answers); that is what must not hold test items. A KTO label is no text.
    fields = {"chat": ["messages"], **PREFERENCE_FIELDS}.get(source.format)
    if fields is None:
        return documents
    if source.format == "chat" and "messages" not in (documents.column_names or ["messages"]):
        fields = ["prompt", "completion"]
    fields = [f for f in fields if f != "label"]
    return documents.map(lambda row: {"text": "\n".join(_turns_text(row[f]) for f in fields)})


def _questions(source: SourceConfig):
    """An eval set of pairs or unpaired answers as its questions: the prompts, each once (a question
    is paired with each wrong option), without the answers."""
    prompts = dict.fromkeys(_turns_text(p) for p in load_source(source)["prompt"])
    return list(prompts)


KEPT_FORMATS = (".jsonl", ".json", ".parquet", ".csv")  # what write_kept writes


def write_kept(
    source: SourceConfig, contaminated: list[int], out: str, ext: str | None = None, named: str | None = None
) -> int:
    """Write the rows of `source` that are not contaminated to `out`, as its extension or `ext`
    says (.jsonl, .json, .parquet or .csv); `named`, the path the user gave, where `out` stages it.

    Text sources keep all their columns; multiple-choice sources are written in the normalised
    schema of medrecipes.usmle, which load_mcq reads back (PubMedQA's with the context its setting
    gave them, said). Returns the number of rows written.
    """
    if source.format == "usmle":
        rows = load_mcq_source(source)
    else:
        rows = load_documents(source, streaming=False)
    drop = set(contaminated)
    kept = rows.select([i for i in range(len(rows)) if i not in drop])
    ext = (ext or os.path.splitext(out)[1]).lower()
    if ext in (".jsonl", ".json"):
        kept.to_json(out, lines=True, force_ascii=False)
    elif ext == ".parquet":
        kept.to_parquet(out)
    elif ext == ".csv":
        kept.to_csv(out, index=False)
    else:
        raise UserError(f"--drop {out}: unsupported file type '{ext}'; use {', '.join(KEPT_FORMATS)}")
    if source.format == "usmle" and any(kept["context"]):  # PubMedQA's: its setting chose the context
        logging.getLogger(__name__).warning(
            "--drop %s: the kept questions are written in medrecipes' own layout, each with the context its "
            "pubmedqa_setting gave it (%s: %s), so a later pubmedqa_setting does not apply to them; decontaminate "
            "with the pubmedqa_setting the file is to be asked in",
            named or out, source.pubmedqa_setting or "reasoning_required",
            "the abstract" if (source.pubmedqa_setting or "reasoning_required") == "reasoning_required" else "its text",
        )  # fmt: skip
    return len(kept)
