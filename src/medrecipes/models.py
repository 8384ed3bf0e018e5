"""Load a model and tokenizer from a Hub id, a local directory or a local .gguf file, or
build a model from scratch from a named architecture preset.

Scratch presets follow the "Pure Transformer" table. They are Llama-style decoders
(RMSNorm, SwiGLU MLP, RoPE, full multi-head attention with 64-dimensional heads) with tied
input/output embeddings and a 49,152-token vocabulary (the SmolLM2 tokenizer's size, a
common choice for small English models). The MLP width of each preset is the multiple of
128 that brings the total closest to the table's stated size; `medrecipes plan` prints the
exact counts, and docs/architectures.md lists them beside the stated totals.
"""

import json
import logging
import os
import re
from importlib import resources
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig
from trl import get_quantization_config

from medrecipes.errors import UserError, did_you_mean
from medrecipes.locations import looks_local, shipped_template, shipped_templates
from medrecipes.outputs import claim_output, staged

logger = logging.getLogger(__name__)

PRESET_VOCAB_SIZE = 49152
# name: (layers, hidden size, MLP width, stated total in the table)
PRESETS = {
    "tiny": (12, 512, 2560, "85M"),
    "small": (16, 768, 2816, "178M"),
    "medium": (24, 1024, 3072, "374M"),
    "medium-large": (20, 1152, 3456, "401M"),
    "large": (24, 1536, 4096, "763M"),
    "xlarge": (32, 1920, 4864, "1.46B"),
}


# The end of a turn in the chat templates shipped with the package, by the token that opens one.
TURN_TOKENS = {"gemma": ("<start_of_turn>", "<end_of_turn>"), "chatml": ("<|im_start|>", "<|im_end|>")}


def chat_template(name: str = "chatml") -> str:
    """A chat template shipped with the package, medrecipes/templates/<name>.jinja."""
    path = shipped_template(name)
    if path is None:
        raise UserError(
            f"chat template '{name}': not shipped with medrecipes; one of {', '.join(shipped_templates())}"
        )
    return Path(path).read_text()


def native_template(tokenizer) -> str | None:
    """The shipped template whose turn tokens the tokenizer has as single tokens: a model trained
    with that turn format (Gemma's <start_of_turn>, ChatML's <|im_start|>) that came without a
    template, as the Gemma 3 base models and their GGUF files do; else None."""
    vocab = tokenizer.get_vocab()
    for name, tokens in TURN_TOKENS.items():
        if all(token in vocab for token in tokens):
            return name
    return None


def sft_template(training_args, tokenizer) -> str | None:
    """The chat template an SFT run trains with: its chat_template_path's file, else the
    tokenizer's own; a tokenizer with neither gets the shipped ChatML template (set as the run's
    chat_template_path, which TRL applies)."""
    if tokenizer.chat_template is None and training_args.chat_template_path is None:
        training_args.chat_template_path = shipped_template("chatml")
        logger.info("the tokenizer has no chat template; using %s", training_args.chat_template_path)
    path = training_args.chat_template_path
    template = Path(path).read_text() if path and path.endswith(".jinja") else tokenizer.chat_template
    template = template if isinstance(template, str) else None
    if getattr(training_args, "assistant_only_loss", False) and template and not GENERATION_MARK.search(template):
        source = path or "the tokenizer's chat template"
        raise UserError(
            f"chat_template_path: {source} has no {{% generation %}} block, which assistant_only_loss needs to tell "
            f"the assistant's tokens from the rest; use a template that marks them ({', '.join(shipped_templates())} "
            "are shipped with it), or set assistant_only_loss: false"
        )
    return template


# How a chat template marks the assistant's tokens for assistant_only_loss: {% generation %}.
GENERATION_MARK = re.compile(r"\{%-?\s*generation\s*-?%\}")


def turn_end(template: str | None) -> str | None:
    """The token that ends a turn of a chat template in a shipped turn format (<end_of_turn>,
    <|im_end|>), else None."""
    return next((end for _, end in TURN_TOKENS.values() if template and end in template), None)


def packaged_config(name: str):
    """A config shipped in medrecipes/architectures (a Hub id with '/' as '--', or a name), or None."""
    path = resources.files("medrecipes") / "architectures" / (name.replace("/", "--") + ".json")
    if not path.is_file():
        return None
    values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    return AutoConfig.for_model(values.pop("model_type"), **values)


