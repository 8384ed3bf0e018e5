"""A local model folder checked where it is read: weights that are there and whole, shards that
its index names, tokenizer files; one line naming the file and what to do."""

import json
import os

from medrecipes.errors import UserError, did_you_mean, is_number
from medrecipes.locations import WEIGHT_SUFFIXES, absent, merge_record, missing_local_model, template_error
from medrecipes.outputs.checkpoints import index_shards, safetensors_extent

# A folder with none of these has no tokenizer for AutoTokenizer to load.
TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
}


def missing_part(path: str) -> str | None:
    """What a model folder lacks to be one whole (a config and weights, or a LoRA adapter's config
    and weights): "config.json" or "weights"; None when it has both."""
    names = os.listdir(path)
    whole = "config.json" in names and any(n.endswith(WEIGHT_SUFFIXES) for n in names)
    if whole or ("adapter_config.json" in names and any(n.startswith("adapter_model") for n in names)):
        return None
    return "config.json" if "config.json" not in names and "adapter_config.json" not in names else "weights"


def check_model_folder(path: str) -> None:
    """A local folder given as a model must hold one whole (`missing_part`), each safetensors file
    as long as its header says. A save that was killed, or an empty folder, is one line here
    rather than a loader's traceback later."""
    if not os.path.isdir(path):
        return
    if missing := missing_part(path):
        raise UserError(
            f"model: {path} is not a complete model (no {missing}); pass a folder a run saved whole, "
            "such as output_dir/final or a checkpoint-N folder"
        )
    check_folder_files(path)
    for name in sorted(os.listdir(path)):
        if name.endswith(".safetensors"):
            _check_safetensors(os.path.join(path, name))
        elif name.endswith(".safetensors.index.json"):
            _check_shards(os.path.join(path, name))
    _check_shapes(path)


def _check_shapes(path: str) -> None:
    """A model folder whose weights are not the shapes its config.json builds (vocab_size edited,
    another model's config copied in): transformers prints a table and raises a RuntimeError as it
    loads. The model is built from the config on the meta device (no memory) and compared with the
    safetensors headers, tensor by tensor, before anything loads."""
    config_path = os.path.join(path, "config.json")
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    if not files or not os.path.isfile(config_path) or os.path.isfile(os.path.join(path, "adapter_config.json")):
        return
    state = (
        os.path.abspath(path),
        *((n, os.stat(os.path.join(path, n)).st_mtime_ns) for n in ["config.json", *files]),
    )
    if state in _CHECKED_SHAPES:  # a run asks for its starting model's folder more than once: built once
        return
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():  # ZeRO-3 builds every model partitioned, the meta device's too
        return
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError):  # a config transformers cannot read: its loader says why
        return
    if getattr(config, "quantization_config", None):  # packed weights: their shapes are the quantizer's
        return
    try:
        with torch.device("meta"):
            built = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()}
    except (ValueError, TypeError, KeyError):  # a config of no causal LM: its loader says so
        return
    for name in files:
        with safe_open(os.path.join(path, name), "pt") as weights:
            for key in weights.keys():  # noqa: SIM118 (a safetensors file is no dict)
                saved = tuple(weights.get_slice(key).get_shape())
                if key in built and built[key] != saved:
                    raise UserError(
                        f"model: {path}: {name} holds {key} of shape {list(saved)}, and its config.json builds "
                        f"{list(built[key])}; use the config.json saved with these weights"
                    )
    _CHECKED_SHAPES.add(state)


_CHECKED_SHAPES: set[tuple] = set()  # (folder, (file, mtime) ...) whose weights fit their config


# The JSON files of a folder that transformers reads as it loads a model or tokenizer (a record of
# medrecipes' own, merged_from.json, is read where it is used, and left out where unreadable).
LOADED_JSON = {"config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
               "special_tokens_map.json", "added_tokens.json", "chat_template.json"}  # fmt: skip


