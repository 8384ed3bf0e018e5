"""What BOS in front of every packed block does to a model's measured loss on held-out text.

Usage:

    python benchmarks/bos_packing.py                   # Gemma 3 270M (make install), real-check's dev abstracts
    python benchmarks/bos_packing.py --model DIR --data docs.jsonl --max-length 256

On the same documents and model, the mean token loss of:

- blocks cut every `max_length` tokens with no BOS put in front (the packing before this rule:
  almost every block starts mid-document, a start the model never sees in use);
- blocks packed as the recipes pack them now, each starting with BOS (counted in max_length);
- whole documents, each alone from BOS, as the model is used (`medrecipes perplexity`).

Writes benchmarks/results/bos_packing.json.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GEMMA = Path(sys.prefix) / "models" / "gemma-3-270m"
DEV_ABSTRACTS = ROOT / "outputs" / "real-check-gemma3-270m" / "data" / "abstracts_dev.jsonl"


@torch.no_grad()
def block_loss(model, blocks: list[list[int]]) -> tuple[float, int]:
    """Mean loss over every predicted token of the blocks, and the number of such tokens."""
    total, count = 0.0, 0
    for block in blocks:
        ids = torch.tensor([block], dtype=torch.long)
        logits = model(input_ids=ids).logits[0, :-1]
        total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
        count += len(block) - 1
    return total / count, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(GEMMA))
    parser.add_argument("--data", default=str(DEV_ABSTRACTS), help="JSONL documents with a text field")
    parser.add_argument("--max-length", type=int, default=256)
    args = parser.parse_args()
    if not Path(args.data).is_file():
        sys.exit(
            f"bos_packing: no {args.data}; run `make real-check MODEL=gemma3-270m` (its data stage) or pass --data"
        )

    from transformers import AutoModelForCausalLM

    from medrecipes.data.packing import adds_bos, pack_batch
    from medrecipes.evaluation.perplexity import document_perplexity
    from medrecipes.models.loading import load_tokenizer

    texts = [json.loads(line)["text"] for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line]
    tokenizer = load_tokenizer(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    bos = adds_bos(tokenizer)
    started = time.perf_counter()
    results = {"model": args.model, "data": args.data, "documents": len(texts), "max_length": args.max_length}
    for name, rule in (("blocks_without_bos", None), ("blocks_with_bos", bos)):
        blocks = pack_batch({"text": texts}, tokenizer, tokenizer.eos_token_id, args.max_length, bos=rule)["input_ids"]
        blocks = [[int(t) for t in b] for b in blocks if len(b) > 1]
        loss, tokens = block_loss(model, blocks)
        starts = sum(b[0] == bos for b in blocks)
        results[name] = {"loss": loss, "perplexity": math.exp(loss), "blocks": len(blocks), "tokens": tokens,
                         "blocks_starting_with_bos": starts}  # fmt: skip
    whole = document_perplexity(model, tokenizer, texts)
    results["whole_documents_from_bos"] = whole
    results["seconds"] = time.perf_counter() - started
    out = ROOT / "benchmarks" / "results" / "bos_packing.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
