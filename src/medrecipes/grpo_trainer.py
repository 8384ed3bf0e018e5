"""The GRPO recipe's trainer: TRL's GRPOTrainer with the recipes' checkpoints, resume and logs
(`trainer.RecipeTrainerMixin`), an embedding learning rate and per-set eval metrics;
multiple-choice accuracy comes from `eval_callback.add_task_evaluation`."""

from trl import GRPOTrainer

from medrecipes.trainer import EmbeddingLearningRateMixin, GRPOEvalMetricsMixin, RecipeTrainerMixin


class MedGRPOTrainer(RecipeTrainerMixin, EmbeddingLearningRateMixin, GRPOEvalMetricsMixin, GRPOTrainer):
    """GRPOTrainer with the recipes' checkpointing, an embedding learning rate and per-set eval metrics."""
