"""Load a model and tokenizer from a Hub id, a local folder or a local .gguf file, or build one from
a scratch preset; dtype, attention and quantisation as the recipe asks."""

import logging
import os
import re
import warnings

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import get_quantization_config

from medrecipes.errors import UserError, causes, did_you_mean
from medrecipes.locations import SAMPLED, START_WEIGHTS, model_run_record, weights_fingerprint
from medrecipes.models.files import (
    TOKENIZER_FILES,
    adapter_base,
    adapter_config,
    check_model_folder,
    check_tokenizer_files,
    read_adapter_config,
)
from medrecipes.models.gguf import split_gguf, unmark_dequantized_gguf
from medrecipes.models.scratch import packaged_config, scratch_config
from medrecipes.models.templates import chat_template, check_renders_question, native_template
from medrecipes.names import DTYPES

logger = logging.getLogger(__name__)


def resolve_dtype(name: str | None) -> torch.dtype | str:
    """'auto' (the checkpoint's dtype) unless the recipe names one."""
    if name in (None, "auto"):
        return "auto"
    if name not in DTYPES:
        raise UserError(
            f"dtype: '{name}' is no dtype a model loads in{did_you_mean(name, DTYPES)}; use {', '.join(DTYPES)}"
        )
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


def cannot_load(where: str, name: str, err: BaseException, fix: str = "") -> UserError:
    """The one line for a model, config or tokenizer that did not load: a Hub id that is not in the
    cache while the Hub cannot be asked (HF_HUB_OFFLINE, no network) said as such, with how to get it
    (transformers says only that it could not connect); else the library's first line and `fix`."""
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    if any(isinstance(cause, LocalEntryNotFoundError) for cause in causes(err)):
        why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        return UserError(
            f"{where}: '{name}' is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}; download it "
            f"where the Hub is reachable (hf download {name}), or pass a local folder"
        )
    return UserError(f"{where}: cannot load '{name}' ({str(err).splitlines()[0]}){f'; {fix}' if fix else ''}")


def starting_model(model_args) -> str:
    """The model a recipe starts from; a recipe that names none (a data-only recipe is fine for
    `medrecipes decontaminate`) gets its one line here, where a model is needed."""
    if not model_args.model_name_or_path:
        raise UserError(
            "recipe: no 'model_name_or_path'; name the model to start from (a Hub id or a folder), "
            "or set init_from_scratch with 'architecture' and 'tokenizer_name_or_path'"
        )
    check_model_folder(os.path.expanduser(model_args.model_name_or_path))
    # peft loads the base an adapter names: a missing one is said here
    if adapter := adapter_config(model_args.model_name_or_path):
        adapter_base(adapter)
    return model_args.model_name_or_path


def recipe_tokenizer(recipe, model_args):
    """The tokenizer a recipe names: its own `tokenizer_name_or_path`, else the model's."""
    name = recipe.tokenizer_name_or_path or starting_model(model_args)
    tokenizer = load_tokenizer(name, model_args.model_revision, named_by="tokenizer_name_or_path")
    own = os.path.expanduser(model_args.model_name_or_path or "") if recipe.tokenizer_name_or_path else None
    if (
        own
        and not recipe.init_from_scratch
        and os.path.isdir(own)
        and any(os.path.isfile(os.path.join(own, f)) for f in TOKENIZER_FILES)
    ):
        theirs = load_tokenizer(own)  # the tokenizer the model was saved with
        if theirs.get_vocab() != tokenizer.get_vocab():
            logger.warning(
                "tokenizer_name_or_path %s is not the tokenizer saved with %s (%d tokens, and %d there, not of the "
                "same ids): the model would read each id as the token its own tokenizer gives it; drop "
                "tokenizer_name_or_path to use the model's own",
                name, own, len(tokenizer), len(theirs),
            )  # fmt: skip
    return tokenizer


def load_tokenizer(name_or_path: str, revision: str | None = None, named_by: str | None = None):
    """The tokenizer of a model (folder, .gguf file or Hub id); `named_by`, the recipe's key that
    names another one, where the caller reads a recipe (`check_tokenizer_files`)."""
    source, kwargs = split_gguf(name_or_path)
    check_tokenizer_files(name_or_path, named_by)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision, **kwargs)
    except (OSError, ValueError) as err:  # ValueError: a folder with no tokenizer files at all
        raise cannot_load("tokenizer", name_or_path, err) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None and (name := native_template(tokenizer)):
        tokenizer.chat_template = chat_template(name)
        logger.info(
            "tokenizer %s has no chat template; using its turn format's, medrecipes/templates/%s.jinja",
            name_or_path,
            name,
        )
    check_renders_question(tokenizer, name_or_path)
    return tokenizer


