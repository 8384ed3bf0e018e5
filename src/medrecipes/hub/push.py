"""The Hub end of a run: final/ pushed with its model card (`hub.card`) and its resolved recipe.
What the card says of the run (its method, script, command and hardware) is what the run
recorded about itself in run.json (`runs.record`), not read again from this process."""

import logging

from huggingface_hub import HfApi

from medrecipes.hub.card import run_method, training_summary, write_card
from medrecipes.hub.checkpoints import CREDENTIAL_FILES, hub_repo_id
from medrecipes.runs.record import read_record

logger = logging.getLogger(__name__)


def push_run(trainer, recipe, model_args, final_dir: str, eval_metrics: dict) -> str | None:
    """Push `final_dir` with its model card and resolved recipe to the run's Hub repository.

    A run that trained from a built data folder carries that folder's decontamination result
    into the card. Returns the commit URL.
    """
    if not trainer.is_world_process_zero():
        return None
    args = trainer.args
    record = read_record(args.output_dir) or {}
    method = run_method(record)
    repo_id = getattr(trainer, "hub_model_id", None) or hub_repo_id(args)
    hardware = (record.get("finished") or {}).get("hardware") or "hardware not recorded"
    command = record.get("command") or f"python {record.get('script')} (its command line was not recorded)"
    write_card(final_dir, args.output_dir, repo_id, method, recipe, model_args, args, training_summary(trainer.state),
               eval_metrics, hardware, command, record.get("script") or f"recipes/{method}.py")  # fmt: skip
    api = HfApi(token=args.hub_token)
    repo_id = api.create_repo(repo_id, private=args.hub_private_repo, exist_ok=True).repo_id
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=final_dir,
        revision=args.hub_revision,
        ignore_patterns=list(CREDENTIAL_FILES),
        commit_message=f"{method}: {trainer.state.global_step} steps, {trainer.state.num_input_tokens_seen:,} tokens",
    )
    logger.info("pushed %s to %s", final_dir, commit.commit_url)
    return commit.commit_url
