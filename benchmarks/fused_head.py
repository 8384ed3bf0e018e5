"""TRL's fused LM head on a CPU: every position scored (TRL's own choice off CUDA) against the
labelled positions only (the recipes' trainers, `training.trl_seams.score_labelled_positions_only`),
in one process, on the same model and batches, the two turned in alternation.

Usage:

    python benchmarks/fused_head.py                      # Gemma 3 270M's architecture, random weights
    python benchmarks/fused_head.py --repeats 5 --out benchmarks/results/fused_head-cpu.json

Each shape is a recipe's batch (rows x tokens, labelled tokens a row): the reasoning-free PubMedQA
SFT (8 x 140, 4: "A. yes" and the end of turn), the long-answer SFT (4 x 450, 50: the conclusion
and the answer), a CPT block (1 x 1,024, all). A step is the forward and backward through the
head with the model's gradients (no optimizer step, the same in both); the time is the median
over the repeats after one warm-up step, and each repeat's ratio is taken between the two steps
run back to back. The loss of the two is checked equal.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import trl.trainer.utils as trl_utils
from transformers import AutoConfig, AutoModelForCausalLM

from medrecipes.training.trl_seams import score_labelled_positions_only

ARCHITECTURE = Path(__file__).parent / "configs" / "architectures" / "gemma3-270m.json"
SHAPES = {"sft-free": (8, 140, 4), "sft-long": (4, 450, 50), "cpt": (1, 1024, 1024)}


def batch(rows: int, tokens: int, labelled: int, vocab: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab, (rows, tokens), generator=generator)
    labels = torch.full_like(ids, -100)
    labels[:, tokens - labelled :] = ids[:, tokens - labelled :]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def step(model, inputs: dict) -> tuple[float, float]:
    """Seconds for one forward and backward through the fused head, and the loss."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    loss = model(**inputs, fused_lm_head=True).loss
    loss.backward()
    return time.perf_counter() - start, loss.item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--architecture", default=str(ARCHITECTURE), help="a config.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--out", help="write the figures here as JSON")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(args.architecture)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    trl_utils.add_fused_lm_head(model)
    trl_choice = trl_utils._use_triton
    score_labelled_positions_only()
    labelled_only = trl_utils._use_triton
    choices = {"every position": trl_choice, "labelled only": labelled_only}
    results = {}
    for shape in args.shapes.split(","):
        inputs = batch(*SHAPES[shape], config.vocab_size)
        times, losses, ratios = {name: [] for name in choices}, {}, []
        for choice in choices.values():  # warm-up
            trl_utils._use_triton = choice
            step(model, inputs)
        for repeat in range(args.repeats):
            order = list(choices) if repeat % 2 == 0 else list(choices)[::-1]
            for name in order:
                trl_utils._use_triton = choices[name]
                seconds, losses[name] = step(model, inputs)
                times[name].append(seconds)
            ratios.append(times["every position"][-1] / times["labelled only"][-1])
        assert abs(losses["every position"] - losses["labelled only"]) <= 1e-5 * abs(losses["every position"])
        results[shape] = {
            "rows, tokens, labelled a row": SHAPES[shape],
            "seconds a step": {name: round(statistics.median(t), 3) for name, t in times.items()},
            "speed-up (median, range)": [
                round(statistics.median(ratios), 2),
                round(min(ratios), 2),
                round(max(ratios), 2),
            ],
            "loss": losses["labelled only"],
        }
        print(shape, json.dumps(results[shape]), flush=True)
    report = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "architecture": Path(args.architecture).name,
        "repeats": args.repeats,
        "shapes": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
