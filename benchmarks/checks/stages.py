"""A real check's folder, its stages (each skipped when its result is there, so a stopped check
resumes at the stage it was in, with its wall time kept), the project's commands run as a user
runs them, and the results written to benchmarks/results."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
MEDQA = DATA / "medqa" / "medqa_us_4opt_test.jsonl"
RESULTS = ROOT / "benchmarks" / "results"


def prepare(folder: str, inputs) -> Path:
    """The check's folder, made; runs from the project's root, offline; every input must exist."""
    os.chdir(ROOT)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for path in inputs:
        if not Path(path).is_file():
            sys.exit(f"real check: {path} is missing; it needs ../shared/data (see its README) and `make install`")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    return out


def stage_runner(out: Path):
    """(stage, seconds): `stage(name, done, work)` runs `work` unless `done` exists (a check that
    was stopped resumes at the stage it was in), adding its wall time to `seconds`, which
    out/seconds.json keeps across runs. A training stage names its recipe, `recipe=(method, recipe
    file, overrides...)`: where it is done, the run there must be the one that recipe makes now, or
    the check stops in one line (a recipe changed since its run is not passed over in silence)."""
    times_file = out / "seconds.json"
    seconds = json.loads(times_file.read_text()) if times_file.exists() else {}

    def stage(name: str, done: Path, work, recipe: tuple[str, ...] = ()) -> None:
        if done.exists():
            if recipe and (changed := recipe_changed(*recipe)):
                sys.exit(
                    f"real check: {name} ({done}) was trained with other settings than {recipe[1]} gives now "
                    f"({changed}); move its run folder aside, or give the check another folder"
                )
            print(f"real check: {name} done ({done})", flush=True)
            return
        print(f"real check: {name}", flush=True)
        start = time.perf_counter()
        work()
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - start
        times_file.write_text(json.dumps(seconds, indent=1))

    return stage, seconds


def recipe_changed(method: str, *argv: str) -> str:
    """How the run in the output_dir of recipe `argv` (its file, then overrides) differs from the run
    that recipe makes now ("" where it does not, or no run is there)."""
    from medrecipes.config import parse_recipe
    from medrecipes.training.run_folder import recorded_differences

    return recorded_differences(method, *parse_recipe(method, list(argv)))


def write_results(name: str, report: dict, text: str) -> None:
    """benchmarks/results/<name>.json and .md, and the table printed."""
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / f"{name}.md").write_text(text)
    print(text)


def run(*args: str) -> float:
    """Run a command of the project as a user would, its output shown; returns its wall time."""
    print("$", " ".join(args), flush=True)
    start = time.perf_counter()
    result = subprocess.run(args, cwd=ROOT)
    if result.returncode != 0:
        sys.exit(f"real check: `{' '.join(args)}` failed with exit code {result.returncode}")
    return time.perf_counter() - start


def medrecipes(*args: str) -> float:
    return run(sys.executable, "-m", "medrecipes.cli", *args)


def evaluated(result: Path, model: Path, *args: str) -> float:
    """`medrecipes eval --model MODEL --output RESULT ARGS` (the tasks, data, mode, ...) unless an
    earlier stage wrote RESULT: the seconds it took, 0 where it was there. Every check's
    evaluations go through here."""
    if result.exists():
        return 0.0
    result.parent.mkdir(parents=True, exist_ok=True)
    return medrecipes("eval", "--model", str(model), "--output", str(result), *args)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
