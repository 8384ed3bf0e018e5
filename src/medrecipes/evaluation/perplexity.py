"""Perplexity of whole documents (`medrecipes perplexity`)."""

import torch

from medrecipes.errors import UserError
from medrecipes.evaluation.loglik import encode_text, max_context_length
from medrecipes.evaluation.statistics import BOOTSTRAP_RESAMPLES


@torch.no_grad()
def _document_loss(model, ids: list[int], window: int, stride: int) -> float:
    """The summed loss of every token of `ids` after the first, each scored once: in one pass where
    the document fits the `window`, else in windows that move `stride` tokens at a time, each
    scoring its new tokens with the window's earlier ones as their context (memory stays that of
    one window, however long the document)."""
    device = next(model.parameters()).device
    total, done, end = 0.0, 1, min(window, len(ids))
    while True:
        begin = max(0, end - window)
        chunk = torch.tensor([ids[begin:end]], device=device)
        logits = model(input_ids=chunk).logits[0, done - 1 - begin : end - 1 - begin].float()
        total += torch.nn.functional.cross_entropy(logits, chunk[0, done - begin :], reduction="sum").item()
        if end == len(ids):
            return total
        done, end = end, min(end + stride, len(ids))


def document_perplexity(model, tokenizer, texts: list[str], seed: int = 0, window: int | None = None) -> dict:
    """Perplexity of whole documents as the model is used: each document tokenized alone, with the
    tokenizer's special tokens (BOS in front where it adds one), every token after the first scored,
    one document per forward pass (no padding) where it fits the model's positions (`window`), and
    a document longer than that in windows moving half a window at a time (`_document_loss`), so
    that every token is scored with at least half a window of context; the output says how many
    documents that took and the stride. Packed training blocks would favour a model trained on
    that packing; this does not. The 95% interval comes from a seeded bootstrap over the documents
    (total loss over total tokens of each resample), None for one document; each document's loss
    and token count are returned too, for paired comparisons."""
    import numpy as np

    window = window or max_context_length(model, tokenizer)
    stride = max(window // 2, 1)
    losses, counts, windowed = [], [], 0
    for text in texts:
        ids = encode_text(tokenizer, text) if text.strip() else []  # spaces alone are no document to score
        if len(ids) < 2:
            continue
        windowed += len(ids) > window
        losses.append(_document_loss(model, ids, window, stride))
        counts.append(len(ids) - 1)
    if not counts:
        raise UserError("perplexity: no document has two tokens or more; pass documents with text")
    losses, counts = np.asarray(losses), np.asarray(counts)
    index = np.random.default_rng(seed).integers(0, len(counts), (BOOTSTRAP_RESAMPLES, len(counts)))
    resampled = np.exp(losses[index].sum(1) / counts[index].sum(1))
    low, high = np.percentile(resampled, [2.5, 97.5])
    loss = losses.sum() / counts.sum()
    return {
        "perplexity": float(np.exp(loss)),
        "ci95": [float(low), float(high)] if len(counts) > 1 else None,  # one document: no spread to resample
        "loss": float(loss),
        "documents": len(counts),
        "left_out": len(texts) - len(counts),  # empty, spaces alone, or a single token: nothing to score
        "tokens": int(counts.sum()),
        # Documents longer than the model's positions, scored in windows of `window` tokens that
        # move `stride` at a time.
        "windowed_documents": windowed,
        "window": window,
        "stride": stride,
        # Each document's summed loss and scored tokens, in order: two models' figures on the same
        # documents can be compared pair by pair.
        "document_losses": losses.tolist(),
        "document_tokens": counts.tolist(),
    }
