"""Trainer callbacks shared by the recipes."""

import logging
import os
import re
import shutil

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


class KeepBestCheckpoints(TrainerCallback):
    """After each save, keep the best `keep` checkpoints by `metric_for_best_model` plus the last.

    HF's `save_total_limit` keeps the newest N (and the single best); a long CPT run wants the
    best few by eval loss to compare or average, so retention is ranked by the metric here.
    """

    def __init__(self, keep: int):
        self.keep = keep

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        metric = args.metric_for_best_model
        metric = metric if metric.startswith("eval_") else f"eval_{metric}"
        scores = {entry["step"]: entry[metric] for entry in state.log_history if metric in entry}
        steps = sorted(int(m.group(1)) for name in os.listdir(args.output_dir) if (m := CHECKPOINT.match(name)))
        if not steps:
            return
        ranked = sorted((s for s in steps if s in scores), key=scores.get, reverse=args.greater_is_better)
        # A checkpoint saved without an evaluation at its step cannot be ranked, so it stays.
        kept = set(ranked[: self.keep]) | {steps[-1]} | {s for s in steps if s not in scores}
        for step in steps:
            if step not in kept:
                logger.info("removing checkpoint-%d (%s not in the best %d)", step, metric, self.keep)
                shutil.rmtree(os.path.join(args.output_dir, f"checkpoint-{step}"), ignore_errors=True)
