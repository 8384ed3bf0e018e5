"""A run's checkpoint folders as the trainer names them, the newest that holds its state, and what
in one the trainer could not read back."""

import json
import os
import re
import zipfile

from medrecipes.errors import is_number, quoted

# A run's checkpoint folders in its output_dir, as the trainer names them.
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
FINAL = "final"  # the finished model, written last


def checkpoint_step(path: str) -> int | None:
    """The step of a `checkpoint-<step>` folder (a name or a path), else None."""
    match = CHECKPOINT.match(os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else None


def checkpoint_steps(output_dir: str) -> list[int]:
    """The steps of the `checkpoint-<step>` folders in `output_dir`, in order."""
    if not os.path.isdir(output_dir):
        return []
    return sorted(step for name in os.listdir(output_dir) if (step := checkpoint_step(name)) is not None)


TRAINER_STATE = "trainer_state.json"  # the trainer writes it last into a checkpoint


def newest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint folder in `output_dir` that holds the trainer state, which the
    trainer writes last: the newest log history a run wrote, which a report reads. Where a run
    resumes from, and what it keeps, is `runs.resume.resume_point`'s (it also sets aside a
    damaged checkpoint, or one another run saved)."""
    for step in reversed(checkpoint_steps(output_dir)):
        path = os.path.join(output_dir, f"checkpoint-{step}")
        if os.path.isfile(os.path.join(path, TRAINER_STATE)):
            return path
    return None


# A pickled state (optimizer, scheduler, RNG, scaler, arguments) up to this size is read whole to
# check it (every member's CRC); a larger one (a full fine-tune's optimizer: gigabytes) by its zip
# directory, which a cut file loses.
WHOLE_READ_BYTES = 256 * 2**20


def safetensors_extent(path: str) -> tuple[int, int | None]:
    """(bytes the file has, bytes its header says it needs), the second None where no header can
    be read: how a safetensors file cut short, or not one at all, is told before a library loads it."""
    size = os.path.getsize(path)
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length)) if 8 < size and length <= size - 8 else None
        tensors = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, UnicodeDecodeError):
        return size, None
    return size, 8 + length + max(tensors, default=0)


def index_shards(index: str) -> tuple[list[str], list[str]] | None:
    """(the shard files a sharded checkpoint's index names, those of them not beside it); None
    where the file is not such an index (no weight_map)."""
    try:
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return shards, [name for name in shards if not os.path.isfile(os.path.join(os.path.dirname(index), name))]


def _pickle_damage(path: str) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            if os.path.getsize(path) <= WHOLE_READ_BYTES and archive.testzip() is not None:
                return "is damaged (a member's checksum differs)"
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as err:
        return f"is not a whole torch.save file ({err})"
    return None


def _json_damage(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError):
        return "is not readable JSON"
    if path.endswith(".index.json"):
        found = index_shards(path)
        if found is None:
            return "is not a weights index"
        return f"names missing files ({', '.join(found[1])})" if found[1] else None
    return None


# The files a checkpoint's weights are written as: a model's or an adapter's (safetensors, or
# torch.save, sharded or not), DeepSpeed's model states, torch.distributed.checkpoint's shards (FSDP).
WEIGHT_FILES = re.compile(
    r"^((pytorch_)?model|adapter_model)([-_][-_\w]*)?\.(safetensors|bin)$|model_states\.pt$|\.distcp$"
)

# The JSON kinds of TrainerState's fields, read from its annotations: a state whose `global_step`
# is text would be loaded and fail later, in the trainer's arithmetic.
_KINDS = {int: "a number", float: "a number", bool: "true or false", str: "text", list: "a list"}


def _fits(value, kind) -> bool:
    """A number for a number field, whole or not (the trainer itself writes some int fields as
    1.0: `logging_steps` given as a fraction of the run); the declared kind for the others."""
    if kind in (int, float):
        return is_number(value)
    return isinstance(value, kind)


def state_damage(state: dict) -> str | None:
    """The first field of a saved trainer state whose value is not of the kind TrainerState declares
    ("global_step is '3', not a whole number"), or None."""
    import types
    import typing

    from transformers import TrainerState

    for name, hint in typing.get_type_hints(TrainerState).items():
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)
        kinds = [k for k in typing.get_args(hint) if k is not type(None)] if optional else [hint]
        kind = typing.get_origin(kinds[0]) or kinds[0] if len(kinds) == 1 else None
        items = typing.get_args(kinds[0]) if kind is list else ()
        if items and (typing.get_origin(items[0]) or items[0]) not in (dict, *_KINDS):
            continue  # a list of objects the trainer writes in a form of its own (stateful_callbacks)
        if kind not in _KINDS or name not in state or (optional and state[name] is None):
            continue
        if not _fits(state[name], kind):
            return f"{name} is {quoted(state[name])}, not {_KINDS[kind]}"
    return None


def checkpoint_damage(checkpoint: str) -> str | None:
    """What in `checkpoint` the trainer would fail to read back as it resumes, in a few words
    ("model.safetensors is cut (1000 bytes where its header describes 2048)"), or None: the
    trainer state (readable, each field of its kind, its step the folder's), weights of some kind, every other JSON file (configs, which the trainer compares on resuming; a
    sharded weights index, with its files present), every safetensors file by its header and
    length, every torch.save file (optimizer, scheduler, RNG states, scaler, arguments) as the zip
    archive torch writes."""
    state = os.path.join(checkpoint, TRAINER_STATE)
    try:
        with open(state, encoding="utf-8") as f:
            loaded = json.load(f)
    except (OSError, ValueError) as err:
        return f"{TRAINER_STATE} is not readable ({type(err).__name__})"
    if not isinstance(loaded, dict):  # TrainerState.load_from_json takes any object of its fields
        return f"{TRAINER_STATE} holds no trainer state"
    if problem := state_damage(loaded):
        return f"{TRAINER_STATE}: {problem}"
    step = checkpoint_step(checkpoint)  # the trainer resumes at the state's step, names the folder by it
    if step is not None and loaded.get("global_step") != step:
        return f"{TRAINER_STATE}: global_step {quoted(loaded.get('global_step'))} is not this checkpoint-{step}'s step"
    if not any(WEIGHT_FILES.search(n) for _, _, names in os.walk(checkpoint) for n in names):
        return "holds no model weights (no model, adapter, DeepSpeed or FSDP weights file)"
    for folder, _, names in sorted(os.walk(checkpoint)):
        for name in sorted(names):
            path = os.path.join(folder, name)
            problem = None
            if name.endswith(".safetensors"):
                size, needed = safetensors_extent(path)
                if needed is None:
                    problem = "has a header that is not safetensors'"
                elif needed != size:
                    problem = f"is cut ({size} bytes where its header describes {needed})"
            elif name.endswith((".pt", ".pth", ".bin")):
                problem = _pickle_damage(path)
            elif name.endswith(".json"):  # configs (the trainer compares the model's on resuming), indexes
                problem = _json_damage(path)
            if problem:
                return f"{os.path.relpath(path, checkpoint)} {problem}"
    return None
