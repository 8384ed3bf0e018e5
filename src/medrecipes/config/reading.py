"""Reading a recipe: the YAML file and the command line into dataclasses, each bad key, type
or value one line that names the file and the key.

`RecipeParser` wraps TRL's `TrlParser` (which reads only `--config`) so that `python
recipes/cpt.py recipes/x.yaml` works too; nested entries (a mixture's sources, eval sets)
become dataclasses through `build_dataclass`; `check_choices` checks every `Literal` field.
"""

import dataclasses
import datetime
import json
import math
import os
import re
import sys
import types
import typing
from argparse import ArgumentTypeError
from enum import Enum
from typing import Any

import yaml
from trl import TrlParser

from medrecipes.errors import UserError, check_choice, did_you_mean, not_utf8, quoted
from medrecipes.locations import absent, local_path


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key written twice in one mapping (YAML keeps the later value
    without a word, so a recipe edited at its end would silently change a key set above). A key
    taken in by a merge (`<<: *anchor`) may be set again: that is what a merge is for."""

    def construct_document(self, node):
        self.root = node
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not _hashable(key) or (node is getattr(self, "root", None) and not isinstance(key, str)):
                # a list as a key is no key at all (PyYAML's TypeError); the document's keys are settings' names
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {quoted(key)} is not a name (YAML reads it as {_kind_of(key)}); write the setting's "
                    "name there",
                    key_node.start_mark,
                )
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is written twice (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


# Numbers as a recipe's reader means them and the command line reads them: YAML 1.1 (PyYAML's) would
# read 010 as octal 8 and 1:30 as 90 (base 60); here they are text, which the key's type then reads
# as `--key 010` is read (10), or refuses (1:30). Decimal whole numbers and floats keep their forms.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
UniqueKeyLoader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$"), list("-+0123456789"))
UniqueKeyLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+][0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _hashable(value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _kind_of(value) -> str:
    """What YAML made of a scalar or collection, in a user's words."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    kinds = {int: "a number", float: "a number", list: "a list", dict: "a mapping", set: "a set", bytes: "binary data"}
    return kinds.get(type(value), "a date")


def load_yaml(stream):
    """One YAML document (`yaml.safe_load`, with repeated keys refused)."""
    return yaml.load(stream, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader)


NEGATIVE_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", re.IGNORECASE)


def _attach_negative_numbers(argv: list[str]) -> list[str]:
    """`--key -1e-3` as `--key=-1e-3`: argparse takes a value that starts with '-' and is not a
    plain number for an option, and says "expected one argument"."""
    out = []
    for arg in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and NEGATIVE_NUMBER.fullmatch(arg):
            out[-1] = f"{out[-1]}={arg}"
        else:
            out.append(arg)
    return out


