"""Where the recipes' trainers reach past the public API of transformers' `Trainer`, all here,
each thin: it calls a hook of `mixins.RecipeTrainerMixin` (`checkpoint_starts`,
`checkpoint_saved`, `grad_norm_taken`) or of a mixin after it (`write_into_checkpoint`) and leaves
the rest to the library. `SEAMS` lists each with why no public hook serves and the test that
holds its behaviour; tests/test_seams.py fails when the installed transformers changes a
signature written here, or the version range below. Written against transformers 5.17 to 5.23."""

import os
import shutil
import time
from dataclasses import dataclass

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from medrecipes.outputs.checkpoints import TRAINER_STATE
from medrecipes.outputs.records import STAGING
from medrecipes.outputs.writes import full_disk_is_one_line, publish
from medrecipes.runs.record import stamp_checkpoint
from medrecipes.runs.resume import kept

LIBRARY = "transformers"
WRITTEN_AGAINST = ("5.17", "5.23")  # the oldest release setup.cfg allows, the one constraints.txt pins


@dataclass(frozen=True)
class Seam:
    owner: str  # the library's class or module, dotted
    name: str  # the private method, function or attribute reached
    signature: str | None  # its parameters as written against (annotations aside); None for an attribute
    why: str  # why no public hook serves
    behaviour: str  # the test that holds what the seam relies on: tests/<file>::<test>


SEAMS = (
    Seam("transformers.Trainer", "_save_checkpoint", "(self, model, trial)",
         "the trainer writes a checkpoint straight into output_dir/checkpoint-N; no hook runs before it is "
         "complete, so a kill would leave a partial folder that resume picks up. The save is staged and renamed",
         "tests/test_long_runs.py::test_kill_during_save_leaves_nothing_half_written_to_resume"),
    Seam("transformers.Trainer", "_get_output_dir", "(self, trial)",
         "where _save_checkpoint writes: the staging folder during a save",
         "tests/test_checkpoints.py::test_save_total_limit_rotates_the_published_checkpoints"),
    Seam("transformers.Trainer", "_push_from_checkpoint", "(self, checkpoint_folder)",
         "hub_strategy pushes from inside _save_checkpoint, before the staged folder has its name: deferred",
         "tests/test_run_record.py::test_each_checkpoint_has_its_weights_on_a_branch"),
    Seam("transformers.Trainer", "_get_grad_norm", "(self, model, grad_norm=None)",
         "the gradient norm before the optimizer step; callbacks see it only after the step "
         "(on_pre_optimizer_step has no norm, on_optimizer_step is after clipping has been applied)",
         "tests/test_nonfinite.py::test_skip_policy_leaves_the_weights_of_a_nan_step_untouched"),
    Seam("transformers.Trainer", "_issue_warnings_after_load", "(self, load_result)",
         "the resume's warning of missing keys names a tied output head, which a checkpoint keeps one copy of; no "
         "hook sees the load's result before it is logged",
         "tests/test_checkpoints.py::test_a_tied_output_head_is_not_named_missing_on_resume"),
    Seam("transformers.generation.configuration_utils.CompileConfig", "_compile_all_devices", None,
         "transformers compiles generate's decoding step on accelerators only; the CPU tests compile it too",
         "tests/test_generation_paths.py::test_a_compiled_static_cache_answers_greedily_as_generate_does"),
)  # fmt: skip


class TrainerSeams:
    """The overrides of `Trainer`'s private methods (SEAMS): atomic checkpoints, the gradient norm
    of each step and the missing keys a resume names. `mixins.RecipeTrainerMixin` inherits them
    and defines their hooks."""

    _staging_root: str | None = None  # the staging folder while a checkpoint is being saved
    _deferred_push = False

    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        self.grad_norm_taken(model, grad_norm)
        return grad_norm

    def _get_output_dir(self, trial):
        return self._staging_root or super()._get_output_dir(trial)

    def _push_from_checkpoint(self, checkpoint_folder):
        if self._staging_root is not None:  # push the folder once it has its final name
            self._deferred_push = True
            return
        super()._push_from_checkpoint(checkpoint_folder)

    def _issue_warnings_after_load(self, load_result):
        # A checkpoint keeps one copy of a tied weight (safetensors), so transformers names the tied
        # output head "missing" on every resume; the keys tied to a loaded weight are not.
        model = self.accelerator.unwrap_model(self.model)
        out, into = model.get_output_embeddings(), model.get_input_embeddings()
        tied = set()
        if out is not None and into is not None and out.weight is into.weight:
            tied = {name for name, p in model.named_parameters(remove_duplicate=False) if p is out.weight}
        loaded = tied - set(load_result.missing_keys)  # the copy the checkpoint kept
        missing = [key for key in load_result.missing_keys if not (loaded and key in tied)]
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing))

    def _save_checkpoint(self, model, trial):
        started = time.perf_counter()
        self.checkpoint_starts()
        run_dir = self._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = os.path.join(run_dir, STAGING)
        staged, final = os.path.join(staging_root, name), os.path.join(run_dir, name)
        if self.args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)  # what a killed save left behind
            os.makedirs(staging_root)
        self.accelerator.wait_for_everyone()
        self._staging_root = staging_root
        try:
            with full_disk_is_one_line(run_dir, final, partial=staging_root, kept=kept(run_dir)):
                super()._save_checkpoint(model, trial)
                write_into = getattr(self, "write_into_checkpoint", None)  # a mixin's part of the checkpoint
                if write_into is not None:
                    write_into(staged)
                if self.args.should_save:
                    stamp_checkpoint(staged, run_dir)
        finally:
            self._staging_root = None
        self.accelerator.wait_for_everyone()  # every process has written its shards and RNG state
        if self.state.best_model_checkpoint == staged:  # the trainer names the best where it was written
            self.state.best_model_checkpoint = final
            if self.args.should_save:
                self.state.save_to_json(os.path.join(staged, TRAINER_STATE))
        if self.args.should_save:
            publish(staged, final)
            shutil.rmtree(staging_root, ignore_errors=True)
            # The library's save_total_limit rotation, which ran in the staging folder, on the published ones.
            rotate_checkpoints(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()
        if self._deferred_push:
            self._deferred_push = False
            super()._push_from_checkpoint(final)
        self.checkpoint_saved(time.perf_counter() - started)


def compile_decoding(generation_config, device: str, backend: str = "inductor") -> None:
    """Let `generate` compile its decoding step over a static cache: TRL 1.16 builds its generation
    config with `disable_compile=True`, whatever the cache. On a GPU the step runs as CUDA graphs
    (transformers' `reduce-overhead`); transformers compiles on accelerators only, so elsewhere the
    compilation is asked for all devices (the CPU tests)."""
    from transformers.generation.configuration_utils import CompileConfig

    compile_config = CompileConfig(backend=backend, mode="reduce-overhead" if device == "cuda" else "default")
    compile_config._compile_all_devices = device != "cuda"
    generation_config.disable_compile = False
    generation_config.compile_config = compile_config
