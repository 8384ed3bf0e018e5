"""The names a recipe or a command may give for benchmark tasks, evaluation modes and PubMedQA's
settings, and the most answers sampled a question.

A leaf: the recipe schema checks these names when a recipe is read, without importing the code
that loads and scores the tasks (`eval_tasks`, `evaluation`), which sits above it.
"""

from typing import Literal, get_args

from medrecipes.errors import UserError, did_you_mean

# The benchmark tasks of `evaluation.tasks.TASKS`, in its order (a test holds the two together).
TASK_NAMES = ("medqa_4opt", "medqa_5opt", "medmcqa", "pubmedqa", "mmlu_medical")
# How `evaluation` scores a question: lm-eval's log-likelihood of each answer, or a generated reply.
EvalMode = Literal["loglik", "generate"]
EVAL_MODES = get_args(EvalMode)
# Answers sampled a question at most (generate mode's votes, pass-rate, on-policy pairs): a share
# finer than 1/1024 changes no vote or filter, and each answer is generated and held in memory.
MOST_SAMPLES = 1024
# The dtypes a model is loaded in: TRL's ModelConfig.dtype choices (a test holds the two together),
# for eval and perplexity as for a recipe; a dtype of whole numbers or booleans loads no model.
DTYPES = ("auto", "bfloat16", "float16", "float32")
# PubMedQA's two settings (Jin et al. 2019): reasoning-required asks about the abstract without its
# conclusion, the benchmark's standard score; reasoning-free gives the conclusion (`LONG_ANSWER`),
# alone or after the abstract. A figure is reported under its setting's name.
PubMedQASetting = Literal["reasoning_required", "reasoning_free", "reasoning_free_with_abstract"]
PUBMEDQA_SETTINGS = get_args(PubMedQASetting)
# The scalars an evaluation during training logs for each scored task, eval_<task>_<name>
# (`evaluation.tables.task_metrics`): accuracy ("acc"), the report's other figures where it has
# them, and the calibration of its ranking; named here so that the recipe schema can check a
# metric_for_best_model against them.
REPORT_METRICS = ("macro_f1", "acc_norm", "unparseable", "abstained", "stopped")
CALIBRATION_METRICS = ("ece", "brier", "nll", "auroc")
TASK_METRICS = ("acc", *REPORT_METRICS, *CALIBRATION_METRICS)


def check_task_names(names: list[str], own_data: list[str], where: str, own_questions: str) -> None:
    """Every name is a registry task or one of `own_data` (names that come with their questions);
    `own_questions` says how a name is given its own questions where the names are written."""
    known = [*TASK_NAMES, *own_data]
    for name in names:
        if name not in known:
            raise UserError(
                f"{where}: unknown task '{name}'{did_you_mean(name, known)}; "
                f"tasks: {', '.join(TASK_NAMES)}, or {own_questions}"
            )