class RecipeParser(TrlParser):
    """TrlParser that also takes the YAML as a positional argument and fails in one line."""

    def __init__(self, dataclass_types):
        # No prefix matching: `--learning_rat 1` must be an error, not learning_rate.
        super().__init__(dataclass_types, allow_abbrev=False)
        self.recipe_path = "command line"
        self.recipe_data: dict = {}  # the recipe file's keys, read once by our loader
        self.given: dict[str, Any] = {}  # the keys the recipe and the command line wrote, with their values
        self.built: dict[str, Any] = {}  # the keys whose mapping is built into a library's dataclass, and how
        self.texts: dict[str, Any] = {}  # the keys that take a mapping or text, and how their text is read
        self.repeated: list[str] = []  # the keys the command line gave more than once, as notes
        self.on_command_line: set[str] = set()  # the keys the command line gave
        self.optional_texts: set[str] = set()  # text keys that take null, which empty text unsets too
        # argparse would call dict() on the text of a mapping key (a mixture, eval sets, a kernel
        # config) and take a list of mappings (rewards) word by word: both take one YAML value.
        hints = {name: hint for cls in dataclass_types for name, hint in typing.get_type_hints(cls).items()}
        # The keys YAML's null cannot stand for: their type takes no None and their default is a value
        # (the command line's 'null' is refused by their argparse type; the YAML's reached the library).
        self.not_null = {
            f.name: hints[f.name]
            for cls in dataclass_types
            for f in dataclasses.fields(cls)
            if f.name in hints and f.default is not None and not _takes_null(hints[f.name])
        }
        for action in self._actions:
            if action.dest not in hints:
                continue
            kind = _structured_kind(hints[action.dest])
            if dataclasses.is_dataclass(_optional_of(hints[action.dest])):  # a library's config of its own keys
                action.type = self.built[action.dest] = self._dataclass_value(
                    action.dest, _optional_of(hints[action.dest])
                )
            elif kind is not None:
                action.type, action.nargs = _yaml_value(kind), None
            elif _mapping_or_text(hints[action.dest]):  # a path only where the library reads a file (its help says)
                action.type = self.texts[action.dest] = _mapping_or_path("path" in (action.help or "").lower())
            if choices(hints[action.dest]):  # argparse checks only the command line; check_choices checks both
                action.choices = None
            if action.type is float:  # before the dataclass: TrainingArguments' own checks fail on inf
                action.type = _finite_float
            if isinstance(action.type, type) and issubclass(action.type, Enum):  # argparse names no choice
                action.type = _enum_value(action.type)
            if _is_union(hints[action.dest]) and type(None) in typing.get_args(hints[action.dest]):
                one = action.nargs is None  # a list's words are its items: an empty one is no name
                action.type = _or_null(action.type, blank=one)  # `--key null` unsets an optional key, as in the YAML
                if one and action.type.__name__ == "text":
                    self.optional_texts.add(action.dest)

    def _dataclass_value(self, key: str, cls: type):
        """An argparse type: a mapping written as YAML ('{tp_size: 2}'), built into `cls` with its
        keys and values checked, as one line naming the key."""

        def parse(text: str | dict):
            value = text if isinstance(text, dict) else _yaml_value(dict)(text)
            return None if value is None else build_dataclass(cls, value, f"{self.recipe_path}: {key}")

        parse.__name__ = cls.__name__
        return parse

    def error(self, message):  # argparse calls this for bad values and types
        if message.endswith("expected one argument"):  # the value is missing, or starts with '-'
            flag = message.removeprefix("argument ").split("/")[0].split(":")[0]
            message += f"; give it one, and a value that starts with '-' as {flag}=VALUE"
        raise UserError(f"{self.recipe_path}: {message}")

    def set_defaults_with_config(self, **config):
        # TRL read the file with PyYAML's YAML 1.1 numbers (010 as 8): our loader's values instead
        config = {key: self.recipe_data.get(key, value) for key, value in config.items()}
        # YAML reads 11e9 as a string, and argparse's int() refuses it; a whole number is meant.
        int_fields = {
            f.name for cls in self.dataclass_types for f in dataclasses.fields(cls) if f.type in (int, int | None)
        }
        for key, value in config.items():
            if value is None and key in self.not_null:
                raise UserError(
                    f"{self.recipe_path}: {key}: null, and it takes {_kind(self.not_null[key])}; give one, or leave "
                    "the key out for its default"
                )
            if key in self.optional_texts and isinstance(value, str) and not value.strip():
                config[key] = None  # as on the command line
            if key in int_fields and isinstance(value, str | float) and _is_whole_number(value):
                config[key] = int(float(value))
            if key in self.built and isinstance(value, dict):  # argparse types only the command line's text
                config[key] = self.built[key](value)
            if key in self.texts and isinstance(value, str):
                try:
                    config[key] = self.texts[key](value)
                except ArgumentTypeError as err:
                    raise UserError(f"{self.recipe_path}: {key}: {err}") from None
        return super().set_defaults_with_config(**config)

    def parse_recipe(self, argv: list[str] | None = None):
        argv = _attach_negative_numbers(list(sys.argv[1:] if argv is None else argv))
        if argv and not argv[0].startswith("-"):
            argv = ["--config", *argv]
        elif "--config" not in argv and (late := next((a for a in argv if a.endswith((".yaml", ".yml"))), None)):
            if not any(
                a.startswith("--") and "=" not in a and argv[i + 1 :][:1] == [late] for i, a in enumerate(argv)
            ):
                raise UserError(
                    f"command line: the recipe {late} comes first, before the keys: "
                    f"python {sys.argv[0]} {late} [--key value ...]"
                )
        path = argv[argv.index("--config") + 1] if "--config" in argv else None
        if path is not None:
            self.recipe_path = path
            self.recipe_data = read_recipe_yaml(path)
            self._check_yaml_keys(self.recipe_data, path)
            self.given |= self.recipe_data
        argv = self._expand_flow_lists(argv)
        written: dict[str, str] = {}  # argparse keeps the last of a key given twice (a wrapper's override): said
        for i, arg in enumerate(argv):
            if arg.startswith("--") and arg != "--config":
                key, equals, value = arg[2:].partition("=")
                if key.replace("-", "_") in written:
                    both = " and ".join(sorted({f"--{written[key.replace('-', '_')]}", f"--{key}"}))
                    self.repeated.append(
                        f"{both} {'is' if ' and ' not in both else 'are one key,'} given twice on the command line; the last is used"
                    )
                written[key.replace("-", "_")] = key
                following = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
                self.given[key] = value if equals else following
                self.on_command_line.add(key.replace("-", "_"))
        *outputs, remaining = self.parse_args_and_config(argv, return_remaining_strings=True)
        unknown = [arg for arg in remaining if arg.startswith("--")]
        if remaining:
            name = (unknown or remaining)[0].lstrip("-").split("=")[0]
            if not unknown and name.replace("-", "_") in self._keys():  # a key written without its dashes
                raise UserError(
                    f"command line: '{name}' is a recipe key written without its dashes, which the command line "
                    f"reads as no key at all; write --{name} VALUE"
                )
            if not unknown and name.endswith((".yaml", ".yml")):  # a second recipe after the first
                raise UserError(
                    f"command line: a second recipe, {name}, after {path}; a script reads one recipe: put the keys "
                    "you want of the other in it, or give them after it as --key value"
                )
            close = did_you_mean(f"--{name}", [f"--{key}" for key in self._keys()])  # as a command line writes them
            if not unknown:  # no dashes either
                raise UserError(
                    f"command line: unknown argument '{name}'; keys after the recipe take two dashes{close}"
                )
            raise UnknownKey("command line", name, f"command line: unknown argument '--{name}'{close}")
        for obj in outputs:
            _read_flow_lists(obj)
            check_finite(obj, path or "command line")
            _check_repeats(obj, path or "command line")
        return outputs, path

    def _expand_flow_lists(self, argv: list[str]) -> list[str]:
        """A list key given a YAML flow list ('--loss_weights [1.0, 0.5]', as the recipe writes it, in
        one word or, unquoted, several) as its items, the words argparse takes for a list (it would
        read '[1.0,' as a number)."""
        lists = {s for action in self._actions if action.nargs in ("+", "*") for s in action.option_strings}
        out, i = [], 0
        while i < len(argv):
            key, equals, value = argv[i].partition("=")
            joined = bool(equals) and key in lists  # '--data=[a, b]'; an item's own '=' (TASK=PATH) is its text
            flow = value if joined else argv[i] if out and out[-1] in lists else None
            end = i
            while flow is not None and flow.startswith("[") and not flow.endswith("]") and end + 1 < len(argv):
                end += 1
                flow += " " + argv[end]
            items = _flow_items(flow) if flow is not None else None
            if items:
                out += [key, *items] if joined else items
                i = end + 1
            else:
                out.append(argv[i])
                i += 1
        return out

    def _keys(self) -> list[str]:
        return field_names(self.dataclass_types)

    def _check_yaml_keys(self, data: dict, path: str) -> None:
        reject_unknown_keys(data, set(self._keys()) | {"env"}, path, recipe_keys=True)
        hints = {name: hint for cls in self.dataclass_types for name, hint in typing.get_type_hints(cls).items()}
        # A list whose help says its entries are NAME=VALUE ("TASK=PATH ...") takes them as a mapping too.
        pairs = {
            f.name
            for cls in self.dataclass_types
            for f in dataclasses.fields(cls)
            if _takes_names(hints[f.name]) and re.match(r"[A-Z_]+=[A-Z_]+\b", f.metadata.get("help", ""))
        }
        for key, value in data.items():
            if key in pairs and isinstance(value, dict):  # {NAME: VALUE}, as YAML writes it: the entries NAME=VALUE
                if wrong := next(((name, item) for name, item in value.items() if not isinstance(item, str)), None):
                    raise UserError(f"{path}: {key}.{wrong[0]} must be text, got {wrong[1]!r}")
                value = data[key] = [f"{name}={item}" for name, item in value.items()]
            if key in hints and value is not None:
                check_value(key, value, hints[key], path, top_level=True)


