"""The rows of a source that a recipe keeps: its seeded part (`part`), and of those the questions a
model's pass rate keeps (`pass_rate`; `medrecipes.pass_rates`)."""

import logging

import datasets

from medrecipes.data_config import PartConfig, SourceConfig
from medrecipes.errors import UserError
from medrecipes.pass_rates import kept_rows

logger = logging.getLogger(__name__)


# The column a part of each format is stratified by: a question's gold answer, an unpaired
# answer's label; pairs and documents have none.
PART_LABELS = {"usmle": "answer", "unpaired": "label"}


def chosen_rows(rows, source: SourceConfig, where: str, label: str | None = None, pass_rates: bool = True):
    """The rows of `source` (named `where` in messages) that its `part` and `pass_rate` keep (all
    of them without either)."""
    if source.part is not None:
        rows = take_part(rows, source.part, label, where)
    if source.pass_rate is not None and pass_rates:
        if "id" not in rows.column_names:
            raise UserError(
                f"{where}: pass_rate keeps rows by their question's id and these rows have no 'id' column "
                f"(columns: {', '.join(rows.column_names)}); `medrecipes pairs` writes one"
            )
        config = source.pass_rate
        rows = rows.select(kept_rows(rows["id"], config.file, config.above, config.below, where))
    return rows


def take_part(rows, part: PartConfig, label: str | None, where: str):
    """The part of `rows` that `part` names: `datasets`' seeded `train_test_split` into `share`
    and the rest, stratified by the column `label` (its classes in the same proportions in
    both parts) where there is one. The rows keep their order in the file."""
    keys = datasets.Dataset.from_dict({"row": list(range(len(rows)))})
    if label is not None:
        keys = keys.add_column("label", [str(value) for value in rows[label]]).class_encode_column("label")
    try:
        halves = keys.train_test_split(
            train_size=part.share, seed=part.seed, stratify_by_column="label" if label else None
        )
    except ValueError as err:
        raise UserError(
            f"{where}: part share {part.share:g} of its {len(rows)} rows cannot be drawn "
            f"({str(err).splitlines()[0]}); use a share that leaves rows of every {label or 'kind'} in both parts"
        ) from None
    chosen = sorted(halves["train" if part.take == "first" else "test"]["row"])
    logger.info(
        "%s: part %s of share %g (seed %d%s): %d of %d rows",
        where,
        part.take,
        part.share,
        part.seed,
        f", stratified by {label}" if label else "",
        len(chosen),
        len(rows),
    )
    return rows.select(chosen)
