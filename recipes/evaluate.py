"""Accuracy of a model on medical multiple-choice benchmarks, scored as lm-evaluation-harness scores them.

Usage:

    python recipes/evaluate.py --model outputs/demo/sft/final --tasks medqa_4opt,mmlu_medical --data_dir ../shared/data
    python recipes/evaluate.py --model google/medgemma-4b-pt --tasks medqa_4opt,medmcqa,pubmedqa,mmlu_medical
    python recipes/evaluate.py --model outputs/x/final --mode generate --chain_of_thought true --output x.json
    python recipes/evaluate.py recipes/tiny_eval.yaml                 # the same keys in a YAML; flags override it

`--mode loglik` (default) scores the log-likelihood of " A", " B", ... after lm-eval's prompt
of each task; `--mode generate` asks through the chat template and reads the answer letter.
Questions come from `--data TASK=PATH`, else `--data_dir` (the ../shared/data layout), else
the Hub. The end of the run prints a markdown table; `--output` keeps every prediction.
`medrecipes eval` takes the same arguments.
"""

from medrecipes.config import parse_eval_args
from medrecipes.errors import exit_on_user_error
from medrecipes.evaluation.commands import run_evaluation
from medrecipes.evaluation.tables import format_table
from medrecipes.logs import setup_logging


def main(args):
    setup_logging()
    results = run_evaluation(args)
    print(format_table(results["tasks"]))


if __name__ == "__main__":
    exit_on_user_error(lambda: main(parse_eval_args()))()
