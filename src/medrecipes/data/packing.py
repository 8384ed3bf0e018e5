"""Tokenise documents with EOS between them and pack them into fixed-length blocks.

Packing is "wrapped" (TRL's name for it): the documents of a batch of
`PACK_BATCH_DOCUMENTS` are concatenated and cut every `max_length` tokens, so no token is
dropped and each batch ends in one shorter block. Where the tokenizer puts BOS in front of a text
(Gemma, Llama 3), every block starts with BOS, counted in `max_length`: a block that would start
mid-document gets one in front. A model never sees text without it in use, so a block without it
would make the base model's loss look worse than it is and spend training on a start that never
occurs (Gemma 3 270M on held-out abstracts: 3.59 on mid-document windows, 2.27 with BOS put back).
TRL's `DataCollatorForLanguageModeling`
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


def adds_bos(tokenizer) -> int | None:
    """The BOS token id where the tokenizer puts one in front of a text (Gemma, Llama 3), else None."""
    bos = getattr(tokenizer, "bos_token_id", None)
    return bos if bos is not None and token_ids(tokenizer, ["a"])[0][:1] == [bos] else None


def block_starts(values: np.ndarray, max_length: int, bos: int | None) -> np.ndarray:
    """Where each block starts in the token stream `values`. With `bos`, a block that would start
    mid-document takes one token fewer, for the BOS put in front of it; one that starts at a
    document's own BOS takes `max_length`. Each start depends on the one before, so this walks
    block by block (a few thousand steps a batch), never token by token."""
    if bos is None:
        return np.arange(0, len(values), max_length)
    starts, position = [], 0
    while position < len(values):
        starts.append(position)
        position += max_length if values[position] == bos else max_length - 1
    return np.asarray(starts, dtype=np.int64)


def pack_batch(
    batch: dict, tokenizer, eos: int, max_length: int, num_sources: int | None = None, bos: int | None = None
) -> dict:
    """A batch of documents (`text`, optionally `source`) as packed blocks of token ids; with
    `bos`, every block starts with it (counted in `max_length`), as the model sees text in use."""
    if not len(batch["text"]):
        return {"input_ids": []} | ({"source_tokens": [], "source_documents": []} if num_sources else {})
    ids = pa.array(token_ids(tokenizer, list(batch["text"])), type=pa.list_(pa.int32()))
    lengths = np.diff(ids.offsets.to_numpy()) + 1  # + EOS
    ends = np.cumsum(lengths)
    values = np.full(int(ends[-1]), eos, dtype=np.int32)
    is_text = np.ones(len(values), dtype=bool)
    is_text[ends - 1] = False
    values[is_text] = ids.flatten().to_numpy(zero_copy_only=False)
    starts = block_starts(values, max_length, bos)
    inserted = starts[values[starts] != bos] if bos is not None else starts[:0]
    # np.insert puts each BOS just before its block's first token, so block k starts at its old
    # start plus the BOS tokens inserted before it.
    packed = np.insert(values, inserted, bos) if len(inserted) else values
    new_starts = starts + np.searchsorted(inserted, starts, side="left") if len(inserted) else starts
    out = {"input_ids": np.split(packed, new_starts[1:])}
    if num_sources and "source" in batch:
        sources = np.repeat(np.asarray(batch["source"], dtype=np.int64), lengths)
        rows = np.repeat(np.arange(len(starts)), np.diff(np.append(new_starts, len(packed))))
        # An inserted BOS counts for the source of the token it stands before.
        packed_sources = np.insert(sources, inserted, sources[inserted]) if len(inserted) else sources
        out["source_tokens"] = _counts(rows, packed_sources, len(starts), num_sources)
        end_rows = np.searchsorted(starts, ends - 1, side="right") - 1
        out["source_documents"] = _counts(end_rows, sources[ends - 1], len(starts), num_sources)
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
    bos = adds_bos(tokenizer)
    if bos is not None and max_length < 2:
        raise UserError(f"max_length: {max_length} leaves no room beside BOS in a block; use at least 2")
    map_kwargs = {"num_proc": num_proc} if num_proc and hasattr(documents, "num_rows") else {}
    return documents.map(
        pack_batch,
        batched=True,
        batch_size=PACK_BATCH_DOCUMENTS,
        remove_columns=documents.column_names or (["text", "source"] if num_sources else ["text"]),
        fn_kwargs={
            "tokenizer": tokenizer,
            "eos": eos,
            "max_length": max_length,
            "num_sources": num_sources,
            "bos": bos,
        },
        **map_kwargs,
    )
