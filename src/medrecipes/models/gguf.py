"""Models stored as one .gguf file (llama.cpp's format): checked before transformers reads it,
dequantized on load, and saved once as an ordinary model folder (`medrecipes convert-gguf`)."""

import os
from pathlib import Path

from medrecipes.errors import UserError
from medrecipes.locations import absent, file_as_model
from medrecipes.models.files import missing_local_model


def split_gguf(path: str) -> tuple[str, dict]:
    """A local .gguf file loads from its folder with `gguf_file=`; anything else loads as is. A
    path that cannot be a Hub id (org/name) must exist here."""
    if path.endswith(".gguf"):
        if os.path.isdir(path):
            raise UserError(
                f"model: {path} is a folder, and a .gguf model is one file; pass the .gguf file in it, or "
                "rename a model's folder without .gguf"
            )
        if not os.path.isfile(path):
            raise UserError(f"model: {path}: {absent(path)}; pass a .gguf file")
        check_gguf(path)
        return str(Path(path).parent), {"gguf_file": Path(path).name}
    if problem := file_as_model(path):
        raise UserError(f"model: {problem}")
    if missing_local_model(path):
        raise UserError(f"{path}: {absent(path)}; pass a model's folder, a .gguf file or a Hub id (org/name)")
    return os.path.expanduser(path), {}  # a Hub id has no "~" to expand


def check_folder_name(out_dir: str, option: str) -> None:
    """A model folder a command writes is not named .gguf: every command reads such a path as one file."""
    if out_dir.rstrip(os.sep).endswith(".gguf"):
        raise UserError(
            f"{option}: {out_dir} ends in .gguf, and every command reads a path so named as one GGUF file, not a "
            "model folder; name the folder without .gguf"
        )


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
