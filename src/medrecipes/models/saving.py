"""Model folders written from another form of a model: a LoRA adapter folded into its base
(`medrecipes merge-lora`), a .gguf file dequantized once (`medrecipes convert-gguf`).

A LoRA run saves only the adapter (adapter_config.json and adapter_model.safetensors); its
base is named in adapter_config.json. Merging adds the scaled B @ A product to each adapted
weight, so the result loads and serves like any checkpoint, without peft. A QLoRA adapter is
merged into the unquantised base: merging into 4-bit weights would round the update away.

    medrecipes merge-lora outputs/medgemma-qlora/final outputs/medgemma-merged --dtype bfloat16
"""

import logging
import os

import torch
from transformers import AutoModelForCausalLM

from medrecipes.errors import UserError
from medrecipes.models.files import TOKENIZER_FILES, check_model_folder, read_adapter_config
from medrecipes.models.gguf import split_gguf, unmark_dequantized_gguf
from medrecipes.models.loading import load_tokenizer, resolve_dtype
from medrecipes.models.templates import align_generation_eos, turn_end
from medrecipes.outputs.claims import claim_output
from medrecipes.outputs.writes import staged

logger = logging.getLogger(__name__)


def adapter_base(adapter_dir: str) -> tuple[str, str | None]:
    """The base model (and revision) that the adapter in `adapter_dir` was trained on."""
    path = os.path.join(adapter_dir, "adapter_config.json")
    if not os.path.isdir(adapter_dir):
        raise UserError(f"merge-lora: no such folder {adapter_dir}; pass the folder a LoRA run saved")
    if not os.path.isfile(path):
        raise UserError(
            f"merge-lora: {adapter_dir} has no adapter_config.json; pass the folder a LoRA run saved "
            "(its final/ or checkpoint-N/ folder)"
        )
    config = read_adapter_config(path)
    base = config.get("base_model_name_or_path")
    if not base:
        raise UserError(f"{path}: no base_model_name_or_path; set it to the model the adapter was trained on")
    return base, config.get("revision")


def _load_tokenizer(adapter_dir: str, base: str, revision: str | None):
    from transformers import AutoTokenizer

    # Training saves the tokenizer beside the adapter, with any chat template or tokens it added.
    if any(os.path.isfile(os.path.join(adapter_dir, name)) for name in TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(adapter_dir)
    source, kwargs = split_gguf(base)
    try:
        return AutoTokenizer.from_pretrained(source, revision=revision, **kwargs)
    except OSError as err:
        raise UserError(f"merge-lora: cannot load the tokenizer of '{base}' ({str(err).splitlines()[0]})") from None


def _load_generation_config(adapter_dir: str, model):
    from transformers import GenerationConfig

    if os.path.isfile(os.path.join(adapter_dir, "generation_config.json")):
        return GenerationConfig.from_pretrained(adapter_dir)
    return model.generation_config


def merge_lora(adapter_dir: str, out_dir: str, dtype: str | None = None, overwrite: bool = False) -> str:
    """Load the adapter's base in `dtype` (default: the checkpoint's), merge the adapter into it
    and save the merged model, tokenizer and generation config to `out_dir` (replacing what is
    there only with `overwrite`, never the adapter or its base); returns `out_dir`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base, revision = adapter_base(adapter_dir)
    claim_output(out_dir, "merge-lora", "merge-lora OUT_DIR", [adapter_dir, base], overwrite, folder=True)
    check_model_folder(adapter_dir)  # the adapter's weights whole, before its base loads
    source, kwargs = split_gguf(base)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, revision=revision, dtype=resolve_dtype(dtype), **kwargs)
    except OSError as err:
        raise UserError(
            f"{adapter_dir}/adapter_config.json: cannot load base_model_name_or_path '{base}' "
            f"({str(err).splitlines()[0]}); fix the path or make the model available"
        ) from None
    tokenizer = _load_tokenizer(adapter_dir, base, revision)
    # Tokens added during training grow the embeddings; the adapter's saved copies have that size.
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    try:
        model = PeftModel.from_pretrained(model, adapter_dir)
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise
        raise UserError(
            f"{adapter_dir}: the adapter's shapes do not fit '{base}'; "
            "set base_model_name_or_path in adapter_config.json to the model it was trained on"
        ) from None
    model = model.merge_and_unload()
    model.generation_config = _load_generation_config(adapter_dir, model)
    with staged(out_dir, folder=True, kind="merge-lora") as path:  # a kill leaves the old folder or the new, whole
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    logger.info("merged %s into %s; saved to %s", adapter_dir, base, out_dir)
    return out_dir


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
