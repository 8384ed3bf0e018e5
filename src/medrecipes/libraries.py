"""How the project treats the libraries it loads: lines they print that no user can act on are
dropped, and back ends a command does not use are kept out of its process.

Each dropped line is named exactly (its logger or warning category and its first words), so a
real warning from the same library still shows; nothing is done to stderr as a whole. The filters
are installed when the `medrecipes` package is first imported, which the recipe scripts and the
command do before any library: some of these lines are printed while a library is imported.
"""

import errno
import logging
import os
import re
import sys
import threading
import warnings

# (logger, first words of the message); the comment under each says why no user can act on it.
HARMLESS_LOG_LINES = (
    (
        "bitsandbytes.backends.cpu.ops",
        "Failed to load CPU gemm_4bit_forward from kernels-community",
        # Printed at import on CPUs with AVX512-BF16, by every process that imports peft (which
        # imports bitsandbytes), quantised or not. The optional kernel comes from a hub at run time;
        # without it bitsandbytes uses its own 4-bit CPU kernel, and results are the same.
    ),
    (
        "DeepSpeed",
        "Setting accelerator to CPU",
        # DeepSpeed's guess on a machine without a GPU, once per process; the launcher's
        # config already chose the device.
    ),
    (
        "transformers.training_args",
        "The speedups for torchdynamo mostly come with",
        # A recipe for GPUs with torch_compile validated or planned on a CPU: true of the machine,
        # not of the recipe, and nothing to change.
    ),
    (
        "transformers.trainer_utils",
        "Warning: The following arguments do not match the ones in the `trainer_state.json`",
        # A resumed run's logging, eval and save steps: they apply from the checkpoint on
        # (training.callbacks.IntervalsOfThisStart), and the run's resume line says its changed settings.
    ),
    (
        "transformers.tokenization_utils_base",
        "Token indices sequence length is longer than the specified maximum sequence length",
        # A text longer than the model's positions, tokenized whole before the recipe cuts it: every
        # path cuts or windows it (SFT, DPO and KTO at max_length, CPT's packing, eval's prompts,
        # perplexity's windows) and says so in its own line; "indexing errors" never follow.
    ),
    (
        "datasets.packaged_modules.json.json",
        "Failed to load JSON from file",
        # Logged before the parse error is raised; the error is then reported as the file's
        # first bad line (`errors.unreadable`), where this line's "row" counts within a block.
    ),
    (
        "datasets.packaged_modules.csv.csv",
        "Failed to read file",
        # The same for a CSV file: the error that follows names its first bad line.
    ),
    (
        "datasets.packaged_modules.parquet.parquet",
        "Failed to read schema",
        # The same for a file that is no Parquet: the error that follows names the file and pyarrow's reason.
    ),
)

# (category, first words of the message): warnings about the libraries' own code.
HARMLESS_WARNINGS = (
    # TRL's generation and PEFT read the model's deprecated `is_gradient_checkpointing`; no recipe
    # setting changes that.
    (FutureWarning, "`is_gradient_checkpointing` is deprecated"),
    # torch's DataLoader on a machine without an accelerator, where transformers pins memory by
    # default: nothing to pin to; the run's own note says it trains on the CPU (accelerator_note).
    (UserWarning, "'pin_memory' argument is set as true but no accelerator is found"),
)

# Back ends that only building or training a model uses: peft (transformers' trainer utilities
# import it, and it imports bitsandbytes) and DeepSpeed.
TRAINING_BACKENDS = ("peft", "bitsandbytes", "deepspeed")


class _DropLines(logging.Filter):
    """Drops the records of one logger whose message starts with `start`."""

    def __init__(self, start: str):
        super().__init__()
        self.start = start

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.start)


# Lines a library logs at every call that say one fact of the whole run: kept the first time.
ONCE_LOG_LINES = (
    (
        "bitsandbytes.autograd._functions",
        "MatMul8bitLt: inputs will be cast from",
        # load_in_8bit's layers at every forward pass of a model in float32 (a CPU recipe's dtype):
        # true of the run once, and a thousand lines over an evaluation.
    ),
)


class _FirstLine(logging.Filter):
    """Keeps the first record of one logger whose message starts with `start`, drops the others."""

    def __init__(self, start: str):
        super().__init__()
        self.start, self.said = start, False

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(self.start):
            return True
        said, self.said = self.said, True
        return not said


class _OneRetryLine(logging.Filter):
    """huggingface_hub's retries of a request the Hub does not answer (no network, a proxy), two lines
    each, five times over half a minute: said as one of the project's lines, with the switch that
    stops the asking."""

    said = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not (" thrown while requesting " in message or message.startswith("Retrying in ")):
            return True
        if _OneRetryLine.said:
            return False
        _OneRetryLine.said = True
        reason = message.split("' thrown while requesting ")[0].lstrip("'") if "thrown" in message else "no answer"
        logging.getLogger("medrecipes").warning(  # marked as the project's lines are, whatever the Hub's handler
            "the Hugging Face Hub does not answer (%s); asking again for about half a minute. Without a network, "
            "set HF_HUB_OFFLINE=1 to use only what is on this machine",
            reason[:120],
        )
        return False


