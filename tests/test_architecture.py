"""The package's layers (docs/architecture.md): import-linter's contracts hold, the registry of
names that the recipe schema checks is the one the evaluation code runs, and the package stands
on its own: what its code reads from disk ships in its wheel."""

import shutil
import sys
import zipfile
from pathlib import Path

from conftest import PYTHON, ROOT, run, run_ok

from medrecipes.evaluation.tasks import TASKS
from medrecipes.names import TASK_NAMES

LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_imports_keep_the_layers_and_make_no_circle():
    result = run(LINT_IMPORTS, "--config", ROOT / ".importlinter", env={"PYTHONPATH": str(ROOT / "src")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_the_task_names_the_schema_checks_are_the_tasks_that_run():
    assert tuple(TASKS) == TASK_NAMES


def test_the_wheel_carries_the_files_the_package_reads(tmp_path):
    # Built from a copy of the sources: a build folder left in the checkout would lend the wheel
    # files that the package's own data list does not name.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    run_ok(
        PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, source, timeout=300
    )
    (wheel,) = tmp_path.glob("medrecipes-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    package = ROOT / "src" / "medrecipes"
    shipped = [*package.glob("templates/*.jinja"), *package.glob("architectures/*.json"), package / "model_card.md"]
    assert any(p.name == "chatml.jinja" for p in shipped)
    for path in shipped:
        assert path.relative_to(ROOT / "src").as_posix() in names, path
