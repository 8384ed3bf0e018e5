"""Attention for Gemma 3's sliding-window layers and for packed rows: the kernels a recipe may name
(`attn_implementation`) give the loss and gradients of eager attention, and rows packed with
position ids that restart attend within their own document only. FlexAttention has no backward
pass on a CPU (torch raises); it is compared on a GPU (tests marked gpu)."""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

# Two layers, one of each kind, and a window (8) shorter than both packed documents (15 and 25).
CONFIG = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, sliding_window=8, max_position_embeddings=256,
    layer_types=["sliding_attention", "full_attention"],
)  # fmt: skip
LENGTHS = (15, 25)


def _model(attention: str) -> Gemma3ForCausalLM:
    torch.manual_seed(0)
    return Gemma3ForCausalLM._from_config(Gemma3TextConfig(**CONFIG), attn_implementation=attention).float()


def _packed_batch():
    torch.manual_seed(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (1, sum(LENGTHS)))
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    return ids, positions


def _loss_and_grads(attention: str):
    model = _model(attention)
    ids, positions = _packed_batch()
    # As the trainers run it: no cache, so transformers reads the documents from the position ids.
    loss = model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.item(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_sdpa_gives_eager_attentions_loss_and_gradients_on_packed_sliding_window_rows():
    eager_loss, eager_grads = _loss_and_grads("eager")
    sdpa_loss, sdpa_grads = _loss_and_grads("sdpa")
    assert sdpa_loss == pytest.approx(eager_loss, abs=1e-6)
    assert eager_grads.keys() == sdpa_grads.keys()
    for name, grad in eager_grads.items():
        torch.testing.assert_close(sdpa_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_packed_document_sees_only_itself(attention):
    """The second document's logits in the packed row are its logits alone: nothing of the first
    one reaches it, through the full layer or the sliding-window one."""
    model = _model(attention).eval()
    ids, positions = _packed_batch()
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, LENGTHS[0] :]
        alone = model(input_ids=ids[:, LENGTHS[0] :], use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-4)


def test_flex_attention_has_no_backward_on_a_cpu():
    """Why FlexAttention is measured on a GPU only: should torch learn its CPU backward, this test
    fails, and the comparison above should take it in."""
    model = _model("flex_attention")
    ids, positions = _packed_batch()
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        model(input_ids=ids, position_ids=positions, labels=ids, use_cache=False).loss.backward()
