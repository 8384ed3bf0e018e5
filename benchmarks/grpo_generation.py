"""GRPO's generation without vLLM, path by path in one process: what TRL's generation step costs
with HF `generate` (its default), with transformers' continuous batching over a paged cache
(`use_transformers_continuous_batching`, TRL calling `generate_batch`), with a static cache as TRL
1.16 asks for it (`cache_implementation: static`, compilation off), and with a static cache whose
decoding step is compiled (the recipe key `compile_generation`: CUDA graphs on a GPU).

    python benchmarks/grpo_generation.py                            # case (d): the 0.4B preset, 16 x 16 of 512
    python benchmarks/grpo_generation.py --preset tiny --prompts 2 --generations 2 --completion 16 --device cpu

The model is the pretraining recipe's preset with random weights (its speed does not depend on
what it learned), in bf16 on a GPU and float32 on a CPU; each prompt is `--prompt-tokens` random
token ids, repeated `--generations` times as TRL repeats it, and all of them (the generation batch
of case (d): 16 prompts x 16 completions) are generated at once with sampling (temperature 1.0),
every completion run to `--completion` tokens (the preset's end-of-sequence token is set, and
`min_new_tokens` holds it back until then). A path is first run once (its warm-up: cache
allocation, and for the compiled path its compilation, at the measured shape: a static cache's
shape is the batch and the prompt and completion lengths, and a new one compiles again). Each path's
tokens/s is reported with its ratio to `generate`, measured in the same process. Before timing,
each path answers the first prompts greedily, and the output says whether its tokens are
`generate`'s (a path that is fast but answers otherwise is no replacement). Where they part, the
record says where and why it may: at the first token that differs, the two tokens' logits after
the same prefix in float32 (their margin) and the error of the model's own dtype on them (bf16
against float32); a margin inside that error is a near-tie that the dtype's rounding decides,
which kernels that add in another order may break either way (`within_dtype_error`), and one
outside it is a real difference.
Results: benchmarks/results/grpo_generation-<device>.json (or --out).
"""

import argparse
import functools
import json
import re
import time
from pathlib import Path

import torch

from medrecipes.models.scratch import PRESETS, preset_config

RESULTS = Path(__file__).resolve().parent / "results"
PATHS = ("generate", "continuous_batching", "static_cache", "static_compiled")
EOS = 2  # the end of sequence of the tokenizer the presets are pretrained with (medrecipes tiny-model: <|endoftext|>)
# A 2-layer model for a CPU run of the script itself (not in the pretraining table).
TINY = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 512}  # fmt: skip


