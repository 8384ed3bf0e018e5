"""Properties of every recipe key and every command path, derived from the schema and the
command's parser rather than listed: whatever value or path a user gives, the answer is the run
going ahead or one `error:` line (exit 2), never a traceback, and no file changes that the
command did not create.

The keys come from the dataclasses of each recipe script (`config.methods.METHODS`) and of
`medrecipes eval`; the values a key must refuse follow from its declared type: a non-finite
number anywhere, true/false or a fraction for a whole number, a list or mapping for a single
value, text for a number.
"""

import dataclasses
import json
import math
import os
import types
import typing
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, card_record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medrecipes.config import parse_eval_args, parse_recipe
from medrecipes.config.eval_args import EvalArguments
from medrecipes.config.methods import METHODS
from medrecipes.config.parse import script_classes
from medrecipes.errors import UserError

RECIPES = {
    "cpt": "recipes/tiny_cpt.yaml",
    "sft": "recipes/tiny_sft.yaml",
    "grpo": "recipes/tiny_grpo.yaml",
    "dpo": "recipes/tiny_dpo.yaml",
    "kto": "recipes/tiny_kto.yaml",
}


def _strip_optional(hint):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return options[0] if len(options) == 1 else None
    return hint


def simple_type(hint):
    """int, float, bool, str, list or dict for a field declared as one of them (Optional or
    not); None for unions of several kinds, Literals and enums (their values are checked by
    name, in tests/test_config.py)."""
    hint = _strip_optional(hint)
    origin = typing.get_origin(hint) or hint
    return origin if origin in (int, float, bool, str, list, dict) else None


def fields_of(classes) -> list[tuple[str, type]]:
    seen, out = set(), []
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = simple_type(hints[f.name])
            if f.init and f.name not in seen and kind is not None:
                seen.add(f.name)
                out.append((f.name, kind))
    return out


FIELDS = {method: fields_of(script_classes(method)) for method in METHODS}
FIELDS["eval"] = fields_of([EvalArguments])


def bad_values(kind: type) -> st.SearchStrategy:
    """Values a field of `kind` must refuse, whatever it is."""
    non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
    words = st.text(alphabet="abcxyz", min_size=1, max_size=6)
    containers = st.one_of(st.lists(st.integers(), min_size=1, max_size=2), st.just({"a": 1}))
    if kind is int:
        fractions = st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: not float(x).is_integer())
        return st.one_of(non_finite, fractions, st.booleans(), words, containers)
    if kind is float:
        return st.one_of(non_finite, st.booleans(), words, containers)
    if kind is bool:
        return st.one_of(st.integers(min_value=2), words, containers)
    if kind is str:
        return containers
    if kind is dict:
        return st.one_of(st.lists(st.integers(), min_size=1, max_size=2), st.integers(), non_finite)
    return st.one_of(st.just({"a": 1}), non_finite)  # list


def any_values(kind: type) -> st.SearchStrategy:
    """Values of the right type that may still be out of range: negative, zero, huge."""
    if kind is int:
        return st.one_of(st.integers(-(10**12), 10**12), st.sampled_from([-1, 0, 1, 2**63]))
    if kind is float:
        return st.floats(allow_nan=False, allow_infinity=False, width=64)
    if kind is bool:
        return st.booleans()
    return st.nothing()


def base_recipe(method: str, tmp: Path) -> dict:
    data = yaml.safe_load((ROOT / RECIPES[method]).read_text()) if method != "eval" else {}
    if method == "eval":
        data = {"model_name_or_path": "m", "tasks": ["usmle"], "data": [f"usmle={ROOT}/data/usmle_sample/test.jsonl"]}
    data["output_dir" if method != "eval" else "output"] = str(tmp / ("out" if method != "eval" else "out.json"))
    return data


def parse_with(method: str, path: Path):
    if method == "eval":
        return parse_eval_args([str(path)])
    return parse_recipe(method, [str(path)])


def answer(method: str, data: dict, tmp: Path) -> str | None:
    """None where the recipe parses; else the one line of its UserError (any other exception
    fails the test with its traceback)."""
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    try:
        parse_with(method, path)
    except UserError as err:
        line = str(err)
        assert line and "\n" not in line, line
        return line
    return None


def cases(value_strategy):
    return st.sampled_from([(m, k, t) for m, fields in FIELDS.items() for k, t in fields]).flatmap(
        lambda case: st.tuples(st.just(case), value_strategy(case[2]))
    )


SETTINGS = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(cases(bad_values))
def test_a_value_of_the_wrong_type_is_refused_in_one_line(tmp_path, case):
    (method, key, kind), value = case
    data = base_recipe(method, tmp_path)
    data[key] = value
    line = answer(method, data, tmp_path)
    assert line is not None, f"{method}: {key}: {value!r} accepted for a {kind.__name__} field"
    assert key in line or "finite" in line, line


@SETTINGS
@given(cases(any_values))
def test_a_value_of_the_right_type_runs_or_is_refused_in_one_line(tmp_path, case):
    (method, key, _), value = case
    data = base_recipe(method, tmp_path)
    data[key] = value
    answer(method, data, tmp_path)  # one line or none; a traceback fails here


@SETTINGS
@given(
    st.sampled_from(
        [(m, k, t) for m, fields in FIELDS.items() if m != "eval" for k, t in fields if t in (int, float)]
    ),
    st.sampled_from(["nan", "inf", "-inf", "2.7", "true", "1e999"]),
)
def test_a_command_line_value_is_held_to_the_same_types(tmp_path, case, text):
    method, key, kind = case
    base = base_recipe(method, tmp_path)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(base))
    must_refuse = text in ("nan", "inf", "-inf", "1e999", "true") or kind is int
    try:
        parse_recipe(method, [str(path), f"--{key}", text])
    except UserError as err:
        assert "\n" not in str(err)
        return
    assert not must_refuse, f"--{key} {text} accepted for a {kind.__name__} field"


def test_every_recipe_field_is_covered():
    """The properties see the schema's fields, not a few: every simple-typed key of each script."""
    for method, fields in FIELDS.items():
        assert len(fields) > (10 if method == "eval" else 80), (method, len(fields))
    assert {"learning_rate", "max_steps", "use_peft", "eval_sets", "dataset_mixture"} <= {k for k, _ in FIELDS["sft"]}


