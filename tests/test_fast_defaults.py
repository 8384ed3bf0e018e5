"""The recipes' speed settings leave the training maths alone: the chunked LM head gives the
model's own loss, and packed examples attend only to themselves with every attention. The cases
marked `gpu` check the CUDA paths (TRL's Triton LM head, sdpa's CUDA kernels) on a GPU, in float32
with TF32 off and in bfloat16; Liger's kernels, which patch model classes for the process, are
checked in subprocesses (test_gpu.py)."""

import contextlib

import pytest
import torch
from conftest import NO_EVAL
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from medrecipes.config import parse_recipe
from medrecipes.training.trainers import CausalLMTrainer

# Where each test runs: (device, model dtype); the GPU's float32 runs with TF32 off.
ON_CPU = pytest.param("cpu", torch.float32, id="cpu")
ON_GPU = [
    pytest.param("cuda", torch.float32, id="cuda-fp32", marks=pytest.mark.gpu),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=pytest.mark.gpu),
]


def device_flags(device: str) -> list[str]:
    """Recipe keys for a trainer on `device` whose loss is called directly: no autocast, no TF32,
    no Liger (its patches would stay for the rest of the process)."""
    if device == "cpu":
        return ["--use_cpu", "true"]
    return ["--use_cpu", "false", "--bf16", "false", "--tf32", "false", "--use_liger_kernel", "false"]


def cpt_trainer(tiny_model, tmp_path, *overrides, dtype=torch.float32):
    _, args, _ = parse_recipe(
        "cpt",
        [
            "recipes/tiny_cpt.yaml",
            "--model_name_or_path",
            tiny_model,
            "--output_dir",
            str(tmp_path),
            *NO_EVAL,
            "--report_to",
            "none",
            *overrides,
        ],
    )
    torch.manual_seed(0)
    return CausalLMTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model, dtype=dtype),
        args=args,
        train_dataset=Dataset.from_dict({"input_ids": [[5, 6, 7]]}),
        processing_class=AutoTokenizer.from_pretrained(tiny_model),
        data_collator=DataCollatorForLanguageModeling(pad_token_id=0),
    )


