"""The DPO recipe's trainer: TRL's DPOTrainer with the recipes' checkpoints, resume and logs
(`trainer.RecipeTrainerMixin`). TRL logs the preference metrics itself at every evaluation
(`eval_rewards/accuracies`, `eval_rewards/margins`, the chosen and rejected rewards);
multiple-choice accuracy comes from `eval_callback.add_task_evaluation`."""

from trl import DPOTrainer

from medrecipes.trainer import RecipeTrainerMixin


class MedDPOTrainer(RecipeTrainerMixin, DPOTrainer):
    """DPOTrainer that saves, resumes and logs as every recipe does."""
