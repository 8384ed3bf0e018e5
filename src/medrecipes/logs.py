"""Logging set-up shared by the recipe scripts: one format, the trainer's verbosity per process."""

import logging
import sys

import datasets
import transformers


def setup_logging(training_args, recipe=None) -> logging.Logger:
    """Configure logging for this process and log the fields the recipe derived."""
    level = training_args.get_process_log_level()
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=level,
    )
    # The project's own lines (derived fields, model, resume, results) on the main process.
    logging.getLogger("medrecipes").setLevel(logging.INFO if training_args.should_log else level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    logger = logging.getLogger("medrecipes")
    for key, value in getattr(recipe, "derived", {}).items():
        logger.info("derived from the recipe: %s = %s", key, value)
    return logger