def load_model(model_args, recipe, tokenizer, activation_checkpointing: bool = False):
    """The model a recipe asks for: pretrained (CPT, SFT), a LoRA adapter's folder as the model it
    made (`load_merged_adapter`), or from a scratch preset. `recipe` (its `init_from_scratch` and
    `architecture`) may be None: then the pretrained model of `model_args`."""
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
    elif adapter_config(starting_model(model_args)):
        # An earlier stage's LoRA output: the model it made, its adapter folded into its base.
        model = load_merged_adapter(os.path.expanduser(model_args.model_name_or_path), model_args.dtype)[0]
        model.requires_grad_(True)  # PEFT loads the base frozen under the adapter
        origin = f"{model_args.model_name_or_path} (a LoRA adapter, merged into its base)"
        _check_vocabulary(model, tokenizer, recipe)
    else:
        source, kwargs = split_gguf(starting_model(model_args))
        _check_language_model(source, model_args.model_name_or_path)
        quantization = get_quantization_config(model_args)  # QLoRA: 4-bit NF4 base weights
        if quantization is not None:
            kwargs.update(quantization_config=quantization, device_map=get_kbit_device_map())
        try:
            model = AutoModelForCausalLM.from_pretrained(
                source, revision=model_args.model_revision, dtype=dtype, attn_implementation=attention, **kwargs
            )
        except OSError as err:
            raise cannot_load("model_name_or_path", model_args.model_name_or_path, err) from None
        if "gguf_file" in kwargs:
            unmark_dequantized_gguf(model)
        origin = model_args.model_name_or_path
        _check_vocabulary(model, tokenizer, recipe)
    check_finite_weights(model, origin)
    check_generation_config(model, origin)
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


