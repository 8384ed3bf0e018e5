"""Checkpoints to the Hub during training: each checkpoint's weights on a branch of its own
(`hub_strategy` of the recipes' checkpoint callback), and the repository a run pushes to. The
one module of `hub` that training imports (a contract): pushing final/ with its card is the
recipe scripts' last step, after training."""

import logging
import os
import shutil
from concurrent.futures import Future
from pathlib import Path

from huggingface_hub import HfApi

from medrecipes.mirror import snapshot_folder

logger = logging.getLogger(__name__)

# The trainer pickles its arguments, hub_token included, into every saved folder: never pushed.
# The resolved recipe (recipe.yaml, card) records the same settings without credentials.
CREDENTIAL_FILES = ("training_args.bin",)
# Resume state, not model: a revision branch holds what loads with from_pretrained.
RESUME_STATE = ("optimizer.pt", "scheduler.pt", "scaler.pt", "rng_state*.pth", "global_step*", "trainer_state.json")


def hub_repo_id(training_args) -> str:
    """The repository a run pushes to: `hub_model_id`, or the output folder's name."""
    return training_args.hub_model_id or Path(training_args.output_dir).absolute().name


class CheckpointPusher:
    """Pushes checkpoints' weights to branches `checkpoint-<step>`, one after another, on
    huggingface_hub's background worker, from hard-linked snapshots."""

    def __init__(self, repo_id: str, token: str | None = None, private: bool | None = None):
        self.api = HfApi(token=token)
        self.repo_id = repo_id
        self.private = private
        self.futures: list[Future] = []

    def submit(self, folder: str) -> None:
        branch = os.path.basename(os.path.normpath(folder))
        snapshot = snapshot_folder(folder, ignore=shutil.ignore_patterns(*RESUME_STATE, *CREDENTIAL_FILES))
        self.futures.append(self.api.run_as_future(self._push, snapshot, branch))

    def _push(self, snapshot: str, branch: str):
        try:
            repo_id = self.api.create_repo(self.repo_id, private=self.private, exist_ok=True).repo_id
            self.api.create_branch(repo_id, branch=branch, exist_ok=True)
            return self.api.upload_folder(
                repo_id=repo_id, folder_path=snapshot, revision=branch, commit_message=f"weights at {branch}"
            )
        finally:
            shutil.rmtree(snapshot, ignore_errors=True)

    def wait(self) -> None:
        for future in self.futures:
            try:
                logger.info("checkpoint pushed: %s", future.result().commit_url)
            except Exception as err:  # a failed push must not fail the run; the checkpoint is on disk
                logger.error("pushing a checkpoint to %s failed: %s", self.repo_id, err)
        self.futures = []
