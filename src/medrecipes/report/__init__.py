"""`medrecipes report`: what runs and evaluations already wrote, as one HTML page with plots.

The page is self-contained (its images inline, no script or style from the network), so it
opens from disk and can be mailed or attached; the same plots are written as PNG files beside
it. Nothing is rerun: a training run's folder gives its trainer state (the root one, or the
newest checkpoint's while it trains), the multiple-choice reports of `eval_callback`
(`eval_tasks/step-<N>.json`) and its record (`run.json`: script, model, resolved recipe); an
evaluation is the JSON file of `medrecipes eval --output` (a folder of them, e.g.
`make real-check`'s `eval/`, gives one evaluation per file). Several runs overlay in each plot,
one colour per run: a baseline and a candidate, or the stages of one pipeline.

Plots, each drawn only where some run logged what it shows:

- loss: training loss and each eval set's loss against tokens seen;
- accuracy: multiple-choice accuracy against steps, with the 95% (Wilson) interval as a band;
- subjects: accuracy by subject at the best and the last evaluation of each run;
- grpo: mean reward per reward function, KL to the reference, completion length;
- throughput: tokens/s, MFU and peak memory;
- evaluations: accuracy per task of each evaluation file, with its interval.

matplotlib draws them (the plain choice for static figures in a file; its Agg backend needs no
display).
"""

from medrecipes.report.figures import figures, subject_points
from medrecipes.report.page import images_folder, write_report
from medrecipes.report.runs import read_inputs, read_run, task_problem

__all__ = [
    "figures",
    "images_folder",
    "read_inputs",
    "read_run",
    "task_problem",
    "subject_points",
    "write_report",
]
