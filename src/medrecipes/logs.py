"""Logging set-up shared by the recipe scripts: one format, the trainer's verbosity per process."""

import logging
import sys

import datasets
import transformers


def setup_logging(training_args=None, recipe=None) -> logging.Logger:
    """Configure logging for this process and log the fields the recipe derived and its notes; without
    training arguments (evaluation): the project's lines only, the libraries' warnings."""
    level = training_args.get_process_log_level() if training_args else logging.WARNING
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
        level=level,
    )
    # The project's own lines (derived fields, model, resume, results) on the main process.
    main_process = training_args is None or training_args.should_log
    logging.getLogger("medrecipes").setLevel(logging.INFO if main_process else level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    logger = logging.getLogger("medrecipes")
    for key, value in getattr(recipe, "derived", {}).items():
        logger.info("derived from the recipe: %s = %s", key, value)
    for note in getattr(recipe, "notes", []) if main_process else []:  # the same in every process: said once
        logger.warning("%s", note)
    return logger
