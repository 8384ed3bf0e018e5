"""Reinforcement learning with GRPO (TRL's GRPOTrainer) on medical multiple-choice questions.

Usage:

    python recipes/grpo.py recipes/tiny_grpo.yaml
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/grpo.py recipes/grpo_usmle.yaml
    python recipes/grpo.py recipes/grpo_usmle.yaml --model_name_or_path outputs/pure-transformer-0p4b/final

Every `format: usmle` row becomes a prompt, a chat turn from `medrecipes.usmle.chat_messages`
(`prompt_format: chat`) or the plain "Question: ... Answer:" of `completion_prompt`
(`prompt_format: plain`), and keeps its gold letter and option texts for the rewards listed
under `rewards` (see `medrecipes.rewards`). `beta > 0` adds the KL divergence to the starting
model; `use_peft` trains a LoRA adapter; `use_vllm` generates with vLLM (colocate or server);
`embedding_learning_rate` gives the embeddings a learning rate of their own. Each eval set
reports its mean reward per function, KL and completion length, and for chat prompts the
greedy accuracy `eval_<name>_acc`; `eval_tasks` adds benchmark accuracy
(`medrecipes.training.eval_callback`). The final model (or adapter) goes to `output_dir/final`.
"""

import importlib.util

from medrecipes.config import parse_recipe
from medrecipes.data.grpo import fit_prompts, grpo_data
from medrecipes.errors import UserError, exit_on_user_error
from medrecipes.hub.push import push_run
from medrecipes.logs import setup_logging
from medrecipes.models.loading import check_model_settings, load_model, recipe_tokenizer
from medrecipes.runs.settle import settle_run
from medrecipes.training.callbacks import recipe_callbacks
from medrecipes.training.eval_callback import add_task_evaluation
from medrecipes.training.run import end_run, evaluate_and_record, train_and_save
from medrecipes.training.run_folder import claim_run_folder
from medrecipes.training.trainers import MedGRPOTrainer

from transformers import set_seed
from trl import get_peft_config

METHOD = "grpo"  # its entry in medrecipes.config.methods: the keys, data and settings of its runs


def main(recipe, training_args, model_args):
    setup_logging(training_args, recipe)
    set_seed(training_args.seed)

    if training_args.use_vllm and importlib.util.find_spec("vllm") is None:  # a recipe plans without it
        raise UserError(
            "use_vllm: vLLM is not installed; pip install 'trl[vllm]' (a GPU machine), "
            "or set use_vllm: false to generate with transformers"
        )
    if claim_run_folder(METHOD, recipe, training_args, model_args):  # True: this run finished there already
        return
    check_model_settings(model_args, recipe, training_args)  # against its config, before weights and data

    tokenizer = recipe_tokenizer(recipe, model_args)
    # What the run is, decided once and recorded in run.json: its chat template (chat prompts need
    # one), the room a prompt may take beside the completion, the reward functions with their
    # weights, the checkpoint it resumes from.
    run = settle_run(METHOD, recipe, training_args, model_args, tokenizer)
    chat = training_args.prompt_format == "chat"
    with training_args.main_process_first(desc="loading data"):
        train_dataset, eval_datasets, mcq_sets = grpo_data(recipe, training_args.prompt_format)

    # Prompts that would leave the completion no room in the model's positions are left out, counted.
    train_dataset = fit_prompts(train_dataset, tokenizer, run.prompt_room, "dataset_mixture")
    eval_datasets = {
        name: fit_prompts(d, tokenizer, run.prompt_room, f"eval_sets.{name}") for name, d in eval_datasets.items()
    }
    model = load_model(model_args, recipe, tokenizer, run.activation_checkpointing)

    trainer = MedGRPOTrainer(
        model=model,
        reward_funcs=list(run.reward_funcs),  # their weights: training_args.reward_weights
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=recipe_callbacks(recipe, training_args),
    )
    # At each evaluation: eval_tasks, and for chat prompts the greedy accuracy of the model's
    # answers on the eval sets. Plain-prompt runs report the sampled accuracy,
    # eval_<name>_rewards/usmle_accuracy/mean, and can list their eval sets in eval_tasks.
    add_task_evaluation(
        trainer, recipe, answered=mcq_sets if chat else None, max_new_tokens=training_args.max_completion_length
    )

    # With use_peft, final/ holds the adapter; a preempted run exits here, resumable.
    final_dir = train_and_save(trainer, run.resume_from)
    metrics = {}
    if eval_datasets:
        metrics = evaluate_and_record(trainer)  # with accuracy by subject for multiple-choice sets

    if training_args.push_to_hub:
        push_run(trainer, final_dir, metrics)
    end_run(trainer)


if __name__ == "__main__":
    exit_on_user_error(lambda: main(*parse_recipe(METHOD)))()
