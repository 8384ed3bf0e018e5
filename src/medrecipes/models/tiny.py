"""Tiny random models with a locally trained tokenizer, for tests and the demo.

Nothing here touches a hub: the tokenizer is a byte-level BPE trained by `tokenizers` on
local text files, with BOS/EOS/pad tokens and a ChatML chat template; the model is a
2-layer random network of the requested architecture family. Both are saved with
`save_pretrained`, so every loading path of the recipes is exercised on a local folder.
"""

import json
import logging
import os
from pathlib import Path

from datasets.exceptions import DatasetGenerationError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

from medrecipes.errors import UserError, bad_line, check_text_file, merged_csv_rows, not_utf8, unreadable
from medrecipes.locations import data_file
from medrecipes.models.templates import chat_template

logger = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ARCHITECTURES = {"llama": LlamaConfig, "qwen2": Qwen2Config, "gemma3_text": Gemma3TextConfig}


def _strings(value):
    """Every text in a JSON value: a row's fields, a conversation's turns, nested as they come."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _strings(item)


def _read_texts(corpus: list[str]):
    """Each line of a text file, the strings of each JSON line or of a JSON document, the cells of
    each CSV or Parquet row (a CSV's header names the columns and is no text)."""
    for path in corpus:
        if path.endswith((".csv", ".parquet")):
            from datasets import load_dataset

            csv = path.endswith(".csv")
            options = {"keep_default_na": False} if csv else {}
            rows = load_dataset("csv" if csv else "parquet", data_files=data_file(path), split="train", **options)
            for row in rows:
                yield (
                    " ".join(str(cell) for cell in row.values() if cell is not None)
                    if csv
                    else " ".join(_strings(row))
                )
            continue
        with open(path, encoding="utf-8") as f:
            lines = f
            if path.endswith(".json"):  # one document (PubMedQA's, keyed by id): its texts, not its syntax
                text = f.read()
                try:
                    document = json.loads(text)
                except json.JSONDecodeError:  # JSON Lines named .json, which datasets reads as such too
                    lines = text.splitlines()
                else:
                    yield from _strings(document)
                    continue
            for line in lines:
                if path.endswith((".jsonl", ".json")):
                    yield " ".join(_strings(json.loads(line))) if line.strip() else ""
                else:
                    yield line


def train_tokenizer(corpus: list[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on `corpus` (text, JSON, JSONL, CSV or Parquet files)."""
    missing = [p for p in corpus if not os.path.isfile(p)]
    if missing:
        what = "is a folder" if os.path.isdir(missing[0]) else "does not exist"
        raise UserError(
            f"tiny-model: corpus file {missing[0]} {what}; pass --corpus FILE (text, JSONL, CSV or Parquet)"
        )
    for path in corpus:  # a bad file is one line, naming its line, before the tokenizer's trainer reads it
        check_text_file(path, "tiny-model: corpus")  # empty, blank, or not UTF-8 (.txt, .json, .jsonl, .csv)
        if found := bad_line([path]):  # a JSON record or CSV row that does not parse, a Parquet file that does not
            raise UserError(f"tiny-model: corpus {found}")
        if found := merged_csv_rows(path):  # rows a quote left open joined: read, said
            logger.warning("tiny-model: corpus %s", found)
        try:  # what the checks cannot see: a CSV's quote left open; a file of another suffix, read as lines
            for _ in _read_texts([path]):
                pass
        except UnicodeDecodeError as err:
            raise not_utf8(f"tiny-model: corpus {path}", err) from None
        except DatasetGenerationError as err:
            raise unreadable(f"tiny-model: corpus {path}", err, [path]) from None
    if not any(text.strip() for text in _read_texts(corpus)):
        raise UserError(
            f"tiny-model: the corpus ({', '.join(corpus)}) holds no text to learn a tokenizer from; pass text, "
            "JSONL, CSV or Parquet files with text in them (--corpus FILE ...)"
        )
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_read_texts(corpus), trainer=trainer)
    bos = backend.token_to_id("<|bos|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|bos|>",
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        chat_template=chat_template("chatml"),
        model_max_length=2048,
    )


def tiny_config(arch: str, tokenizer, hidden_size: int = 64, num_layers: int = 2):
    if arch not in ARCHITECTURES:
        raise UserError(f"tiny-model: unknown --arch '{arch}'; one of {', '.join(ARCHITECTURES)}")
    extra = {"head_dim": 16, "sliding_window": 64} if arch == "gemma3_text" else {}
    return ARCHITECTURES[arch](
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **extra,
    )


def build_tiny_model(
    out_dir: str,
    corpus: list[str],
    arch: str = "llama",
    vocab_size: int = 1024,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
):
    """Save a random `num_layers`-layer `arch` model and its tokenizer to `out_dir`; returns the path."""
    import torch

    tokenizer = train_tokenizer(corpus, vocab_size)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, tokenizer, hidden_size, num_layers))
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
