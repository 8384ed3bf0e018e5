"""The package's layers (docs/architecture.md): import-linter's contracts hold, and the registry
of names that the recipe schema checks is the one the evaluation code runs."""

import sys
from pathlib import Path

from conftest import ROOT, run

from medrecipes.eval_tasks import TASKS
from medrecipes.names import TASK_NAMES

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_imports_keep_the_layers_and_make_no_circle():
    result = run(LINT_IMPORTS, "--config", ROOT / ".importlinter", env={"PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_task_names_the_schema_checks_are_the_tasks_that_run():
    assert tuple(TASKS) == TASK_NAMES