def _flow_items(text: str) -> list[str] | None:
    """The items of a non-empty YAML flow list ('[1.0, 0.5]') as words, else None."""
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        parsed = load_yaml(text)
    except yaml.YAMLError:
        return None
    if not isinstance(parsed, list) or not parsed or any(isinstance(v, dict | list) for v in parsed):
        return None
    return [str(v) for v in parsed]


def _read_flow_lists(obj) -> None:
    """A list of names written on the command line as YAML writes it ('[a, b]', '[]'): argparse
    takes its words as names ('[a,', 'b]'); read as the list it is."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name, None)
        words = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
        # One word a config's own __post_init__ took out of its list (TRL's lora_target_modules).
        taken = isinstance(value, str) and "list" in str(field.type)
        if words or taken:
            text = " ".join(value) if words else value
            if text.startswith("[") and text.endswith("]"):
                try:
                    parsed = load_yaml(text)
                except yaml.YAMLError:
                    continue
                if isinstance(parsed, list):
                    setattr(obj, field.name, [str(v) for v in parsed])


def _check_repeats(obj, where: str) -> None:
    """A list of names (loggers, losses, tasks, modules) that names one twice: the libraries take
    it once or twice without a word (TRL would weigh a loss twice)."""
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name, None)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            if twice := next((v for i, v in enumerate(value) if v in value[:i]), None):
                raise UserError(f"{where}: {field.name} names '{twice}' twice; give each once")


def _is_union(hint) -> bool:
    """`a | b` or `Optional[a]`: a field that takes more than one type."""
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _optional_of(hint):
    """The type of an optional field (`X | None` -> X), the type itself if not a union, None for
    a union of several types."""
    if _is_union(hint):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return options[0] if len(options) == 1 else None
    return hint


def _structured_kind(hint) -> type | None:
    """dict for a mapping field, list for a list of mappings, None for the others (Optional
    stripped)."""
    hint = _optional_of(hint)
    origin, args = typing.get_origin(hint) or hint, typing.get_args(hint)
    if origin is dict:
        return dict
    if origin is list and args and (typing.get_origin(args[0]) or args[0]) is dict:
        return list
    return None


def _mapping_or_text(hint) -> bool:
    """A field the library takes as a mapping or as text (`dict | str`: JSON of a mapping, or a
    path, as `deepspeed` takes)."""
    args = typing.get_args(hint) if _is_union(hint) else ()
    return str in args and any((typing.get_origin(a) or a) is dict for a in args)


def _mapping_or_path(reads_files: bool):
    """An argparse type for a field the library takes as a mapping or as text: a mapping written
    as YAML or JSON ('{page_size: 16}') becomes that mapping, where the library would read only
    JSON and fail without naming the key; other text is the path of a JSON file where the library
    reads one (`reads_files`: accelerator_config, deepspeed), which must be there, and refused
    where it reads none."""

    def parse(text: str):
        if not text.lstrip().startswith("{"):
            if not reads_files:
                raise ArgumentTypeError(f"expected a mapping such as '{{key: value, ...}}', got {text!r}")
            if not os.path.isfile(os.path.expanduser(text)) and not _base64_mapping(text):  # DeepSpeed takes base64
                raise ArgumentTypeError(
                    f"no such file {text!r}; give the path of a JSON file, or a mapping such as '{{key: value, ...}}'"
                )
            if os.path.isfile(os.path.expanduser(text)) and (problem := _not_json_mapping(text)):
                raise ArgumentTypeError(problem)
            return text
        try:
            value = load_yaml(text)
        except yaml.YAMLError as err:
            raise ArgumentTypeError(
                f"not a valid mapping ({str(err).splitlines()[0]}); write it as '{{key: value, ...}}'"
            ) from None
        if not isinstance(value, dict):
            raise ArgumentTypeError(f"expected a mapping such as '{{key: value, ...}}', got {text!r}")
        return value

    parse.__name__ = "mapping"
    return parse


def _not_json_mapping(path: str) -> str | None:
    """What keeps a file from being the JSON mapping the library reads (transformers' own words are
    json's, with no file): not JSON, or JSON of something else. An accelerate config (YAML with
    distributed_type) is said to be one: it belongs to `accelerate launch --config_file`."""
    import json

    try:
        with open(os.path.expanduser(path), encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as err:
        return f"cannot read {path} ({err.strerror if isinstance(err, OSError) else 'not UTF-8 text'})"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        try:
            read = load_yaml(text)
        except yaml.YAMLError:
            read = None
        if isinstance(read, dict) and "distributed_type" in read:
            return (
                f"{path} is an accelerate config, which `accelerate launch --config_file {path}` reads; "
                "launch the recipe with it and leave this key out"
            )
        return f"{path} is not JSON (line {err.lineno}, column {err.colno}: {err.msg}); give a JSON file of a mapping"
    return None if isinstance(value, dict) else f"{path} holds JSON of a {type(value).__name__}; give a mapping"


def _base64_mapping(text: str) -> bool:
    """Whether `text` is a JSON mapping encoded in base64 (as DeepSpeed's config may be given)."""
    import base64
    import binascii
    import json

    try:
        return isinstance(json.loads(base64.b64decode(text, validate=True)), dict)
    except (binascii.Error, ValueError):
        return False


def _or_null(parse, blank: bool = True):
    """An argparse type that reads 'null' as None, as YAML does, and other text with `parse`; for a
    text key (`blank`), the empty text as None too (a wrapper clearing a recipe's value writes `--key ""`)."""

    def parse_or_null(text: str):
        if text == "null" or (blank and parse in (None, str) and not text.strip()):
            return None
        return parse(text) if parse is not None else text

    parse_or_null.__name__ = (
        "text" if parse in (None, str) else getattr(parse, "__name__", "text")
    )  # argparse's "invalid <name> value"
    return parse_or_null


def _enum_value(kind: type[Enum]):
    """An argparse type for one of an Enum's values, which names them when the text is none."""

    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            values = [str(member.value) for member in kind]
            raise ArgumentTypeError(f"'{text}' is none of {', '.join(values)}{did_you_mean(text, values)}") from None

    parse.__name__ = kind.__name__
    return parse


def _finite_float(text: str) -> float:
    """argparse's float, refusing nan and infinities."""
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def yaml_problem(err: yaml.YAMLError, text: str | None = None) -> str:
    """What PyYAML found wrong and where, as an editor counts: "line 3, column 5: ..." (a one-line
    `text`, as a command line value is, by its column alone)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    if mark is None:
        return problem
    line = "" if text is not None and "\n" not in text else f"line {mark.line + 1}, "
    return f"{line}column {mark.column + 1}: {problem}"


def _yaml_value(kind: type):
    """An argparse type: the text as YAML (so JSON too), which must be a `kind` or null."""

    def parse(text: str):
        try:
            value = load_yaml(text)
        except yaml.YAMLError as err:
            raise ArgumentTypeError(f"not valid YAML ({yaml_problem(err, text)}); fix it there") from None
        if value is not None and not isinstance(value, kind):
            example = "'{key: value, ...}'" if kind is dict else "'[{key: value, ...}, ...]'"
            raise ArgumentTypeError(f"expected a YAML {kind.__name__} such as {example}, got {text!r}")
        return value

    return parse


def read_recipe_yaml(path: str) -> dict:
    """A recipe file's mapping of keys to values, or the one-line error of a missing or bad file."""
    return read_yaml_mapping(path, "recipe", "see recipes/ for examples")


def read_yaml_mapping(path: str, what: str, examples: str) -> dict:
    """A YAML file of keys and values (a recipe, an accelerate config), or one line naming what is
    wrong with it: missing, a folder, not UTF-8, not YAML (at the line and column an editor
    shows), empty or not a mapping; `examples` says where to find good ones."""
    if os.path.isdir(path):
        raise UserError(f"{path}: is a folder; pass the path of a YAML {what} in it")
    if not os.path.isfile(path):
        why = absent(path)
        raise UserError(
            f"{path}: {f'no such {what} file' if why == 'no such file or folder' else why}; pass the path of a YAML {what}"
        )
    try:
        with open(path, "rb") as f:
            data = load_yaml(f.read().decode("utf-8"))  # decoded whole: the error's byte counts from the start
    except UnicodeDecodeError as err:
        raise not_utf8(path, err, path) from None
    except yaml.YAMLError as err:
        raise UserError(f"{path}: not valid YAML ({yaml_problem(err)}); fix the {what} there") from None
    if data is None:
        raise UserError(f"{path}: the {what} is empty; write its keys ({examples})")
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a mapping of keys to values, which every {what} is ({examples})")
    return data


def field_names(classes) -> list[str]:
    """The keys a recipe may set for these dataclasses."""
    return [f.name for cls in classes for f in dataclasses.fields(cls) if f.init]


class UnknownKey(UserError):
    """A key of a recipe's own (in its file, or on the command line after it) that its script's
    dataclasses do not have: `where` it was given and the `key`, for a caller that can say more."""

    def __init__(self, where: str, key: str, message: str):
        super().__init__(message)
        self.where, self.key = where, key


def reject_unknown_keys(data: dict, valid: set[str], where: str, recipe_keys: bool = False) -> None:
    """One line for the first key of `data` not in `valid`; `recipe_keys`: a recipe's own (UnknownKey)."""
    for key in data:
        if key not in valid:
            message = f"{where}: unknown key '{key}'{did_you_mean(key, valid)}"
            raise UnknownKey(where, key, message) if recipe_keys else UserError(message)


def _is_whole_number(value) -> bool:
    try:
        return float(value).is_integer()
    except ValueError:
        return False


def build_dataclass(cls, data: Any, where: str):
    """`cls(**data)` with unknown and missing keys reported as one line naming `where`."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: expected a mapping of keys to values, got {data!r}")
    reject_unknown_keys(data, {f.name for f in dataclasses.fields(cls)}, where)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in data
    ]
    if missing:
        raise UserError(f"{where}: missing key '{missing[0]}'")
    hints = typing.get_type_hints(cls)
    data = {key: check_value(key, value, hints[key], where) for key, value in data.items()}
    built = cls(**data)
    check_choices(built, where)
    return built


def check_value(key: str, value, hint, where: str, top_level: bool = False):
    """A recipe value of the type its field declares, or the one line that says what is wrong:
    numbers finite, whole numbers whole (not true/false, not 2.7), mappings and lists where the
    type says so. Returns the value, a number YAML read as text (1e-2) made a number. At the
    top level a list of names also takes one name or a comma-separated text, as the command
    line does."""
    nested = _optional_of(hint)
    if isinstance(value, dict) and dataclasses.is_dataclass(nested):  # an entry of its own keys: a source's part
        return build_dataclass(nested, value, f"{where}: {key}" if top_level else f"{where}.{key}")
    if isinstance(value, str) and (_fits(1.0, hint) or _fits(1, hint)) and not _fits("", hint):
        value = _yaml_number(value)  # YAML reads 1e-2 and 11e9 as text
    if isinstance(value, float) and value.is_integer() and not _fits(1.0, hint) and _fits(1, hint):
        value = int(value)  # 2.0 or 11e9 for a whole number
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{where}: {key} must be a finite number, got {value}")
    if _fits(value, hint) or (top_level and isinstance(value, str) and _takes_names(hint)):
        return value
    if isinstance(value, datetime.date) and _fits("", hint):  # YAML reads 2024-01-01 as a date
        raise UserError(f"{where}: {key} {value} is read by YAML as a date; quote it ('{value}') to keep it text")
    if isinstance(value, str) and value.lower() in ("true", "false") and _fits(True, hint):
        raise UserError(
            f"{where}: {key} must be true or false, got the text '{value}' (in quotes); write {value.lower()} without them"
        )
    if isinstance(value, bool) and _fits("", hint):  # YAML 1.1 reads an unquoted no, off, yes or on so
        raise UserError(
            f"{where}: {key} must be {_kind(hint)}, got {str(value).lower()} (YAML's reading of an unquoted yes, no, "
            "on, off, true or false); write the word in quotes"
        )
    raise UserError(f"{where}: {key} must be {_kind(hint)}, got {value!r}")


def _numbers(value, name: str):
    """(where, number) for every number inside `value`, however deeply nested: "rewards[1].weight"."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{name}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _numbers(item, f"{name}[{index}]")
    elif isinstance(value, float | int) and not isinstance(value, bool):
        yield name, value


# The largest whole number torch, numpy and Python's slicing take as a count or an index.
LARGEST_COUNT = 2**63 - 1


def check_finite(obj, where: str) -> None:
    """Every number of a parsed dataclass, however deep in its lists and mappings (a reward's
    weight inside `rewards`), is finite: a NaN or infinite learning rate, weight or threshold from
    the YAML or the command line is refused where it is given, not found as a NaN model after
    training. A field whose default is not finite keeps it. A whole number fits a 64-bit count
    (a batch of 1e20 would fail in the sampler's arithmetic)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        if value == f.default or (isinstance(f.default, float) and math.isnan(f.default)):
            continue
        for name, number in _numbers(value, f.name):
            if isinstance(number, float) and not math.isfinite(number):
                raise UserError(f"{where}: {name} must be a finite number, got {number}")
            if isinstance(number, int) and abs(number) > LARGEST_COUNT:
                raise UserError(
                    f"{where}: {name} {number} is beyond the largest whole number a count can be ({LARGEST_COUNT:.3g})"
                )


def choices(hint) -> tuple | None:
    """The values a `Literal` field (or an optional one) takes; None for any other field."""
    hint = _optional_of(hint)
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def check_choices(obj, where: str) -> None:
    """Every `Literal` field of a parsed dataclass holds one of its values, and so does every field
    whose metadata lists its choices (TRL's dtype): the one line with the closest names and the
    valid ones, for a value from the YAML (which argparse takes as a default, unchecked) or the
    command line alike."""
    listed = {f.name: list(f.metadata["choices"]) for f in dataclasses.fields(obj) if f.metadata.get("choices")}
    for name, hint in typing.get_type_hints(type(obj)).items():
        values, value = choices(hint) or listed.get(name), getattr(obj, name, None)
        if values is not None and value is not None:
            check_choice(value if isinstance(value, str) else str(value), values, f"{where}: {name}")


def written_keys(given: dict) -> set[str]:
    """The field names of the keys a recipe and its command line wrote (`--eval-steps` is eval_steps)."""
    return {key.replace("-", "_") for key in given}


def split_names(entries: list[str]) -> list[str]:
    """Names given as a list, comma- or space-separated, or both (one quoted word 'a b' too), or as
    a YAML flow list written on the command line ('[a, b]', one word or several): [a,b c] -> [a, b, c]."""
    names = (name.strip() for entry in entries for name in entry.replace(",", " ").split())
    return [bare for name in names if (bare := name.removeprefix("[").removesuffix("]").strip())]


KINDS = {float: "a number", int: "a whole number", str: "text", bool: "true or false", type(None): "null"}


def _kind(hint) -> str:
    """A field's type in a user's words: "text or a list or null"."""
    if _is_union(hint):  # an Enum or its text (transformers' strategies): its values are the texts taken
        args = typing.get_args(hint)
        if any(isinstance(arg, type) and issubclass(arg, Enum) for arg in args):
            args = tuple(arg for arg in args if arg is not str)
        return " or ".join(_kind(arg) for arg in args)
    if typing.get_origin(hint) is typing.Literal:
        return " or ".join(sorted({_kind(type(choice)) for choice in typing.get_args(hint)}))
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, Enum):  # transformers' strategies: their values
        return "one of " + ", ".join(str(member.value) for member in origin)
    if dataclasses.is_dataclass(origin):
        return f"a mapping of {', '.join(f.name for f in dataclasses.fields(origin))}"
    return KINDS.get(origin) or {list: "a list", dict: "a mapping"}.get(origin, getattr(origin, "__name__", str(hint)))


def _yaml_number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def _takes_null(hint) -> bool:
    """Whether a field of type `hint` may hold None: Any, an Optional, or a union with None."""
    return hint is typing.Any or hint is type(None) or (_is_union(hint) and type(None) in typing.get_args(hint))


def _takes_names(hint) -> bool:
    """A list of text (Optional stripped)."""
    hint = _optional_of(hint)
    return typing.get_origin(hint) is list and typing.get_args(hint) in ((str,), ())


def _fits(value, hint) -> bool:
    """Whether a YAML value has the type a nested recipe entry's field declares (a float field
    takes an int; containers are checked by kind, not item by item; a `Literal` field by the
    type of its choices, the choice itself by `check_choices`)."""
    if _is_union(hint):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is Any:
        return True
    if typing.get_origin(hint) is typing.Literal:
        return any(_fits(value, type(choice)) for choice in typing.get_args(hint))
    if isinstance(value, bool) and hint is not bool:
        return False
    if hint is float:
        return isinstance(value, int | float)
    return isinstance(value, typing.get_origin(hint) or hint)


def check_revision(model: str, revision: str | None, where: str) -> None:
    """A revision picks a version of a Hub model; a local folder has none, and transformers loads
    it whatever the revision says."""
    if revision and local_path(model):
        raise UserError(
            f"{where}: model_revision picks a version of a Hub model, and '{model}' is a local folder, which has "
            "none; leave model_revision out"
        )


def shell_variable(location: str) -> str | None:
    """What is wrong with a path that holds a shell's variable ($HOME, ${DATA}): a recipe's paths
    are read as written, so it would name a folder of that name; None for any other path."""
    variable = re.search(r"\$(\w+|\{\w+\})", location)
    if variable is None:
        return None
    expanded = os.path.expandvars(location)
    instead = f", such as '{expanded}'" if expanded != location else f" ({variable.group()} is not set here either)"
    return f"'{location}' holds {variable.group()}, which a shell expands and a recipe does not; write the path itself{instead}"


def check_blank_text(parsed: tuple, given: dict, path: str) -> None:
    """A text key left empty (or spaces) whose default is not empty and which takes no null: a
    name, id or revision that names nothing (an optional text key reads the empty text as null,
    `config.reading`). A key whose default is the empty text (transformers' `debug`) takes it.
    output_dir given null or empty would write into transformers' `trainer_output` in the working folder."""
    for obj in parsed:
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name, None)
            names = [f.name, *(alias.lstrip("-").replace("-", "_") for alias in f.metadata.get("aliases", []))]
            if any(n in given for n in names) and isinstance(value, str) and not value.strip() and f.default != "":
                required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                raise UserError(
                    f"{path}: {f.name} is empty; give it a value{'' if required else ', or leave it out for its default'}"
                )
            if (
                any(n in given for n in names)
                and isinstance(value, list)
                and value != [""]  # --eval_tasks "" alone: the empty list
                and any(isinstance(v, str) and not v.strip() for v in value)
            ):  # --data ' ': an entry that names nothing
                raise UserError(f"{path}: {f.name} has an empty entry ({value!r}); give each entry a value")
            place = f.name.endswith(("_dir", "_path", "_url", "_file"))  # a folder or file the run writes or reads
            if f.name in given and place and isinstance(value, str) and value.strip() and value != value.strip():
                raise UserError(
                    f"{path}: {f.name} {value!r} starts or ends with a space, which a folder or file name keeps; "
                    "drop it"
                )
            if f.name in given and place and isinstance(value, str) and (problem := shell_variable(value)):
                raise UserError(f"{path}: {f.name} {problem}")
    if "output_dir" in given and str(given["output_dir"] or "").strip() in ("", "null"):  # as YAML or argv write it
        raise UserError(
            f"{path}: output_dir is not set, and the run would write into ./trainer_output; name its folder"
        )