def _check_language_model(source: str, name: str) -> None:
    """A local checkpoint whose config.json names only heads that are no language model's (a
    sequence classifier, a bare encoder): AutoModelForCausalLM would load its body under a new,
    untrained output layer and answer from it, after a report of missing weights. The heads taken
    are those transformers maps to causal LM or image-text-to-text generation."""
    import json

    from transformers.models.auto import modeling_auto

    path = os.path.join(os.path.expanduser(source), "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            architectures = json.load(f).get("architectures") or []
    except (OSError, ValueError, AttributeError):  # no local config, or one the loader reports itself
        return
    generating = {
        head
        for mapping in (
            modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
            modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
        )
        for heads in mapping.values()
        for head in ([heads] if isinstance(heads, str) else heads)
    }
    if architectures and not set(architectures) & generating:
        raise UserError(
            f"{name}: config.json's architectures {', '.join(map(str, architectures))} is no language model (its "
            "output layer is another task's), so it would be loaded with a new, untrained one; give a checkpoint of "
            "a ...ForCausalLM model"
        )


def check_finite_weights(model, origin: str) -> None:
    """Weights that hold NaN or infinity (saved by a run that diverged, or an adapter that did)
    make every answer and loss NaN without a word: one line naming the first such tensor."""
    for name, param in model.named_parameters():
        if param.is_floating_point() and param.numel() and not torch.isfinite(param).all():
            raise UserError(
                f"model {origin}: {name} holds NaN or infinite weights, saved by a run that diverged; use an "
                "earlier checkpoint of it"
            )


def check_generation_config(model, origin: str) -> None:
    """The model's generation_config.json, as generation reads it: an end token past the model's
    embedding rows is refused (answers would stop only at their length limit); sampling values out
    of the ranges generate() takes are said (medrecipes answers with its own, greedy unless asked;
    another tool sampling from the model would fail)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return
    rows = model.get_input_embeddings().num_embeddings
    ends = config.eos_token_id
    for end in [ends] if isinstance(ends, int) else list(ends or []):
        if not isinstance(end, int) or not 0 <= end < rows:
            raise UserError(
                f"model {origin}: generation_config.json's eos_token_id {end!r} is not one of its {rows:,} token ids, "
                "so no answer stops at it; set it to the tokenizer's end token ids (tokenizer_config.json's "
                "eos_token), or delete generation_config.json"
            )
    ranges = (("temperature", lambda v: v >= 0), ("top_p", lambda v: 0 < v <= 1), ("top_k", lambda v: v >= 0))
    for key, ok in ranges:
        value = getattr(config, key, None)
        if isinstance(value, int | float) and not isinstance(value, bool) and not ok(value):
            logger.warning(
                "model %s: generation_config.json's %s %r is out of the range generate() samples with; medrecipes "
                "answers with its own settings (greedy unless asked), and other tools would fail: fix or drop it",
                origin, key, value,
            )  # fmt: skip


def _check_vocabulary(model, tokenizer, recipe) -> None:
    """A tokenizer with more tokens than the model has embedding rows: its ids past the last row
    fail inside the embedding at the first step (an index error); said here in one line."""
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        key = "tokenizer_name_or_path" if getattr(recipe, "tokenizer_name_or_path", None) else "the model's tokenizer"
        raise UserError(
            f"{key} ({tokenizer.name_or_path}): {len(tokenizer):,} tokens, and the model has {rows:,} embedding "
            f"rows, so ids from {rows:,} on have none; use the tokenizer the model was trained with, or one of at "
            "most that many tokens"
        )


def positions(model) -> int | None:
    """How many positions the model (or its config) has (max_position_embeddings, or GPT-2's
    n_positions); None where its config sets no limit."""
    config = getattr(model, "config", model)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def settle_unused_parameters(config, args) -> None:
    """DDP's find_unused_parameters where the recipe leaves it unset: off for a dense text model,
    whose every trained parameter takes part in each step's loss. Trainer turns it on for any model
    trained without activation checkpointing, and torch then walks the autograd graph once more at
    every step and warns at the first that it found nothing unused. A Mixture-of-Experts model (an
    expert no token reached; TRL's sign of one, a router) or a model of several parts (a vision tower
    that text never reaches) keeps Trainer's choice. `config`: the model's."""
    text = config.get_text_config()
    if args.ddp_find_unused_parameters is None and text is config and not hasattr(text, "output_router_logits"):
        args.ddp_find_unused_parameters = False


def check_positions(model, args) -> None:
    """Refuse, before the first step, a sequence longer than the model has positions for: a
    model with learned positions (GPT-2) fails inside its embedding, one with rotary positions
    trains on positions it has never seen. The length is `max_length` (CPT, SFT) or a GRPO
    completion's `max_completion_length`; a config without a limit is not checked."""
    limit = positions(model)
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


def load_config(name_or_path: str):
    """The model config without weights (for planning): a packaged copy first, so that the
    recipes' Hub models can be planned offline, then the Hub or a local path. A LoRA adapter's
    folder (an earlier stage's final/) has its base's shape: the config of the base it names."""
    packaged = packaged_config(name_or_path)
    if packaged is not None:
        return packaged
    if adapter := adapter_config(name_or_path):
        return load_config(adapter_base(adapter, typed=False)[0])
    source, kwargs = split_gguf(name_or_path)
    try:
        return AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as err:  # ValueError: a config.json with no model_type transformers knows
        raise cannot_load("model config", name_or_path, err) from None


def load_for_inference(name_or_path: str, revision: str | None = None, dtype: str | None = None):
    """(model, tokenizer) to answer or score with: a Hub id, a model folder or a .gguf file as the
    recipes load them, or a LoRA adapter's folder as lm-eval's `peft=` takes one
    (`load_merged_adapter`: its base with the adapter folded in)."""
    from trl import ModelConfig

    if not adapter_config(name_or_path):
        tokenizer = load_tokenizer(name_or_path, revision)
        model_args = ModelConfig(model_name_or_path=name_or_path, model_revision=revision, dtype=dtype or "auto")
        return load_model(model_args, None, tokenizer), tokenizer
    return load_merged_adapter(os.path.expanduser(name_or_path), dtype)


def _base_changed(adapter_dir: str, base: str) -> bool:
    """Whether a run's adapter (final/ or a checkpoint in its output_dir) has a base that is no longer
    the model the run started from (trained again, another model copied over it): the adapter would
    be folded into weights it never trained with, without a word; the run's record tells."""
    try:
        record = model_run_record(adapter_dir)
    except OSError:
        return False
    started = record.get(START_WEIGHTS) if isinstance(record, dict) and record.get("model") == base else None
    return isinstance(started, str) and weights_fingerprint(base, ends=SAMPLED) not in (None, started)


def _missing_adapter_weights(adapter_dir: str, said: str) -> str:
    """The line for an adapter whose config builds tensors its weights do not hold (use_dora or
    target_modules edited, a config from another run): PEFT would leave them as initialised and
    merge them in."""
    keys = re.findall(r"'([^']+)'", said)
    kinds = sorted({m.group(1) for k in keys if (m := re.search(r"\.(lora_\w+?)(?:\.|$)", k))})
    dora = " (use_dora: true needs the magnitudes a DoRA run saves)" if "lora_magnitude_vector" in kinds else ""
    return (
        f"{adapter_dir}/adapter_config.json calls for {len(keys)} adapter tensors its weights do not hold "
        f"({', '.join(kinds) or keys[0] if keys else 'named by PEFT'}){dora}; they would be merged in as "
        "initialised: copy adapter_config.json again from the run that saved these weights"
    )


def _saved_rank(adapter_dir: str) -> str | None:
    """Where an adapter's weights are of another rank than its adapter_config.json's r (the file
    edited, or copied from another run): the line that says so, else None (the base is then what
    does not fit)."""
    from safetensors import safe_open

    config = read_adapter_config(os.path.join(adapter_dir, "adapter_config.json"), typed=False)
    weights = os.path.join(adapter_dir, "adapter_model.safetensors")
    if config.get("rank_pattern") or not os.path.isfile(weights):  # ranks by module: no one r to compare
        return None
    with safe_open(weights, "pt") as saved:
        ranks = {saved.get_slice(k).get_shape()[0] for k in saved.keys() if ".lora_A." in k}  # noqa: SIM118
    if len(ranks) == 1 and (rank := ranks.pop()) != config.get("r"):
        return (
            f"{adapter_dir}/adapter_config.json: r {config.get('r')}, and the adapter's weights are of rank {rank}; "
            f"set r: {rank} (or copy adapter_config.json again from the run that saved these weights)"
        )
    return None


def load_merged_adapter(adapter_dir: str, dtype: str | None = None):
    """(model, tokenizer) of a LoRA adapter's folder: its base (in `dtype`, default the
    checkpoint's), grown to the tokens training added, the adapter folded in; the tokenizer and
    generation config the run saved beside the adapter, else the base's. `medrecipes merge-lora`
    saves this; eval, generate and serve answer with it."""
    from peft import PeftModel
    from transformers import GenerationConfig

    base, revision = adapter_base(os.path.join(adapter_dir, "adapter_config.json"))
    check_model_folder(adapter_dir)  # the adapter's weights whole, before its base loads
    changed = _base_changed(adapter_dir, base)  # said once the adapter is found to fit it, or in its refusal
    check_model_folder(os.path.expanduser(base))  # the base's weights whole and of its config's shapes
    source, kwargs = split_gguf(base)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, revision=revision, dtype=resolve_dtype(dtype), **kwargs)
    except OSError as err:
        raise cannot_load(
            f"{adapter_dir}/adapter_config.json: base_model_name_or_path",
            base,
            err,
            "fix the path or make the model available",
        ) from None
    # Training saves the tokenizer beside the adapter, with any chat template or tokens it added.
    saved = any(os.path.isfile(os.path.join(adapter_dir, name)) for name in TOKENIZER_FILES)
    tokenizer = load_tokenizer(adapter_dir if saved else base, None if saved else revision)
    # Tokens added during training grow the embeddings; the adapter's saved copies have that size.
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            model = PeftModel.from_pretrained(model, adapter_dir)
        # PEFT's word for weights its config calls for and the file lacks: refused, its other words then moot.
        if missing := next((str(w.message) for w in said if "Found missing adapter keys" in str(w.message)), None):
            raise UserError(_missing_adapter_weights(adapter_dir, missing))
        for warning in said:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise
        if rank := _saved_rank(adapter_dir):
            raise UserError(rank) from None
        since = ", whose weights changed since the adapter's run started from them" if changed else ""
        raise UserError(
            f"{adapter_dir}: the adapter's shapes do not fit '{base}'{since}; "
            "set base_model_name_or_path in adapter_config.json to the model it was trained on"
        ) from None
    except (KeyError, ValueError, TypeError) as err:  # a config PEFT cannot build an adapter from
        raise UserError(
            f"{adapter_dir}: not a LoRA adapter PEFT can load ({str(err).splitlines()[0]}); "
            "copy the adapter again from its run"
        ) from None
    if changed:
        logger.warning(
            "%s: its base %s is not the model its run trained it on (its weights changed since the run started from "
            "them); the adapter is applied to these weights. Point base_model_name_or_path at the model it was "
            "trained on",
            adapter_dir, base,
        )  # fmt: skip
    model = model.merge_and_unload()
    check_finite_weights(model, f"{adapter_dir} (merged into {base})")
    if os.path.isfile(os.path.join(adapter_dir, "generation_config.json")):  # the run's stop tokens
        model.generation_config = GenerationConfig.from_pretrained(adapter_dir)
    return model, tokenizer


