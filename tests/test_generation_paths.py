"""GRPO's generation without vLLM: transformers' continuous batching (paged attention), which TRL's
`use_transformers_continuous_batching` recipe key turns on, answers greedily with the same tokens
as HF `generate`, the path it replaces, on a CPU. Its speed is a GPU measurement
(benchmarks/gpu_session.sh); the key stays off by default until that figure says otherwise."""

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.generation.configuration_utils import ContinuousBatchingConfig


def _model() -> LlamaForCausalLM:
    """A random 2-layer Llama whose weights are large enough that greedy answers vary token by token."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, initializer_range=0.4, pad_token_id=0,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_continuous_batching_answers_greedily_as_generate_does():
    model = _model()
    torch.manual_seed(1)
    prompts = [torch.randint(1, 96, (n,)).tolist() for n in (3, 11, 7, 20)]  # of different lengths
    config = GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=-1, pad_token_id=0)
    with torch.no_grad():
        expected = [model.generate(torch.tensor([p]), generation_config=config)[0, len(p) :].tolist() for p in prompts]
        # A cache of a few pages: by default it takes a share of the free memory, which on a CPU is RAM.
        paged = ContinuousBatchingConfig(page_size=16, num_blocks=32, max_batch_tokens=64)
        answers = model.generate_batch(
            prompts, generation_config=config, continuous_batching_config=paged, progress_bar=False
        )
    assert all(len(set(tokens)) > 3 for tokens in expected)  # answers that vary, not one token repeated
    assert [answer.generated_tokens for answer in answers.values()] == expected


def test_a_compiled_static_cache_answers_greedily_as_generate_does():
    """`compile_generation`'s decoding (a static cache, its step compiled: CUDA graphs on a GPU),
    the GRPO path without vLLM, gives `generate`'s greedy tokens to left-padded prompts of
    different lengths, with the end of sequence set and held back to the full length. The graph is
    captured with the aot_eager backend here (inductor's C++ build takes a minute on a CPU); the
    benchmark checks inductor's on the measured model."""
    from medrecipes.training.transformers_seams import compile_decoding

    model = _model()
    model.config.eos_token_id = 95
    torch.manual_seed(1)
    prompts = [torch.randint(1, 95, (n,)).tolist() for n in (3, 11, 7, 20)]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    plain = GenerationConfig(do_sample=False, max_new_tokens=12, min_new_tokens=12, eos_token_id=95, pad_token_id=0)
    compiled = GenerationConfig(**plain.to_diff_dict(), cache_implementation="static")
    compile_decoding(compiled, "cpu", backend="aot_eager")
    assert compiled.compile_config.backend == "aot_eager" and compiled.disable_compile is False
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=mask, generation_config=plain)[:, width:]
        calls = []
        original = torch.compile
        with pytest.MonkeyPatch.context() as patch:  # generate compiles through torch.compile
            patch.setattr(torch, "compile", lambda *a, **k: calls.append(k) or original(*a, **k))
            answers = model.generate(input_ids=ids, attention_mask=mask, generation_config=compiled)[:, width:]
    assert calls and calls[0].get("backend") == "aot_eager"
    assert all(len(set(row)) > 3 for row in expected.tolist())
    assert answers.tolist() == expected.tolist()


def test_the_grpo_trainer_compiles_its_decoding_only_when_asked():
    """TRL 1.16 builds GRPO's generation config with compilation off; `compile_generation` turns it
    on (over the static cache the recipe check asks for), and nothing changes without it."""
    from types import SimpleNamespace

    from medrecipes.training.trl_seams import CompiledGenerationMixin

    class TRLLike:
        def __init__(self, asked: bool):
            self.args = SimpleNamespace(compile_generation=asked)
            self.generation_config = GenerationConfig(cache_implementation="static", disable_compile=True)
            self.accelerator = SimpleNamespace(device=torch.device("cpu"))

    class Trainer(CompiledGenerationMixin, TRLLike):
        pass

    asked, left = Trainer(True).generation_config, Trainer(False).generation_config
    assert asked.disable_compile is False and asked.compile_config.mode == "default"  # CUDA graphs on a GPU only
    assert left.disable_compile is True and left.compile_config is None