@pytest.mark.parametrize("method", list(RECIPES))
def test_a_key_written_twice_is_refused_with_both_lines(tmp_path, method):
    text = (ROOT / RECIPES[method]).read_text() + "\nseed: 7\n"
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=r"key 'seed' is written twice \(first on line \d+\)"):
        parse_recipe(method, [str(path)])


def test_a_merge_key_takes_in_its_anchor_and_its_keys_may_be_set_again():
    """YAML's merge (`<<: *anchor`, what PyYAML's safe loader reads) in a recipe: the mapping takes
    the anchor's keys, its own override them, and a key of its own written twice is still refused."""
    from medrecipes.config.reading import load_yaml

    text = "base: &b {lr: 1, seed: 2}\nrun:\n  <<: *b\n  seed: 3\n"
    assert load_yaml(text)["run"] == {"lr": 1, "seed": 3}
    with pytest.raises(yaml.YAMLError, match="key 'seed' is written twice"):
        load_yaml(text + "  seed: 4\n")


def test_bools_and_fractions_are_not_whole_numbers_anywhere_in_a_mixture(tmp_path):
    data = base_recipe("cpt", tmp_path)
    for value, words in ((math.nan, "finite"), (True, "number"), ("abc", "number")):
        data["dataset_mixture"]["sources"][0]["weight"] = value
        line = answer("cpt", data, tmp_path)
        assert line is not None and words in line, (value, line)
    assert os.listdir(tmp_path) == ["recipe.yaml"]


# --- every path argument of every command ---------------------------------------------------
#
# The path arguments are the parser's own (`cli.arguments.input_path` and `output_path` types, and
# `medrecipes eval`'s --model and --output, whose parser is config.EvalArguments); each command
# runs from a valid invocation with one path replaced by a bad one of each kind below.


def path_arguments() -> list[tuple[str, str, str]]:
    """(command, option or positional name, "input" or "output") for every path argument."""
    from medrecipes.cli import make_parser
    from medrecipes.cli.arguments import html_path, input_path, output_path

    commands = next(a for a in make_parser()._actions if a.dest == "command").choices
    found = [("eval", "--model", "input"), ("eval", "--output", "output")]
    for name, sub in commands.items():
        for action in sub._actions:
            if action.type in (input_path, output_path, html_path):
                flag = action.option_strings[0] if action.option_strings else action.dest
                found.append((name, flag, "input" if action.type is input_path else "output"))
    return found


PATH_ARGUMENTS = path_arguments()
INPUT_KINDS = ("missing", "empty folder", "unrelated file", "read-only place", "another command's output")
OUTPUT_KINDS = (
    "parent is a file",
    "read-only place",
    "user's folder",
    "user's file",
    "an input",
    "another command's output",
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, tiny_model):
    """A folder of valid inputs for every command, and their values by argument."""
    import shutil

    from medrecipes import cli
    from medrecipes.outputs.writes import staged

    root = tmp_path_factory.mktemp("paths")
    model = shutil.copytree(tiny_model, root / "model")
    (root / "notes.jsonl").write_text("".join(f'{{"text": "note {i} on iron deficiency anemia"}}\n' for i in range(8)))
    shutil.copy(ROOT / "data/usmle_sample/test.jsonl", root / "questions.jsonl")
    shutil.copy(ROOT / "data/usmle_sample/train.jsonl", root / "other-questions.jsonl")
    recipe = yaml.safe_load((ROOT / RECIPES["cpt"]).read_text())
    recipe.update(model_name_or_path=str(model), output_dir=str(root / "run"))
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    (root / "model.gguf").write_bytes(b"GGUF")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(model), lora).save_pretrained(root / "adapter")
    AutoTokenizer.from_pretrained(model).save_pretrained(root / "adapter")
    (root / "unrelated.txt").write_text("not what any command reads")
    cli.main(["eval", "--model", str(model), "--data", f"{root}/questions.jsonl", "--tasks", "usmle", "--limit", "4",
              "--output", str(root / "result.json")])  # fmt: skip
    with staged(str(root / "earlier-report.html"), folder=False, kind="report") as path:
        Path(path).write_text("<html></html>")
    # The record of a finished run of the recipe, as a run leaves it, whose card `medrecipes card` writes.
    from medrecipes.config import parse_recipe

    recipe_, args, model_args = parse_recipe("cpt", [str(root / "recipe.yaml")])
    shutil.copytree(model, root / "run" / "final")  # the run's model: result.json evaluated the same weights
    (root / "run" / "trainer_state.json").write_text('{"global_step": 1, "log_history": [{"loss": 2.0, "step": 1}]}')
    finished = {"global_step": 1, "max_steps": 1, "num_train_epochs": 1, "hardware": "1 x CPU, 1 node, one process"}
    record = card_record("cpt", (recipe_, args, model_args), command="python recipes/cpt.py recipe.yaml")
    record.update(model=str(model), finished=finished)
    (root / "run" / "run.json").write_text(json.dumps(record))
    grpo = {"model_name_or_path": str(model), "output_dir": str(root / "grpo-run"), "use_cpu": True,
            "dataset_mixture": {"sources": [{"path": str(root / "questions.jsonl"), "format": "usmle"}]},
            "prompt_format": "chat", "rewards": [{"name": "usmle_accuracy"}], "max_completion_length": 4}  # fmt: skip
    (root / "grpo.yaml").write_text(yaml.safe_dump(grpo))
    valid = {
        "recipe": str(root / "recipe.yaml"),
        "--out": str(root / "new-out.jsonl"),  # build-data's folder, pairs' file
        "--mcq": str(root / "questions.jsonl"),
        "--dev": str(root / "other-questions.jsonl"),  # 60 questions: calibrate fits on 50 or more
        "--held-out": str(root / "questions.jsonl"),
        "--data-dir": str(root),
        "--train": str(root / "notes.jsonl"),
        "--eval": str(root / "questions.jsonl"),
        "--drop": str(root / "new-kept.jsonl"),
        "--model": str(model),
        "--data": str(root / "notes.jsonl"),
        "--output": str(root / "new.json"),
        "out_dir": str(root / "new-dir"),
        "--corpus": str(root / "notes.jsonl"),
        "adapter_dir": str(root / "adapter"),
        "gguf": str(root / "model.gguf"),
        "--accelerate-config": str(ROOT / "accelerate_configs" / "ddp.yaml"),
        "model": str(model),
        "paths": str(root / "result.json"),
        "run": str(root / "run"),
        "evals": str(root / "result.json"),
    }
    return root, valid