def _local_config(model_args, recipe=None):
    """The config of the model a recipe starts from, where it is on this machine: its scratch
    architecture, or a local folder's config.json. None for a Hub id (offline it is not there yet)
    and for a config transformers cannot read: the run's load says what is wrong with it."""
    if recipe is not None and recipe.init_from_scratch and recipe.architecture:
        return scratch_config(recipe.architecture)
    path = os.path.expanduser(model_args.model_name_or_path or "")
    if not os.path.isfile(os.path.join(path, "config.json")):
        return None
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError):
        return None


def check_model_settings(model_args, recipe=None, args=None) -> None:
    """The recipe's settings against the model they will train, read from its config before any
    weight or data loads (`_local_config`): what TRL and transformers refuse or do without a word
    only once the model is there. TRL's rule for router_aux_loss_coef (a Mixture-of-Experts model
    that returns its router logits); lengths within the model's positions; a LoRA rank below the
    width of the layers it adapts (at or above it the update is no longer low-rank and costs more
    than the weights); LoRA's target modules (`check_adapter_targets`); a LoRA adapter's folder
    trains whole (`load_model` folds it into its base), not under a new adapter."""
    config = _local_config(model_args, recipe)
    where = getattr(recipe, "recipe_file", None) or "command line"
    adapting = [key for key in ("use_peft", "load_in_4bit", "load_in_8bit") if getattr(model_args, key, False)]
    if adapting and adapter_config(model_args.model_name_or_path or ""):
        raise UserError(
            f"{where}: model_name_or_path {model_args.model_name_or_path} is a LoRA adapter, which a run starts from "
            f"folded into its base, and {adapting[0]} would put a new adapter on that merged model while naming the "
            f"base alone as its own; merge it first (medrecipes merge-lora {model_args.model_name_or_path} OUT) and "
            "start from OUT"
        )
    if config is not None and args is not None:
        text = config.get_text_config()
        coef = getattr(args, "router_aux_loss_coef", None)
        if coef and not hasattr(text, "output_router_logits"):
            raise UserError(
                f"{where}: router_aux_loss_coef {coef:g} weighs a Mixture-of-Experts model's router loss, and {config.model_type} "
                "has no router (TRL refuses it once the model loads); drop it"
            )
        positions = getattr(text, "max_position_embeddings", None)
        for key in ("max_length", "max_completion_length"):
            value = getattr(args, key, None)
            if positions and isinstance(value, int) and value > positions:
                raise UserError(
                    f"{where}: {key} {value} is past the {positions} positions {config.model_type} has "
                    f"(max_position_embeddings); set {key} to {positions} or less"
                )
        width = getattr(text, "hidden_size", None)
        if model_args.use_peft and width and model_args.lora_r >= width:
            raise UserError(
                f"{where}: lora_r {model_args.lora_r} is not below the width of the layers LoRA adapts ({width}, the "
                f"model's hidden_size): the update is then no low-rank one and costs more than the weights; "
                f"use a rank below {width} (8 to 64 is usual)"
            )
    check_adapter_targets(model_args, recipe, config, args)


