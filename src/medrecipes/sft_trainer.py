"""The SFT recipe's trainer: TRL's SFTTrainer with the recipes' checkpoints, resume and logs
(`trainer.RecipeTrainerMixin`) and perplexity on each eval set; multiple-choice accuracy comes
from `eval_callback.add_task_evaluation`."""

from trl import SFTTrainer

from medrecipes.trainer import PerplexityMixin, RecipeTrainerMixin


class MedSFTTrainer(RecipeTrainerMixin, PerplexityMixin, SFTTrainer):
    """SFTTrainer that also logs perplexity on each eval set."""
