"""Where the recipes' trainers reach past TRL's public API, all here: a private function patched
(`_use_triton`), a private method overridden (`GRPOTrainer._generate_single_turn`), and the
metrics TRL keeps in private attributes (`_metrics`, `_total_train_tokens`), read and filled by
mixins that make its logs cheaper or complete. `SEAMS` lists each with why no public hook serves
and the test that holds its behaviour; tests/test_seams.py fails when the installed TRL changes
a signature written here, no longer sets an attribute read here, or leaves the version range
below. Written against TRL 1.16."""

import logging
import math

import torch

from medrecipes.rewards import NO_SIGNAL, correctness_index
from medrecipes.training.transformers_seams import Seam, compile_decoding

logger = logging.getLogger(__name__)

LIBRARY = "trl"
WRITTEN_AGAINST = ("1.16", "1.16")  # the oldest release setup.cfg allows, the one constraints.txt pins

SEAMS = (
    Seam("trl.trainer.utils", "_use_triton", "(device)",
         "TRL's fused LM head scores every position off CUDA and XPU, and has no option for it",
         "tests/test_fast_defaults.py::test_chunked_lm_head_scores_only_labelled_positions_on_a_cpu"),
    Seam("trl.GRPOTrainer", "_generate_single_turn",
         "(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False)",
         "TRL's generation leaves the model in training mode after continuous batching, even in an evaluation; "
         "its generation method is the only hook",
         "tests/test_grpo_recipe.py::test_continuous_batching_generates_for_training_and_for_an_evaluation_before_the_first_step"),
    Seam("trl.SFTTrainer", "_metrics", None,
         "SFT's per-batch metrics, kept on the device and handed to TRL's log once per log",
         "tests/test_fast_defaults.py::test_sft_metrics_read_once_per_log_with_trls_loss_and_values"),
    Seam("trl.SFTTrainer", "_total_train_tokens", None,
         "the running token count TRL logs as num_tokens, summed once per log",
         "tests/test_fast_defaults.py::test_sft_metrics_read_once_per_log_with_trls_loss_and_values"),
    Seam("trl.GRPOTrainer", "_metrics", None,
         "GRPO's eval metrics, which TRL adds only in its own log, under one prefix for every eval set",
         "tests/test_grpo_recipe.py::test_kl_to_the_reference_and_periodic_evaluation"),
    Seam("trl.GRPOTrainer", "_calculate_rewards", "(self, inputs, prompts, completions, completion_ids_list)",
         "the rewards of every function, gathered over processes, exist only inside TRL's scoring; its own share of "
         "groups without a spread (frac_reward_zero_std) compares a float32 std to 0 with atol 1e-8 and reads a "
         "group scoring 1.2 eight times as spread",
         "tests/test_grpo_recipe.py::test_the_share_of_groups_without_a_signal_is_read_on_the_correctness_reward"),
    Seam("trl.GRPOTrainer", "generation_config", None,
         "TRL builds its generation config with disable_compile=True whatever the cache; compile_generation "
         "turns compilation on",
         "tests/test_generation_paths.py::test_the_grpo_trainer_compiles_its_decoding_only_when_asked"),
)  # fmt: skip


# Devices where TRL's fused LM head runs eagerly without Triton. TRL scores only the labelled
# positions where its Triton kernel runs (CUDA, XPU) and every position elsewhere, zeroing the
# unlabelled ones, so that a static-shape device (Neuron, XLA) keeps one tile shape; on these the
# shape costs nothing and the unlabelled positions are pure work: an SFT row of 140 tokens trains 4,
# and the head over Gemma's 262k vocabulary is 63% of Gemma 3 270M's compute a token. Same loss and
# gradients; 3.4x faster a step of that SFT on 2 CPU cores (docs/benchmarks.md, benchmarks/fused_head.py).
EAGER_DEVICES = ("cpu", "mps")


def score_labelled_positions_only() -> None:
    """Make TRL's fused LM head score only the positions with a label on EAGER_DEVICES too (once per
    process; TRL's choice stands on every other device). Its choice is `trl.trainer.utils._use_triton`,
    read at each forward: TRL has no option for it. A TRL without that function is left as it is."""
    import trl.trainer.utils as trl_utils

    chosen = getattr(trl_utils, "_use_triton", None)
    if chosen is None or getattr(chosen, "labelled_only", False):
        return

    def compact(device) -> bool:
        return chosen(device) or device.type in EAGER_DEVICES

    compact.labelled_only = True
    trl_utils._use_triton = compact