def scratch_config(name: str, vocab_size: int | None = None, **ids):
    """The config of a scratch architecture: a preset, a packaged config (e.g. gpt2-1b) or a
    config.json path; the tokenizer's `vocab_size` and bos/eos/pad `ids` are set on it when given."""
    if name in PRESETS:
        return preset_config(name, vocab_size or PRESET_VOCAB_SIZE, **ids)
    config = packaged_config(name)
    if config is None and os.path.exists(name):
        config = AutoConfig.from_pretrained(name)
    if config is None:
        choices = [
            *PRESETS,
            *(p.name.removesuffix(".json") for p in (resources.files("medrecipes") / "architectures").iterdir()),
        ]
        raise UserError(
            f"architecture: unknown architecture '{name}'{did_you_mean(name, choices)}; "
            f"a preset ({', '.join(PRESETS)}), a packaged config or a config.json path"
        )
    for key, value in {"vocab_size": vocab_size, **ids}.items():
        if value is not None:
            setattr(config, key, value)
    return config


def preset_config(name: str, vocab_size: int = PRESET_VOCAB_SIZE, max_position_embeddings: int = 2048, **ids):
    """The LlamaConfig of a scratch preset; `ids` are the tokenizer's bos/eos/pad token ids."""
    if name not in PRESETS:
        raise UserError(
            f"architecture: unknown preset '{name}'{did_you_mean(name, PRESETS)}; one of {', '.join(PRESETS)}"
        )
    layers, hidden, mlp, _ = PRESETS[name]
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        **{k: v for k, v in ids.items() if v is not None},
    )


def split_gguf(path: str) -> tuple[str, dict]:
    """A local .gguf file loads from its folder with `gguf_file=`; anything else loads as is. A
    path that cannot be a Hub id (org/name) must exist here."""
    if path.endswith(".gguf"):
        if not os.path.isfile(path):
            raise UserError(f"model: no such file {path}")
        check_gguf(path)
        return str(Path(path).parent), {"gguf_file": Path(path).name}
    if missing_local_model(path):
        raise UserError(f"{path}: no such folder; pass a model's folder, a .gguf file or a Hub id (org/name)")
    return os.path.expanduser(path), {}  # a Hub id has no "~" to expand


_CHECKED_GGUF: set[tuple[str, int, int]] = set()  # (path, size, mtime) read whole once in this process


def check_gguf(path: str) -> None:
    """A .gguf file holds its whole header and every tensor its header places: a download or copy
    cut short is one line here, not the gguf reader's struct.error at load."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key in _CHECKED_GGUF:
        return
    import gguf

    try:
        tensors = gguf.GGUFReader(path).tensors
        needed = max((t.data_offset + t.n_bytes for t in tensors), default=0)
    except Exception as err:  # the reader raises struct.error, ValueError, IndexError, ... on a bad file
        raise UserError(
            f"model: {path} is cut short or corrupt (its header cannot be read: {str(err).splitlines()[0] if str(err) else type(err).__name__}); "
            "copy or download it again"
        ) from None
    if needed > stat.st_size:
        raise UserError(
            f"model: {path} is cut short ({stat.st_size:,} bytes, its tensors need {needed:,}); copy or download it again"
        )
    _CHECKED_GGUF.add(key)


def missing_local_model(path: str) -> bool:
    """A model path that cannot be a Hub id (org/name) and does not exist here."""
    return looks_local(path) and not os.path.exists(os.path.expanduser(path))


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf")
# A folder with none of these has no tokenizer for AutoTokenizer to load.
TOKENIZER_FILES = {
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
}


def check_model_folder(path: str) -> None:
    """A local folder given as a model must hold one whole: a config and weights, or a LoRA
    adapter's config and weights. A save that was killed, or an empty folder, is one line here
    rather than a loader's traceback later."""
    if not os.path.isdir(path):
        return
    names = os.listdir(path)
    whole = "config.json" in names and any(n.endswith(WEIGHT_SUFFIXES) for n in names)
    if whole or ("adapter_config.json" in names and any(n.startswith("adapter_model") for n in names)):
        for name in sorted(names):
            if name.endswith(".safetensors"):
                _check_safetensors(os.path.join(path, name))
            elif name.endswith(".safetensors.index.json"):
                _check_shards(os.path.join(path, name))
        return
    missing = "config.json" if "config.json" not in names and "adapter_config.json" not in names else "weights"
    raise UserError(
        f"model: {path} is not a complete model (no {missing}); pass a folder a run saved whole, "
        "such as output_dir/final or a checkpoint-N folder"
    )


def _check_safetensors(file: str) -> None:
    """A .safetensors file holds as many bytes as its header says (a save or a copy cut short is
    one line here, not safetensors' "incomplete metadata" traceback at load)."""
    size = os.path.getsize(file)
    try:
        with open(file, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(length)) if 8 < size and length <= size - 8 else None
        tensors = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        needed = 8 + length + max(tensors, default=0)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        needed = None  # no header that can be read
    if needed is None or needed > size:
        need = f"its header needs {needed:,}" if needed else "no readable header"
        raise UserError(
            f"model: {file} is cut short or corrupt ({size:,} bytes, {need}); the save or copy did not finish: "
            "copy it again, or use another checkpoint"
        )


