"""The learning check's ablations (benchmarks/real_learning_gemma.py `--ablation`): each seed's SFT
trained again with one setting of its recipe switched, the validation accuracy of the two settings
on the same seeds (what chooses the recipe's), and their table; and the DPO runs' pairs compared
the same way."""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from checks.learning_recipes import DPO_RUNS, RECIPES
from checks.learning_report import eval_file, read, selected
from medrecipes.runs.record import read_record


def balance_of(recipe: dict) -> bool:
    """`balance_answers` of a recipe's (first) training source."""
    return bool(recipe["dataset_mixture"]["sources"][0].get("balance_answers", False))


def part_of(recipe: dict) -> dict | None:
    """The `part` of a recipe's (first) training source: None for every question."""
    return recipe["dataset_mixture"]["sources"][0].get("part")


def balance_set(on: bool) -> dict:
    """seeded_recipe's changes for balance_answers `on`: the key on, or taken out for off (off is its
    default, and a run's data fingerprint tells a default written out from a key left out: the run
    is then the recipe as it was without the key)."""
    return {"dataset_mixture_source": {"balance_answers": True if on else None}}


NO_RUN = object()  # what Ablation.used gives where a seed's run is not there


@dataclass(frozen=True)
class Ablation:
    """Each seed's SFT of stage `stage` (sft-free, sft-long) trained again with one setting switched
    from its recipe's, into <folder>-sS: the validation accuracy of the two settings on the same seeds
    is what chooses the recipe's. `setting` reads it from a recipe (the shipped one, or the one a run
    record keeps), `other` gives the switched value of the shipped one, and `changes` seeded_recipe's
    changes for a value."""

    stage: str
    key: str  # the recipe key, as the report names the arms
    folder: str
    setting: Callable[[dict], object]
    other: Callable[[object], object]
    changes: Callable[[object], dict]

    def arms(self) -> tuple[object, object]:
        """The recipe's setting as it ships, and the switched one."""
        shipped = self.setting(yaml.safe_load(Path(RECIPES[self.stage]).read_text()))
        return shipped, self.other(shipped)

    def switched(self, out: Path, seed: int) -> dict:
        """seeded_recipe's changes for seed `seed`'s switched run, in its own folder."""
        return {**self.changes(self.arms()[1]), "output_dir": str(out / f"{self.folder}-s{seed}")}

    def used(self, out: Path, folder: str, seed: int) -> object:
        """The setting a run trained with, from the recipe its run record keeps (NO_RUN: no run; a
        setting may itself be None, as the part of a run on every question is)."""
        record = read_record(str(out / f"{folder}-s{seed}"))
        return NO_RUN if record is None else self.setting(record["recipe"])


# Passes: validation kept the third of four passes in two seeds of three, so 3 is trained for a
# schedule of its own (its cosine decay ends there), at a quarter less time; 3 and 4 switch.
# long-balance: the long-answer SFT said "yes" to 139 of 150 dev questions (seed 1) unbalanced. A
# balanced pass is 500 rows, so the balanced arm trains one (500 rows where the recipe's 2 passes
# train 600; about 30 minutes a seed on 2 cores, where 2 balanced passes would take an hour).
ABLATIONS = {
    "balance": Ablation("sft-free", "balance_answers", "sft-free-flip", balance_of, lambda on: not on, balance_set),
    "passes": Ablation("sft-free", "num_train_epochs", "sft-free-passes", lambda recipe: recipe["num_train_epochs"],
                       lambda passes: 7 - passes, lambda passes: {"num_train_epochs": passes}),
    "long-balance": Ablation("sft-long", "balance_answers", "sft-long-flip", balance_of, lambda on: not on,
                             lambda on: {**balance_set(on), **({"num_train_epochs": 1} if on else {})}),
    # The SFT recipe on every training question, the part taken out: what the pipeline is compared with
    "parts": Ablation("sft-free", "part", "sft-all-free", part_of, lambda part: None,
                      lambda part: {"dataset_mixture_source": {"part": part}}),
}  # fmt: skip
SFT_ALL = ABLATIONS["parts"]
WHAT = {  # what each stage's ablation tables give
    "sft-free": "reasoning-free SFT: validation accuracy of the kept checkpoint",
    "sft-long": "reasoning-required long-answer SFT (balanced: one pass): validation accuracy of the kept checkpoint",
}


