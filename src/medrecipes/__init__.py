"""medrecipes: training recipes for medical language models on the Hugging Face stack."""

from medrecipes.errors import report_environment_on_import
from medrecipes.libraries import drop_harmless_lines, say_switches, say_thread_counts

__version__ = "0.1.0"

# First, before any library loads: some of the lines dropped are printed while one is imported.
drop_harmless_lines()
report_environment_on_import()
say_thread_counts()
say_switches()
