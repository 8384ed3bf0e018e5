"""The SFT recipe's trainer: TRL's SFTTrainer with the recipes' checkpoints, resume and logs
(`trainer.RecipeTrainerMixin`), perplexity and multiple-choice accuracy on each eval set."""

from trl import SFTTrainer

from medrecipes.trainer import MCQAccuracyMixin, PerplexityMixin, RecipeTrainerMixin


class MedSFTTrainer(RecipeTrainerMixin, MCQAccuracyMixin, PerplexityMixin, SFTTrainer):
    """SFTTrainer that also logs perplexity and multiple-choice accuracy on each eval set."""