def switches(names: list[str], stage: str) -> list[Ablation]:
    """The ablations named that switch a setting of stage `stage`'s recipe."""
    return [ABLATIONS[name] for name in names if ABLATIONS[name].stage == stage]


def ablation(out: Path, seeds: list[int], name: str) -> dict:
    """The validation accuracy each seed's SFT kept in ablation `name`'s two arms (the recipe's
    setting first): what chooses the recipe's setting. Each run is put by the setting its run record
    names, so a folder trained before the recipe changed its setting is still read right. Its dev
    accuracy (`dev`) is beside it once evaluated (for the reasoning-free SFT only after every seed's
    runs have their validation figures; dev chooses nothing either way)."""
    switch = ABLATIONS[name]
    found = {f"{switch.key} {setting}".lower(): {} for setting in switch.arms()}
    for folder in (switch.stage, switch.folder):
        for s in seeds:
            kept, used = selected(out, folder, s), switch.used(out, folder, s)
            if kept and used is not NO_RUN:
                dev = read(eval_file(out, folder, "generate", s))
                found.setdefault(f"{switch.key} {used}".lower(), {})[str(s)] = {
                    **kept,
                    **({"dev": dev["accuracy"]} if dev else {}),
                }
    return found


def ablations(out: Path, seeds: list[int]) -> dict:
    """Each ablation with a switched run there, by name: its arms (`ablation`)."""
    return {
        name: ablation(out, seeds, name)
        for name, switch in ABLATIONS.items()
        if any((out / f"{switch.folder}-s{s}").is_dir() for s in seeds)
    }


def ablation_markdown(found: dict | None, what: str = WHAT["sft-free"]) -> str:
    """The ablation's table: each arm's validation accuracy by seed (with the kept step where the run
    chose one; "not run" where a seed's run is missing), and its mean over the seeds it ran."""
    if not found:
        return ""
    seeds = sorted({seed for runs in found.values() for seed in runs}, key=int)
    lines = ["", f"| {what} | " + " | ".join(f"seed {s}" for s in seeds) + " | mean of the seeds run |",
             "|---|" + "---:|" * (len(seeds) + 1)]  # fmt: skip
    for arm, runs in found.items():
        values = [runs[s]["validation"] for s in seeds if s in runs]
        cells = [
            f"{runs[s]['validation']:.1%}"
            + (f" (step {runs[s]['step']})" if "step" in runs[s] else "")
            + (f"; dev {runs[s]['dev']:.1%}" if "dev" in runs[s] else "")
            if s in runs
            else "not run"
            for s in seeds
        ]
        mean = f"{sum(values) / len(values):.1%}" if values else "none"
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(lines) + "\n"


def pair_sources(out: Path, seeds: list[int]) -> dict:
    """The validation accuracy of each seed's DPO runs (DPO_RUNS), its dev accuracy beside it once
    evaluated: what compares the pairs of the SFT model's own answers with gold ones."""
    found = {}
    for name, source, changes in DPO_RUNS:
        pairs_named = {"own": "the SFT model's own pairs", "gold": "gold pairs"}[source]
        arm = f"DPO on {pairs_named}" + (
            "".join(f", {key} {value:g}" for key, value in changes.items()) or " (recipe)"
        )
        for s in seeds:
            validation, dev = (read(eval_file(out, stage, "generate", s)) for stage in (f"{name}-validation", name))
            if validation:
                found.setdefault(arm, {})[str(s)] = {
                    "validation": validation["accuracy"],
                    **({"dev": dev["accuracy"]} if dev else {}),
                }
    return found
