"""The GRPO recipe's trainer: TRL's GRPOTrainer with the recipes' checkpoints, resume and logs
(`trainer.RecipeTrainerMixin`), an embedding learning rate, per-set eval metrics and
multiple-choice accuracy."""

from trl import GRPOTrainer

from medrecipes.trainer import EmbeddingLearningRateMixin, GRPOEvalMetricsMixin, MCQAccuracyMixin, RecipeTrainerMixin


class MedGRPOTrainer(
    RecipeTrainerMixin, EmbeddingLearningRateMixin, MCQAccuracyMixin, GRPOEvalMetricsMixin, GRPOTrainer
):
    """GRPOTrainer with the recipes' checkpointing, an embedding learning rate, per-set eval
    metrics and MCQ accuracy."""
