"""The libraries' known-harmless lines are dropped by name, and nothing else is."""

import logging
import warnings

from conftest import AVX512_BF16_CPU, BNB_LINE, PYTHON, run

from medrecipes.libraries import HARMLESS_LOG_LINES, ONCE_LOG_LINES, drop_harmless_lines


def test_the_simulated_cpu_makes_bitsandbytes_print_its_line():
    # Without the project's filters (no medrecipes import), the condition the tests force is real.
    result = run(PYTHON, "-c", "import transformers.trainer_utils", env=AVX512_BF16_CPU, timeout=120)
    assert result.returncode == 0 and BNB_LINE in result.stderr, result.stderr[-2000:]


def test_importing_the_project_first_drops_it():
    result = run(PYTHON, "-c", "import medrecipes, transformers.trainer_utils", env=AVX512_BF16_CPU, timeout=120)
    assert result.returncode == 0 and BNB_LINE not in result.stderr, result.stderr[-2000:]


def test_each_harmless_line_is_dropped_and_other_lines_of_its_logger_show(caplog):
    drop_harmless_lines()
    for name, start in HARMLESS_LOG_LINES:
        logger = logging.getLogger(name)
        with caplog.at_level(logging.WARNING, logger=name):
            caplog.clear()
            logger.warning("%s, and the rest of the line", start)
            logger.warning("a real warning from %s", name)
        assert [r.getMessage() for r in caplog.records] == [f"a real warning from {name}"]


def test_each_once_line_is_kept_the_first_time_only(caplog):
    """A line a library logs at every call (bitsandbytes' 8-bit cast, a thousand times an evaluation)
    is said once a process; the logger's other lines all show."""
    drop_harmless_lines()
    for name, start in ONCE_LOG_LINES:
        logger = logging.getLogger(name)
        for kept in logger.filters:  # a line said earlier in this process, by another test
            if hasattr(kept, "said"):
                kept.said = False
        with caplog.at_level(logging.WARNING, logger=name):
            caplog.clear()
            for step in range(3):
                logger.warning("%s torch.float32 (call %d)", start, step)
                logger.warning("a real warning from %s (%d)", name, step)
        said = [r.getMessage() for r in caplog.records]
        assert said == [f"{start} torch.float32 (call 0)", *(f"a real warning from {name} ({i})" for i in range(3))]


def test_the_harmless_future_warning_is_dropped_and_others_show():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        drop_harmless_lines()  # filters go before the catch-all, as they do once installed at import
        warnings.warn("`is_gradient_checkpointing` is deprecated, use ...", FutureWarning, stacklevel=1)
        warnings.warn("`something_else` is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["`something_else` is deprecated"]


def test_a_thread_count_that_is_none_is_said_as_the_package_loads():
    """OpenMP complains in its own words as torch loads and then uses every core: the line names the
    variable and what to set; a count, or OpenMP's list of counts, says nothing."""
    for value, said in (("abc", True), ("0", True), ("4", False), ("4,2", False)):
        result = run(PYTHON, "-c", "import medrecipes", env={"OMP_NUM_THREADS": value})
        assert (f"OMP_NUM_THREADS={value!r} in the environment is no count of threads" in result.stderr) == said


def test_a_library_switch_neither_true_nor_false_is_said_as_the_package_loads():
    """huggingface_hub reads a switch as true for its own true words and as false for anything else:
    HF_HUB_OFFLINE=maybe left the Hub on without a word. Its switches are all in SWITCHES, read from
    its constants' source; true and false words say nothing."""
    import inspect
    import re

    import huggingface_hub.constants as hub

    from medrecipes.libraries import SWITCHES, TRUE_WORDS

    assert set(TRUE_WORDS) == set(hub.ENV_VARS_TRUE_VALUES)
    source = inspect.getsource(hub)  # read directly, or through a variable of the value
    read = set(
        re.findall(r'_is_true\(os\.environ\.get\("(HF_HUB_\w+)"', source)
        + re.findall(r"_is_true\(__(HF_HUB_\w+)\)", source)
    )
    assert read and read <= set(SWITCHES), read - set(SWITCHES)
    for value, said in (
        ("maybe", True),
        ("2", True),
        (" 1", True),
        ("1", False),
        ("yes", False),
        ("0", False),
        ("", False),
    ):
        result = run(PYTHON, "-c", "import medrecipes", env={"HF_HUB_OFFLINE": value})
        assert ("HF_HUB_OFFLINE=" in result.stderr and "neither true nor false" in result.stderr) == said, value


def test_tokenizers_parallelism_neither_true_nor_false_is_said_as_read_on(monkeypatch, caplog):
    """tokenizers reads TOKENIZERS_PARALLELISM the other way round: off for its false words, on for
    any other value, so a slip switches it on."""
    from medrecipes.libraries import say_switches

    for value, said in (
        ("maybe", True),
        ("2", True),
        (" false", True),
        ("f", False),
        ("N", False),
        ("true", False),
        ("", False),
    ):
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", value)
        caplog.clear()
        with caplog.at_level("WARNING"):
            say_switches()
        line = f"TOKENIZERS_PARALLELISM={value!r} in the environment is neither true nor false, and tokenizers reads it as true"
        assert (line in caplog.text) == said, (value, caplog.text)


RETRIES = """
import logging, medrecipes
from medrecipes.errors import mark_unconfigured_warnings
mark_unconfigured_warnings()  # as every command and recipe script does
http = logging.getLogger("huggingface_hub.utils._http")
http.addHandler(logging.StreamHandler())  # a bare handler, as transformers gives huggingface_hub's logger
for attempt in range(1, 6):
    http.warning("'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/x")
    http.warning(f"Retrying in {2 ** attempt}s [Retry {attempt}/5].")
http.warning("an unrelated line")
"""


def test_the_hubs_retries_are_one_line_with_the_switch_that_stops_them():
    """huggingface_hub asks an unreachable Hub five times over half a minute, two lines each time:
    one warning, naming the cause and HF_HUB_OFFLINE; its other lines are kept."""
    result = run(PYTHON, "-c", RETRIES, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "warning: the Hugging Face Hub does not answer ([Errno -2] Name or service not known); asking again for "
        "about half a minute. Without a network, set HF_HUB_OFFLINE=1 to use only what is on this machine",
        "an unrelated line",
    ]
