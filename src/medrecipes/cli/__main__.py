"""`python -m medrecipes.cli`: the `medrecipes` command."""

from medrecipes.cli import run

run()
