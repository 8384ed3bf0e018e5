"""Logging set-up shared by the recipe scripts: one format, the trainer's verbosity per process."""

import logging
import os
import sys

import datasets
import transformers


class _Output:
    """A run's stdout or stderr, whose reader may go away while it trains (`| head`, `2>&1 | tee`
    stopped): from then on its lines (logging's, the trainer's metrics, the progress bars) go
    nowhere and the run goes on to its end, where a closed pipe would end it between its last
    checkpoint and its final weights."""

    def __init__(self, stream):
        self.stream = stream

    def _gone(self):
        self.stream = open(os.devnull, "w")  # noqa: SIM115 (the stream's stand-in for the rest of the run)

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name):  # fileno, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)


def setup_logging(training_args=None, recipe=None) -> logging.Logger:
    """Configure logging for this process and log the fields the recipe derived and its notes; without
    training arguments (evaluation): the project's lines only, the libraries' warnings."""
    level = training_args.get_process_log_level() if training_args else logging.WARNING
    for name in ("stdout", "stderr") if training_args is not None else ():
        if not isinstance(getattr(sys, name), _Output):
            setattr(sys, name, _Output(getattr(sys, name)))
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
    # Its bars in a log or a pipe: lines of \r-updates (the trainer's own stay); a user's setting wins.
    if not sys.stderr.isatty() and "HF_DATASETS_DISABLE_PROGRESS_BARS" not in os.environ:
        datasets.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity(level)
    logger = logging.getLogger("medrecipes")
    for key, value in getattr(recipe, "derived", {}).items():
        logger.info("derived from the recipe: %s = %s", key, value)
    for note in getattr(recipe, "notes", []) if main_process else []:  # the same in every process: said once
        logger.warning("%s", note)
    return logger
