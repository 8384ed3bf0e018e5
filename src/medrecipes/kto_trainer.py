"""The KTO recipe's trainer: TRL's KTOTrainer with the recipes' checkpoints, resume and logs
(`trainer.RecipeTrainerMixin`). TRL logs the preference metrics itself at every evaluation
(`eval_rewards/chosen`, `eval_rewards/rejected`, `eval_rewards/margins`, `eval_kl`);
multiple-choice accuracy comes from `eval_callback.add_task_evaluation`."""

from trl import KTOTrainer

from medrecipes.trainer import RecipeTrainerMixin


class MedKTOTrainer(RecipeTrainerMixin, KTOTrainer):
    """KTOTrainer that saves, resumes and logs as every recipe does."""