INVOCATIONS = {  # each command's valid call, in terms of its path arguments
    "validate": ["validate", "{recipe}", "--accelerate-config", "{--accelerate-config}"],
    "plan": ["plan", "{recipe}"],
    "preview": ["preview", "{recipe}", "--examples", "1"],
    "launch-plan": ["launch-plan", "{recipe}", "--nodes", "1", "--accelerate-config", "{--accelerate-config}"],
    "build-data": ["build-data", "{recipe}", "--out", "{--out}"],
    "decontaminate": ["decontaminate", "--train", "{--train}", "--eval", "{--eval}", "--drop", "{--drop}"],
    "eval": [
        "eval",
        "--model",
        "{--model}",
        "--data",
        "{--eval}",
        "--tasks",
        "usmle",
        "--limit",
        "2",
        "--output",
        "{--output}",
    ],
    "perplexity": [
        "perplexity",
        "--model",
        "{--model}",
        "--data",
        "{--data}",
        "--limit",
        "2",
        "--output",
        "{--output}",
    ],
    "pairs": [
        "pairs",
        "--mcq",
        "{--mcq}",
        "--model",
        "{--model}",
        "--samples",
        "2",
        "--max-new-tokens",
        "2",
        "--out",
        "{--out}",
    ],  # fmt: skip
    "calibrate": [
        "calibrate",
        "--model",
        "{--model}",
        "--task",
        "usmle",
        "--dev",
        "{--dev}",
        "--held-out",
        "{--held-out}",
        "--data-dir",
        "{--data-dir}",
        "--limit",
        "50",
    ],  # fmt: skip
    "tiny-model": [
        "tiny-model",
        "{out_dir}",
        "--corpus",
        "{--corpus}",
        "--vocab-size",
        "300",
        "--hidden-size",
        "8",
        "--layers",
        "1",
    ],
    "merge-lora": ["merge-lora", "{adapter_dir}", "{out_dir}"],
    "convert-gguf": ["convert-gguf", "{gguf}", "{out_dir}"],
    "generate": ["generate", "{model}", "--prompt", "Which vitamin prevents scurvy?", "--max-new-tokens", "2"],
    "report": ["report", "{paths}", "--output", "{--output}"],
    "card": ["card", "{run}", "{evals}", "--output", "{--output}"],
    "serve": ["serve", "{model}", "--port", "8000"],
    "pass-rate": ["pass-rate", "{recipe}", "--output", "{--output}", "--samples", "2"],
}
# The valid value of an argument where a command takes another than the others: pass-rate reads a
# GRPO recipe and writes JSON lines.
VALID_FOR = {"pass-rate": {"recipe": "grpo.yaml", "--output": "new-rates.jsonl"}, "report": {"--output": "new.html"}}


def valid_for(command: str, root: Path, valid: dict) -> dict:
    return {**valid, **{name: str(root / value) for name, value in VALID_FOR.get(command, {}).items()}}


def bad_path(root: Path, role: str, kind: str, argv: list[str], valid: dict) -> str:
    if kind == "missing":
        return str(root / "no" / "such" / "path")
    if kind == "empty folder":
        folder = root / "empty"
        folder.mkdir(exist_ok=True)
        return str(folder)
    if kind == "unrelated file":
        return str(root / "unrelated.txt")
    if kind == "read-only place":
        return "/sys/medrecipes-check/x.json"
    if kind == "parent is a file":
        return str(root / "unrelated.txt" / "below")
    if kind == "user's folder":
        folder = root / "users"
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text('{"mine": true}')
        return str(folder)
    if kind == "user's file":
        return str(root / "unrelated.txt")
    if kind == "an input":
        inputs = [value for value in argv if value in valid.values() and not value.startswith(str(root / "new"))]
        return inputs[0]
    return str(root / ("earlier-report.html" if "eval" in argv[0] else "result.json"))  # another command's output


def hashes(root: Path) -> dict:
    import hashlib

    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "command, argument, role, kind",
    [(c, a, r, k) for c, a, r in PATH_ARGUMENTS for k in (INPUT_KINDS if r == "input" else OUTPUT_KINDS)],
)
def test_every_path_argument_refuses_a_bad_path_in_one_line_and_changes_nothing(
    sandbox, command, argument, role, kind, capsys, monkeypatch
):
    from medrecipes import cli, serving

    root, valid = sandbox
    valid = valid_for(command, root, valid)
    monkeypatch.setattr(serving, "run_server", lambda *args: (_ for _ in ()).throw(SystemExit(0)))  # no server
    argv = [part.format(**valid) if part.startswith("{") else part for part in INVOCATIONS[command]]
    position = INVOCATIONS[command].index("{" + argument + "}")
    argv[position] = bad_path(root, role, kind, argv, valid)
    before, folders = hashes(root), {p for p in root.rglob("*") if p.is_dir()}
    try:
        cli.main(argv)
        code = 0
    except SystemExit as exit:
        code = exit.code
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code in (0, 2), (argv, code)
    assert code == 0 or len(errors) == 1, (argv, errors)
    if role == "output" and kind != "another command's output":
        assert code == 2, (argv, "a bad output was written")
    after = hashes(root)
    assert {p: h for p, h in after.items() if p in before} == before, (argv, "a file changed")
    for created in set(after) - set(before):  # what a successful command wrote goes for the next case
        assert code == 0, (argv, created)
        created.unlink()
    for folder in sorted({p for p in root.rglob("*") if p.is_dir()} - folders, reverse=True):  # a folder result's
        assert code == 0, (argv, folder)
        folder.rmdir()


