"""Supervised fine-tuning (full, LoRA or QLoRA) with TRL's SFTTrainer, on medical
multiple-choice questions or any chat dataset.

Usage:

    python recipes/sft.py recipes/tiny_sft.yaml
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/sft.py recipes/medgemma_4b_qlora.yaml
    python recipes/sft.py recipes/gemma2_2b_lora.yaml --learning_rate 1e-4      # overrides the YAML

Sources with `format: usmle` (MedQA, MedMCQA, MMLU, PubMedQA, ... detected per file) become
conversations: the question and its options as the user turn, the answer as the assistant
turn; `format: chat` sources are used as they are (messages or prompt/completion). `subjects`
trains on those subjects only. Every `format: usmle` eval set also reports answer accuracy
(`eval_<name>_acc`), and the end of the run prints it by subject. With `use_peft` the saved
model is the adapter; `medrecipes merge-lora` folds it into its base.
"""

from medrecipes.config import parse_recipe
from medrecipes.data.sft import sft_data
from medrecipes.errors import exit_on_user_error
from medrecipes.hub.push import push_run
from medrecipes.logs import setup_logging
from medrecipes.models.loading import check_model_settings, load_model, recipe_tokenizer
from medrecipes.models.templates import align_generation_eos
from medrecipes.runs.settle import settle_run
from medrecipes.training.callbacks import recipe_callbacks
from medrecipes.training.eval_callback import add_task_evaluation
from medrecipes.training.run import end_run, evaluate_and_record, train_and_save
from medrecipes.training.run_folder import claim_run_folder
from medrecipes.training.trainers import MedSFTTrainer

from transformers import set_seed
from trl import get_peft_config

METHOD = "sft"  # its entry in medrecipes.config.methods: the keys, data and settings of its runs


def main(recipe, training_args, model_args):
    setup_logging(training_args, recipe)
    set_seed(training_args.seed)

    if claim_run_folder(METHOD, recipe, training_args, model_args):  # True: this run finished there already
        return
    check_model_settings(model_args, recipe, training_args)  # against its config, before weights and data

    tokenizer = recipe_tokenizer(recipe, model_args)  # a Gemma without a template gets Gemma's turns
    # What the run is, decided once and recorded in run.json: the template it trains with (checked to
    # mark what assistant_only_loss trains) and its end of turn, where answers are trained to end;
    # activation checkpointing; the checkpoint it resumes from.
    run = settle_run(METHOD, recipe, training_args, model_args, tokenizer)
    with training_args.main_process_first(desc="loading data"):
        train_dataset, eval_datasets, mcq_sets = sft_data(recipe, training_args.completion_only_loss, tokenizer)

    model = load_model(model_args, recipe, tokenizer, run.activation_checkpointing)

    trainer = MedSFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=recipe_callbacks(recipe, training_args),
    )
    # At each evaluation: the accuracy of the model's answers on multiple-choice eval sets, and eval_tasks.
    add_task_evaluation(trainer, recipe, answered=mcq_sets)
    align_generation_eos(trainer.model, trainer.processing_class, run.end_of_turn)  # generation stops there too

    final_dir = train_and_save(trainer, run.resume_from)  # with use_peft, final/ holds the adapter
    metrics = {}
    if eval_datasets:
        metrics = evaluate_and_record(trainer)  # with accuracy by subject for multiple-choice sets

    if training_args.push_to_hub:
        push_run(trainer, final_dir, metrics)
    end_run(trainer)


if __name__ == "__main__":
    exit_on_user_error(lambda: main(*parse_recipe(METHOD)))()
