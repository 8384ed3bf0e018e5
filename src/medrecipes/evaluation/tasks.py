"""The benchmarks that `medrecipes eval` and the training-time evaluation know, in one registry.

Each task says where its questions come from (a Hub id, or a path under a local data folder
laid out like ../shared/data) and how lm-evaluation-harness 0.4 prompts it for log-likelihood
scoring: the text of its `doc_to_text`, the answer strings of its `doc_to_choice` (scored
after one space), MMLU's description line, and few-shot examples taken in order from the
few-shot split (lm-eval's `first_n` sampler, which its MMLU tasks use). A name that is not in
the registry but comes with its own questions (`--data NAME=FILE`, or a recipe's
`format: usmle` eval set) is prompted like MedQA.
"""

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from medrecipes.data.sources import load_mcq_source
from medrecipes.errors import UserError, row_in_files
from medrecipes.locations import BUILDERS, absent, looks_local
from medrecipes.usmle import (
    LETTERS,
    Row,
    completion_prompt,
    letters_for,
    load_mcq,
    options_block,
    question_key,
    scored_split,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Wording:
    """How the command that loads a task names, in a fix it is told, a file of questions for a task
    (`data`, with {name}), questions under a name of their own (`own`, with {source}), the folder of
    benchmarks (`data_dir`) and few-shot examples (`fewshot`): a line names the command's own options."""

    data: str = "--data {name}=FILE"
    own: str = "--tasks NAME --data NAME={source}"
    data_dir: str = "--data_dir"
    fewshot: str = "--fewshot_data {name}=FILE or --num_fewshot 0"
    limit: str = "--limit"


EVAL_WORDING = Wording()  # medrecipes eval's options
CALIBRATE_WORDING = Wording(
    data="--held-out FILE", own="--task NAME (a name of its own) with the file as --dev or --held-out",
    data_dir="--data-dir", fewshot="",
)  # fmt: skip
RECIPE_WORDING = Wording(
    data="an eval_sets entry of format usmle", own="an eval_sets entry of another name ({source}, format usmle)",
    data_dir="eval_tasks_data_dir", fewshot="", limit="eval_tasks_limit",
)  # fmt: skip

MMLU_MEDICAL = (
    "anatomy",
    "clinical_knowledge",
    "college_biology",
    "college_medicine",
    "medical_genetics",
    "professional_medicine",
)


def _medmcqa_prompt(row: Row) -> str:
    return f"Question: {row['question']}\nChoices:\n{options_block(row)}\nAnswer:"


def _pubmedqa_prompt(row: Row) -> str:
    return f"Abstract: {row['context']}\nQuestion: {row['question']}\nAnswer:"


def _pubmedqa_free_prompt(row: Row) -> str:
    # The reasoning-free context names its parts itself ("Conclusion: ...", "Abstract: ...\nConclusion: ...").
    return f"{row['context']}\nQuestion: {row['question']}\nAnswer:"


def _mmlu_prompt(row: Row) -> str:
    return f"{row['question']}\n{options_block(row)}\nAnswer:"


def _mmlu_description(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


@dataclass(frozen=True)
class Task:
    name: str
    reference: str  # the lm-evaluation-harness task whose prompt and scoring it reproduces
    prompt: Callable[[Row], str] = completion_prompt
    local: str | None = None  # a file, or an MMLU-style folder with dev/ val/ test/, under --data_dir
    hub: str | None = None
    hub_configs: tuple[str | None, ...] = (None,)
    split: str = "test"  # the Hub split, or the MMLU-style folder, of the questions
    fewshot_split: str | None = None  # where few-shot examples come from, in the same source
    score_option_text: bool = False  # PubMedQA scores " yes"/" no"/" maybe", not letters
    subjects: tuple[str, ...] = ()  # keep these subjects only; few-shot examples match the subject
    description: Callable[[str], str] | None = None
    options: int | None = None  # every question's option count, where the benchmark fixes it
    layouts: tuple[str, ...] = ()  # the row layouts (usmle's FORMATS) only this benchmark's files have

    def choices(self, row: Row) -> list[str]:
        """The strings whose log-likelihood is scored after the prompt (lm-eval's doc_to_choice)."""
        return list(row["options"]) if self.score_option_text else list(letters_for(row))

    def context(self, row: Row, shots: list[Row]) -> str:
        """The text before the answer: description, few-shot examples with their answers, the prompt."""
        description = self.description(row["subject"]) if self.description else ""
        examples = "".join(f"{self.prompt(s)} {self.choices(s)[LETTERS.index(s['answer'])]}\n\n" for s in shots)
        return description + examples + self.prompt(row)


TASKS = {
    task.name: task
    for task in [
        Task(
            "medqa_4opt",
            "medqa_4options",
            options=4,
            layouts=("medqa_hf",),
            local="medqa/medqa_us_4opt_test.jsonl",
            hub="GBaker/MedQA-USMLE-4-options-hf",
            fewshot_split="train",
        ),
        Task(
            "medqa_5opt",
            "medqa_4options with a fifth option E",
            options=5,
            layouts=("medqa_hf",),
            local="medqa/medqa_us_5opt_test.jsonl",
        ),
        Task(
            "medmcqa",
            "medmcqa",
            options=4,
            layouts=("medmcqa",),
            prompt=_medmcqa_prompt,
            local="medmcqa/dev.json",
            hub="openlifescienceai/medmcqa",
            split="validation",
            fewshot_split="train",
        ),
        Task(
            "pubmedqa",
            "pubmedqa",
            options=3,
            layouts=("pubmedqa",),
            prompt=_pubmedqa_prompt,
            local="pubmedqa/ori_pqal.json",
            hub="qiaojin/PubMedQA",
            hub_configs=("pqa_labeled",),
            split="train",
            score_option_text=True,
        ),
        Task(
            "mmlu_medical",
            "mmlu_anatomy, mmlu_clinical_knowledge, ... (the six medical MMLU subjects)",
            prompt=_mmlu_prompt,
            local="mmlu_medical",
            hub="cais/mmlu",
            hub_configs=MMLU_MEDICAL,
            fewshot_split="dev",
            subjects=MMLU_MEDICAL,
            description=_mmlu_description,
            options=4,
            layouts=("mmlu",),
        ),
    ]
}


def task_for(name: str) -> Task:
    """The registry task, or a MedQA-prompted task for a name that brings its own questions."""
    return TASKS.get(name) or Task(name, "medqa_4options")


@dataclass
class TaskData:
    """A task's questions in the normalised MCQ schema and the few-shot examples for each."""

    task: Task
    rows: list[Row]
    source: str
    fewshot: list[Row]
    pubmedqa_setting: str | None = None  # what PubMedQA's questions were asked about, for a PubMedQA task

    def shots(self, row: Row, k: int) -> list[Row]:
        pool = [r for r in self.fewshot if r["subject"] == row["subject"]] if self.task.subjects else self.fewshot
        return pool[:k]


def _source(task: Task, data: str | None, data_dir: str | None, wording: Wording) -> str:
    if data:
        return data
    file, folder = wording.data.format(name=task.name), wording.data_dir
    if data_dir and not Path(data_dir).is_dir():
        what = "a file, not a folder" if Path(data_dir).is_file() else absent(data_dir)
        raise UserError(
            f"{folder} {data_dir}: {what}; give the folder that holds the benchmarks, or a file with {file}"
        )
    if data_dir and task.local:
        path = Path(data_dir) / task.local
        if not path.exists():
            near = (
                sorted(p.name for p in path.parent.glob("*") if BUILDERS.get(p.suffix) not in (None, "text"))
                if path.parent.is_dir()
                else []
            )
            there = f" ({path.parent} holds {', '.join(near[:4])}{', ...' if len(near) > 4 else ''})" if near else ""
            raise UserError(
                f"{task.name}: no {path} under {folder} {data_dir}{there}; put the file there or pass {file}"
            )
        return str(path)
    if task.hub:
        return task.hub
    raise UserError(f"{task.name}: has no Hub copy; pass {folder} (with {task.local}) or {file}")


def _misfit(task: Task, source: str, wording: Wording) -> Callable[[str], str | None]:
    """Why rows of a layout are not a registry task's: the layout only another benchmark's files
    have (MMLU's header-less CSV given to medqa_4opt would be scored with MedQA's prompt and
    reported as MedQA). MedQA's JSON Lines layout fits every task: benchmark collections
    (medagents') write MedMCQA and MMLU in it too."""

    def misfit(layout: str) -> str | None:
        theirs = next((t.name for t in TASKS.values() if layout in t.layouts), None)
        if theirs is None or layout in task.layouts or task.name not in TASKS:  # a name of its own reads any
            return None
        return (
            f"its rows are laid out as {theirs}'s files are ({layout}), not as {task.name}'s; score them as questions "
            f"of their own ({wording.own.format(source=source)}), or as {theirs} (its files in {wording.data_dir})"
        )

    return misfit


def _load(task: Task, source: str, split: str | None, pubmedqa_setting: str | None, wording: Wording) -> list[Row]:
    subjects = list(task.subjects) or None
    # answered: a question without its gold answer is named by its line where it is read
    misfit = _misfit(task, source, wording)
    reading = {"subjects": subjects, "pubmedqa_setting": pubmedqa_setting, "answered": True, "misfit": misfit}
    if looks_local(source) or Path(source).exists():
        rows = load_mcq(source, split=scored_split(source, split), **{**reading, "subjects": None}).to_list()
        held = sorted({row["subject"] for row in rows})
        if subjects and (missing := [s for s in subjects if s not in held]):  # a task scores all of its own
            raise UserError(
                f"{source}: no questions of {task.name}'s subject(s) {', '.join(missing)} (it holds "
                f"{', '.join(held) or 'none named'}), and {task.name} scores its {len(subjects)} subjects; give the "
                f"questions of all of them, or score these under a name of their own "
                f"({wording.own.format(source=source)}), which takes the subjects they hold"
            )
        return [row for row in rows if not subjects or row["subject"] in subjects]
    configs = task.hub_configs if source == task.hub else (None,)
    try:
        return [row for config in configs for row in load_mcq(source, split=split, config=config, **reading)]
    except UserError as err:
        if source != task.hub or err.__cause__ is None:  # the rows' own problem, or a source the user named
            raise
        reason = (str(err.__cause__).strip() or type(err.__cause__).__name__).splitlines()[0]
        raise UserError(
            f"{task.name}: with no file or folder of its questions given, they come from the Hub ({task.hub}), which "
            f"cannot be loaded here ({reason}); pass {wording.data_dir} FOLDER (laid out as ../shared/data) or "
            f"{wording.data.format(name=task.name)}"
        ) from None


def takes_pubmedqa_setting(name: str) -> bool:
    """Whether `--pubmedqa_setting` reaches task `name`: PubMedQA's, and a task that brings its own
    questions (which must then be PubMedQA's)."""
    return name == "pubmedqa" or name not in TASKS


def _first_per_subject(rows: list[Row], limit: int | None, per_subject: bool) -> list[Row]:
    if limit is None:
        return rows
    if not per_subject:
        return rows[:limit]
    # lm-eval's --limit applies to each MMLU subject task on its own.
    seen: dict[str, int] = {}
    kept = []
    for row in rows:
        seen[row["subject"]] = seen.get(row["subject"], 0) + 1
        if seen[row["subject"]] <= limit:
            kept.append(row)
    return kept


def load_task(
    name: str,
    data: str | None = None,
    data_dir: str | None = None,
    limit: int | None = None,
    num_fewshot: int = 0,
    fewshot_data: str | None = None,
    pubmedqa_setting: str | None = None,
    wording: Wording = EVAL_WORDING,
) -> TaskData:
    """The questions of task `name`, from `data` (a file, folder or Hub id), else from
    `data_dir` (the ../shared/data layout), else from the Hub; the first `limit` of them (per
    subject for MMLU), and `num_fewshot` examples each from `fewshot_data` or the task's dev split.
    `pubmedqa_setting` (names.PUBMEDQA_SETTINGS) applies to the tasks `takes_pubmedqa_setting`
    names; the pubmedqa task in a reasoning-free setting is prompted with the conclusion it gives.
    `wording`: the loading command's names for what a fix asks of it."""
    task = task_for(name)
    if data is None and name not in TASKS:
        raise UserError(f"{name}: not a known task; pass its questions with {wording.data.format(name=name)}")
    setting = pubmedqa_setting if takes_pubmedqa_setting(name) else None
    if setting not in (None, "reasoning_required") and task.prompt is _pubmedqa_prompt:
        task = replace(
            task, prompt=_pubmedqa_free_prompt, reference=f"{task.reference}, the conclusion given ({setting})"
        )
    source = _source(task, data, data_dir, wording)
    loaded = _task_data(task, _load(task, source, task.split, setting, wording), source, limit, wording)
    if name == "pubmedqa" or setting:
        loaded.pubmedqa_setting = setting or "reasoning_required"
    if num_fewshot > 0:
        loaded.fewshot = _load(task, *_fewshot_source(task, source, fewshot_data, wording), setting, wording)
        # The same file by its path is refused when the arguments are read; a copy, by its questions.
        if fewshot_data and (
            shared := {question_key(r.get("context"), r["question"], r["options"]) for r in loaded.fewshot}
            & {question_key(r.get("context"), r["question"], r["options"]) for r in loaded.rows}
        ):
            raise UserError(
                f"{name}: {len(shared)} of the few-shot examples in {fewshot_data} are questions it scores "
                "(a copy of the scored file?), so a question can be shown solved before it is asked; give solved "
                "examples from another split (train or dev)"
            )
        short = next((r for r in loaded.rows if len(loaded.shots(r, num_fewshot)) < num_fewshot), None)
        if short is not None:
            raise UserError(
                f"{name}: fewer than {num_fewshot} few-shot examples"
                + (f" for subject '{short['subject']}'" if task.subjects else "")
                + f" in {fewshot_data or source}; lower --num_fewshot"
            )
        counts = sorted({len(r["options"]) for r in loaded.rows})
        if other := sorted({len(r["options"]) for r in loaded.fewshot} - set(counts)):
            logger.warning(
                "%s: few-shot examples in %s have %s options and the questions %s: the examples show answers "
                "among letters the questions do not have; give examples of the questions' kind",
                name, fewshot_data or source, " or ".join(map(str, other)), " or ".join(map(str, counts)),
            )  # fmt: skip
    return loaded


def _task_data(task: Task, rows: list[Row], source: str, limit: int | None, wording: Wording) -> TaskData:
    # A question of a JSON Lines file is named by its line (its rows are its records, in order); others by id.
    index = {id(r): i for i, r in enumerate(rows)} if str(source).lower().endswith(".jsonl") else {}
    most = max(Counter(r["subject"] for r in rows).values(), default=0) if task.subjects else len(rows)
    if limit is not None and rows and limit > most:
        logger.warning(
            "%s: %s %d is more than the %d questions%s in %s: all of them are scored",
            task.name, wording.limit, limit, most, " of its largest subject" if task.subjects else "", source,
        )  # fmt: skip
    rows = _first_per_subject(rows, limit, bool(task.subjects))
    if not rows:
        raise UserError(f"{task.name}: {source} holds no questions; check the file")
    other = [r for r in rows if task.options and len(r["options"]) != task.options]
    if other:
        where = {
            id(r): row_in_files([source], index[id(r)]).removeprefix(f"{source} ") for r in other if id(r) in index
        }
        named = ", ".join(f"{where.get(id(r), repr(r['id']))} has {len(r['options'])}" for r in other[:3])
        raise UserError(
            f"{task.name}: {len(other)} of the {len(rows)} questions in {source} have other than the {task.options} "
            f"options of {task.name} ({named}{', ...' if len(other) > 3 else ''}); fix them, or score them as "
            f"questions of their own ({wording.own.format(source=source)}) as they are"
        )
    missing = next((r for r in rows if not r["answer"]), None)
    if missing is not None:
        raise UserError(
            f"{task.name}: question '{missing['id']}' in {source} has no gold answer; use a labelled split"
        )
    return TaskData(task, rows, source, [])


def eval_set_task(name: str, source, limit: int | None = None, rows=None) -> TaskData:
    """A recipe's `format: usmle` eval set (a `SourceConfig`) as a MedQA-prompted task; `rows`,
    the set's questions when the data pipeline has loaded them already."""
    rows = load_mcq_source(source) if rows is None else rows
    return _task_data(task_for(name), list(rows), str(source.data_files or source.path), limit, RECIPE_WORDING)


def _fewshot_source(task: Task, source: str, fewshot_data: str | None, wording: Wording) -> tuple[str, str | None]:
    if fewshot_data:
        return fewshot_data, None
    # The few-shot split of the same Hub dataset or MMLU-style folder; never the test file itself.
    local = looks_local(source) or Path(source).exists()
    if task.fewshot_split and (not local or (Path(source) / task.fewshot_split).is_dir()):
        return source, task.fewshot_split
    raise UserError(f"{task.name}: {source} has no few-shot split; pass {wording.fewshot.format(name=task.name)}")