@pytest.mark.parametrize("command", list(INVOCATIONS))
def test_each_invocation_runs_as_given(sandbox, command, capsys, monkeypatch):
    """The calls above are valid, so a refusal in the test before is the bad path's doing."""
    from medrecipes import cli, serving

    root, valid = sandbox
    valid = valid_for(command, root, valid)
    monkeypatch.setattr(serving, "run_server", lambda *args: (_ for _ in ()).throw(SystemExit(0)))
    argv = [part.format(**valid) if part.startswith("{") else part for part in INVOCATIONS[command]]
    if command == "convert-gguf":
        pytest.skip("no .gguf model in the tests: its valid run is tests/test_real_gemma.py's")
    before = hashes(root)
    try:
        cli.main(argv)
    except SystemExit as exit:
        assert exit.code == 0, (argv, capsys.readouterr().err[-2000:])
    for created in set(hashes(root)) - set(before):
        created.unlink()
    for folder in ("new-out.jsonl", "new-dir"):
        if (root / folder).is_dir():
            import shutil

            shutil.rmtree(root / folder)


def test_every_command_has_its_paths_checked():
    from medrecipes.cli import make_parser

    commands = next(a for a in make_parser()._actions if a.dest == "command").choices
    assert set(INVOCATIONS) == set(commands)
    assert {c for c, _, _ in PATH_ARGUMENTS} == set(commands)


def _nested_numbers(value, path=()):
    """(path, number) of every number inside a recipe's lists and mappings."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _nested_numbers(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nested_numbers(item, (*path, index))
    elif isinstance(value, int | float) and not isinstance(value, bool) and len(path) > 1:
        yield path, value


def _spelled(path) -> str:
    return path[0] + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])


def _with_nested(method: str, path: tuple, value, tmp: Path) -> dict:
    """The method's tiny recipe with the number at `path` inside its lists and mappings set to `value`."""
    data = base_recipe(method, tmp)
    holder = data
    for step in path[:-1]:
        holder = holder[step]
    holder[path[-1]] = value
    return data


NESTED = [(m, path) for m in RECIPES for path, _ in _nested_numbers(yaml.safe_load((ROOT / RECIPES[m]).read_text()))]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_anywhere_in_a_nested_key_is_refused_where_it_is(tmp_path, bad):
    """Every number inside the shipped tiny recipes' lists and mappings (reward weights, source
    weights, mixture seeds, ...) made NaN or infinite: one line naming where it is, or its key."""
    assert {m for m, _ in NESTED} >= {"grpo", "cpt"} and any("rewards" in path for _, path in NESTED)
    for method, path in NESTED:
        line = answer(method, _with_nested(method, path, bad, tmp_path), tmp_path)
        assert line is not None, f"{method}: {_spelled(path)} = {bad} accepted"
        assert "finite" in line or "number" in line, line


def _bounded_keys():
    for method in METHODS:
        for cls in script_classes(method):
            for key, bound in getattr(cls, "BOUNDS", {}).items():
                yield method, key, bound


@pytest.mark.parametrize("method, key, bound", list(_bounded_keys()), ids=lambda v: str(v)[:20])
def test_a_method_key_whose_sign_or_zero_defeats_the_method_is_refused_with_why(tmp_path, method, key, bound):
    """0, negative, huge and the bound itself: the schema's meaning of each numeric key's sign."""
    for value in (0, -1, -0.5, 1e-9, bound.low, 0.25, 1e12):
        data = base_recipe(method, tmp_path)
        data[key] = value
        if (method, key) == ("dpo", "label_smoothing"):
            data["loss_type"] = ["robust"]  # a loss that reads it (the others are refused it, by name)
        if key.startswith("sapo_"):
            data["loss_type"] = "sapo"  # likewise
        if key == "entropy_coef_min":
            data["entropy_coef_max"] = 1e13  # the floor stays under its ceiling (refused by a check of its own)
        if key == "num_generations_eval" and bound.admits(value):
            data["per_device_eval_batch_size"] = int(value)  # a batch it divides (refused by a check of its own)
        line = answer(method, data, tmp_path)
        if bound.admits(value):
            assert line is None or key not in line, line
        else:  # a count's key refuses a fraction as a fraction, before its range
            why = "whole number" if line and "must be a whole number" in line else bound.why
            assert line is not None and key in line and why in line, (key, value, line)


def _branch_settings():
    from medrecipes.config.library_checks import _branch_readers, _trainer_of

    for method in METHODS:
        args = METHODS[method].config(output_dir="unused", use_cpu=True)
        if found := _trainer_of(args):
            for key, (choice, values) in _branch_readers(*found).items():
                yield method, key, choice, sorted(values)


@pytest.mark.parametrize("method, key, choice, readers", list(_branch_settings()), ids=lambda v: str(v)[:20])
def test_a_setting_its_trainer_reads_under_some_choices_only_is_refused_under_the_others(
    tmp_path, method, key, choice, readers
):
    """Each setting TRL reads only in some branches of a choice (DPO's label_smoothing under its
    smoothed losses, GRPO's SAPO temperatures): changed under another choice, one line naming it;
    under a choice that reads it, taken."""
    field = {f.name: f for cls in script_classes(method) for f in dataclasses.fields(cls)}
    default = field[key].default
    listed = isinstance(field[choice].default_factory(), list) if callable(field[choice].default_factory) else False
    others = [v for v in _choice_values(method, choice) if v not in readers]
    data = base_recipe(method, tmp_path)
    data[key] = default + 1 if isinstance(default, int) else default / 2 if default else 0.1
    if others:
        data[choice] = [others[0]] if listed else others[0]
        line = answer(method, data, tmp_path)
        assert line is not None and key in line and readers[0] in line, (key, data[key], line)
    data[choice] = [readers[0]] if listed else readers[0]
    line = answer(method, data, tmp_path)
    assert line is None or key not in line, line


def _trainer_choices():
    from medrecipes.config.library_checks import _compared_values, _trainer_of

    for method in METHODS:
        if found := _trainer_of(METHODS[method].config(output_dir="unused", use_cpu=True)):
            for key, known in _compared_values(*found).items():
                if key != "model_init_kwargs":  # a mapping, whose keys are compared
                    yield method, key, sorted(known)