def check_adapter_targets(model_args, recipe=None, config=None, args=None) -> None:
    """LoRA's `lora_target_modules` name modules the model has, checked on the meta device (no
    weights, seconds for a 27B architecture) before the data is built: PEFT refuses a name that
    matches nothing only once the model has loaded. PEFT's rule: a name matches a module whose
    name is it or ends with "." and it (`self_attn.q_proj` too); a single text is a regular
    expression the whole module name must match. `config`: the model's (`_local_config`). TRL's
    trainers (`args` one of their configs: all but CPT's) refuse an adapter on the output layer once the model loads:
    they compute log-probabilities from its weight directly, and the adapter would never train."""
    import re

    where = getattr(recipe, "recipe_file", None) or "command line"
    targets = model_args.lora_target_modules
    if model_args.use_peft and targets is not None and len(targets) == 0:
        raise UserError(
            f"{where}: lora_target_modules is an empty list, so LoRA would adapt nothing; name modules ([q_proj, v_proj]), "
            "all-linear, or leave it out for PEFT's choice for the model"
        )
    saved = model_args.lora_modules_to_save or []
    parameters = getattr(model_args, "lora_target_parameters", None) or []
    everything = not targets or targets == "all-linear" or targets == ["all-linear"]
    if not model_args.use_peft or (everything and not saved and not parameters) or config is None:
        return
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = [name for name, _ in model.named_modules() if name]
    linear = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
    # PEFT's modules_to_save: trained whole and saved beside the adapter, matched by the same rule;
    # a name that matches nothing trains and saves nothing, without a word.
    if unsaved := [t for t in saved if not any(n == t or n.endswith("." + t) for n in names)]:
        tops = sorted({name.rsplit(".", 1)[-1] for name in names})
        raise UserError(
            f"{where}: lora_modules_to_save: {', '.join(unsaved)} names no module of {config.model_type}"
            f"{did_you_mean(unsaved[0], tops)}; name modules it has (lm_head, embed_tokens, ...), or leave it out"
        )
    # PEFT's target_parameters (a mixture of experts' stacked weights): the same rule on parameter
    # names; PEFT says of a name that matches nothing only a RuntimeWarning, and trains without it.
    held = [name for name, _ in model.named_parameters()]
    if unmatched := [t for t in parameters if not any(n == t or n.endswith("." + t) for n in held)]:
        ends = sorted({".".join(name.split(".")[-3:]) for name in held})
        raise UserError(
            f"{where}: lora_target_parameters: {', '.join(unmatched)} names no parameter of {config.model_type}"
            f"{did_you_mean(unmatched[0], ends)}; name a parameter by its full name or its end (its weights are "
            f"named like {held[len(held) // 2]}), or leave it out"
        )
    if everything:
        return
    if isinstance(targets, str):
        try:
            pattern = re.compile(targets)
        except re.error as err:
            raise UserError(
                f"{where}: lora_target_modules: '{targets}' is one text, which PEFT reads as a regular expression, and it is "
                f"not one ({err}); give a list of names ([q_proj, v_proj]), or all-linear"
            ) from None
        missing = [] if any(pattern.fullmatch(name) for name in names) else [targets]
    else:
        missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    output = next((name for name, module in model.named_modules() if module is model.get_output_embeddings()), "")
    adapted = (
        pattern.fullmatch(output)
        if isinstance(targets, str)
        else any(output == t or output.endswith("." + t) for t in targets)
    )
    trl = any(kind.__module__.startswith("trl.") for kind in type(args).__mro__)  # CPT's is transformers' own
    if output and adapted and trl:
        raise UserError(
            f"{where}: lora_target_modules: {output} is the output layer, and TRL's trainer computes log-probabilities from "
            f"its weight directly, so an adapter on it would never train (TRL refuses it); leave {output} out"
        )
    if missing and isinstance(targets, str):
        raise UserError(
            f"{where}: lora_target_modules: '{targets}' is one text, which PEFT reads as a regular expression the whole "
            f"module name must match, and no module of {config.model_type} does (they are named like "
            f"{linear[0]}); give a list of names ([q_proj, v_proj]), a pattern such as '.*{targets}', or all-linear"
        )
    if missing:
        hint = did_you_mean(missing[0], leaves)
        raise UserError(
            f"{where}: lora_target_modules: {', '.join(missing)} names no module of {config.model_type}{hint}; its linear "
            f"layers are {', '.join(leaves)} (or all-linear)"
        )
