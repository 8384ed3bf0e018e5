"""Multiple-choice accuracy during training, one path for every recipe: a recipe's
`eval_tasks`, and the multiple-choice eval sets that its trained model answers in chat, scored
at every evaluation.

Any trainer of the recipes (HF Trainer, SFTTrainer, GRPOTrainer) takes it in one line:

    add_task_evaluation(trainer, recipe, answered=mcq_sets)

At each evaluation it scores the tasks (`eval_tasks_mode`: loglik as lm-evaluation-harness
does, or generate) on at most `eval_tasks_limit` questions each, and the `answered` sets (SFT
and chat-prompt GRPO: every question, answered by generation as the recipe prompts); adds
`eval_<name>_acc` (and `eval_<name>_acc_norm` or `eval_<name>_unparseable`) to the evaluation's
metrics, so that `metric_for_best_model` can name them; logs them through the trainer
(trainer_state.json, TensorBoard) with the report by subject; and writes the full reports to
output_dir/eval_tasks/step-<N>.json.
"""

import json
import logging
import os

from transformers import TrainerCallback

from medrecipes.data.rows import local_files, named
from medrecipes.evaluation.scoring import evaluate_task
from medrecipes.evaluation.tables import format_report, task_metrics
from medrecipes.evaluation.tasks import RECIPE_WORDING, TASKS, eval_set_task, load_task
from medrecipes.outputs.writes import staged
from medrecipes.runs.folder import RunFolder

logger = logging.getLogger(__name__)


class TaskEvaluationCallback(TrainerCallback):
    """Scores `tasks` ({name: evaluation.tasks.TaskData}) with the trainer's model at each evaluation,
    each in its mode (`modes`: {name: "loglik" or "generate"}).

    It holds the trainer because a callback cannot log by itself: `trainer.log` is what records
    a value in the state and sends it to TensorBoard. Every process scores every question: the
    sets are small, and a model sharded by ZeRO-3 or FSDP needs all processes in each forward.
    """

    def __init__(self, trainer, tasks: dict, modes: dict[str, str], generation: dict | None = None):
        self.trainer = trainer
        self.tasks = tasks
        self.modes = modes
        self.generation = generation or {}
        self.reports: dict[str, dict] = {}

    def _first_of_this_evaluation(self, metrics: dict) -> bool:
        # With several eval sets the trainer evaluates (and calls on_evaluate) once per set.
        eval_dataset = self.trainer.eval_dataset
        if not isinstance(eval_dataset, dict):
            return True
        return f"eval_{next(iter(eval_dataset))}_runtime" in metrics

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics is None or not self._first_of_this_evaluation(metrics):
            return
        self.reports = {
            name: evaluate_task(
                self.trainer.model,
                self.trainer.processing_class,
                data,
                mode=self.modes[name],
                batch_size=args.per_device_eval_batch_size,
                generation=self.generation,
                progress=state.is_world_process_zero,
            )
            for name, data in self.tasks.items()
        }
        scores = task_metrics(self.reports)
        metrics.update(scores)  # the dict the trainer ranks checkpoints by
        self.trainer.log(dict(scores))
        if state.is_world_process_zero:
            for name, report in self.reports.items():
                logger.info("step %d: %s", state.global_step, format_report(name, report))
            # Written whole or not at all (renamed into place): `medrecipes report` reads these, and a
            # file cut by a kill would stop it.
            report = RunFolder(args.output_dir).eval_report(state.global_step)
            with staged(report, folder=False) as path, open(path, "w", encoding="utf-8") as f:
                json.dump({"step": state.global_step, "tasks": self.reports}, f, indent=1)


def say_trained_on(recipe, scored: dict[str, str]) -> None:
    """One line for each benchmark task whose questions' file is one the recipe trains on: its
    accuracy is then of questions the model has seen (`medrecipes decontaminate` finds overlap short
    of the same file). An eval set of the training file (usmle_train) is scored so on purpose."""
    sources = recipe.mixture.sources if recipe.mixture else []
    trained = {os.path.realpath(f): s for s in sources for f in local_files(s)}
    for name, source in scored.items():
        if os.path.isfile(source) and (same := trained.get(os.path.realpath(source))) is not None:
            logger.warning(
                "eval_tasks %s scores %s, which the recipe trains on (%s): its accuracy is of questions the model "
                "has seen; train on another split, or score another file",
                name, source, named(same),
            )  # fmt: skip


def add_task_evaluation(
    trainer, recipe, answered: dict | None = None, max_new_tokens: int | None = None
) -> TaskEvaluationCallback | None:
    """Load the recipe's `eval_tasks` now (a missing file fails before training) and add the
    callback that scores them, and the `answered` eval sets ({name: questions loaded by the data
    pipeline}) by generation, to `trainer`; nothing when there are neither. `max_new_tokens`:
    the reply length of generated answers (GRPO's completion length), else the evaluation's."""
    tasks = {
        name: load_task(
            name, data_dir=recipe.eval_tasks_data_dir, limit=recipe.eval_tasks_limit, wording=RECIPE_WORDING
        )  # fmt: skip
        if name in TASKS
        else eval_set_task(name, recipe.eval_sources[name], recipe.eval_tasks_limit)
        for name in recipe.eval_tasks
    }
    say_trained_on(recipe, {name: data.source for name, data in tasks.items() if name in TASKS})
    modes = dict.fromkeys(tasks, recipe.eval_tasks_mode)
    for name, rows in (answered or {}).items():  # the schema keeps eval_tasks from naming these
        tasks[name] = eval_set_task(name, recipe.eval_sources[name], rows=rows)
        modes[name] = "generate"
    if not tasks:
        return None
    generation = {"system_prompt": recipe.system_prompt, "chain_of_thought": recipe.chain_of_thought}
    if max_new_tokens is not None:
        generation["max_new_tokens"] = max_new_tokens
    callback = TaskEvaluationCallback(trainer, tasks, modes, generation)
    trainer.add_callback(callback)
    return callback