@pytest.mark.parametrize("method, key, known", list(_trainer_choices()), ids=lambda v: str(v)[:24])
def test_a_choice_its_trainer_does_not_act_on_is_refused_with_the_ones_it_does(tmp_path, method, key, known):
    """Each name a TRL trainer chooses by (losses, divergences, reward scaling, packing strategy):
    one it never compares with, misspelt from one it does, is one line naming the key and offering
    the one meant; the one meant is not refused for being unknown."""
    field = {f.name: f for cls in script_classes(method) for f in dataclasses.fields(cls)}[key]
    listed = field.default_factory is not dataclasses.MISSING and isinstance(field.default_factory(), list)
    data = base_recipe(method, tmp_path)
    data[key] = [known[0] + "x"] if listed else known[0] + "x"
    line = answer(method, data, tmp_path)
    assert line is not None and key in line, (key, line)
    assert f"'{known[0]}'" in line or "int()" in line, line  # offered, where the key is not a number's
    data[key] = [known[0]] if listed else known[0]
    line = answer(method, data, tmp_path)
    assert line is None or "none of the values" not in line, line


def _choice_values(method: str, choice: str) -> list[str]:
    """The values TRL's trainer for `method` compares `choice` with, read from its source."""
    import inspect
    import re

    from medrecipes.config.library_checks import _trainer_of

    _, trainer = _trainer_of(METHODS[method].config(output_dir="unused", use_cpu=True))
    return sorted(set(re.findall(rf'{choice} == "([a-z_0-9]+)"', inspect.getsource(trainer))))


