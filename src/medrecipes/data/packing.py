"""Tokenise documents with EOS between them and pack them into fixed-length blocks.

Packing is "wrapped" (TRL's name for it): the documents of a batch of
`PACK_BATCH_DOCUMENTS` are concatenated and cut every `max_length` tokens, so no token is
dropped and each batch ends in one shorter block; TRL's `DataCollatorForLanguageModeling`
pads that block with labels of -100 by position, so even those tokens train and the EOS token
(often also the pad token) is learned.

Why not TRL's `pack_dataset`: it works on Arrow-formatted datasets, and an interleaved
streaming mixture has no Arrow path in `datasets`, which then converts it to Arrow one
document at a time (measured: 6 ms per block). Here one batched map tokenises a batch with the
Rust tokenizer, concatenates with numpy and cuts, for map-style and streaming data alike; no
Python loop runs per token (benchmarks/data_pipeline.py measures it). When the documents carry
a `source` column (the mixture's source index), each block also gets `source_tokens` and
`source_documents`: its tokens from each source, and the documents of each source ending in it.
"""

import numpy as np
import pyarrow as pa

from medrecipes.errors import UserError

# Documents per packing batch: one short block per this many documents.
PACK_BATCH_DOCUMENTS = 10_000


def token_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, with the tokenizer's own special tokens (BOS where it adds one)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    # The Rust tokenizer's batch call skips the offsets and Python-side work of tokenizer(...);
    # it gives the same ids unless the backend was left with truncation or padding switched on.
    if backend is not None and backend.truncation is None and backend.padding is None:
        return [encoding.ids for encoding in backend.encode_batch_fast(texts)]
    return tokenizer(texts)["input_ids"]


def _counts(rows: np.ndarray, sources: np.ndarray, blocks: int, num_sources: int) -> list[np.ndarray]:
    counts = np.zeros((blocks, num_sources), dtype=np.int64)
    np.add.at(counts, (rows, sources), 1)
    return list(counts)


def pack_batch(batch: dict, tokenizer, eos: int, max_length: int, num_sources: int | None = None) -> dict:
    """A batch of documents (`text`, optionally `source`) as packed blocks of token ids."""
    if not len(batch["text"]):
        return {"input_ids": []} | ({"source_tokens": [], "source_documents": []} if num_sources else {})
    ids = pa.array(token_ids(tokenizer, list(batch["text"])), type=pa.list_(pa.int32()))
    lengths = np.diff(ids.offsets.to_numpy()) + 1  # + EOS
    ends = np.cumsum(lengths)
    values = np.full(int(ends[-1]), eos, dtype=np.int32)
    is_text = np.ones(len(values), dtype=bool)
    is_text[ends - 1] = False
    values[is_text] = ids.flatten().to_numpy(zero_copy_only=False)
    cuts = np.arange(max_length, len(values), max_length)
    out = {"input_ids": np.split(values, cuts)}
    if num_sources and "source" in batch:
        sources = np.repeat(np.asarray(batch["source"], dtype=np.int64), lengths)
        rows = np.arange(len(values)) // max_length
        out["source_tokens"] = _counts(rows, sources, len(cuts) + 1, num_sources)
        out["source_documents"] = _counts(rows[ends - 1], sources[ends - 1], len(cuts) + 1, num_sources)
    return out


def pack_documents(documents, tokenizer, max_length: int, num_proc: int | None = None, num_sources: int | None = None):
    """`documents` (a `text` column) as blocks of `max_length` token ids (`input_ids`).

    With a `source` column and `num_sources`, each block also has `source_tokens` and
    `source_documents`. Works on a Dataset and on an IterableDataset.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UserError(
            f"tokenizer {tokenizer.name_or_path}: no EOS token, so packed documents could not be separated; "
            "use a tokenizer that has one (tokenizer_name_or_path)"
        )
    map_kwargs = {"num_proc": num_proc} if num_proc and hasattr(documents, "num_rows") else {}
    return documents.map(
        pack_batch,
        batched=True,
        batch_size=PACK_BATCH_DOCUMENTS,
        remove_columns=documents.column_names or (["text", "source"] if num_sources else ["text"]),
        fn_kwargs={"tokenizer": tokenizer, "eos": eos, "max_length": max_length, "num_sources": num_sources},
        **map_kwargs,
    )
