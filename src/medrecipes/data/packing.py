"""Tokenise documents with EOS between them and pack them into fixed-length blocks.

Packing is TRL's `pack_dataset` with the "wrapped" strategy: documents are concatenated
and cut every `max_length` tokens, so no token is dropped. Each map batch ends in one
shorter block; TRL's `DataCollatorForLanguageModeling` pads it with labels of -100 by
position, so even those tokens train and the EOS token (often also the pad token) is learned.
"""

from trl import pack_dataset

# Documents per packing batch: one short block per this many documents.
PACK_BATCH_DOCUMENTS = 10_000


def pack_documents(documents, tokenizer, max_length: int, num_proc: int | None = None):
    """`documents` (a `text` column) as blocks of `max_length` token ids (`input_ids`)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token; documents could not be separated")

    def tokenize(batch):
        # The tokenizer's own special tokens (BOS where it adds one) start each document; EOS ends it.
        ids = tokenizer(list(batch["text"]))["input_ids"]
        return {"input_ids": [doc + [eos] for doc in ids]}

    map_kwargs = {"num_proc": num_proc} if num_proc and hasattr(documents, "num_rows") else {}
    tokenized = documents.map(tokenize, batched=True, remove_columns=["text"], **map_kwargs)
    return pack_dataset(
        tokenized, max_length, strategy="wrapped", map_kwargs={"batch_size": PACK_BATCH_DOCUMENTS, **map_kwargs}
    )