def build_model(preset: str, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if preset == "tiny":
        config = LlamaConfig(max_position_embeddings=2048, **TINY)
    else:
        config = preset_config(preset)
    config.pad_token_id, config.eos_token_id, config.bos_token_id = 0, EOS, 1
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval()


def prompts(count: int, length: int, vocab: int, generations: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of `length` random ids, each repeated `generations` times (TRL's order)."""
    rng = torch.Generator().manual_seed(seed)
    unique = [torch.randint(3, vocab, (length,), generator=rng).tolist() for _ in range(count)]
    return [p for p in unique for _ in range(generations)]


def generation_config(new_tokens: int, sample: bool, **extra):
    from transformers import GenerationConfig

    # min_new_tokens: the end of sequence held back, every completion as long as a model that has not learned to stop
    return GenerationConfig(
        do_sample=sample, temperature=1.0 if sample else None, top_k=0 if sample else None, top_p=1.0,
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_id=EOS, pad_token_id=0, **extra,
    )  # fmt: skip


def run_path(
    path: str, model, batch: list[list[int]], new_tokens: int, sample: bool, backend: str = "inductor"
) -> list[list[int]]:
    """The completions (token ids) of `batch` by one path."""
    device = next(model.parameters()).device
    with torch.no_grad():
        if path == "continuous_batching":
            from transformers.generation.configuration_utils import ContinuousBatchingConfig

            # a cache of pages sized for the batch: by default it takes a share of the free memory
            pages = -(-len(batch) * (max(map(len, batch)) + new_tokens) // 256) + len(batch)
            found = model.generate_batch(
                batch, generation_config=generation_config(new_tokens, sample), progress_bar=False,
                continuous_batching_config=ContinuousBatchingConfig(page_size=256, num_blocks=pages),
            )  # fmt: skip
            return [found[key].generated_tokens for key in sorted(found, key=lambda k: int(k.split("_")[-1]))]
        width = max(map(len, batch))  # left-padded, as TRL pads its prompts
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        config = generation_config(new_tokens, sample)
        if path == "static_cache":  # as TRL 1.16 builds it: compilation off
            config.cache_implementation, config.disable_compile = "static", True
        if path == "static_compiled":
            from medrecipes.training.transformers_seams import compile_decoding

            config.cache_implementation = "static"
            compile_decoding(config, device.type, backend)
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return out[:, width:].tolist()


def divergences(model, check: list, expected: list, found: list) -> list[dict]:
    """Where each greedy answer first parts from `generate`'s, and whether the two tokens there are
    a tie within the model's dtype: their logits after the shared prefix in float32 (the margin of
    generate's token over the path's) against the model's own dtype's error on those two logits."""
    import copy

    reference, rows = None, []
    for index, (prompt, mine, theirs) in enumerate(zip(check, expected, found, strict=True)):
        if mine == theirs:
            continue
        shared = min(len(mine), len(theirs))
        at = next((k for k in range(shared) if mine[k] != theirs[k]), shared)
        row = {"prompt": index, "position": at}
        if at < shared:
            reference = reference or copy.deepcopy(model).float()
            ids = torch.tensor([prompt + mine[:at]], device=next(model.parameters()).device)
            with torch.no_grad():
                low = model(input_ids=ids).logits[0, -1].float()
                exact = reference(input_ids=ids).logits[0, -1].float()
            a, b = mine[at], theirs[at]
            error = ((low[a] - exact[a]).abs() + (low[b] - exact[b]).abs()).item()
            row.update(generate_token=a, path_token=b, margin=(exact[a] - exact[b]).item(), dtype_error=error)
            row["within_dtype_error"] = abs(row["margin"]) <= error
        else:  # one answer is a prefix of the other: a length, not a token, differs
            row["within_dtype_error"] = False
        rows.append(row)
    return rows


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(path: str, model, batch, new_tokens: int, options, check: list, expected) -> tuple[dict, list | None]:
    """The path's record (tokens/s, or the error it met) and its greedy answers to `check`."""
    record, device = {"path": path}, options.device
    run = functools.partial(run_path, path, model, backend=options.compile_backend)
    try:
        greedy = run(check, min(new_tokens, 32), sample=False)
        record["greedy_same_as_generate"] = expected is None or greedy == expected
        if not record["greedy_same_as_generate"]:
            record["greedy_divergences"] = divergences(model, check, expected, greedy)
            record["greedy_within_dtype_error"] = all(d["within_dtype_error"] for d in record["greedy_divergences"])
        warm = time.perf_counter()
        run(batch, new_tokens if path == "static_compiled" else min(new_tokens, 8), sample=True)
        synchronize(device)
        record["warmup_seconds"] = time.perf_counter() - warm
        start = time.perf_counter()
        completions = run(batch, new_tokens, sample=True)
        synchronize(device)
        seconds = time.perf_counter() - start
    except Exception as err:  # a path this transformers or device cannot take is reported, not fatal
        return {**record, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}, None
    tokens = sum(map(len, completions))
    record.update({"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds})
    if device == "cuda":
        record["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return record, greedy


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="medium-large", choices=[*PRESETS, "tiny"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=256, help="tokens per prompt (MedQA's are 200-300)")
    parser.add_argument("--completion", type=int, default=512)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, from {', '.join(PATHS)}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="static_compiled's torch.compile backend (aot_eager: a quick CPU check)",
    )
    parser.add_argument("--out", type=Path, help="the results file (default benchmarks/results/...)")
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    if unknown := set(paths) - set(PATHS):
        parser.error(f"unknown paths {sorted(unknown)}; from {', '.join(PATHS)}")
    if paths[0] != "generate":
        paths = ["generate", *[p for p in paths if p != "generate"]]  # the baseline first
    model = build_model(args.preset, args.device)
    batch = prompts(args.prompts, args.prompt_tokens, model.config.vocab_size, args.generations)
    check = batch[:: args.generations][:4]  # the first prompts, once each, answered greedily
    device = re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()) if args.device == "cuda" else "cpu"
    out = args.out or RESULTS / f"grpo_generation-{device.strip('-')}.json"
    records, expected = [], None
    for path in paths:
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        record, greedy = measure(path, model, batch, args.completion, args, check, expected)
        if path == "generate":
            expected = greedy
        records.append(record)
        print(json.dumps(record), flush=True)
        result = write_result(out, args, model, records, complete=path == paths[-1])  # a cut run keeps its paths
    for record in records:
        ratio = f", {record['ratio_to_generate']:.2f}x generate" if "ratio_to_generate" in record else ""
        speed = f"{record['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in record else record.get("error")
        same = record.get("greedy_same_as_generate")
        if "greedy_divergences" in record:
            same = f"{same} (where they part, a tie within the dtype's error: {record['greedy_within_dtype_error']})"
        print(f"{record['path']}: {speed}{ratio}; greedy tokens as generate's: {same}")
    return result


def write_result(out: Path, args, model, records: list[dict], complete: bool) -> dict:
    """The results file with the paths measured so far, each with its ratio to `generate`."""
    import transformers

    base = records[0].get("tokens_per_s")
    for record in records:
        if base and record.get("tokens_per_s"):
            record["ratio_to_generate"] = record["tokens_per_s"] / base
    result = {
        "case": {k: getattr(args, k) for k in ("preset", "prompts", "generations", "prompt_tokens", "completion")},
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "dtype": str(next(model.parameters()).dtype),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "complete": complete,
        "paths": records,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    partial.replace(out)
    return result


if __name__ == "__main__":
    main()
