"""The Hub end of a run: final/ pushed with its model card (`hub.card`) and its resolved recipe,
in one commit. What the card says of the run (its method, script, command and hardware) is what
the run recorded about itself in run.json (`runs.record`, `runs.described`), not worked out again
from the recipe in this process. The
card is written whole into output_dir/card (`outputs.writes.staged`), beside final/, which is
never written again once it is in place."""

import logging
import os

from huggingface_hub import CommitOperationAdd, HfApi

from medrecipes.hub.card import described_run, run_method, training_summary, write_card
from medrecipes.hub.checkpoints import CREDENTIAL_FILES, hub_repo_id
from medrecipes.outputs.records import MARKER
from medrecipes.outputs.writes import staged
from medrecipes.runs.folder import RunFolder

logger = logging.getLogger(__name__)


def push_run(trainer, final_dir: str, eval_metrics: dict) -> str | None:
    """Push `final_dir` with its model card and resolved recipe to the run's Hub repository.
    Returns the commit URL."""
    if not trainer.is_world_process_zero():
        return None
    args = trainer.args
    repo_id = getattr(trainer, "hub_model_id", None) or hub_repo_id(args)
    run = described_run(args.output_dir, repo_id.split("/")[-1])
    card = RunFolder(args.output_dir).card
    with staged(card, folder=True, kind="card") as folder:
        write_card(folder, run, repo_id, training_summary(trainer.state), eval_metrics, secrets=(args.hub_token,))
    api = HfApi(token=args.hub_token)
    repo_id = api.create_repo(repo_id, private=args.hub_private_repo, exist_ok=True).repo_id
    commit = api.create_commit(
        repo_id=repo_id,
        operations=_files(final_dir) + _files(card),
        revision=args.hub_revision,
        commit_message=f"{run_method(run.record)}: {trainer.state.global_step} steps, {trainer.state.num_input_tokens_seen:,} tokens",
    )
    logger.info("pushed %s to %s", final_dir, commit.commit_url)
    return commit.commit_url


def _files(folder: str) -> list[CommitOperationAdd]:
    """Every file of `folder` as a file of the repository at the same relative path (final/ and the
    card go in one commit; `upload_folder` sends one folder a commit), our marks
    (`outputs.records.MARKER`) and the credentials the trainer pickles (CREDENTIAL_FILES) left out."""
    operations = []
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            if name in CREDENTIAL_FILES or name.endswith(MARKER):
                continue
            path = os.path.join(root, name)
            operations.append(CommitOperationAdd(path_in_repo=os.path.relpath(path, folder), path_or_fileobj=path))
    return operations
