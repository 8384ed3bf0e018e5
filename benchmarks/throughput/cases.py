"""A case of train_throughput.py: its JSON file in benchmarks/configs/, the recipe keys every
measured run gets, and its synthetic data (random token ids: nothing is downloaded)."""

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "benchmarks" / "configs"
RESULTS = ROOT / "benchmarks" / "results"
# Recipe keys set for every measured run: no evaluation, saving or logging inside the window.
PLUMBING = {
    "eval_strategy": "no",
    "eval_tasks": "",
    "eval_on_start": "false",
    "save_strategy": "no",
    "load_best_model_at_end": "false",
    "push_to_hub": "false",
    "report_to": "none",
}


def load_case(name: str) -> dict:
    path = Path(name) if name.endswith(".json") else CONFIGS / f"{name}.json"
    if not path.is_file():
        known = sorted(p.stem for p in CONFIGS.glob("*.json"))
        raise SystemExit(f"error: no case '{name}' ({path}); cases: {', '.join(known)}")
    case = json.loads(path.read_text())
    case["name"] = path.stem
    return case


def vocabulary_tokenizer(size: int):
    """A word-level tokenizer with exactly `size` tokens, so that the recipe's model code builds the
    architecture's own vocabulary: each whitespace-separated word is one token (unknown ones
    <unk>). The data are token ids; text (GRPO prompts) gets realistic lengths, not meanings."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<bos>", "<eos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]  # the Gemma recipes' turns
    vocab = {token: i for i, token in enumerate(specials + [f"t{i}" for i in range(size - len(specials))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def token_blocks(count: int, length: int, vocab: int, seed: int = 0):
    """CPT data: `count` blocks of `length` random token ids, as the recipe's packing produces."""
    import numpy as np
    from datasets import Dataset

    rng = np.random.default_rng(seed)
    return Dataset.from_dict({"input_ids": rng.integers(4, vocab, size=(count, length), dtype=np.int32)})


def example_lengths(spec: dict, count: int, seed: int = 0):
    """Prompt and answer lengths of `count` SFT examples: log-normal prompts (`median`, `sigma`) plus
    the chat template's tokens, a fixed answer, cut to [min, max]."""
    import numpy as np

    rng = np.random.default_rng(seed)
    prompts = np.rint(spec["median"] * np.exp(spec["sigma"] * rng.standard_normal(count))) + spec["template"]
    prompts = np.clip(prompts, spec["min"], spec["max"] - spec["answer"]).astype(int)
    return prompts, spec["answer"]


def sft_examples(spec: dict, count: int, vocab: int, seed: int = 0):
    """Pre-tokenised SFT examples (`input_ids`, `completion_mask`), the answer tokens alone trained."""
    import numpy as np
    from datasets import Dataset

    prompts, answer = example_lengths(spec, count, seed)
    rng = np.random.default_rng(seed + 1)
    rows = {"input_ids": [], "completion_mask": []}
    for n in prompts:
        rows["input_ids"].append(rng.integers(4, vocab, size=n + answer).tolist())
        rows["completion_mask"].append([0] * n + [1] * answer)
    return Dataset.from_dict(rows)


def grpo_prompts(recipe, prompt_format: str, source: str):
    """The recipe's own GRPO data path on a bundled MCQ file instead of the recipe's Hub sources."""
    from medrecipes.data.grpo import grpo_data
    from medrecipes.data_config import SourceConfig

    recipe.mixture.sources = [SourceConfig(path=source, format="usmle")]
    recipe.eval_sources = {}
    train, _, _ = grpo_data(recipe, prompt_format)
    return train


def cli_value(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_case(case: dict, changes: dict, device: str, output_dir: str):
    """The recipe's dataclasses with the case's keys, `changes`, and the benchmark's plumbing."""
    from medrecipes.config import parse_recipe

    keys = {**case.get("overrides", {}), **changes, **PLUMBING, "output_dir": output_dir}
    if device == "cpu":
        keys["use_cpu"] = "true"
    argv = [case["recipe"]] + [item for key, value in keys.items() for item in (f"--{key}", cli_value(value))]
    recipe, args, model_args = parse_recipe(case["method"], argv)
    recipe.init_from_scratch, recipe.architecture = True, case["architecture"]
    args.max_steps = case["steps"]  # after any token budget the recipe derives its steps from
    args.logging_steps = case["steps"]  # the one log (a host sync) comes after the window
    return recipe, args, model_args