def _check_shards(index: str) -> None:
    """Every shard a sharded checkpoint's index names is there."""
    try:
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise UserError(
            f"model: {index} is not a checkpoint index (no weight_map); copy the checkpoint again"
        ) from None
    missing = [name for name in shards if not os.path.isfile(os.path.join(os.path.dirname(index), name))]
    if missing:
        raise UserError(
            f"model: {index} names {missing[0]}, which is not there ({len(missing)} of {len(shards)} shards missing); "
            "copy the whole checkpoint"
        )


def resolve_dtype(name: str | None) -> torch.dtype | str:
    """'auto' (the checkpoint's dtype) unless the recipe names one."""
    if name in (None, "auto"):
        return "auto"
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise UserError(f"dtype: unknown dtype '{name}'; use bfloat16, float16, float32 or auto")
    return getattr(torch, name)


def resolve_attention(requested: str | None) -> str:
    """flash_attention_2 when it is importable on CUDA, else PyTorch's sdpa, unless the recipe says."""
    if requested:
        return requested
    if torch.cuda.is_available():
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def starting_model(model_args) -> str:
    """The model a recipe starts from; a recipe that names none (a data-only recipe is fine for
    `medrecipes decontaminate`) gets its one line here, where a model is needed."""
    if not model_args.model_name_or_path:
        raise UserError(
            "recipe: no 'model_name_or_path'; name the model to start from (a Hub id or a folder), "
            "or set init_from_scratch with 'architecture' and 'tokenizer_name_or_path'"
        )
    path = os.path.expanduser(model_args.model_name_or_path)
    check_model_folder(path)
    adapter = os.path.join(path, "adapter_config.json")
    if os.path.isfile(adapter):  # peft loads the base the adapter names: a missing one is said here
        try:
            with open(adapter, encoding="utf-8") as f:
                base = json.load(f).get("base_model_name_or_path")
        except (ValueError, AttributeError):
            raise UserError(f"{adapter}: not a JSON mapping; copy the adapter again from its run") from None
        if base and looks_local(base) and not os.path.exists(os.path.expanduser(base)):
            raise UserError(
                f"{adapter}: base_model_name_or_path {base} is not there; put the base model at that path, "
                "or set base_model_name_or_path to where it is"
            )
    return model_args.model_name_or_path


def recipe_tokenizer(recipe, model_args):
    """The tokenizer a recipe names: its own `tokenizer_name_or_path`, else the model's."""
    return load_tokenizer(recipe.tokenizer_name_or_path or starting_model(model_args), model_args.model_revision)


def check_tokenizer_files(name_or_path: str) -> None:
    """A local model folder holds its tokenizer's files (a save of the model alone does not)."""
    if os.path.isdir(name_or_path) and not set(os.listdir(name_or_path)) & TOKENIZER_FILES:
        raise UserError(
            f"tokenizer: {name_or_path} has no tokenizer files ({', '.join(sorted(TOKENIZER_FILES))}); save the "
            "tokenizer there too, or set tokenizer_name_or_path to the model it came from"
        )


def load_tokenizer(name_or_path: str, revision: str | None = None):
    source, kwargs = split_gguf(name_or_path)
    check_tokenizer_files(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, **kwargs)
    except (OSError, ValueError) as err:  # ValueError: a folder with no tokenizer files at all
        raise UserError(f"tokenizer: cannot load '{name_or_path}' ({str(err).splitlines()[0]})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None and (name := native_template(tokenizer)):
        tokenizer.chat_template = chat_template(name)
        logger.info(
            "tokenizer %s has no chat template; using its turn format's, medrecipes/templates/%s.jinja",
            name_or_path,
            name,
        )
    return tokenizer


def load_model(model_args, recipe, tokenizer, activation_checkpointing: bool = False):
    """The model a recipe asks for: pretrained (CPT, SFT) or from a scratch preset. `recipe` (its
    `init_from_scratch` and `architecture`) may be None: then the pretrained model of `model_args`."""
    dtype = resolve_dtype(model_args.dtype)
    attention = resolve_attention(model_args.attn_implementation)
    if recipe is not None and recipe.init_from_scratch:
        config = scratch_config(
            recipe.architecture,
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32 if dtype == "auto" else dtype, attn_implementation=attention
        )
        origin = f"scratch architecture '{recipe.architecture}'"
    else:
        source, kwargs = split_gguf(starting_model(model_args))
        quantization = get_quantization_config(model_args)  # QLoRA: 4-bit NF4 base weights
        if quantization is not None:
            kwargs.update(quantization_config=quantization, device_map=get_kbit_device_map())
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, revision=model_args.model_revision, dtype=dtype, attn_implementation=attention, **kwargs
            )
        except OSError as err:
            raise UserError(
                f"model_name_or_path: cannot load '{model_args.model_name_or_path}' ({str(err).splitlines()[0]})"
            ) from None
        if "gguf_file" in kwargs:
            unmark_dequantized_gguf(model)
        origin = model_args.model_name_or_path
    if activation_checkpointing:
        model.config.use_cache = False
    # Under ZeRO-3 each parameter is a partitioned placeholder; ds_numel is its full size.
    count = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    logger.info(
        "model %s: %s parameters, dtype %s, attention %s",
        origin,
        f"{count:,}",
        next(model.parameters()).dtype,
        attention,
    )
    return model