def check_folder_files(path: str) -> None:
    """The files of a model or tokenizer folder that transformers reads as it loads, each one line
    where it would fail with a traceback or a message that names no file: each JSON file parses,
    config.json names a model type this transformers knows, and the chat template (chat_template.jinja,
    or tokenizer_config.json's) compiles."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    names = sorted(set(os.listdir(path)) & (LOADED_JSON | {"chat_template.jinja"}))
    for name in names:  # a link to a device, or a loop: transformers would read it as nothing
        if not os.path.isfile(file := os.path.join(path, name)):
            raise UserError(f"model: {file}: {absent(file)}; copy the model folder again")
    state = (os.path.abspath(path), *((n, os.stat(os.path.join(path, n)).st_mtime_ns) for n in names))
    if state in _CHECKED_FOLDERS:  # a folder is checked as a model, then as its tokenizer: read once
        return
    read = {}
    for name in (n for n in names if n in LOADED_JSON):
        file = os.path.join(path, name)
        try:
            with open(file, encoding="utf-8") as f:
                read[name] = json.load(f)
        except (ValueError, UnicodeDecodeError) as err:
            raise UserError(f"model: {file} is not valid JSON ({err}); copy the model folder again") from None
    config = read.get("config.json")
    if "config.json" in read and not isinstance(config, dict):
        raise UserError(f"model: {path}/config.json holds no mapping of settings; copy the model folder again")
    kind = config.get("model_type") if config is not None else None
    # transformers guesses a config without model_type from the folder's name (a "llama" in it)
    if (
        config is not None
        and kind is None
        and not any(name in os.path.basename(os.path.abspath(path)) for name in CONFIG_MAPPING_NAMES)
    ):
        raise UserError(
            f"model: {path}/config.json: no model_type, which transformers builds the model by; set it (llama, "
            "gemma3_text, ...) to the architecture the weights are of, or copy the model folder again"
        )
    if kind is not None and kind not in CONFIG_MAPPING_NAMES:
        close = did_you_mean(str(kind), CONFIG_MAPPING_NAMES)
        raise UserError(
            f"model: {path}/config.json: model_type '{kind}' is no architecture this transformers knows{close}; "
            "fix model_type, or install the transformers that wrote it"
        )
    templates = {}
    if "chat_template.jinja" in names:
        with open(jinja := os.path.join(path, "chat_template.jinja"), encoding="utf-8", errors="replace") as f:
            templates[jinja] = f.read()
    settings = read.get("tokenizer_config.json")
    if isinstance(settings, dict) and isinstance(settings.get("chat_template"), str):
        templates[os.path.join(path, "tokenizer_config.json")] = settings["chat_template"]
    for file, text in templates.items():
        if problem := template_error(text):
            raise UserError(f"model: {file}: its chat template does not compile ({problem}); fix the template")
    _CHECKED_FOLDERS.add(state)


_CHECKED_FOLDERS: set[tuple] = set()  # (folder, (file, mtime) ...) found whole in this process


def _check_safetensors(file: str) -> None:
    """A .safetensors file holds as many bytes as its header says (a save or a copy cut short is
    one line here, not safetensors' "incomplete metadata" traceback at load)."""
    size, needed = safetensors_extent(file)
    if needed is None or needed > size:
        need = f"its header needs {needed:,}" if needed else "no readable header"
        raise UserError(
            f"model: {file} is cut short or corrupt ({size:,} bytes, {need}); the save or copy did not finish: "
            "copy it again, or use another checkpoint"
        )


def _check_shards(index: str) -> None:
    """Every shard a sharded checkpoint's index names is there."""
    found = index_shards(index)
    if found is None:
        raise UserError(f"model: {index} is not a checkpoint index (no weight_map); copy the checkpoint again")
    shards, missing = found
    if missing:
        raise UserError(
            f"model: {index} names {missing[0]}, which is not there ({len(missing)} of {len(shards)} shards missing); "
            "copy the whole checkpoint"
        )


def check_tokenizer_files(name_or_path: str, named_by: str | None = "tokenizer_name_or_path") -> None:
    """A local model folder holds its tokenizer's files (a save of the model alone does not), each
    readable (`check_folder_files`). `named_by`: the key that names another tokenizer where the
    caller has one (a recipe's), None where it has none (a command given a model)."""
    if os.path.isdir(name_or_path):
        check_folder_files(name_or_path)
    if os.path.isdir(name_or_path) and not set(os.listdir(name_or_path)) & TOKENIZER_FILES:
        raise UserError(
            f"tokenizer: {name_or_path} has no tokenizer files ({', '.join(sorted(TOKENIZER_FILES))}); save the "
            "tokenizer of the model it came from there too"
            + (f", or set {named_by} to that model" if named_by else "")
        )
    if name_or_path.endswith(".gguf") and os.path.isfile(name_or_path) and not _gguf_has_tokenizer(name_or_path):
        raise UserError(
            f"tokenizer: {name_or_path} holds no tokenizer (no tokenizer.ggml.* metadata), and transformers builds one "
            "from those alone; export the .gguf with its tokenizer (llama.cpp's convert_hf_to_gguf.py writes it)"
            + (f", or name the tokenizer's folder ({named_by})" if named_by else "")
        )


def _gguf_has_tokenizer(path: str) -> bool:
    """Whether a .gguf file's metadata holds a tokenizer (its tokenizer.ggml.model key)."""
    import gguf

    try:
        return "tokenizer.ggml.model" in gguf.GGUFReader(path).fields
    except Exception:  # a cut or corrupt file: its own line comes where it is read (`gguf.check_gguf`)
        return True


def adapter_config(path: str) -> str | None:
    """The adapter_config.json of a LoRA adapter's folder `path` (~ expanded); None for any other path."""
    config = os.path.join(os.path.expanduser(path), "adapter_config.json")
    return config if os.path.isfile(config) else None


def read_adapter_config(path: str, typed: bool = True) -> dict:
    """A LoRA adapter's adapter_config.json, checked as PEFT will use it: a JSON mapping whose
    numeric settings (r, lora_alpha, lora_dropout, ...) are numbers of the type PEFT's LoraConfig
    declares (`typed`; off where no adapter loads and PEFT is kept out of the process, as for a
    plan). PEFT takes `"r": "eight"` as it comes and fails mid-load, comparing text with a number."""
    import dataclasses
    import typing

    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not valid JSON ({err}); copy the adapter again from its run") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: not a JSON mapping; copy the adapter again from its run")
    if not typed:
        return config
    if (kind := config.get("peft_type", "LORA")) != "LORA":  # PEFT's name for LoRA in every adapter it saves
        raise UserError(
            f"{path}: peft_type {kind}, and medrecipes loads and merges LoRA adapters only (peft_type LORA); load "
            "this adapter with PEFT itself"
        )
    from peft import LoraConfig

    hints = typing.get_type_hints(LoraConfig)
    for field in dataclasses.fields(LoraConfig):
        kinds = set(typing.get_args(hints.get(field.name))) | {hints.get(field.name)}
        numeric = kinds & {int, float}
        value = config.get(field.name)
        if not numeric or value is None or kinds & {str, dict, list}:
            continue
        wrong = (
            isinstance(value, bool) or not isinstance(value, int | float) or (numeric == {int} and value != int(value))
        )
        if wrong:
            kind = "a whole number" if numeric == {int} else "a number"
            raise UserError(
                f"{path}: {field.name} must be {kind}, got {json.dumps(value)}; copy the adapter again from its run"
            )
    for key in ("r", "lora_alpha"):  # the adapter adds B A times lora_alpha / r: at 0 it adds nothing
        if is_number(config.get(key)) and config[key] <= 0:
            raise UserError(
                f"{path}: {key} {config[key]} must be above 0 (the adapter adds its update times lora_alpha / r); "
                "copy the adapter again from its run"
            )
    return config