def test_recipe_defaults_are_the_fast_ones(tmp_path):
    _, cpt, _ = parse_recipe("cpt", ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    _, sft, _ = parse_recipe("sft", ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--use_cpu", "true"])
    assert cpt.fused_lm_head is None and not cpt.logging_nan_inf_filter  # on where a GPU trains
    assert cpt.use_liger_kernel is False  # Liger needs a GPU
    assert sft.packing and sft.packing_strategy == "bfd" and not sft.logging_nan_inf_filter
    assert cpt.report_to == sft.report_to == ["tensorboard"]  # the default, also for a recipe without the key
    _, off, _ = parse_recipe(
        "cpt",
        ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--use_cpu", "true", "--fused_lm_head", "false"],
    )
    assert off.fused_lm_head is False


def test_chunked_lm_head_is_on_where_a_gpu_trains(tiny_model, tmp_path):
    from types import SimpleNamespace

    from medrecipes.training.mixins import fused_lm_head_on

    assert cpt_trainer(tiny_model, tmp_path / "auto", "--use_cpu", "true").fused_lm_head is False
    assert cpt_trainer(tiny_model, tmp_path / "on", "--use_cpu", "true", "--fused_lm_head", "true").fused_lm_head
    assert fused_lm_head_on(SimpleNamespace(fused_lm_head=None, device=torch.device("cuda")))
    assert not fused_lm_head_on(SimpleNamespace(fused_lm_head=False, device=torch.device("cuda")))


@pytest.mark.parametrize("device,dtype", [ON_CPU, *ON_GPU])
def test_chunked_lm_head_gives_the_models_own_loss(tiny_model, tmp_path, device, dtype):
    generator = torch.Generator().manual_seed(0)
    batch = DataCollatorForLanguageModeling(pad_token_id=0)(
        [{"input_ids": torch.randint(5, 1000, (n,), generator=generator).tolist()} for n in (24, 17)]
    )
    losses = {}
    for fused in ("true", "false"):
        flags = ["--fused_lm_head", fused, *device_flags(device)]
        trainer = cpt_trainer(tiny_model, tmp_path / fused, *flags, dtype=dtype)
        loss, outputs = trainer.compute_loss(trainer.model, trainer._prepare_inputs(dict(batch)), return_outputs=True)
        loss.backward()
        grad = trainer.model.lm_head.weight.grad.float().cpu()
        losses[fused] = (loss.item(), grad, getattr(outputs, "logits", None))
    assert losses["true"][2] is None  # no (batch, length, vocabulary) tensor was made
    assert losses["false"][2] is not None
    if dtype == torch.float32:
        assert losses["true"][0] == pytest.approx(losses["false"][0], rel=1e-5)
        torch.testing.assert_close(losses["true"][1], losses["false"][1], rtol=1e-4, atol=1e-6)
    else:
        # The chunked head sums its logits in float32 where the plain head rounds them to bf16 first.
        assert losses["true"][0] == pytest.approx(losses["false"][0], rel=1e-2)
        scale = losses["false"][1].abs().max().item()
        torch.testing.assert_close(losses["true"][1], losses["false"][1], rtol=5e-2, atol=2e-2 * scale)


def test_chunked_lm_head_scores_only_labelled_positions_on_a_cpu(tiny_model, tmp_path, monkeypatch):
    """A completion-only row (SFT's prompt, GRPO's and DPO's prompt, masked): the head projects the
    labelled positions alone once a recipe's trainer is made, with the loss and gradients of
    projecting every position and zeroing the rest (TRL's own choice off CUDA)."""
    import trl.trainer.utils as trl_utils

    from medrecipes.training import trl_seams

    monkeypatch.setattr(trl_utils, "_use_triton", trl_utils._use_triton)  # restored after the test
    scored = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def counting(hidden, *rest):
        scored.append(hidden.shape[0])
        return apply(hidden, *rest)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", counting)
    generator = torch.Generator().manual_seed(0)
    batch = DataCollatorForLanguageModeling(pad_token_id=0)(
        [{"input_ids": torch.randint(5, 1000, (n,), generator=generator).tolist()} for n in (24, 17)]
    )
    batch["labels"][:, :12] = -100  # the prompts; the padding of the short row is -100 already
    labelled = int((batch["labels"][:, 1:] != -100).sum())
    results = []
    for name, labelled_only in (("all", False), ("labelled", True)):
        trainer = cpt_trainer(tiny_model, tmp_path / name, "--use_cpu", "true", "--fused_lm_head", "true")
        if not labelled_only:
            monkeypatch.setattr(trl_utils, "_use_triton", lambda device: False)  # TRL's choice on a CPU
        loss = trainer.compute_loss(trainer.model, trainer._prepare_inputs(dict(batch)))
        loss.backward()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        results.append((loss.item(), grads, scored.pop()))
    (all_loss, all_grads, all_rows), (loss, grads, rows) = results
    assert all_rows == 2 * 24 - 2 and rows == labelled < all_rows
    assert loss == pytest.approx(all_loss, rel=1e-6)
    assert grads.keys() == all_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, all_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    # Once per process; a TRL without the function is left as it is.
    chosen = trl_utils._use_triton
    trl_seams.score_labelled_positions_only()
    assert trl_utils._use_triton is chosen and chosen(torch.device("cpu")) and chosen(torch.device("mps"))
    monkeypatch.delattr(trl_utils, "_use_triton")
    trl_seams.score_labelled_positions_only()
    assert not hasattr(trl_utils, "_use_triton")


@pytest.mark.parametrize(
    "device,attention",
    [("cpu", "sdpa"), ("cpu", "eager"), pytest.param("cuda", "sdpa", id="cuda-sdpa", marks=pytest.mark.gpu)],
)
def test_packed_examples_attend_only_to_themselves(chat_model, tmp_path, device, attention):
    """A padding-free row (TRL's collator: restarting position_ids, no attention mask) gives
    each example the loss it has alone: transformers builds the block-diagonal mask, as long
    as no KV cache is made, and TRL's SFT loss asks for none. In float32: the leak it rules out
    is smaller than bfloat16's rounding."""
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    model = AutoModelForCausalLM.from_pretrained(chat_model, attn_implementation=attention)
    generator = torch.Generator().manual_seed(0)
    examples = [{"input_ids": torch.randint(5, 1000, (n,), generator=generator).tolist()} for n in (23, 9, 31)]
    _, args, _ = parse_recipe(
        "sft",
        ["--model_name_or_path", chat_model, "--output_dir", str(tmp_path), "--report_to", "none"]
        + ["--max_length", "64", *device_flags(device)],
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(examples), processing_class=tokenizer)
    packed = trainer.data_collator(examples)
    assert "attention_mask" not in packed and packed["input_ids"].shape == (1, 63)

    def loss_of(batch) -> float:
        return trainer.compute_loss(model, trainer._prepare_inputs(dict(batch))).item()

    with torch.no_grad():
        alone = [loss_of(trainer.data_collator([e])) for e in examples]
        together = loss_of(packed)
        # The same row with a mask of ones lets each example see the ones before it.
        leaking = loss_of({**packed, "attention_mask": torch.ones_like(packed["input_ids"])})
    targets = [len(e["input_ids"]) - 1 for e in examples]  # each example's first token has no label
    expected = sum(loss * n for loss, n in zip(alone, targets, strict=True)) / sum(targets)
    # A random model's predictions barely depend on context, so the leak (about 1e-4 of the loss)
    # is small, but far above the rounding of either device.
    assert abs(together - expected) < (1e-6 if device == "cpu" else 1e-5) * expected
    assert abs(leaking - expected) > 2e-5 * expected


class _HostReads(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the host's reads of tensor values (each a wait for the device on a GPU)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reads += func.overloadpacket is torch.ops.aten._local_scalar_dense
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_sft_metrics_read_once_per_log_with_trls_loss_and_values(tiny_model, tmp_path, packing):
    """The SFT trainer's per-batch metrics (entropy, token accuracy, tokens) stay on the device until
    the trainer logs: the loss and every gradient are TRL's, the logged values TRL's, in training
    and evaluation, and computing the loss reads nothing on the host."""
    import copy

    from trl import SFTConfig

    from medrecipes.training.trl_seams import DeferredSFTMetricsMixin

    class Deferred(DeferredSFTMetricsMixin, SFTTrainer):
        pass

    generator = torch.Generator().manual_seed(0)
    rows = {"input_ids": [], "completion_mask": []}
    for prompt, answer in ((9, 3), (14, 2), (6, 4), (11, 3)):
        rows["input_ids"].append(torch.randint(5, 500, (prompt + answer,), generator=generator).tolist())
        rows["completion_mask"].append([0] * prompt + [1] * answer)
    data = Dataset.from_dict(rows)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    results = []
    for name, trainer_class in (("trl", SFTTrainer), ("deferred", Deferred)):
        args = SFTConfig(
            output_dir=str(tmp_path / name), use_cpu=True, report_to="none", packing=packing, max_length=64,
            completion_only_loss=True, per_device_train_batch_size=2,
        )  # fmt: skip
        trainer = trainer_class(
            model=copy.deepcopy(model), args=args, train_dataset=data,
            processing_class=AutoTokenizer.from_pretrained(tiny_model),
        )  # fmt: skip
        prepared = trainer.train_dataset
        losses, census, forward = [], _HostReads(), _HostReads()
        # two micro-batches, then one log (packed: the four examples fill one row)
        for part in [[0, 1], [2, 3]] if not packing else [list(range(len(prepared)))]:
            batch = trainer._prepare_inputs(trainer.data_collator([prepared[i] for i in part]))
            with census if trainer_class is Deferred else contextlib.nullcontext():
                loss = trainer.compute_loss(trainer.model, batch)
            with forward, torch.no_grad():  # what the model's forward reads itself (packed rows: their mask)
                trainer.model(**{k: v for k, v in batch.items() if k != "labels"})
            loss.backward()
            losses.append(loss.item())
        if trainer_class is Deferred:
            assert census.reads == forward.reads
        grads = {n: p.grad for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.log({"loss": losses[-1]})
        trainer.model.eval()
        with torch.no_grad():
            trainer.compute_loss(trainer.model, batch)
        trainer.log({"eval_loss": 0.0})
        results.append((losses, grads, trainer.state.log_history))
    (trl_losses, trl_grads, trl_logs), (losses, grads, logs) = results
    assert losses == pytest.approx(trl_losses, rel=1e-6)
    assert grads.keys() == trl_grads.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, trl_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    for ours, theirs in zip(logs, trl_logs, strict=True):
        assert ours.keys() == theirs.keys() and ours.keys() & {"entropy", "eval_entropy"}
        for key in ours.keys() - {"epoch", "step"}:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-6), key
