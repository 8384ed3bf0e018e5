"""The recipe keys that describe data: one source (`SourceConfig`) and a weighted mixture of
sources (`MixtureConfig`).

A leaf: the recipe schema (`config`) fills these from a recipe's `dataset_mixture` and
`eval_sets`, and the data pipeline and the benchmark tasks (`data`, `eval_tasks`) read them,
so neither side imports the other to share them.
"""

from dataclasses import dataclass
from typing import Any, Literal, get_args

from medrecipes.names import PubMedQASetting

# What one document of a .txt file is, as `datasets`' text builder reads it (its `sample_by`):
# a line (its default), a paragraph (lines up to a blank line), or the whole file.
SampleBy = Literal["line", "paragraph", "document"]
SAMPLE_BY = get_args(SampleBy)


@dataclass
class PartConfig:
    """A seeded share of a source's rows: `take: first` keeps `share` of them, `take: rest` the
    others, so that two recipes naming the same share and seed with the two `take`s train on
    disjoint rows that together are the whole file (SFT on one part, GRPO or DPO on the other).
    Multiple-choice rows are split in the proportions of their gold answers (stratified), other
    rows in a seeded order; `datasets`' own `train_test_split` draws both."""

    share: float
    take: Literal["first", "rest"] = "first"
    seed: int = 42


@dataclass
class PassRateConfig:
    """The rows whose question a model answered right in a share of its samples above `above` and
    below `below`, as `medrecipes pass-rate` measured them into `file` (a row's `id` is its
    question's): questions a model always or never gets right give GRPO groups without a spread
    of reward, and DPO's on-policy pairs none at all. Rows without a measured pass rate are left
    out and counted."""

    file: str
    above: float | None = 0.0  # null: no lower bound (the questions never answered right are kept too)
    below: float | None = 1.0  # null: no upper bound (those always answered right are kept too)


@dataclass
class SourceConfig:
    """One data source: a Hub id, a `datasets` builder (json, parquet, text, csv) or a local path."""

    path: str
    name: str | None = None
    split: str = "train"
    data_files: str | list[str] | None = None
    data_dir: str | None = None
    revision: str | None = None
    text_field: str = "text"
    # .txt files: one document a line (unset, datasets' default), a paragraph or the whole file
    # (docs/data.md, "Plain text").
    sample_by: SampleBy | None = None
    # "text": a column of documents; "usmle": multiple-choice rows (MedQA, MedMCQA, MMLU, PubMedQA, ...)
    # rendered for the recipe (documents for CPT, chat turns for SFT); "chat": rows kept as they are
    # (messages, or prompt/completion), for SFT; "preference": prompt/chosen/rejected rows (TRL's
    # preference layout, plain text or conversational), for DPO and KTO; "unpaired":
    # prompt/completion/label rows (TRL's unpaired preference layout, label true for a
    # desirable answer), for KTO.
    format: Literal["text", "usmle", "chat", "preference", "unpaired"] = "text"
    weight: float = 1.0
    # format usmle, PubMedQA rows only: what the question is asked about, the abstract
    # (reasoning_required, PubMedQA's standard setting, also when unset), its conclusion
    # (reasoning_free) or both (reasoning_free_with_abstract).
    pubmedqa_setting: PubMedQASetting | None = None
    # format usmle, training sources only: every gold answer (letter) drawn as often as the
    # commonest one, the rows of the rarer answers repeated in a seeded order (the mixture's seed),
    # so that a model cannot lower its loss by learning the label counts (PubMedQA's "yes" is 55%
    # of its questions, "maybe" 11%). Each row is kept at least once.
    balance_answers: bool = False
    # A seeded share of the rows (see PartConfig): {share: 0.6, take: first} in one recipe and
    # {share: 0.6, take: rest} in the next give the two stages disjoint rows.
    part: PartConfig | None = None
    # Keep only the rows whose questions a model answers right in some of its samples and not all
    # (see PassRateConfig): {file: pass_rate.jsonl, above: 0, below: 1}.
    pass_rate: PassRateConfig | None = None
    # fsspec options for s3://, gs://, ... URLs in `path` or `data_files` (credentials, endpoint,
    # anon); passed to `datasets` as `storage_options`.
    storage_options: dict[str, Any] | None = None

    def locations(self) -> list[str]:
        """Its path and each of its data_files (one name or a list), as written."""
        files = (
            []
            if self.data_files is None
            else [self.data_files]
            if isinstance(self.data_files, str)
            else self.data_files
        )
        return [self.path, *files]


@dataclass
class MixtureConfig:
    """Weighted sources interleaved with a fixed seed; a weight may exceed its share (upsampling)."""

    sources: list[SourceConfig]
    seed: int = 42
    streaming: bool = False
    stopping_strategy: Literal["all_exhausted", "first_exhausted"] = "all_exhausted"
    # "documents": a weight is the share of documents drawn; "tokens": the share of training tokens
    # (converted with each source's measured mean document length, see data/mixture.py).
    weight_unit: Literal["documents", "tokens"] = "documents"
    # Streaming only: packed blocks held and shuffled together before training (0: stream order).
    shuffle_buffer: int = 1000
