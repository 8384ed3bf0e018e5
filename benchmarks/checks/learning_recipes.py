"""The learning check's recipes, settings and stages as data (benchmarks/real_learning_gemma.py):
which recipe each stage runs, the folders a recipe's runs take seed by seed, the DPO runs, and the
GPU run's settings."""

LABELS = {"A": "yes", "B": "no", "C": "maybe"}  # PubMedQA's answers by letter
RECIPES = {
    "sft-free": "recipes/gemma3_270m_sft_pubmedqa_free.yaml",
    "grpo-free": "recipes/gemma3_270m_grpo_pubmedqa_free.yaml",
    "dpo-free": "recipes/gemma3_270m_dpo_pubmedqa_free.yaml",
    "sft-long": "recipes/gemma3_270m_sft_pubmedqa_long.yaml",
    "grpo-free-rationale": "recipes/gemma3_270m_grpo_pubmedqa_free_rationale.yaml",
    "grpo-long": "recipes/gemma3_270m_grpo_pubmedqa_long.yaml",
}
SETTINGS = {"free": "reasoning_free", "required": "reasoning_required"}
FOLDERS = (
    "sft-free",
    "grpo-free",
    "dpo-free",
    "preference-gold-free",
    "pass-rate-free",
    "sft-long",
    "grpo-free-rationale",
    "pass-rate-free-rationale",
    "grpo-long",
    "pass-rate-long",
)  # a recipe's, seed by seed
VALIDATION = 50  # of the 350 training questions
# Each seed's DPO runs, from its SFT model with the DPO recipe: its folder, the pairs it trains on
# ("gold": each question's answer against a wrong one drawn with the seed; "own": the SFT model's
# right and wrong sampled answers) and its changes to the recipe. Gold pairs at the recipe's rate
# won on validation before the stages had parts (docs/real-model.md has those runs).
DPO_RUNS = (("dpo-free", "gold", {}),)
PAIRS = {"own": "preference-free", "gold": "preference-gold-free"}  # where each seed's pairs file goes
# On a GPU: bf16, LoRA adapters (r 32 on every projection: 15 MB each in float32, within what a call
# of the GPU machine brings back), and far more training than the CPU stages.
GPU = ["--use_cpu", "false", "--dtype", "bfloat16", "--bf16", "true", "--report_to", "none"]
LORA = ["--use_peft", "true", "--lora_r", "32", "--lora_alpha", "64",
        "--lora_target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"]  # fmt: skip
GRPO_STEPS = ["--max_steps", "100", "--save_steps", "25", "--eval_steps", "25", "--learning_rate", "1e-5",
              "--sync_ref_model", "false"]  # fmt: skip  # TRL syncs no reference model under LoRA
GPU_STAGES = {
    "sft-free": [*GPU, *LORA, "--num_train_epochs", "12", "--learning_rate", "3e-4"],
    "grpo-free": [*GPU, *LORA, *GRPO_STEPS],
    "sft-long": [
        *GPU,
        "--num_train_epochs",
        "12",
        "--per_device_train_batch_size",
        "8",
        "--gradient_accumulation_steps",
        "1",
    ],  # fmt: skip
    "grpo-long": [*GPU, *LORA, *GRPO_STEPS],
}
# Generation and reading of an answer that writes the conclusion first, and of a short rationale
LONG_ANSWERS = ("--chain_of_thought", "--max_new_tokens", "160")
RATIONALE = ("--chain_of_thought", "--max_new_tokens", "64")
