"""Tokenise + pack throughput of the data pipeline against a plain `datasets.map` baseline.

Usage:

    python benchmarks/data_pipeline.py                       # 100 MB of text, 2,048-token blocks
    python benchmarks/data_pipeline.py --size-mb 20 --max-length 4096

Nothing is downloaded. The text is synthesised from the sentences of the bundled
data/medical_text corpus (documents of 3 to 40 sentences in random order, seeded); the
tokenizer is a byte-level BPE trained on that corpus by `tokenizers` (medrecipes.models.tiny), a fast
tokenizer like those of GPT-2, Llama 3 or SmolLM2.

Measured in one process, on the same documents and tokenizer, with a fresh `datasets` cache:

- pipeline: `medrecipes.data.pack_documents` (the recipes' code): one batched map that hands
  each batch to the Rust tokenizer and concatenates and cuts with numpy;
- baseline: the usual `datasets.map(tokenizer)` then a second map that concatenates the token
  lists in Python and cuts them into blocks (as in transformers' run_clm example), with the same
  EOS between documents and the same batches, so that both produce the same blocks (checked);
- streaming: the pipeline over the same file read as an IterableDataset (what a streaming
  recipe runs), for reference;
- the tokenizer alone (its batch call on the same batches of documents, no `datasets`, no
  packing), the ceiling that any pipeline with this tokenizer can reach on this machine.

Throughput is tokens in the packed blocks per second of wall time, and per second of CPU time
of the process (all its threads): on a machine shared with other work the wall time measures
the contention as much as the code, while CPU time compares the two paths fairly.
"""

import argparse
import json
import os
import platform
import random
import re
import tempfile
import time
from itertools import chain
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "medical_text" / "train.jsonl"


def synthesise(path: Path, size_mb: float, seed: int = 0) -> int:
    """Write about `size_mb` MB of JSONL documents made of the corpus's sentences; returns the count."""
    texts = [json.loads(line)["text"] for line in CORPUS.open(encoding="utf-8")]
    sentences = [s for text in texts for s in re.split(r"(?<=[.!?]) ", text)]
    rng, size, count = random.Random(seed), 0, 0
    with path.open("w", encoding="utf-8") as f:
        while size < size_mb * 1e6:
            line = json.dumps({"text": " ".join(rng.choices(sentences, k=rng.randint(3, 40)))}) + "\n"
            f.write(line)
            size, count = size + len(line.encode()), count + 1
    return count


def baseline(documents, tokenizer, max_length: int, batch_size: int, bos: int | None):
    """datasets.map(tokenizer) + concatenate-and-chunk in Python, as transformers' run_clm does,
    with the pipeline's rule added: with `bos`, a block that starts mid-document gets BOS in front."""
    eos = tokenizer.eos_token_id

    def tokenize(batch):
        return {"input_ids": [ids + [eos] for ids in tokenizer(batch["text"])["input_ids"]]}

    def group(batch):
        tokens, blocks, i = list(chain.from_iterable(batch["input_ids"])), [], 0
        while i < len(tokens):
            head = [] if bos is None or tokens[i] == bos else [bos]
            blocks.append(head + tokens[i : i + max_length - len(head)])
            i += max_length - len(head)
        return {"input_ids": blocks}

    tokenized = documents.map(tokenize, batched=True, batch_size=batch_size, remove_columns=["text"])
    return tokenized.map(group, batched=True, batch_size=batch_size)


