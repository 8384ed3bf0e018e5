"""Kahneman-Tversky optimisation (KTO) of a chat model on answers marked desirable or not, with
TRL's KTOTrainer.

Usage:

    medrecipes pairs --mcq data/usmle_sample/train.jsonl --layout unpaired --out outputs/demo/kto/train.jsonl
    python recipes/kto.py recipes/tiny_kto.yaml
    accelerate launch --config_file accelerate_configs/ddp.yaml recipes/kto.py RECIPE.yaml

Every source of `dataset_mixture` and `eval_sets` holds unpaired answers (`format: unpaired`:
prompt, completion, label true for a desirable answer) or pairs (`format: preference`, each split
into one desirable and one undesirable answer); plain text or conversational. `beta`, `loss_type`,
`desirable_weight` and `undesirable_weight` are TRL's own keys. With `use_peft` the reference model
is the base with the adapter switched off, never a second copy; `precompute_ref_log_probs`
computes the reference's log-probabilities once, before training. At each evaluation TRL logs
the rewards of desirable and undesirable answers, their margin and the KL estimate on the eval
sets, and `eval_tasks` their accuracy. The final model (or adapter) goes to `output_dir/final`;
with `push_to_hub`, to the Hub with a model card.
"""

from medrecipes.config import parse_recipe
from medrecipes.data.preference import preference_data
from medrecipes.errors import exit_on_user_error
from medrecipes.hub.push import push_run
from medrecipes.logs import setup_logging
from medrecipes.models.loading import check_model_settings, load_model, recipe_tokenizer
from medrecipes.runs.settle import settle_run
from medrecipes.training.callbacks import recipe_callbacks
from medrecipes.training.eval_callback import add_task_evaluation
from medrecipes.training.run import end_run, evaluate_and_record, train_and_save
from medrecipes.training.run_folder import claim_run_folder
from medrecipes.training.trainers import MedKTOTrainer

from transformers import set_seed
from trl import get_peft_config

METHOD = "kto"  # its entry in medrecipes.config.methods: the keys, data and settings of its runs


def main(recipe, training_args, model_args):
    setup_logging(training_args, recipe)
    set_seed(training_args.seed)

    if claim_run_folder(METHOD, recipe, training_args, model_args):  # True: this run finished there already
        return
    check_model_settings(model_args, recipe, training_args)  # against its config, before weights and data

    tokenizer = recipe_tokenizer(recipe, model_args)
    run = settle_run(METHOD, recipe, training_args, model_args, tokenizer)  # decided once, in run.json
    with training_args.main_process_first(desc="loading data"):
        train_dataset, eval_datasets = preference_data(
            recipe, unpair=True, args=training_args, start=model_args.model_name_or_path
        )

    model = load_model(model_args, recipe, tokenizer, run.activation_checkpointing)

    trainer = MedKTOTrainer(
        model=model,
        ref_model=None,  # TRL's: the adapter switched off with LoRA, else a frozen copy
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=recipe_callbacks(recipe, training_args),
    )
    add_task_evaluation(trainer, recipe)  # eval_tasks: benchmark accuracy at each evaluation

    final_dir = train_and_save(trainer, run.resume_from)
    metrics = evaluate_and_record(trainer) if eval_datasets else {}

    if training_args.push_to_hub:
        push_run(trainer, final_dir, metrics)
    end_run(trainer)


if __name__ == "__main__":
    exit_on_user_error(lambda: main(*parse_recipe(METHOD)))()
