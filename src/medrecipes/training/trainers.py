"""The recipes' trainers: HF's Trainer (CPT and pretraining) and TRL's SFT, GRPO, DPO and KTO
trainers, each with the recipes' checkpoints, resume and logs (`mixins.RecipeTrainerMixin`).
Multiple-choice accuracy during training comes from `eval_callback.add_task_evaluation`; TRL
logs DPO's and KTO's preference metrics itself at every evaluation (rewards, margins, KL)."""

from transformers import Trainer
from trl import DPOTrainer, GRPOTrainer, KTOTrainer, SFTTrainer

from medrecipes.training.mixins import (
    EmbeddingLearningRateMixin,
    FusedLMHeadMixin,
    PerplexityMixin,
    RecipeTrainerMixin,
    StreamTrainerMixin,
)
from medrecipes.training.trl_seams import (
    CompiledGenerationMixin,
    DeferredSFTMetricsMixin,
    GenerationKeepsModeMixin,
    GRPOEvalMetricsMixin,
    SignalShareMixin,
)


class CausalLMTrainer(RecipeTrainerMixin, StreamTrainerMixin, PerplexityMixin, FusedLMHeadMixin, Trainer):
    """HF Trainer for continued pretraining and pretraining from scratch."""


class MedSFTTrainer(RecipeTrainerMixin, PerplexityMixin, DeferredSFTMetricsMixin, SFTTrainer):
    """SFTTrainer that also logs perplexity on each eval set, and reads its metrics once per log."""


class MedGRPOTrainer(
    RecipeTrainerMixin,
    EmbeddingLearningRateMixin,
    GRPOEvalMetricsMixin,
    GenerationKeepsModeMixin,
    CompiledGenerationMixin,
    SignalShareMixin,
    GRPOTrainer,
):
    """GRPOTrainer with the recipes' checkpointing, an embedding learning rate, per-set eval
    metrics, the share of groups without a learning signal and, when asked, a compiled decoding step."""


class MedDPOTrainer(RecipeTrainerMixin, DPOTrainer):
    """DPOTrainer that saves, resumes and logs as every recipe does."""


class MedKTOTrainer(RecipeTrainerMixin, KTOTrainer):
    """KTOTrainer that saves, resumes and logs as every recipe does."""