def timed(build) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of every thread of this process, result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = build()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=100.0)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # both paths may use every core

    import datasets
    import tokenizers
    import transformers

    from medrecipes.data import packing
    from medrecipes.data.packing import pack_documents
    from medrecipes.data.sources import load_source
    from medrecipes.data.stream import TokenStream
    from medrecipes.data_config import SourceConfig
    from medrecipes.models.tiny import train_tokenizer

    work = Path(tempfile.mkdtemp(prefix="medrecipes-bench-"))
    sample = work / "sample.jsonl"
    count = synthesise(sample, args.size_mb)
    tokenizer = train_tokenizer([str(CORPUS)], args.vocab_size)
    datasets.config.HF_DATASETS_CACHE = str(work / "cache")  # nothing reused between the runs below
    documents = datasets.load_dataset("json", data_files=str(sample), split="train", cache_dir=str(work / "cache"))

    texts = list(documents["text"])
    batches = [texts[i : i + packing.PACK_BATCH_DOCUMENTS] for i in range(0, len(texts), packing.PACK_BATCH_DOCUMENTS)]
    raw_s, raw_cpu, raw_tokens = timed(
        lambda: sum(len(ids) + 1 for batch in batches for ids in packing.token_ids(tokenizer, batch))
    )
    pipeline_s, pipeline_cpu, blocks = timed(lambda: pack_documents(documents, tokenizer, args.max_length))
    bos = packing.adds_bos(tokenizer)
    baseline_s, baseline_cpu, reference = timed(
        lambda: baseline(documents, tokenizer, args.max_length, packing.PACK_BATCH_DOCUMENTS, bos)
    )
    # The same pipeline cutting every max_length tokens with no BOS put in front (the rule before
    # blocks started with BOS), to see what the rule costs.
    adds_bos, packing.adds_bos = packing.adds_bos, lambda tokenizer: None
    plain_s, plain_cpu, plain = timed(lambda: pack_documents(documents, tokenizer, args.max_length))
    packing.adds_bos = adds_bos
    ours, theirs = (d.data.column("input_ids").combine_chunks() for d in (blocks, reference))
    tokens = len(ours.flatten())
    same = np.array_equal(ours.offsets, theirs.offsets) and np.array_equal(ours.flatten(), theirs.flatten())

    source = load_source(SourceConfig(path=str(sample)), streaming=True, tag=0)  # checked and tagged as in a mixture
    stream = TokenStream(pack_documents(source, tokenizer, args.max_length, num_sources=1), ["sample"], 0)
    read = zip(range(len(blocks)), stream, strict=False)
    stream_s, stream_cpu, streamed = timed(lambda: sum(len(block["input_ids"]) for _, block in read))

    results = {
        "sample_mb": round(sample.stat().st_size / 1e6, 1),
        "documents": count,
        "tokens": tokens,
        "blocks": len(blocks),
        "max_length": args.max_length,
        "bos_in_front_of_blocks": bos is not None,
        "tokenizer": f"byte-level BPE, {len(tokenizer):,} tokens",
        "tokens_per_s": {
            "pipeline": round(tokens / pipeline_s),
            "pipeline_without_bos": round(len(plain.data.column("input_ids").combine_chunks().flatten()) / plain_s),
            "baseline": round(tokens / baseline_s),
            "streaming": round(streamed / stream_s),
            "tokenizer_alone": round(raw_tokens / raw_s),
        },
        "tokens_per_cpu_s": {
            "pipeline": round(tokens / pipeline_cpu),
            "pipeline_without_bos": round(len(plain.data.column("input_ids").combine_chunks().flatten()) / plain_cpu),
            "baseline": round(tokens / baseline_cpu),
            "streaming": round(streamed / stream_cpu),
            "tokenizer_alone": round(raw_tokens / raw_cpu),
        },
        "speedup_wall": round(baseline_s / pipeline_s, 2),
        "speedup_cpu": round(baseline_cpu / pipeline_cpu, 2),
        "load_average": os.getloadavg(),
        "same_blocks": same,
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "versions": {
            "python": platform.python_version(),
            "datasets": datasets.__version__,
            "tokenizers": tokenizers.__version__,
            "transformers": transformers.__version__,
        },
    }
    print(json.dumps(results, indent=2))
    for kind in ("tokens_per_s", "tokens_per_cpu_s"):
        row = results[kind]
        print(
            f"| {kind} | "
            + " | ".join(f"{row[k]:,}" for k in ("pipeline", "baseline", "streaming", "tokenizer_alone"))
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
