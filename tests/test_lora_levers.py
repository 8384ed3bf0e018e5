"""The speed levers of LoRA SFT change how a step is computed, never what it computes: on the same
packed rows (padding-free, position ids restarting at each example, as the SFT recipe trains), the
loss and every adapter gradient are those of the plain path (no checkpointing, the whole batch at
once, no compilation) with activation checkpointing (which the memory plan turns off where the
run fits without it), with the batch split into micro-batches and accumulated (the micro-batch
shape), and with the model compiled (`torch_compile`; here with the `aot_eager` backend, the graph
capture without a C compiler's code generation)."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora_model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa",
    )  # fmt: skip
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    for name, parameter in model.named_parameters():  # B starts at zero: give it values, so A's gradient is not 0
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.02)
    return model


def packed_rows(rows: int = 4, length: int = 48):
    """Rows of several examples each, position ids restarting at every example; labels -100 on
    each example's first half (the prompt) as assistant-only loss leaves it."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 128, (rows, length), generator=generator)
    positions, labels = torch.zeros_like(ids), ids.clone()
    for row in range(rows):
        cuts = sorted(torch.randint(8, length - 8, (2,), generator=generator).tolist())
        for start, end in zip([0, *cuts], [*cuts, length], strict=True):
            positions[row, start:end] = torch.arange(end - start)
            labels[row, start : start + (end - start) // 2] = -100
    return {"input_ids": ids, "position_ids": positions, "labels": labels}


def loss_and_gradients(model, batch, micro_batch: int | None = None, forward=None):
    """The mean loss over every trained token of `batch` and the adapters' gradients, the batch
    run in micro-batches of `micro_batch` rows, each loss summed and divided by the whole batch's
    trained tokens (`num_items_in_batch`, as the trainer scales accumulated micro-batches).
    `forward`: the model as called (a compiled one), `model` holding the parameters. Without a
    cache, as TRL's SFTTrainer calls the model in training: a cache would keep transformers from
    reading the restarting position ids as packed examples, and the examples would see each other."""
    forward = model if forward is None else forward
    model.zero_grad()
    rows = batch["input_ids"].shape[0]
    step = micro_batch or rows
    trained = (batch["labels"][:, 1:] != -100).sum()
    total = 0.0
    for start in range(0, rows, step):
        part = {key: value[start : start + step] for key, value in batch.items()}
        logits = forward(input_ids=part["input_ids"], position_ids=part["position_ids"], use_cache=False).logits[
            :, :-1
        ]
        loss = (
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), part["labels"][:, 1:].reshape(-1), reduction="sum"
            )
            / trained
        )
        loss.backward()
        total += loss.item()
    gradients = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return total, gradients


def assert_same(found, expected, tolerance: float = 1e-5):
    (loss, gradients), (expected_loss, expected_gradients) = found, expected
    assert loss == pytest.approx(expected_loss, rel=tolerance)
    assert gradients.keys() == expected_gradients.keys() and len(gradients) == 2 * len(TARGETS) * 2
    for name, gradient in gradients.items():
        assert gradient.abs().sum() > 0, name
        torch.testing.assert_close(gradient, expected_gradients[name], rtol=tolerance, atol=1e-7, msg=name)


def test_activation_checkpointing_and_micro_batches_change_no_loss_or_gradient():
    model, batch = lora_model(), packed_rows()
    plain = loss_and_gradients(model, batch)
    assert_same(loss_and_gradients(model, batch, micro_batch=1), plain)  # 4 micro-batches of 1 row
    assert_same(loss_and_gradients(model, batch, micro_batch=2), plain)
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert model.base_model.model.is_gradient_checkpointing
    assert_same(loss_and_gradients(model, batch), plain)
    assert_same(loss_and_gradients(model, batch, micro_batch=2), plain)


def test_a_compiled_lora_model_trains_as_the_eager_one():
    model, batch = lora_model(), packed_rows()
    plain = loss_and_gradients(model, batch)
    compiled = torch.compile(model, backend="aot_eager")
    assert_same(loss_and_gradients(model, batch, forward=compiled), plain, tolerance=1e-4)
