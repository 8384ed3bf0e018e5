"""Continued pretraining (CPT) of a causal LM on medical text, or pretraining from scratch.

Usage:

    python recipes/cpt.py recipes/tiny_cpt.yaml
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/cpt.py recipes/gemma3_4b.yaml
    python recipes/cpt.py recipes/gemma3_4b.yaml --learning_rate 1e-5      # overrides the YAML

The recipe's `dataset_mixture` is tokenised with EOS between documents and packed into
blocks of `max_length` tokens (or read already packed from `built_data`, the folder
`medrecipes build-data RECIPE` writes); a streaming mixture saves its position with every
checkpoint and logs tokens per source. Each entry of `eval_sets` is reported as its own
`eval_<name>_loss` and `eval_<name>_perplexity`. A run whose `output_dir` already holds a
checkpoint resumes from the last complete one; SIGTERM or SIGUSR1 saves a checkpoint and exits 0.
The final model and tokenizer go to `output_dir/final`; with `push_to_hub`, to the Hub with a
model card that records the run.
"""

from medrecipes.config import parse_recipe
from medrecipes.data.pretraining import pretraining_data
from medrecipes.errors import UserError, exit_on_user_error
from medrecipes.hub.push import push_run
from medrecipes.logs import setup_logging
from medrecipes.models.loading import check_model_settings, load_model, recipe_tokenizer
from medrecipes.runs.settle import settle_run
from medrecipes.training.callbacks import recipe_callbacks
from medrecipes.training.eval_callback import add_task_evaluation
from medrecipes.training.run import end_run, eval_loss_summary, evaluate_and_record, train_and_save
from medrecipes.training.run_folder import claim_run_folder
from medrecipes.training.trainers import CausalLMTrainer

from transformers import set_seed
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

METHOD = "cpt"  # its entry in medrecipes.config.methods: the keys, data and settings of its runs


def main(recipe, training_args, model_args):
    logger = setup_logging(training_args, recipe)
    set_seed(training_args.seed)

    if claim_run_folder(METHOD, recipe, training_args, model_args):  # True: this run finished there already
        return
    check_model_settings(model_args, recipe, training_args)  # against its config, before weights and data

    tokenizer = recipe_tokenizer(recipe, model_args)
    run = settle_run(METHOD, recipe, training_args, model_args, tokenizer)  # decided once, in run.json
    with training_args.main_process_first(desc="tokenising and packing"):
        train_dataset, eval_datasets = pretraining_data(
            recipe, tokenizer, training_args.max_length, training_args.dataset_num_proc
        )
    if recipe.mixture.streaming and training_args.max_steps <= 0:
        raise UserError("recipe: a streaming mixture has no length; set max_steps or total_tokens")

    model = load_model(model_args, recipe, tokenizer, run.activation_checkpointing)

    trainer = CausalLMTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id),
        callbacks=recipe_callbacks(recipe, training_args),
    )
    add_task_evaluation(trainer, recipe)  # eval_tasks: benchmark accuracy at each evaluation

    final_dir = train_and_save(trainer, run.resume_from)  # a preempted run exits here, resumable
    metrics = {}
    if eval_datasets:
        metrics = evaluate_and_record(trainer)
        for line in eval_loss_summary(trainer.state.log_history):
            logger.info(line)

    if training_args.push_to_hub:
        push_run(trainer, final_dir, metrics)
    end_run(trainer)


if __name__ == "__main__":
    exit_on_user_error(lambda: main(*parse_recipe(METHOD)))()
