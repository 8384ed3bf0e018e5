"""The arguments of `medrecipes eval` and recipes/evaluate.py, and their parse."""

import dataclasses
import os
import sys
from dataclasses import dataclass, field

from medrecipes.config.reading import RecipeParser, check_blank_text, check_choices, check_revision, split_names
from medrecipes.config.schema import world_size
from medrecipes.errors import UserError, did_you_mean
from medrecipes.names import DTYPES, MOST_SAMPLES, TASK_NAMES, EvalMode, PubMedQASetting, check_task_names
from medrecipes.outputs.claims import check_writable


@dataclass
class EvalArguments:
    """`medrecipes eval` and recipes/evaluate.py: which model, which benchmarks, how to score them."""

    model_name_or_path: str = field(metadata={"aliases": ["--model"], "help": "Hub id, local folder or .gguf file."})
    tasks: list[str] = field(
        default_factory=lambda: ["medqa_4opt"],
        metadata={"help": "Comma- or space-separated: medqa_4opt, medqa_5opt, medmcqa, pubmedqa, mmlu_medical."},
    )
    mode: EvalMode = field(default="loglik", metadata={"help": "loglik (as lm-evaluation-harness) or generate."})
    data: list[str] | None = field(
        default=None,
        metadata={"help": "TASK=PATH (file, folder or Hub id) for a task's questions; PATH alone with one task."},
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "Folder with the benchmark files laid out as in ../shared/data."}
    )
    limit: int | None = field(
        default=None, metadata={"help": "First N questions of each task (of each MMLU subject)."}
    )
    pubmedqa_setting: PubMedQASetting | None = field(
        default=None,
        metadata={
            "help": "pubmedqa: reasoning_required (the abstract; PubMedQA's standard score, the default), "
            "reasoning_free (its conclusion) or reasoning_free_with_abstract (both)."
        },
    )
    num_fewshot: int = field(default=0, metadata={"help": "Solved examples before each question (MMLU: dev split)."})
    fewshot_data: list[str] | None = field(
        default=None, metadata={"help": "TASK=PATH of few-shot examples for tasks without a dev split."}
    )
    batch_size: int = field(default=8, metadata={"help": "Sequences per forward pass."})
    max_length: int | None = field(
        default=None, metadata={"help": "Context length; longer inputs lose tokens on the left (default: model's)."}
    )
    model_revision: str | None = field(default=None, metadata={"help": "Hub revision of the model."})
    dtype: str = field(
        default="auto", metadata={"help": "auto (the checkpoint's), or the one to load in.", "choices": DTYPES}
    )
    device: str | None = field(default=None, metadata={"help": "cpu, cuda, cuda:1 (default: cuda when available)."})
    system_prompt: str | None = field(default=None, metadata={"help": "generate: system turn before each question."})
    chain_of_thought: bool = field(default=False, metadata={"help": "generate: reason, then 'Final Answer: X'."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "generate: 16, or 512 with chain of thought."})
    temperature: float = field(default=0.0, metadata={"help": "generate: 0 is greedy; above 0 samples."})
    top_p: float = field(default=1.0, metadata={"help": "generate: nucleus sampling when temperature > 0."})
    samples: int = field(
        default=1,
        metadata={
            "help": "generate: answers sampled per question; above 1 the answer is their majority and its "
            "confidence their agreement (needs temperature > 0)."
        },
    )
    seed: int = field(default=42, metadata={"help": "generate: seeds sampling when temperature > 0."})
    output: str | None = field(default=None, metadata={"help": "JSON file for the reports and every prediction."})
    overwrite: bool = field(default=False, metadata={"help": "Let `output` replace an existing file."})

    def __post_init__(self):
        for key in ("model_name_or_path", "data_dir", "output"):  # ~ is the home, as in a recipe's output_dir
            if isinstance(value := getattr(self, key), str) and value.startswith("~"):
                setattr(self, key, os.path.expanduser(value))
        self.tasks = split_names(self.tasks)
        if not self.tasks:  # an evaluation of nothing would write an empty result and exit 0
            raise UserError(f"tasks is empty; name at least one: {', '.join(TASK_NAMES)}")
        if twice := next((task for i, task in enumerate(self.tasks) if task in self.tasks[:i]), None):
            raise UserError(
                f"tasks: {twice} is named twice (a task is scored once, its result kept once); name it once"
            )
        self.data_by_task = _by_task(self.data, self.tasks, "--data")
        self.fewshot_by_task = _by_task(self.fewshot_data, self.tasks, "--fewshot_data")