def unmark_dequantized_gguf(model) -> None:
    """A .gguf file that transformers dequantized as it loaded (the GGUF matmul kernels are not
    here, or not for this architecture) gives ordinary float weights, but the model keeps its
    GGUF quantizer, with which the Trainer refuses to train and save_pretrained to save. With
    every weight a plain float tensor, the marker goes, and the model is an ordinary one."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None or str(quantizer.quantization_config.quant_method.value) != "gguf":
        return
    if getattr(quantizer, "quantized", None) or not all(p.is_floating_point() for p in model.parameters()):
        raise UserError(
            "model_name_or_path: this .gguf model keeps its weights quantized (GGUF kernels are installed), "
            "and transformers cannot train those; load it without the `kernels` package, or from a folder"
        )
    quantizer.remove_quantization_config(model)


def convert_gguf(gguf: str, out_dir: str, overwrite: bool = False) -> None:
    """Save a .gguf model as an ordinary model folder (safetensors, tokenizer, generation config):
    dequantized once, where loading the .gguf dequantizes it in every process (Gemma 3 270M:
    about 30 s on 2 cores, against seconds from the folder). A model whose file has no chat template
    gets its turn format's (Gemma's for the Gemma 3 base), and generation stops at its end of turn."""
    if not gguf.endswith(".gguf"):
        raise UserError(f"convert-gguf: {gguf} is not a .gguf file; pass the model file itself")
    claim_output(out_dir, "convert-gguf", "convert-gguf OUT_DIR", [gguf], overwrite, folder=True)
    tokenizer = load_tokenizer(gguf)
    source, kwargs = split_gguf(gguf)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)
    except (OSError, ValueError) as err:
        raise UserError(f"convert-gguf: cannot load {gguf} ({str(err).splitlines()[0]})") from None
    unmark_dequantized_gguf(model)
    align_generation_eos(model, tokenizer, turn_end(tokenizer.chat_template))
    with staged(out_dir, folder=True, kind="convert-gguf") as folder:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


def check_positions(model, args) -> None:
    """Refuse, before the first step, a sequence longer than the model has positions for: a
    model with learned positions (GPT-2) fails inside its embedding, one with rotary positions
    trains on positions it has never seen. The length is `max_length` (CPT, SFT) or a GRPO
    completion's `max_completion_length`; a config without a limit is not checked."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    for key in ("max_length", "max_completion_length"):
        length = getattr(args, key, None)
        if limit and length and length > limit:
            raise UserError(
                f"{key}: {length} tokens is beyond the model's {limit} positions (max_position_embeddings in its "
                f"config.json); set {key} to at most {limit}"
            )


def get_kbit_device_map() -> dict | None:
    """Quantized weights are placed at load time: on this process's GPU, or left on the CPU."""
    if torch.cuda.is_available():
        from accelerate import PartialState

        return {"": PartialState().local_process_index}
    return None


def align_generation_eos(model, tokenizer, end_of_turn: str | None) -> None:
    """Make generation stop at the chat template's end of turn as well as at EOS.

    A model fine-tuned on Gemma's template ends its answers with <end_of_turn>; without it in
    generation_config.eos_token_id, generation would run on to max_new_tokens.
    """
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    for token in (tokenizer.eos_token, end_of_turn):
        token_id = tokenizer.convert_tokens_to_ids(token) if token else None
        if token_id is not None and token_id != tokenizer.unk_token_id and token_id not in ids:
            ids.append(token_id)
    model.generation_config.eos_token_id = ids


def load_config(name_or_path: str):
    """The model config without weights (for planning): a packaged copy first, so that the
    recipes' Hub models can be planned offline, then the Hub or a local path."""
    packaged = packaged_config(name_or_path)
    if packaged is not None:
        return packaged
    source, kwargs = split_gguf(name_or_path)
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except OSError as err:
        raise UserError(f"model: cannot read the config of '{name_or_path}' ({str(err).splitlines()[0]})") from None
