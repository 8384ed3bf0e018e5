"""A model's pass rate on each question: the file `medrecipes pass-rate` writes (one JSON line a
question: its `id`, the share of sampled answers the recipe's correctness reward scored right,
and the fingerprint of the model that answered) and the recipe filter that reads it
(`data_config.PassRateConfig`).

A leaf: the recipe schema checks that a file was measured on the model a recipe starts from,
and the data pipeline keeps the rows whose questions lie in the range; neither imports the other.
The filter is open-r1's pass-rate filtering of RL prompts: a question every sample gets right (or
wrong) gives a GRPO group no spread of reward, so no gradient, and DPO's own pairs none.
"""

import json
import logging
import os
from collections import Counter

from medrecipes.errors import UserError

logger = logging.getLogger(__name__)

COLUMNS = ("id", "pass_rate", "right", "samples", "model", "model_fingerprint")


def read_pass_rates(path: str) -> tuple[dict[str, float], set]:
    """({question id: pass rate}, {the model fingerprints the file names}) of a pass-rate file;
    one line naming the file and line for a file that is not one."""
    if not os.path.isfile(path):
        raise UserError(
            f"pass_rate file {path}: no such file; measure it with `medrecipes pass-rate RECIPE --output {path}`"
        )
    rates, fingerprints = {}, set()
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rate, question = float(row["pass_rate"]), str(row["id"])
            except (ValueError, KeyError, TypeError) as err:
                what = f"no '{err.args[0]}'" if isinstance(err, KeyError) else "not a pass-rate row"
                raise UserError(
                    f"{path}:{number}: {what}; a pass-rate file is `medrecipes pass-rate`'s output "
                    f"(one JSON object a line with {', '.join(COLUMNS)})"
                ) from None
            if question in rates:
                raise UserError(f"{path}:{number}: question id {question!r} again; each question has one row")
            rates[question] = rate
            fingerprints.add(row.get("model_fingerprint"))
    if not rates:
        raise UserError(f"pass_rate file {path}: no rows; measure it with `medrecipes pass-rate RECIPE`")
    return rates, fingerprints


def check_measured_on(path: str, fingerprint: str | None, model: str) -> None:
    """The pass-rate file at `path` was measured on the weights whose fingerprint is `fingerprint`
    (those of `model`, the recipe's start), else one line saying whose it is and what to do."""
    _, measured = read_pass_rates(path)
    if fingerprint is None or measured == {fingerprint}:
        return
    raise UserError(
        f"{path} was measured on other weights ({', '.join(sorted(map(str, measured)))}) than "
        f"{model} ({fingerprint}), the model this recipe starts from; measure it again with "
        f"`medrecipes pass-rate RECIPE --output {path}`"
    )


def in_range(rate: float, above: float, below: float) -> bool:
    return above < rate < below


def kept_rows(ids: list, path: str, above: float | None, below: float | None, where: str) -> list[int]:
    """The indices of `ids` whose pass rate in the file at `path` lies above `above` and below
    `below` (None: no bound on that side), with how many were left out and why logged; one line
    where none is kept."""
    rates, _ = read_pass_rates(path)
    why = Counter()
    kept = []
    for index, question in enumerate(ids):
        rate = rates.get(str(question))
        if rate is None:
            why["not measured"] += 1
        elif above is not None and rate <= above:
            why[f"pass rate {above:g} or below"] += 1
        elif below is not None and rate >= below:
            why[f"pass rate {below:g} or above"] += 1
        else:
            kept.append(index)
    account = ", ".join(f"{n} {reason}" for reason, n in sorted(why.items())) or "none left out"
    if not kept:
        raise UserError(
            f"{where}: pass_rate keeps none of its {len(ids)} questions ({account}) from {path}; widen above/below, "
            "or measure the questions this source reads"
        )
    # Questions the file never measured are left out as well: a file of another source, or an older
    # copy of this one, drops them without a choice of the recipe's; said louder than the bounds' work.
    logger.log(
        logging.WARNING if why["not measured"] else logging.INFO,
        "%s: pass_rate above %s and below %s keeps %d of %d questions (%s)%s",
        where,
        "none" if above is None else f"{above:g}",
        "none" if below is None else f"{below:g}",
        len(kept),
        len(ids),
        account,
        f"; measure them too with `medrecipes pass-rate` to keep them ({path} holds no rate for them)"
        if why["not measured"]
        else "",
    )
    return kept


def range_counts(rates: list[float], ranges: list[tuple[float, float]]) -> dict[str, int]:
    """How many of `rates` each (above, below) range keeps: what `medrecipes pass-rate` prints."""
    return {f"above {a:g} and below {b:g}": sum(in_range(r, a, b) for r in rates) for a, b in ranges}