def _by_task(entries: list[str] | None, tasks: list[str], flag: str) -> dict[str, str]:
    """{task: path} from TASK=PATH entries; a bare PATH belongs to the only task, also one whose
    name holds '=' (fold=1.jsonl): a task's name has no '/', and a path that exists is a path."""
    result = {}
    for entry in entries or []:
        if not entry.strip():
            raise UserError(f"{flag} is empty ({entry!r}); give {flag} PATH, or TASK=PATH")
        if entry.lstrip().startswith("{"):  # a YAML mapping, as eval_sets are written
            raise UserError(
                f"{flag} {entry}: a mapping, where {flag} takes TASK=PATH entries; write {flag} TASK=PATH ..."
            )
        name, sep, path = entry.partition("=")
        if not sep or "/" in name or os.path.exists(entry):
            if len(tasks) != 1:
                raise UserError(f"{flag} {entry}: name the task it is for, as {flag} TASK={entry}")
            name, path = tasks[0], entry
        if not name.strip() or not path.strip():
            raise UserError(
                f"{flag} {entry}: {'no task name before' if not name.strip() else 'no path after'} '='; give {flag} "
                "TASK=PATH"
            )
        if name in result and result[name] != path:  # one would be dropped without a word
            raise UserError(
                f"{flag}: task '{name}' is given twice ({result[name]} and {path}); give each task one {flag} entry"
            )
        result[name] = path
    return result


def _check_data_replaced(args: EvalArguments, parser: RecipeParser, where: str) -> None:
    """A task whose questions the recipe's `data` gave, left without them by a --data on the command
    line, which replaces the recipe's whole list (as every list key given there does)."""
    if "data" not in parser.on_command_line:
        return
    given = parser.recipe_data.get("data") or []
    entries = given.items() if isinstance(given, dict) else (str(e).partition("=")[::2] for e in given)
    recipe_names = {str(name).strip() for name, _ in entries}
    if lost := [t for t in args.tasks if t not in args.data_by_task and t in recipe_names and t not in TASK_NAMES]:
        raise UserError(
            f"{where}: task '{lost[0]}' has its questions in the recipe's data, which --data on the command line "
            f"replaces (a list given there replaces the recipe's whole list); give --data {lost[0]}=FILE too, or "
            "leave it out of tasks"
        )