class DeferredSFTMetricsMixin:
    """TRL's SFT loss with its per-batch metrics (entropy, token accuracy, tokens trained) kept on
    the device and read once per log, not in every micro-batch.

    TRL 1.16's `SFTTrainer.compute_loss` reads five values on the host in each micro-batch (two
    `> 0` tests, two `.item()` for the metrics, one for the token count): on a GPU each waits for
    every kernel queued before it, so the host stops queueing the next ones. TRL has no option to
    defer them; `compute_loss` is the trainer's public hook. This one computes TRL's loss the way
    TRL's own common path does (the fused head's log-probabilities over the labelled tokens, DFT
    weighting, the count across devices) and hands every other case (an auxiliary MoE loss, label
    smoothing, a custom loss function, sequence parallelism, outputs asked for) to TRL unchanged.
    The metrics are TRL's values: each micro-batch's entropy and accuracy per labelled token (0
    where it has none) and the running token count, averaged by TRL's `log` as before."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args = self.args
        parallel = getattr(self.accelerator, "parallelism_config", None)
        if (
            return_outputs
            or self.aux_loss_enabled
            or self.compute_loss_func is not None
            or (self.label_smoother is not None and args.loss_type == "nll")
            or (parallel is not None and getattr(parallel, "sp_enabled", False))
        ):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        inputs["use_cache"] = False
        outputs = model(**inputs, fused_lm_head=True)
        per_token_loss = -outputs.log_probs  # zero on ignored positions
        if args.loss_type == "dft":
            per_token_loss = per_token_loss * outputs.log_probs.exp().detach()
        num_tokens = outputs.label_mask.sum() if num_items_in_batch is None else num_items_in_batch
        loss = per_token_loss.sum() / torch.as_tensor(num_tokens).clamp(min=1)
        if args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())
        gather = self.accelerator.gather_for_metrics
        valid = gather(outputs.label_mask.sum()).sum().clamp(min=1)  # entropy and top-1 are 0 where unlabelled
        values = [gather(outputs.entropy.detach().sum()).sum() / valid, gather(outputs.is_top1.sum()).sum() / valid]
        if mode == "train":
            if "attention_mask" in inputs:
                seen = gather(inputs["attention_mask"].sum()).sum()
            else:  # padding-free: the flattened row's length, host metadata
                seen = gather(torch.tensor(inputs["position_ids"].size(1), device=loss.device)).sum()
            values.append(seen // self._tp_size)
        else:
            values.append(torch.zeros((), device=loss.device))
        self._deferred_metrics(mode).append(torch.stack([v.to(torch.float64) for v in values]))
        return loss

    def _deferred_metrics(self, mode: str) -> list:
        if not hasattr(self, "_deferred"):
            self._deferred = {"train": [], "eval": []}
        return self._deferred[mode]

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        mode = "train" if self.model.training else "eval"
        pending = self._deferred_metrics(mode)
        if pending:
            rows = torch.stack(pending).tolist()  # the one read of the values since the last log
            pending.clear()
            self._metrics[mode]["entropy"].extend(row[0] for row in rows)
            self._metrics[mode]["mean_token_accuracy"].extend(row[1] for row in rows)
            self._total_train_tokens += int(sum(row[2] for row in rows))
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        super().log(logs, start_time)


class GRPOEvalMetricsMixin:
    """Reports GRPO's evaluation metrics (reward per function, KL, completion length, ...) under
    the eval set's prefix, `eval_<set>_reward`, and returns them from `evaluate`.

    GRPOTrainer keeps them in `_metrics["eval"]` and adds them as `eval_<metric>` in `log`, so
    with several eval sets they would mix in one series and miss from evaluate()'s result.
    """

    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        for key, values in self._metrics["eval"].items():
            finite = [v for v in values if not math.isnan(v)]
            if finite:
                output.metrics[f"{metric_key_prefix}_{key}"] = sum(finite) / len(finite)
        self._metrics["eval"].clear()
        return output


class GenerationKeepsModeMixin:
    """The model in the mode it had before GRPO generated its completions. TRL 1.16 sets it to
    training mode after transformers' continuous batching (`use_transformers_continuous_batching`)
    even during an evaluation, where the loss then reads the training loop's accumulation, which
    an evaluation before the first step (`eval_on_start`) has not set yet, and dropout would be on.
    TRL's generation method is the only hook."""

    def _generate_single_turn(self, *args, **kwargs):
        training = self.model.training
        try:
            return super()._generate_single_turn(*args, **kwargs)
        finally:
            self.model.train(training)


class CompiledGenerationMixin:
    """GRPO's generation with its decoding step compiled (`compile_generation`, over
    `cache_implementation: static`; `config.checks.resolve_grpo` asks for both)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if getattr(self.args, "compile_generation", False) and getattr(self, "generation_config", None) is not None:
            compile_decoding(self.generation_config, self.accelerator.device.type)


def no_spread_share(rewards: torch.Tensor, group: int) -> float:
    """The share of the groups of `group` consecutive rewards (one question's answers) whose values
    do not vary, NaN (a reward that did not apply) ignored. Equal is within float32's rounding of
    the values, not an absolute 1e-8: eight answers scoring 1.0 x 1 + 0.2 x 1 = 1.2 have a float32
    std of 1.3e-7."""
    grouped = rewards.reshape(-1, group).to(torch.float64)
    present = ~torch.isnan(grouped)
    high = torch.where(present, grouped, -torch.inf).amax(dim=1)
    low = torch.where(present, grouped, torch.inf).amin(dim=1)
    scale = torch.maximum(high.abs(), low.abs()).nan_to_num(0.0).clamp(min=1.0)
    flat = ~present.any(dim=1) | ((high - low) <= 8 * torch.finfo(torch.float32).eps * scale)
    return flat.double().mean().item()


class SignalShareMixin:
    """Logs NO_SIGNAL for every batch of completions scored, beside TRL's own rewards. TRL has no
    hook after its rewards are gathered; `_calculate_rewards` returns them, so this wraps it and
    hands them back unchanged. Where the recipe has no correctness reward, the weighted sum TRL
    computes the advantages from is read.

    DAPO's dynamic sampling (groups without a spread replaced by others before the loss) is not
    done here: TRL 1.16 generates, scores and computes the advantages of a batch inside one private
    method (`_generate_and_score_completions`), so refilling a batch would mean writing that method
    again; the recipes filter the questions before training instead (`pass_rate`)."""

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        mode = "train" if self.model.training else "eval"
        group = self.num_generations if mode == "train" else (self.num_generations_eval or self.num_generations)
        index = correctness_index(self.reward_funcs)
        if index is not None:
            scored = rewards[:, index]
        else:
            scored = (rewards * self.reward_weights.to(rewards.device).unsqueeze(0)).nansum(dim=1)
        if group and scored.numel() % group == 0:
            self._metrics[mode][NO_SIGNAL].append(no_spread_share(scored, group))
        return rewards
