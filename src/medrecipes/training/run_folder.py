"""Which run an output_dir belongs to, and whether that run has finished.

A run writes `run.json` into its output_dir when it starts: the recipe script, the model it
starts from and a fingerprint of its training data (which tell runs apart), and the resolved
recipe it runs with (which `medrecipes report` shows). A later run in the same folder is the same
run if those agree (it resumes, or, when it finished, stops at once without writing anything)
and another run if they do not: it is refused, since resuming would load another model's
checkpoint and its final/ would replace the other run's. `overwrite_output_dir: true` starts
over instead, removing the earlier run's checkpoints, final model, record, benchmark reports and
model card first.
"""

import logging
import os
import shutil

from medrecipes.config.parse import recorded_command, resolved_recipe
from medrecipes.data.sources import recipe_inputs
from medrecipes.errors import UserError, on_interrupt, on_refusal
from medrecipes.locations import RUN_RECORD
from medrecipes.outputs.claims import claim_output, lock_folder
from medrecipes.outputs.records import LOCK, MARKER, mark
from medrecipes.runs.folder import RunFolder
from medrecipes.runs.record import identity_differences, run_identity, update_record, write_record
from medrecipes.runs.resume import kept
from medrecipes.training.launch import check_launch

logger = logging.getLogger(__name__)


def _differences(saved: dict, ours: dict, recipe) -> str:
    return "; ".join(identity_differences(saved, ours, recipe.dataset_mixture))


# Settings that do not change what a run trains: where and how it logs and saves (a run folder
# moved elsewhere holds the same run), and where it resumes from; and the starting model's path,
# which the run's identity judges by the weights there, however the path is written.
_NOT_TRAINING = ("output_dir", "logging_dir", "logging_steps", "logging_strategy", "logging_first_step",
                 "log_level", "log_level_replica", "log_on_each_node", "disable_tqdm", "report_to", "save_steps",
                 "save_strategy", "save_total_limit", "push_to_hub", "hub_model_id", "hub_strategy",
                 "hub_private_repo", "run_name", "resume_from_checkpoint", "resume_from_another_run",
                 "overwrite_output_dir", "model_name_or_path")  # fmt: skip


# Settings a checkpoint carries in its optimizer, scheduler and data position: a run that resumes
# from one trains with the checkpoint's, whatever the recipe now says (the restored scheduler
# sets the learning rate; the data position counts batches of the size it was saved with).
RESTORED = ("learning_rate", "embedding_learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "min_lr",
            "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "optim", "optim_args",
            "per_device_train_batch_size", "gradient_accumulation_steps", "global_batch_tokens", "max_length",
            "packing", "seed", "data_seed")  # fmt: skip


# Of those, the ones a resumed run takes up from its checkpoint on (training.callbacks.IntervalsOfThisStart).
_INTERVALS = ("logging_steps", "logging_strategy", "save_steps", "save_strategy", "save_total_limit")


def _shown(value) -> str:
    """A setting's value as a recipe gives it: a whole step count as 1, not the 1.0 transformers keeps
    for a count that may be a share of the run."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else repr(value)


def _changed_settings(saved: dict, ours: dict, intervals: bool = False) -> str:
    """The resolved settings a finished run differs in from these, "learning_rate 0.0003 there,
    0.0001 here", those that only log or save left out (but for the `intervals`, where asked)."""
    left_out = set(_NOT_TRAINING) - (set(_INTERVALS) if intervals else set())
    keys = [k for k in ours if k in saved and k not in left_out and saved[k] != ours[k]]
    return "; ".join(f"{k} {_shown(saved[k])} there, {_shown(ours[k])} here" for k in keys[:5]) + (
        "; ..." if len(keys) > 5 else ""
    )


def recorded_differences(method: str, recipe, training_args, model_args) -> str:
    """How the run recorded in this recipe's output_dir differs from the run the recipe makes now:
    its script, model or data, then the settings that change what it trained; "" where they agree
    or no run is recorded there. A pipeline that skips a stage whose run finished asks this first,
    so that a recipe changed since is not passed over in silence."""
    saved = RunFolder(training_args.output_dir).record()
    if saved is None:
        return ""
    ours = resolved_recipe(recipe, model_args, training_args)
    found = (
        _differences(saved, run_identity(method, recipe, model_args), recipe),
        _changed_settings(saved.get("recipe") or {}, ours),
    )
    return "; ".join(part for part in found if part)


def finished(record: dict, training_args) -> bool:
    """Whether the run in the record trained as far as these arguments ask (final/ written)."""
    done = RunFolder(training_args.output_dir).finished(record)
    if done is None:
        return False
    if training_args.max_steps > 0:
        return done["global_step"] >= training_args.max_steps
    return done["max_steps"] <= 0 and done["num_train_epochs"] >= training_args.num_train_epochs


def _remove_unused(output_dir: str, made: str) -> None:
    """A run folder this start made, removed where the run was refused before it held anything but
    its record (no checkpoint, log or model), and the folders above it that it made (`made`, the
    outermost) where they are left empty: a rerun then starts as new, and nothing is left to explain."""
    if os.path.isdir(output_dir) and set(os.listdir(output_dir)) <= {RUN_RECORD, MARKER, LOCK}:
        shutil.rmtree(output_dir, ignore_errors=True)
        folder, made = os.path.dirname(os.path.abspath(output_dir)), os.path.abspath(made)
        while os.path.commonpath([folder, made]) == made and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)  # within what this start made (none where it made output_dir alone)
            folder = os.path.dirname(folder)