def parse_eval_args(argv: list[str] | None = None) -> EvalArguments:
    """EvalArguments from the command line (and an optional positional YAML with the same keys)."""
    parser = RecipeParser([EvalArguments])
    (args,), path = parser.parse_recipe(argv)
    where = path or "command line"
    for note in parser.repeated:  # a key given twice: argparse keeps the last
        print(f"# note: {note}", file=sys.stderr)
    check_blank_text((args,), parser.given, where)
    if (processes := world_size()) > 1:  # each would score every question and write the one output
        raise UserError(
            f"{where}: an evaluation runs in one process, and this launch started {processes} (WORLD_SIZE); run it "
            "with python or medrecipes eval, not under accelerate launch or torchrun"
        )
    _check_data_replaced(args, parser, where)
    check_task_names(args.tasks, list(args.data_by_task), where, "give a name its own questions with --data NAME=FILE")
    # An entry for a task not run is fine (a YAML's data for several tasks, --tasks picking some),
    # unless its name is a misspelling of a task that runs without an entry of its own.
    for flag, by_task in (("data", args.data_by_task), ("fewshot_data", args.fewshot_by_task)):
        for name in by_task:
            hint = "" if name in args.tasks else did_you_mean(name, [t for t in args.tasks if t not in by_task])
            if hint:
                raise UserError(
                    f"{where}: {flag} names task '{name}', which is not in tasks{hint}; "
                    f"name the task as in tasks, or drop the {flag} entry"
                )
    check_choices(args, where)
    # The tasks it reaches: evaluation.tasks.takes_pubmedqa_setting, which this layer may not import.
    if args.pubmedqa_setting and all(name in TASK_NAMES and name != "pubmedqa" for name in args.tasks):
        raise UserError(
            f"{where}: pubmedqa_setting chooses what PubMedQA's questions are asked about, and tasks "
            f"{', '.join(args.tasks)} hold none; add pubmedqa to tasks, or leave pubmedqa_setting out"
        )
    if args.model_name_or_path:
        check_revision(args.model_name_or_path, args.model_revision, where)
    for key in ("limit", "batch_size", "max_new_tokens", "samples", "max_length"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            raise UserError(f"{where}: {key} must be at least 1, got {getattr(args, key)}")
    if args.samples > MOST_SAMPLES:
        raise UserError(
            f"{where}: samples {args.samples} is more than the {MOST_SAMPLES} a question that any vote needs (each "
            f"is a generated answer, held in memory); use {MOST_SAMPLES} or fewer"
        )
    if args.num_fewshot < 0:
        raise UserError(f"{where}: num_fewshot must be 0 or more, got {args.num_fewshot}")
    try:  # as the generator the evaluation seeds takes it
        import numpy as np

        np.random.RandomState(args.seed)
    except ValueError as err:
        raise UserError(
            f"{where}: seed {args.seed}: {err} (numpy's generator, which sampling is seeded with)"
        ) from None
    if args.fewshot_by_task and not args.num_fewshot:
        raise UserError(
            f"{where}: fewshot_data gives solved examples, and num_fewshot is 0, so none is shown; set num_fewshot, "
            "or leave fewshot_data out"
        )
    for task, shots in args.fewshot_by_task.items():
        scored = args.data_by_task.get(task)
        if scored and os.path.exists(shots) and os.path.exists(scored) and os.path.samefile(shots, scored):
            raise UserError(
                f"{where}: fewshot_data for {task} is the file it scores ({shots}), so a question can be shown solved "
                "before it is asked; give solved examples from another split (train or dev)"
            )
    if args.temperature < 0:
        raise UserError(f"{where}: temperature must be 0 (greedy) or more, got {args.temperature}")
    if args.samples > 1 and (args.mode != "generate" or args.temperature <= 0):
        raise UserError(
            f"{where}: samples {args.samples} draws several answers to each question: use mode generate with "
            "temperature above 0 (e.g. --mode generate --temperature 1.0), or samples 1"
        )
    if args.device:
        check_device(args.device, f"{where}: device")
    if not 0 < args.top_p <= 1:
        raise UserError(f"{where}: top_p must be above 0 and at most 1, got {args.top_p}")
    # The keys whose help says they shape generated answers do nothing when options are scored: said
    # (a YAML written for generate may be switched to loglik on the command line, as tiny_eval.yaml says).
    generating = [f for f in dataclasses.fields(args) if f.metadata.get("help", "").startswith("generate:")]
    args.notes = []
    if args.mode != "generate" and (given := [f.name for f in generating if getattr(args, f.name) != f.default]):
        args.notes.append(
            f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} generated answers, and mode {args.mode} scores "
            f"each option's likelihood, generating nothing: {'it does' if len(given) == 1 else 'they do'} nothing here"
        )
    # And those whose help says they shape sampling only (temperature above 0), under greedy decoding.
    sampling = [f for f in generating if "when temperature > 0" in f.metadata["help"]]
    if args.mode == "generate" and args.temperature == 0:
        if given := [f.name for f in sampling if getattr(args, f.name) != f.default]:
            args.notes.append(
                f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} sampled answers, and temperature 0 "
                f"answers greedily: {'it does' if len(given) == 1 else 'they do'} nothing here; set temperature "
                "above 0 to sample"
            )
    for flag, by_task in (("data", args.data_by_task), ("fewshot_data", args.fewshot_by_task)):
        if idle := [name for name in by_task if name not in args.tasks]:
            args.notes.append(
                f"{flag} for {', '.join(idle)} is not read: tasks are {', '.join(args.tasks)}; add "
                f"{'it' if len(idle) == 1 else 'them'} to tasks to score {'it' if len(idle) == 1 else 'them'}"
            )
    if args.output:  # a path that cannot be written is refused by `validate` too
        check_writable(args.output, f"{where}: output")
    # What the output may not replace; `evaluation.commands.run_evaluation` claims it before any work.
    args.inputs = [path, args.model_name_or_path, *args.data_by_task.values(), *args.fewshot_by_task.values()]
    args.where = where
    return args


def check_device(name: str, where: str) -> None:
    """A device this torch can place a model on: its name as torch.device parses it, its kind
    built into this torch and present, its index among those there (torch says only at the first
    tensor moved, after the model has loaded)."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as err:
        reason = " ".join(str(err).split())
        raise UserError(f"{where} '{name}' is not a device torch knows ({reason}); use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return
    backend = getattr(torch, device.type, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if count == 0:
        raise UserError(
            f"{where} '{name}': this machine's torch ({torch.__version__}) has no {device.type} device; "
            "use cpu, or run where one is"
        )
    if device.index is not None and device.index >= count:
        raise UserError(
            f"{where} '{name}': there are {count} {device.type} device(s), {device.type}:0 to :{count - 1}"
        )