def _quiet_writer_thread(default):
    """threading.excepthook that leaves out the traceback TensorBoard's writer thread prints when the
    disk is full: the thread keeps the error and the training loop raises it at its next logged
    value, where the run makes it its one full-disk line (training.run.train_and_save)."""

    def hook(args) -> None:
        full = getattr(args.exc_value, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
        if full and type(args.thread).__name__ == "_AsyncWriterThread":
            return
        default(args)

    hook.quiet_writer = True
    return hook


def drop_harmless_lines() -> None:
    """Install the filters for HARMLESS_LOG_LINES, ONCE_LOG_LINES and HARMLESS_WARNINGS, the Hub's retries as one
    line, and the writer thread's quiet hook (once per process)."""
    if not getattr(threading.excepthook, "quiet_writer", False):
        threading.excepthook = _quiet_writer_thread(threading.excepthook)
    for name, start in HARMLESS_LOG_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLines) and f.start == start for f in logger.filters):
            logger.addFilter(_DropLines(start))
    for name, start in ONCE_LOG_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _FirstLine) and f.start == start for f in logger.filters):
            logger.addFilter(_FirstLine(start))
    for category, start in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=start, category=category)
    retries = logging.getLogger("huggingface_hub.utils._http")
    if not any(isinstance(f, _OneRetryLine) for f in retries.filters):
        retries.addFilter(_OneRetryLine())


def keep_out(modules=TRAINING_BACKENDS) -> None:
    """Make `import` of these modules fail in this process, as if they were not installed, so the
    libraries that import them when present (transformers, TRL) skip them. For a process that
    never builds or trains a model; a module already imported stays."""
    for name in modules:
        sys.modules.setdefault(name, None)


# The thread counts the math libraries read as they load (OpenMP's list, one count per nesting level).
THREAD_COUNTS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


# The switches the Hugging Face libraries read from the environment as true where they are one of
# TRUE_WORDS and as false otherwise, so that a slip (HF_HUB_OFFLINE=maybe) turns a switch off without
# a word: huggingface_hub's own (its constants), and the offline switches of transformers and datasets.
SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_EXPERIMENTAL_WARNING",
            "HF_HUB_DISABLE_IMPLICIT_TOKEN", "HF_HUB_DISABLE_SHARED_BLOBS", "HF_HUB_DISABLE_SYMLINKS",
            "HF_HUB_DISABLE_SYMLINKS_WARNING", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_DISABLE_UPDATE_CHECK",
            "HF_HUB_DISABLE_XET", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_DISABLE_PROGRESS_BARS")  # fmt: skip
TRUE_WORDS = ("1", "ON", "YES", "TRUE")  # huggingface_hub's ENV_VARS_TRUE_VALUES (tests/test_libraries.py)
FALSE_WORDS = ("", "0", "OFF", "NO", "FALSE")


# tokenizers (its Rust get_env_parallelism) reads its switch the other way round: off for one of
# these words in any case, on for every other value.
TOKENIZERS_SWITCH, TOKENIZERS_FALSE_WORDS = "TOKENIZERS_PARALLELISM", ("", "OFF", "FALSE", "F", "NO", "N", "0")


def say_switches() -> None:
    """One line for a library switch in the environment that is neither true nor false: the
    libraries read it as false (offline mode off, for HF_HUB_OFFLINE=maybe), or tokenizers as
    true, without a word."""
    for name in (*SWITCHES, TOKENIZERS_SWITCH):
        value = os.environ.get(name)
        read_as_false = name != TOKENIZERS_SWITCH
        false_words = FALSE_WORDS if read_as_false else TOKENIZERS_FALSE_WORDS
        if value is not None and value.upper() not in (*TRUE_WORDS, *false_words):  # as read: " 1" is not 1
            logging.getLogger("medrecipes").warning(
                "%s=%r in the environment is neither true nor false, and %s reads it as %s; set 1 to switch it on, "
                "or 0", name, value, *(("the Hugging Face libraries", "false (it is off)") if read_as_false else
                                       ("tokenizers", "true (it is on)")),
            )  # fmt: skip


def say_thread_counts() -> None:
    """One line for a thread count in the environment that is not one: OpenMP prints its own
    complaint as torch loads and then uses every core, with nothing said of what to set."""
    for name in THREAD_COUNTS:
        value = os.environ.get(name)
        if value is not None and not re.fullmatch(r"\s*[1-9]\d*\s*(,\s*[1-9]\d*\s*)*", value):
            logging.getLogger("medrecipes").warning(
                "%s=%r in the environment is no count of threads (a whole number above 0, or a list of them): the "
                "libraries ignore it and use every core; set a count, or unset it", name, value,
            )  # fmt: skip