# output_dir: (the record of the run there as this start found it, the settings it changes and the
# entries that record them), for `say_resumed`. The record is put back if the start is refused before
# it trains: the run settled anew writes its record before its checkpoint is checked.
_RESUMING: dict[str, tuple[dict, str, dict]] = {}


def _put_back(output_dir: str) -> None:
    if (pending := _RESUMING.pop(output_dir, None)) is not None:
        write_record(output_dir, pending[0])


def say_resumed(training_args) -> None:
    """The settings a resumed run changed since it last ran, said and added to its record once
    training goes ahead (its checkpoint found to fit the model): a start refused before then leaves
    the record as it was, and says nothing would apply."""
    _, changed, entries = _RESUMING.pop(training_args.output_dir, (None, "", {}))  # what it writes now stays
    if not changed:
        return
    if training_args.should_log:
        logger.warning(
            "output_dir: resuming the run there with other settings than it last ran with (%s); they apply from its "
            "newest checkpoint on, and run.json records them",
            changed,
        )
    update_record(training_args, **entries)


def claim_run_folder(method: str, recipe, training_args, model_args) -> bool:
    """Claim output_dir for this run: check that it is this run's (one line and exit 2 if it holds
    another run's, unless the recipe sets overwrite_output_dir, which deletes that run first; or
    anything medrecipes did not write, or anything the run reads), create and lock it for this
    launch, mark it and record the run there if it is new. Returns whether the run already
    finished there: the script then stops without training a step or writing anything. The main
    process looks first, so the others find the folder as it leaves it. A launch whose processes
    accelerate set up otherwise than it asked is said first (`launch.check_launch`)."""
    check_launch(training_args)
    output_dir = training_args.output_dir
    ours = run_identity(method, recipe, model_args)
    where = f"{recipe.recipe_file or 'command line'}: output_dir"
    if training_args.should_save:  # the process that writes; the launch's others wait below
        inputs = [*recipe_inputs(recipe, training_args, model_args, recipe.recipe_file), recipe.built_data]
        claim_output(output_dir, "run", where, inputs, overwrite=True, folder=True)  # resumes or refuses by its record
        if not os.path.exists(output_dir):
            made = output_dir  # the outermost folder this start makes
            while not os.path.exists(parent := os.path.dirname(os.path.abspath(made))):
                made = parent
            on_refusal(lambda: _remove_unused(output_dir, made))
        os.makedirs(output_dir, exist_ok=True)
        lock_folder(output_dir, where)
        mark(output_dir, "run")
        on_interrupt(lambda: kept(output_dir))
    folder = RunFolder(output_dir)
    with training_args.main_process_first(local=False, desc="checking output_dir"):
        if recipe.overwrite_output_dir and training_args.should_save and os.path.isdir(output_dir):
            if removed := folder.start_over():
                logger.info(
                    "overwrite_output_dir: removed the earlier run from %s (%s)", output_dir, ", ".join(removed)
                )
        saved = folder.record()
        if saved is not None and not folder.has_results():
            saved = None  # a run that stopped before its first save: nothing of it to protect
        differences = _differences(saved, ours, recipe) if saved is not None else ""
        if differences:
            raise UserError(
                f"{where}: {output_dir} holds another run ({differences}); give this run "
                "its own output_dir, or set overwrite_output_dir: true to delete that run and start over"
            )
        if saved is not None and finished(saved, training_args):
            logger.info(
                "output_dir: %s holds this run, finished at step %d (final/ written); nothing to do. "
                "Raise max_steps to train further, or give a new output_dir for a new run",
                output_dir,
                saved["finished"]["global_step"],
            )
            if training_args.resume_from_checkpoint:
                logger.warning(
                    "resume_from_checkpoint %s is not read: the run finished there; raise max_steps to train on from "
                    "its newest checkpoint, or drop it",
                    training_args.resume_from_checkpoint,
                )
            changed = _changed_settings(saved.get("recipe") or {}, resolved_recipe(recipe, model_args, training_args))
            if changed:
                logger.warning(
                    "output_dir: the finished run there ran with other settings than these (%s); they were not "
                    "applied: set overwrite_output_dir: true to train again with them, or give a new output_dir",
                    changed,
                )
            return True
        if saved is not None:  # this run, which resumes: a setting the checkpoint overrides is refused
            _RESUMING[output_dir] = (saved, "", {})
            if training_args.should_save:
                on_refusal(lambda: _put_back(output_dir))
            ours_resolved = resolved_recipe(recipe, model_args, training_args)
            recorded = saved.get("recipe") or {}
            changed = _changed_settings({k: v for k, v in recorded.items() if k in RESTORED}, ours_resolved)
            if changed:
                raise UserError(
                    f"{where}: {output_dir} holds this run, saved with other settings than these ({changed}); "
                    "resuming keeps the checkpoint's optimizer, schedule and data position, so they would not "
                    "apply: set them back to resume, or set overwrite_output_dir: true to start over with them"
                )
            # The others (max_steps raised, a system prompt edited) apply from the checkpoint on: said, and
            # recorded, so that the record, the card and a later start compare with what trained last;
            # once the checkpoint is found to fit the model (`say_resumed`), so a refused start changes nothing.
            if changed := _changed_settings(recorded, ours_resolved, intervals=True):
                resumed = [*saved.get("resumed_with", []), changed]
                _RESUMING[output_dir] = (saved, changed, {"recipe": ours_resolved, "resumed_with": resumed})
        if saved is None and training_args.should_save:
            # The settings it ran with and how it was started, for `medrecipes report` and `medrecipes
            # card`; only `ours` tells runs apart.
            command = recorded_command(recipe, model_args, training_args)
            write_record(
                output_dir, {**ours, "command": command, "recipe": resolved_recipe(recipe, model_args, training_args)}
            )
    return False