@SETTINGS
@given(
    st.sampled_from(["adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "learning_rate"]),
    st.floats(-2, 2, allow_nan=False),
)
def test_the_recipe_takes_an_optimizer_setting_exactly_when_torch_does(tmp_path, key, value):
    """The optimizer's own checks, not a copy of them: parse refuses a value iff AdamW refuses it, and
    an epsilon of 0, which AdamW takes and turns into NaN weights at its first step."""
    import torch

    data = base_recipe("sft", tmp_path)
    data[key] = value
    settings = {"lr": 2e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    torch_key = {"adam_beta1": "betas", "adam_beta2": "betas", "adam_epsilon": "eps", "learning_rate": "lr"}.get(
        key, key
    )
    settings[torch_key] = (value, 0.999) if key == "adam_beta1" else (0.9, value) if key == "adam_beta2" else value
    for other in ("learning_rate", "weight_decay"):  # the recipe's own, where not the key tried
        if other != key and other in data:
            settings[{"learning_rate": "lr"}.get(other, other)] = data[other]
    try:
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], **settings)
        accepted = True
    except ValueError:
        accepted = False
    if key == "adam_epsilon" and value == 0:  # torch takes it, and then divides 0 by 0 for a weight with no gradient
        accepted = False
    line = answer("sft", data, tmp_path)
    if accepted:
        assert line is None or key not in line, line
    else:
        assert line is not None and key in line, (key, value)


@settings(SETTINGS, max_examples=40)
@given(
    st.integers(-3, 3),
    st.one_of(st.none(), st.integers(-2, 4)),
    st.booleans(),
    st.sampled_from(["sft", "cpt", "grpo", "dpo"]),
)
def test_the_recipe_takes_dataloader_settings_exactly_when_torch_does(tmp_path, workers, prefetch, persistent, method):
    """torch's DataLoader's own checks, at parse: the recipe is refused, naming a loader key, iff
    the DataLoader refuses the same settings (workers, prefetch factor, persistent workers), when it
    is built or when its workers start (a prefetch factor of 0 is refused only then)."""
    import warnings

    from torch.utils.data import DataLoader

    data = base_recipe(method, tmp_path)
    settings = {"num_workers": workers, "prefetch_factor": prefetch, "persistent_workers": persistent}
    data.update({f"dataloader_{key}": value for key, value in settings.items()})
    try:
        with warnings.catch_warnings():  # its advice on the worker count for this machine
            warnings.simplefilter("ignore")
            for _ in DataLoader([0], **settings):  # its workers start, and end with the loader
                pass
        accepted = True
    except (ValueError, AssertionError):
        accepted = False
    line = answer(method, data, tmp_path)
    if accepted:
        assert line is None or "dataloader_" not in line, line
    else:
        assert line is not None and "dataloader_" in line, (settings, line)


def test_settings_that_do_nothing_here_are_said_in_one_line_each(tmp_path):
    """What the libraries accept and then ignore: clipping at a norm of 0 or below (transformers
    clips above 0), fp16 on a CPU (accelerate casts only on an accelerator), and a warm-up under
    every schedule whose function takes none (read from transformers' own table)."""
    import inspect

    from transformers.optimization import TYPE_TO_SCHEDULER_FUNCTION

    def notes(**keys):
        data = {**base_recipe("sft", tmp_path), "use_cpu": True, **keys}
        (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
        return parse_with("sft", tmp_path / "recipe.yaml")[0].notes

    assert notes() == []
    for norm, off in ((1.0, False), (0.5, False), (0.0, True), (-1.0, True)):
        found = [n for n in notes(max_grad_norm=norm) if "max_grad_norm" in n]
        assert bool(found) == off, (norm, found)
    assert any(n.startswith("fp16 does nothing on a CPU run") for n in notes(fp16=True))
    for rate, off in ((0.0, True), (1e-9, False)):  # a rate of 0 changes no weight
        assert any(n.startswith("learning_rate 0 changes no weight") for n in notes(learning_rate=rate)) == off
    assert not any("bf16" in n.split(";")[0] for n in notes(bf16=True))
    needs = {"reduce_lr_on_plateau": {"eval_strategy": "steps", "eval_steps": 1}}
    for kind, function in TYPE_TO_SCHEDULER_FUNCTION.items():
        name = kind.value
        try:
            found = notes(lr_scheduler_type=name, warmup_steps=2, **needs.get(name, {}))
        except UserError:
            continue  # a schedule this recipe cannot take at all (refused in its own line)
        ignored = "num_warmup_steps" not in inspect.signature(function).parameters
        assert any(n.startswith("warmup_steps 2 is ignored") for n in found) == ignored, (name, found)
        assert not any("unchanged after warm-up" in n for n in found), (name, found)  # each moves as it comes
    # an interval in steps beside a strategy of epochs
    said = notes(eval_strategy="epoch", eval_steps=5, logging_strategy="epoch", logging_steps=3)
    assert sum(n.endswith("is epoch; set eval_strategy: steps to use it, or drop it") for n in said) == 1, said
    assert any(n.startswith("logging_steps is read only while logging_strategy is steps") for n in said), said
    assert not any("is read only while" in n for n in notes(eval_strategy="steps", eval_steps=5))
    # the tokens seen are counted whatever the library's switch says
    assert any(
        n.startswith("include_num_input_tokens_seen false leaves") for n in notes(include_num_input_tokens_seen=False)
    )
    # transformers' own SIGTERM checkpoint: a recipe's handler replaces its handler
    assert any(n.startswith("enable_jit_checkpoint does nothing") for n in notes(enable_jit_checkpoint=True))
    assert not any("enable_jit_checkpoint" in n for n in notes(enable_jit_checkpoint=False))
    # a warm-up of 1.0: one step, where a share of the run is written below 1
    for steps, said in ((1.0, True), (1, False), (2.0, False), (0.5, False)):
        assert any(n.startswith("warmup_steps 1.0 is one step") for n in notes(warmup_steps=steps)) == said, steps
    # a warm-up as long as the run (transformers' count: a share rounded up): the rate never peaks
    for warmup, max_steps, said in ((0.05, 1, "trains at learning rate 0"), (3, 3, "reaches 67% of learning_rate"),
                                    (0.5, 2, None), (2, 3, None), (0.99, 100, None), (0.995, 100, "reaches 99% of learning_rate")):  # fmt: skip
        found = [n for n in notes(warmup_steps=warmup, max_steps=max_steps) if "the whole run" in n]
        assert [said in n for n in found] == ([True] if said else []), (warmup, max_steps, found)
    constant = notes(warmup_steps=2, max_steps=2, lr_scheduler_type="constant")  # no warm-up to be the run
    assert not any("the whole run" in n for n in constant) and any("is ignored by" in n for n in constant), constant
    # kwargs that hold a moving schedule still after its warm-up
    for name, kwargs in (
        ("cosine", {"num_cycles": 0}),
        ("polynomial", {"power": 0}),
        ("cosine_with_min_lr", {"min_lr_rate": 1}),
    ):
        found = notes(lr_scheduler_type=name, lr_scheduler_kwargs=kwargs, max_steps=20)
        assert any(n.startswith(f"lr_scheduler_type {name} with lr_scheduler_kwargs") for n in found), (name, found)
    # decontaminate_against is read by the commands that check data, not by a run from the sources
    against = {"decontaminate_against": [str(ROOT / "data/usmle_sample/test.jsonl")]}
    assert any(n.startswith("decontaminate_against is read by") for n in notes(**against))
    # the prompt's keys where no question is asked as a prompt: SFT on chat rows only
    chat = {"dataset_mixture": {"sources": [{"path": str(ROOT / "data/medical_text/train.jsonl"), "format": "chat"}]}}
    said = notes(system_prompt="You are a doctor.", eval_sets=None, eval_strategy="no", **chat)
    assert any(n.startswith("system_prompt is for questions asked as a prompt") for n in said), said
    assert not any("asked as a prompt" in n for n in notes(system_prompt="You are a doctor."))
    said = notes(with_explanation=True, chain_of_thought=True, eval_sets=None, eval_strategy="no", **chat)
    assert any(n.startswith("with_explanation writes the explanation into SFT's answers") for n in said), said
    assert not any("with_explanation" in n for n in notes(with_explanation=True, chain_of_thought=True))
    # a system prompt that is the path of a file: the model would read the path
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("You are a careful physician.")
    assert any(n.startswith("system_prompt is the prompt's own text") for n in notes(system_prompt=str(prompt_file)))
    # the best checkpoints kept with no evaluation in training to rank them: only the newest stays
    said = notes(eval_strategy="no", keep_best_checkpoints=2)
    assert any(n.startswith("keep_best_checkpoints 2 keeps the checkpoints an evaluation ranks best") for n in said)
    # keys that only a stream or object storage reads
    text = {"path": str(ROOT / "data/medical_text/train.jsonl"), "format": "chat"}
    said = notes(eval_sets=None, eval_strategy="no", dataset_mixture={"sources": [text], "shuffle_buffer": 10})
    assert any(n.startswith("dataset_mixture.shuffle_buffer shuffles a stream's") for n in said), said
    said = notes(eval_sets=None, eval_strategy="no", dataset_mixture={"sources": [{**text, "storage_options": {}}]})
    assert not any("storage_options" in n for n in said)  # empty: nothing given
    local = {**text, "storage_options": {"anon": True}}
    said = notes(eval_sets=None, eval_strategy="no", dataset_mixture={"sources": [local]})
    assert any(n.startswith("dataset_mixture.sources[0].storage_options are for object storage") for n in said)
    # a compile mode alone: transformers switches compilation on
    assert any(
        n.startswith("torch_compile_mode switches torch_compile on") for n in notes(torch_compile_mode="default")
    )
    assert not any("switches torch_compile" in n for n in notes(torch_compile=True, torch_compile_mode="default"))
    # transformers' script flags, said where they ask for what a recipe does not do
    evaluates = parse_with("sft", tmp_path / "recipe.yaml")[1].eval_strategy != "no"
    for flag, done in (("do_train", True), ("do_eval", evaluates), ("do_predict", False)):
        for value in (True, False):
            said = any(n.startswith(f"{flag} is left by transformers") for n in notes(**{flag: value}))
            assert said == (value != done), (flag, value)
    for key, value in (("include_for_metrics", ["loss"]), ("batch_eval_metrics", True)):
        assert any(n.startswith(f"{key} is read only with a trainer's compute_metrics") for n in notes(**{key: value}))
    assert any(n.startswith("fsdp shards the model") for n in notes(fsdp="full_shard"))
    # keys one logger reads, said unless that logger is in report_to
    from medrecipes.config.library_checks import LOGGER_KEYS

    for logger, keys in LOGGER_KEYS.items():
        key = keys[0] if not keys[0].endswith("_") else f"{keys[0]}space_id"
        for loggers, said in (("none", True), (logger, False)):
            data = {**base_recipe("sft", tmp_path), "use_cpu": True, key: "x", "report_to": loggers}
            (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
            read = parse_recipe("sft", [str(tmp_path / "recipe.yaml")], here=False)[0].notes  # logger not installed
            assert any(n.startswith(f"{key} is read only by the {logger} logger") for n in read) == said, (key, read)
    assert any(n.startswith("optim_target_modules is read only by") for n in notes(optim_target_modules=["q_proj"]))
    # every setting transformers' help says is for several processes, said in a run of one
    from medrecipes.config import method_named
    from medrecipes.config.library_checks import distributed_keys

    several = distributed_keys(method_named("sft").config)
    assert {"ddp_find_unused_parameters", "save_on_each_node", "average_tokens_across_devices"} <= set(several)
    kinds = typing.get_type_hints(method_named("sft").config)
    tried = 0
    for key in several:
        value = {bool: True, bool | None: True, int | None: 25, int: 25}.get(kinds[key])
        if value is None:
            continue  # a name (a backend starts a process group: refused outside a launch)
        tried += 1
        assert any(n.startswith(f"{key} sets up training on several processes") for n in notes(**{key: value})), key
    assert tried >= 6, tried
    import torch

    if torch.accelerator.is_available():  # use_cpu beside an accelerator: nothing to offload
        assert any(
            n.startswith("activation_offloading does nothing on a CPU") for n in notes(activation_offloading=True)
        )
    else:  # TRL asks torch for the accelerator and fails without one
        with pytest.raises(UserError, match="this machine has no accelerator"):
            notes(activation_offloading=True)
    notes()  # recipe.yaml as the lines below read it
    # a key the command line gives twice, in either spelling: the last is used (a wrapper's override), and said
    twice = parse_recipe("sft", [str(tmp_path / "recipe.yaml"), "--seed", "1", "--seed", "2"])
    assert twice[1].seed == 2 and "--seed is given twice on the command line; the last is used" in twice[0].notes
    spelt = parse_recipe("sft", [str(tmp_path / "recipe.yaml"), "--max-steps", "3", "--max_steps", "4"])
    assert spelt[1].max_steps == 4 and any(
        n.startswith("--max-steps and --max_steps are one key") for n in spelt[0].notes
    )
    assert any(n.startswith("dataloader_pin_memory does nothing on a CPU") for n in notes(dataloader_pin_memory=True))
    # two processes' groups: said where the recipe is read (validate), refused where one process trains
    with pytest.raises(UserError, match="groups multiply to 2 processes, and 1 trains"):
        notes(parallelism_config={"tp_size": 2})
    read = parse_recipe("sft", [str(tmp_path / "recipe.yaml")], here=False)[0].notes
    assert any(n.startswith("parallelism_config's groups take 2") for n in read), read


def test_keys_of_a_feature_switched_off_are_said_each(tmp_path):
    """Each key that sets up a feature (a push, evaluations, saves, logs, vLLM, a reference sync)
    given while its switch is off: one line naming the key and the switch. A key's value is its
    default changed to another of its kind (a key whose default is None takes a value of the kind
    it holds), so every key of the table is tried, for each method whose config has it."""
    import dataclasses

    from medrecipes.config import method_named
    from medrecipes.config.library_checks import SWITCHED_OFF

    unset = {"hub_model_id": "med/x", "hub_private_repo": True, "hub_revision": "v1", "save_total_limit": 2,
             "eval_steps": 5, "vllm_server_base_url": "http://localhost:8000", "vllm_max_model_length": 512,
             "vllm_structured_outputs_regex": "[AB]", "vllm_importance_sampling_clip_min": 0.5,
             "fsdp_config": {"min_num_params": 100}, "keep_best_checkpoints": 1, "keep_last_checkpoints": 2,
             "checkpoint_mirror_url": "file:///tmp/mirror"}  # fmt: skip
    changed = {
        bool: lambda v: not v,
        int: lambda v: v + 3,
        float: lambda v: v / 2 if v else 0.5,
        str: lambda v: "every_save",
    }
    tried = 0
    from medrecipes.config.schema import RecipeArguments

    recipe_keys = {f.name: f.default for f in dataclasses.fields(RecipeArguments)}  # the keys set up may be these
    for method in ("sft", "grpo", "dpo"):
        defaults = {**recipe_keys, **{f.name: f.default for f in dataclasses.fields(method_named(method).config)}}
        for switch, (off, keys) in SWITCHED_OFF.items():
            if switch not in defaults:
                continue
            named = [k for key in keys for k in defaults if k == key or (key.endswith("_") and k.startswith(key))]
            for key in named:
                if key == "vllm_mode" or (defaults[key] is None and key not in unset):
                    continue  # a choice of words, or a key whose kind the table does not hold
                value = unset[key] if defaults[key] is None else changed[type(defaults[key])](defaults[key])
                data = {**base_recipe(method, tmp_path), "use_cpu": True, key: value, switch: off[0]}
                (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
                try:
                    notes = parse_with(method, tmp_path / "recipe.yaml")[0].notes
                    said = [n for n in notes if key in n.split(" do")[0].split(", ")]
                except UserError:
                    continue  # a value its own check refuses (a range): one line already
                assert said and f"while {switch} is" in said[0], (method, key, said)
                tried += 1
    assert tried >= 20, tried


def test_evaluation_settings_without_eval_sets_are_said(tmp_path):
    """Every key of a method's config that sets how it evaluates (eval a word of its name), given
    where the recipe has no eval sets and so evaluates nothing: said in one line, unless the
    eval_strategy switch already says it. Derived from the configs' fields, not a list."""
    import dataclasses
    import re

    from medrecipes.config import method_named
    from medrecipes.config.library_checks import SWITCHED_OFF

    changed = {bool: lambda v: not v, int: lambda v: v + 3, float: lambda v: v / 2 if v else 0.5}
    tried = 0
    for method in ("sft", "grpo", "dpo", "kto", "cpt"):
        for field in dataclasses.fields(method_named(method).config):
            default, key = field.default, field.name
            if not re.search(r"(^|_)eval(_|$)", key) or type(default) not in changed:
                continue  # not an evaluation's setting, or one whose kind the table does not hold
            if key in (*SWITCHED_OFF["eval_strategy"][1], "do_eval", "eval_on_start", "eval_strategy"):
                continue  # said by the switch or as a script's flag, or an evaluation asked for (refused without eval sets)
            data = {**base_recipe(method, tmp_path), "use_cpu": True, "eval_sets": None, "eval_strategy": "no",
                    "eval_on_start": False, "load_best_model_at_end": False, key: changed[type(default)](default)}  # fmt: skip
            (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
            try:
                notes = parse_with(method, tmp_path / "recipe.yaml")[0].notes
            except UserError:
                continue  # a value its own check refuses: one line already
            said = [n for n in notes if "how the run evaluates, and there are no eval_sets" in n]
            assert len(said) == 1 and key in said[0].split(" set")[0].split(", "), (method, key, notes)
            tried += 1
    assert tried >= 10, tried


def test_every_device_torch_names_is_taken_for_evaluation_only_where_it_is_there():
    """Each device type torch's own parser lists (read from its refusal of a type it does not
    know), bare and with the indices 0 and 7: taken where torch has that many of them, else one
    line saying what this machine's torch has; never a traceback at the first tensor moved."""
    import re

    import torch

    from medrecipes.config.eval_args import check_device

    try:
        torch.device("nosuchdevice")
    except RuntimeError as err:
        kinds = re.search(r"Expected one of (.+?) device type", str(err)).group(1).split(", ")
    assert "cpu" in kinds and "cuda" in kinds
    for kind in kinds:
        backend = getattr(torch, kind, None)
        count = backend.device_count() if kind != "cpu" and backend and backend.is_available() else 0
        for name in (kind, f"{kind}:0", f"{kind}:7"):
            index = int(name.split(":")[1]) if ":" in name else 0
            try:
                torch.device(name)
            except RuntimeError:
                continue  # a type torch takes with no index
            try:
                check_device(name, "eval: device")
                taken = True
            except UserError as err:
                assert "\n" not in str(err) and name in str(err), str(err)
                taken = False
            assert taken == (kind == "cpu" or index < count), (name, count)


@pytest.mark.parametrize("value", [0, -1, -0.5, 10**30, 2**64])
def test_any_number_anywhere_in_a_nested_key_runs_or_is_refused_in_one_line(tmp_path, value):
    """Zero, negative and huge values at every number inside the shipped tiny recipes' lists and
    mappings: the recipe parses or one line names the problem, never a traceback."""
    for method, path in NESTED:
        answer(method, _with_nested(method, path, value, tmp_path), tmp_path)  # one line or none, no traceback


# --- every numeric option of every command ---------------------------------------------------


def numeric_options() -> list[tuple[str, str, object]]:
    """(command, flag, type) for every option of every command that takes a number."""
    from medrecipes.cli import make_parser

    commands = next(a for a in make_parser()._actions if a.dest == "command").choices
    found = []
    for name, sub in commands.items():
        for action in sub._actions:
            takes_number = action.type in (int, float) or type(action.type).__name__ == "Number"
            if takes_number:
                found.append((name, action.option_strings[0] if action.option_strings else action.dest, action.type))
    return found


def minimal_argv(command: str, flag: str, value: str) -> list[str]:
    """The command with something in each of its required arguments (parsing checks no path) and `flag` set."""
    from medrecipes.cli import make_parser

    sub = next(a for a in make_parser()._actions if a.dest == "command").choices[command]
    argv = [command]
    for action in sub._actions:
        if action.option_strings and action.required and action.option_strings[0] != flag:
            argv += [action.option_strings[0], "1" if type(action.type).__name__ == "Number" else "x"]
        elif not action.option_strings and action.dest != "help":
            argv.append("x")
    return [*argv, flag, value] if flag.startswith("-") else argv


@pytest.mark.parametrize("command, flag, kind", numeric_options(), ids=lambda v: str(v)[:16])
def test_every_numeric_option_states_its_range_and_holds_to_it(command, flag, kind):
    """0, negative, fractional, huge and non-finite values, and each side of the option's bounds:
    parsed as given where its range admits the value, else one line naming the flag, before the
    command does anything. A new option is covered here as soon as it is added."""
    from medrecipes.cli import make_parser
    from medrecipes.cli.arguments import Number

    assert isinstance(kind, Number), f"{command} {flag}: give it a Number type with its range"
    edges = [b + d for b in (kind.least, kind.most, kind.above) if b is not None for d in (-1, 0, 1)]
    for text in ["0", "-1", "1.5", "1e30", "nan", "inf", "-inf", str(2**63), *map(str, edges)]:
        try:
            value = kind.kind(text)
        except ValueError:
            value = None
        argv = minimal_argv(command, flag, text)
        try:
            args, _ = make_parser().parse_known_args(argv)
        except UserError as err:
            assert value is None or not kind.admits(value), (command, flag, text, str(err))
            assert flag in str(err) and "\n" not in str(err), str(err)
            continue
        assert value is not None and kind.admits(value), (command, flag, text)
        assert getattr(args, flag.lstrip("-").replace("-", "_")) == value


def test_a_command_option_given_twice_keeps_the_last_and_says_so(capsys):
    """argparse keeps the last of an option given twice (a wrapper's default, then the user's);
    the command says so on stderr, in either spelling, and a repeatable option is not said."""
    from medrecipes.cli import make_parser

    args, _ = make_parser().parse_known_args(["plan", "recipes/tiny_cpt.yaml", "--num-gpus", "2", "--num-gpus", "3"])
    assert args.num_gpus == 3 and "--num-gpus is given twice; the last is used" in capsys.readouterr().err
    evals = ["--eval", "data/usmle_sample/test.jsonl", "--eval", "data/usmle_sample/train.jsonl"]
    args, _ = make_parser().parse_known_args(["decontaminate", "--train", "data/medical_text/train.jsonl", *evals])
    assert len(args.eval) == 2 and "given twice" not in capsys.readouterr().err