def merged_adapter_fingerprint(path: str) -> str | None:
    """The weights' fingerprint of the LoRA adapter that `medrecipes merge-lora` folded into the model
    folder `path`, as its merged_from.json records it; None for a model that is not a merge."""
    found = merge_record(path).get("adapter_fingerprint")
    return found if isinstance(found, str) else None


def adapter_base(config_path: str, typed: bool = True) -> tuple[str, str | None]:
    """The base model (and revision) named by a LoRA adapter's adapter_config.json (`typed`: as
    `read_adapter_config`)."""
    config = read_adapter_config(config_path, typed)
    base = config.get("base_model_name_or_path")
    if not base:
        raise UserError(f"{config_path}: no base_model_name_or_path; set it to the model the adapter was trained on")
    if missing_local_model(base):  # peft loads the base the adapter names
        raise UserError(
            f"{config_path}: base_model_name_or_path {base} is not there; put the base model at that path, "
            "or set base_model_name_or_path to where it is"
        )
    if os.path.isdir(base) and (missing := missing_part(base)):  # e.g. a run's output_dir, not its final/
        raise UserError(
            f"{config_path}: base_model_name_or_path {base} is a folder with no {missing}, not a whole model; set it "
            "to the model the adapter was trained on (a run's final/, for a model trained here)"
        )
    return base, config.get("revision")
