"""GRPO's generation without vLLM: transformers' continuous batching (paged attention), which TRL's
`use_transformers_continuous_batching` recipe key turns on, answers greedily with the same tokens
as HF `generate`, the path it replaces, on a CPU. Its speed is a GPU measurement
(benchmarks/gpu_session.sh); the key stays off by default until that figure says otherwise."""

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
