"""Model folders written from another form of a model: a LoRA adapter folded into its base
(`medrecipes merge-lora`), a .gguf file dequantized once (`medrecipes convert-gguf`).

A LoRA run saves only the adapter (adapter_config.json and adapter_model.safetensors); its
base is named in adapter_config.json. Merging adds the scaled B @ A product to each adapted
weight, so the result loads and serves like any checkpoint, without peft. A QLoRA adapter is
merged into the unquantised base: merging into 4-bit weights would round the update away.

    medrecipes merge-lora outputs/medgemma-qlora/final outputs/medgemma-merged --dtype bfloat16
"""

import json
import logging
import os

import torch
from transformers import AutoModelForCausalLM

from medrecipes.errors import UserError
from medrecipes.locations import MERGE_RECORD, absent, trained_system_prompt, weights_fingerprint
from medrecipes.models.files import adapter_base as adapter_base_of
from medrecipes.models.gguf import check_folder_name, split_gguf, unmark_dequantized_gguf
from medrecipes.models.loading import load_merged_adapter, load_tokenizer
from medrecipes.models.templates import align_generation_eos, turn_end
from medrecipes.outputs.claims import claim_output
from medrecipes.outputs.writes import staged

logger = logging.getLogger(__name__)


def adapter_base(adapter_dir: str) -> tuple[str, str | None]:
    """The base model (and revision) that the adapter in `adapter_dir` was trained on."""
    path = os.path.join(adapter_dir, "adapter_config.json")
    if not os.path.isdir(adapter_dir):
        what = "a file, not a folder" if os.path.isfile(adapter_dir) else absent(adapter_dir)
        raise UserError(f"merge-lora: {adapter_dir}: {what}; pass the folder a LoRA run saved")
    if not os.path.isfile(path):
        raise UserError(
            f"merge-lora: {adapter_dir} has no adapter_config.json; pass the folder a LoRA run saved "
            "(its final/ or checkpoint-N/ folder)"
        )
    return adapter_base_of(path)


def merge_lora(adapter_dir: str, out_dir: str, dtype: str | None = None, overwrite: bool = False) -> str:
    """Load the adapter's base in `dtype` (default: the checkpoint's), merge the adapter into it
    and save the merged model, tokenizer and generation config to `out_dir` (replacing what is
    there only with `overwrite`, never the adapter or its base), with a record of the adapter and
    base it came from (merged_from.json: an evaluation of the merge is then one of the adapter's
    run); returns `out_dir`."""
    base, revision = adapter_base(adapter_dir)
    check_folder_name(out_dir, "merge-lora OUT_DIR")
    claim_output(out_dir, "merge-lora", "merge-lora OUT_DIR", [adapter_dir, base], overwrite, folder=True)
    model, tokenizer = load_merged_adapter(adapter_dir, dtype)
    with staged(out_dir, folder=True, kind="merge-lora") as path:  # a kill leaves the old folder or the new, whole
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        record = {
            "adapter": os.path.abspath(adapter_dir),
            "adapter_fingerprint": weights_fingerprint(adapter_dir),
            "base": base,
            "base_revision": revision,
            "dtype": str(model.dtype),
        }
        known, prompt = trained_system_prompt(adapter_dir)
        if known:  # kept with the merge: its adapter's run may be moved or removed
            record["system_prompt"] = prompt
        with open(os.path.join(path, MERGE_RECORD), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    logger.info("merged %s into %s; saved to %s", adapter_dir, base, out_dir)
    return out_dir


def convert_gguf(gguf: str, out_dir: str, overwrite: bool = False) -> None:
    """Save a .gguf model as an ordinary model folder (safetensors, tokenizer, generation config):
    dequantized once, where loading the .gguf dequantizes it in every process (Gemma 3 270M:
    about 30 s on 2 cores, against seconds from the folder). A model whose file has no chat template
    gets its turn format's (Gemma's for the Gemma 3 base), and generation stops at its end of turn."""
    if not gguf.endswith(".gguf"):  # transformers reads a file as GGUF by its suffix
        is_gguf = False
        if os.path.isfile(gguf):
            with open(gguf, "rb") as f:
                is_gguf = f.read(4) == b"GGUF"  # the format's magic number
        raise UserError(
            f"convert-gguf: {gguf} is a GGUF model named without .gguf, the suffix it is read by; rename it to end in .gguf"
            if is_gguf
            else f"convert-gguf: {gguf} is not a .gguf file; pass the model file itself"
        )
    check_folder_name(out_dir, "convert-gguf OUT_DIR")
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
