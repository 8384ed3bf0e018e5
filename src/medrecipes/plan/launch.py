"""The settings that depend on how many processes train, and how a multi-node launch starts a
recipe (`medrecipes launch-plan`)."""

import math
import os

from medrecipes.config import library_checks, method_of_args, prompts_per_step_accumulation, resolve_token_budget
from medrecipes.errors import UserError, did_you_mean
from medrecipes.locations import absent


def for_world_size(recipe, training_args, path: str, world_size: int) -> None:
    """The recipe's settings that depend on how many processes train, derived (or refused in one
    line) for `world_size`, the same for `plan` and `launch-plan`: the token budget's steps and
    accumulation, GRPO's accumulation from its prompts per step and the micro-batches it
    generates at once."""
    library_checks.check_parallelism(training_args, path, world_size)
    recipe.derived = {**recipe.derived, **resolve_token_budget(recipe, training_args, path, world_size=world_size)}
    if getattr(training_args, "prompts_per_step", None) is not None:  # GRPO counts its batch in prompts
        training_args.gradient_accumulation_steps = prompts_per_step_accumulation(training_args, world_size)
        recipe.derived["gradient_accumulation_steps"] = training_args.gradient_accumulation_steps
    if method_of_args(training_args).generates:
        training_args.steps_per_generation_on(world_size)


def launch_plan(recipe, training_args, path: str, nodes: int, gpus_per_node: int) -> dict:
    """How a multi-node launch starts this recipe: training nodes and processes, the gradient
    accumulation the recipe derives for them, and whether one node serves vLLM (GRPO with
    `vllm_mode: server`, where generation runs on a node of its own)."""
    if nodes < 1 or gpus_per_node < 1:
        raise UserError(f"launch-plan: need at least one node and one GPU per node, got {nodes} x {gpus_per_node}")
    vllm_server = (
        bool(getattr(training_args, "use_vllm", False)) and getattr(training_args, "vllm_mode", "") == "server"
    )
    train_nodes = nodes - int(vllm_server)
    if train_nodes < 1:
        raise UserError(f"{path}: vllm_mode server takes a node of its own; launch on 2 nodes or more")
    processes = train_nodes * gpus_per_node
    for_world_size(recipe, training_args, path, processes)
    return {
        "TRAIN_NODES": train_nodes,
        "NUM_PROCESSES": processes,
        "GRADIENT_ACCUMULATION_STEPS": training_args.gradient_accumulation_steps,
        "OUTPUT_DIR": training_args.output_dir,
        "PREEMPTION_GRACE_SECONDS": math.ceil(recipe.preemption_grace_seconds),
        "VLLM_SERVER": int(vllm_server),
        "VLLM_PORT": getattr(training_args, "vllm_server_port", 8000),
        "VLLM_TENSOR_PARALLEL_SIZE": getattr(training_args, "vllm_tensor_parallel_size", 1),
    }


# Keys ClusterConfig declares true or false that `accelerate config` itself writes as 'no' or 'yes'.
WRITTEN_AS_WORDS = ("downcast_bf16",)


def check_accelerate_config(path: str) -> dict:
    """An accelerate config file as `accelerate launch` will read it, checked before the launch
    (accelerate reads it before any recipe code runs, and answers a mistake with a traceback):
    YAML, accelerate's own loader (unknown keys, an unknown distributed_type), each key of the
    kind accelerate's `ClusterConfig` declares, mixed_precision one of its precisions,
    num_processes at least 1, a ZeRO stage DeepSpeed has. Its keys and values, as checked."""
    import dataclasses
    import typing

    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import PrecisionType

    from medrecipes.config import read_yaml_mapping

    data = read_yaml_mapping(path, "accelerate config", "accelerate_configs/ holds one per kind of launch")
    fix = "fix it there, or start from one in accelerate_configs/"
    others = sorted(set(data) - {f.name for f in dataclasses.fields(ClusterConfig)})
    if "distributed_type" not in data and others:  # another kind of file: a recipe, most likely
        raise UserError(
            f"{path}: not an accelerate config (no distributed_type, and {', '.join(others[:3])}"
            f"{', ...' if len(others) > 3 else ''} are no keys of one); pass one from accelerate_configs/, and the "
            "recipe after the script"
        )
    kinds = {bool: "true or false", int: "a whole number", dict: "a mapping", list: "a list"}
    for declared in dataclasses.fields(ClusterConfig):
        value = data.get(declared.name)
        if declared.name in WRITTEN_AS_WORDS and value in ("no", "yes"):
            continue
        kind = next((t for t in (declared.type, *typing.get_args(declared.type)) if t in kinds), None)
        if (
            value is not None
            and kind
            and not (isinstance(value, kind) and (kind is bool or not isinstance(value, bool)))
        ):
            raise UserError(f"{path}: {declared.name} must be {kinds[kind]}, got {value!r}; {fix}")
    environment = data.get("compute_environment", "LOCAL_MACHINE")
    if environment != "LOCAL_MACHINE":  # accelerate reads the file as that service's config, of other keys
        raise UserError(
            f"{path}: compute_environment {environment}, a config for accelerate to start a job there (its keys, not "
            "this file's); for a launch on these machines set compute_environment: LOCAL_MACHINE"
        )
    try:
        load_config_from_file(path)
    except (ValueError, TypeError, KeyError) as err:
        raise UserError(f"{path}: accelerate refuses it ({' '.join(str(err).split())}); {fix}") from None
    precisions = [str(p.value) for p in PrecisionType]
    if isinstance(data.get("mixed_precision"), bool):  # YAML 1.1 reads an unquoted no (or yes, off) as false
        raise UserError(f"{path}: mixed_precision is {data['mixed_precision']!r} to YAML; write 'no' in quotes; {fix}")
    if "mixed_precision" in data and str(data["mixed_precision"]) not in precisions:
        raise UserError(
            f"{path}: mixed_precision {data['mixed_precision']!r} is none of {', '.join(precisions)}; {fix}"
        )
    processes = data.get("num_processes", 1)
    if processes < 1:
        raise UserError(f"{path}: num_processes must be at least 1, got {processes}; {fix}")
    machines, rank = data.get("num_machines", 1), data.get("machine_rank", 0)
    if machines < 1:
        raise UserError(f"{path}: num_machines must be at least 1, got {machines}; {fix}")
    if not 0 <= rank < machines:
        raise UserError(
            f"{path}: machine_rank {rank} of num_machines {machines}: the ranks of {machines} machine(s) are 0 to "
            f"{machines - 1}; {fix}"
        )
    gpus = data.get("gpu_ids")
    if gpus is not None and str(gpus).strip().lower() != "all" and not data.get("use_cpu"):
        listed = [g.strip() for g in str(gpus).split(",") if g.strip()]
        each = max(processes // machines, 1)  # processes a machine
        if len(set(listed)) < each:
            raise UserError(
                f"{path}: gpu_ids {gpus} lists {len(set(listed))} GPU(s) and each machine starts {each} processes "
                f"(num_processes {processes} over {machines} machine(s)), one a GPU; the ones past the list find no "
                f"GPU; list {each} GPUs, or set num_processes to {len(set(listed)) * machines}; {fix}"
            )
    deepspeed = data.get("deepspeed_config") or {}
    stage = deepspeed.get("zero_stage")
    if isinstance(stage, str) and stage.strip() in ("0", "1", "2", "3"):
        raise UserError(
            f"{path}: deepspeed_config.zero_stage is the text {stage!r}; write {stage.strip()} without quotes; {fix}"
        )
    if stage is not None and (isinstance(stage, bool) or stage not in (0, 1, 2, 3)):
        raise UserError(f"{path}: deepspeed_config.zero_stage {stage!r} is none of DeepSpeed's stages 0-3; {fix}")
    _check_named_values(data, path, fix)
    _check_plugin_kinds(data, path, fix)
    if (ds_file := deepspeed.get("deepspeed_config_file")) and not os.path.isfile(ds_file):
        raise UserError(
            f"{path}: deepspeed_config.deepspeed_config_file {ds_file}: {absent(ds_file)} (accelerate reads it from "
            f"where it is launched); {fix}"
        )
    return data


def recipe_under_launch(
    config: dict, config_path: str, recipe, training_args, recipe_path: str, model_name: str | None = None
) -> str:
    """A parsed recipe as a launch with the accelerate config (`check_accelerate_config`'s mapping)
    will run it: its process-count settings derived for the config's processes (`for_world_size`),
    its precision settled as the launch settles it (`launch_precision`: a recipe that sets another
    is refused in the launch's line), DeepSpeed's accumulation against the recipe's. Returns the
    line that says how it launches, with what a CPU recipe makes of a GPU config."""
    from medrecipes.config.trainer_configs import launch_precision

    processes = config.get("num_processes", 1)
    sharded = str(config.get("distributed_type") or "NO")  # an unquoted NO is false to YAML, as accelerate reads it
    for_world_size(recipe, training_args, recipe_path, _started(config, sharded, processes))
    _check_against_recipe(config, config_path, training_args, processes)
    precision = str(config.get("mixed_precision", "no"))  # handed to the recipe by the launch
    given = training_args.bf16 if "bf16" in recipe.given else None
    try:
        training_args.bf16 = launch_precision(given, training_args.fp16, precision, training_args.bf16)
    except ValueError as err:
        raise UserError(f"{recipe_path}: {err}") from None
    _check_wrapped_layers(config, config_path, model_name)
    launch = f"{config_path}: {processes} process{'es' if processes > 1 else ''} a machine"
    if config.get("use_cpu") and not training_args.use_cpu:
        launch += "; it has use_cpu: true, so its processes train on CPUs and the recipe's GPUs stay idle"
    if training_args.use_cpu and sharded in ("DEEPSPEED", "FSDP", "MULTI_GPU"):
        launch += (
            f"; it asks for {sharded}, which accelerate sets up on GPUs only, and the recipe has use_cpu: true, "
            "so each CPU process would hold the whole model (plain data parallel)"
        )
    recipe.notes = _notes_under_launch(recipe, training_args, config, sharded, processes)
    if training_args.bf16 and not training_args.use_cpu and not _bf16_here():  # a login node, often
        recipe.notes.append(
            f"the launch trains in bf16 ({config_path}: mixed_precision {precision}), which transformers refuses on "
            "this machine, without a GPU that has bf16: launched here, it stops at its start; launch it where its GPUs "
            "are"
        )
    return launch + "".join(f"; {note}" for note in _idle_settings(config, sharded, processes))


def _bf16_here() -> bool:
    """Whether transformers lets a GPU recipe (use_cpu false) train in bf16 on this machine."""
    from transformers.utils import is_torch_bf16_gpu_available, is_torch_xla_available

    return is_torch_bf16_gpu_available() or is_torch_xla_available()


def _check_against_recipe(config: dict, config_path: str, training_args, processes: int) -> None:
    """What the accelerate config sets that the recipe sets too, or reads from it, refused where
    transformers would refuse it once the model is loaded: DeepSpeed's gradient accumulation and
    clipping unlike the recipe's (it requires them to match), FSDP's activation checkpointing beside
    the recipe's; and ZeRO-3 without zero3_save_16bit_model, which saves final/ as DeepSpeed's
    shards with no model weights for the evaluations, the card and the push to read."""
    deepspeed, fsdp = config.get("deepspeed_config") or {}, config.get("fsdp_config") or {}
    for key, recipe_key in (("gradient_accumulation_steps", "gradient_accumulation_steps"),
                            ("gradient_clipping", "max_grad_norm")):  # fmt: skip
        value, ours = deepspeed.get(key), getattr(training_args, recipe_key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value != ours:
            raise UserError(
                f"{config_path}: deepspeed_config.{key} {value} and the recipe's {recipe_key} {ours} (for {processes} "
                f"processes) disagree; drop it from the accelerate config (the recipe sets it), or make them equal"
            )
    if fsdp.get("fsdp_activation_checkpointing") is True and training_args.activation_checkpointing:
        raise UserError(
            f"{config_path}: fsdp_config.fsdp_activation_checkpointing and the recipe's activation_checkpointing are "
            "both on, which transformers refuses; keep FSDP's and set activation_checkpointing: false in the recipe"
        )
    if config.get("distributed_type") == "DEEPSPEED" and deepspeed.get("zero_stage") == 3:
        if deepspeed.get("zero3_save_16bit_model") is False:
            raise UserError(
                f"{config_path}: zero3_save_16bit_model false saves final/ as DeepSpeed's shards, with no model "
                "weights for the evaluations, the card and the push to read; set it true"
            )


def _notes_under_launch(recipe, training_args, config: dict, sharded: str, processes: int) -> list[str]:
    """The recipe's notes as the launch's processes will say them: the settings for several
    processes or for a sharding read the environment accelerate launch sets (the process count,
    DeepSpeed and its stage, FSDP), which this process, not launched, has not."""
    from unittest import mock

    alone = library_checks.notes(training_args, recipe)
    launched = {
        "WORLD_SIZE": str(_started(config, sharded, processes)),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    if sharded == "DEEPSPEED":
        stage = (config.get("deepspeed_config") or {}).get("zero_stage", 0)
        launched |= {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": str(stage)}
    if sharded == "FSDP":
        launched["ACCELERATE_USE_FSDP"] = "true"
    with mock.patch.dict(os.environ, launched):
        return [note for note in recipe.notes if note not in alone] + library_checks.notes(training_args, recipe)


def _started(config: dict, sharded: str, processes: int) -> int:
    """The processes accelerate launch starts on this machine for the config (`_idle_settings` says
    why fewer than num_processes): one under distributed_type NO unless the machine has several
    GPUs, and one under MULTI_CPU or use_cpu: true unless under mpirun."""
    import torch

    hostfile = (config.get("mpirun_config") or {}).get("mpirun_hostfile")
    alone = (sharded == "NO" and torch.cuda.device_count() < 2) or (
        not hostfile and (sharded == "MULTI_CPU" or config.get("use_cpu") is True)
    )
    return 1 if alone else processes


def _idle_settings(config: dict, sharded: str, processes: int) -> list[str]:
    """What an accelerate config sets that its launch does not use, as accelerate's launch command
    chooses a launcher: several processes under distributed_type NO (it starts one, unless the
    machine has several GPUs, where it turns multi-GPU on), MULTI_CPU or use_cpu: true (one, unless
    under mpirun), a sharding section of a type it does not launch, and DeepSpeed's parameter
    offload below ZeRO stage 3 (it offloads parameters at 3 only)."""
    idle = []
    several = f"for {processes} processes set distributed_type: MULTI_GPU and use_cpu: false in it (torchrun starts them; a recipe's use_cpu: true keeps them on CPUs), or num_processes: 1"
    hostfile = (config.get("mpirun_config") or {}).get("mpirun_hostfile")
    if sharded == "NO" and processes > 1:
        idle.append(
            f"distributed_type NO starts one process, not {processes}, unless the machine has several GPUs (then "
            f"accelerate turns multi-GPU on); {several}"
        )
    elif processes > 1 and not hostfile and (sharded == "MULTI_CPU" or config.get("use_cpu") is True):
        why = "distributed_type MULTI_CPU" if sharded == "MULTI_CPU" else "use_cpu: true"
        idle.append(
            f"{why} starts one process, not {processes}: accelerate's plain launcher, or mpirun with "
            f"mpirun_config.mpirun_hostfile; {several}"
        )
    for section, kind in (("fsdp_config", "FSDP"), ("deepspeed_config", "DEEPSPEED")):
        if config.get(section) and sharded != kind:
            idle.append(f"{section} does nothing while distributed_type is {sharded}, not {kind}; drop it, or switch")
    deepspeed = config.get("deepspeed_config") or {}
    offload = str(deepspeed.get("offload_param_device", "none")).lower()
    if sharded == "DEEPSPEED" and offload != "none" and deepspeed.get("zero_stage", 0) != 3:
        idle.append(
            f"offload_param_device {offload} does nothing at zero_stage {deepspeed.get('zero_stage', 0)} (DeepSpeed "
            "offloads parameters at stage 3 only); use zero_stage: 3, or offload_optimizer_device"
        )
    return idle


# DeepSpeed's OffloadDeviceEnum, as accelerate's `config` offers it: not imported, since the
# commands that only read a recipe keep DeepSpeed out of their process (`cli.run`).
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def _check_wrapped_layers(config: dict, path: str, model_name: str | None) -> None:
    """FSDP's fsdp_transformer_layer_cls_to_wrap names layer classes of the model (accelerate
    looks them up once the model is built, and stops there): checked against the classes of the
    recipe's model, built on the meta device from its config, where that config can be read."""
    from medrecipes.models.loading import load_config

    names = (config.get("fsdp_config") or {}).get("fsdp_transformer_layer_cls_to_wrap")
    if not names or not model_name:
        return
    try:
        model_config = load_config(model_name)
    except UserError:  # a Hub model not here: the launch checks it
        return
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        classes = {type(m).__name__ for m in AutoModelForCausalLM.from_config(model_config).modules()}
    for name in [n.strip() for n in str(names).split(",")]:
        if name not in classes:
            layers = sorted(c for c in classes if c.endswith("Layer"))
            raise UserError(
                f"{path}: fsdp_config.fsdp_transformer_layer_cls_to_wrap {name} is no class of {model_name}"
                f"{did_you_mean(name, sorted(classes))}; its layer classes: {', '.join(layers) or 'none'}"
            )


def _rendezvous_backends() -> list[str]:
    """The rendezvous backends torch's elastic launch knows (its registry, filled as torchrun fills it)."""
    from torch.distributed.elastic.rendezvous.api import rendezvous_handler_registry
    from torch.distributed.elastic.rendezvous.registry import _register_default_handlers

    _register_default_handlers()
    return list(rendezvous_handler_registry._registry)


def _check_plugin_kinds(data: dict, path: str, fix: str) -> None:
    """The keys of fsdp_config and deepspeed_config of the kind accelerate's plugin declares for them:
    a switch true or false (the launch passes it on as text, which the plugin reads with str_to_bool,
    and a traceback in every process where it cannot), a count a whole number, a norm a number."""
    import dataclasses

    from accelerate.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, str_to_bool

    sections = (
        ("fsdp_config", FullyShardedDataParallelPlugin, lambda key: key.removeprefix("fsdp_")),
        ("deepspeed_config", DeepSpeedPlugin, lambda key: key),
    )
    for section, plugin, field_of in sections:
        declared = {f.name: f.type for f in dataclasses.fields(plugin)}
        declared["offload_params"] = bool  # fsdp_offload_params: the plugin's cpu_offload
        for key, value in (data.get(section) or {}).items():
            kind = declared.get(field_of(key))
            if key == "fsdp_reshard_after_forward" and (data.get(section) or {}).get("fsdp_version") == 2:
                kind = bool  # FSDP 2 reshards or not; a sharding strategy's name is FSDP 1's
            if kind in (bool, bool | None) and not isinstance(value, bool):
                try:
                    str_to_bool(str(value))
                except ValueError:
                    raise UserError(f"{path}: {section}.{key} must be true or false, got {value!r}; {fix}") from None
            elif kind in (int, float) and (isinstance(value, bool) or not isinstance(value, int | float)):
                if value != "auto":  # DeepSpeed's word for "as the trainer says"
                    what = "a whole number" if kind is int else "a number"
                    raise UserError(f"{path}: {section}.{key} must be {what} (or auto), got {value!r}; {fix}")


def _check_named_values(data: dict, path: str, fix: str) -> None:
    """The port and the names an accelerate config chooses by, against the names accelerate and
    DeepSpeed define (the launch refuses another only once its processes start): the dynamo
    backend, FSDP's sharding strategy, state dict type, wrap policy and prefetch, DeepSpeed's
    offload devices."""
    from accelerate.utils import DynamoBackend
    from accelerate.utils.constants import (
        FSDP_AUTO_WRAP_POLICY,
        FSDP_BACKWARD_PREFETCH,
        FSDP_SHARDING_STRATEGY,
        FSDP_STATE_DICT_TYPE,
    )

    port = data.get("main_process_port")
    if port is not None and not (isinstance(port, int) and 0 <= port <= 65535):
        raise UserError(f"{path}: main_process_port {port!r} is no TCP port (0 to 65535); {fix}")
    named = [
        ("dynamo_config.dynamo_backend", (data.get("dynamo_config") or {}).get("dynamo_backend"),
         [b.value for b in DynamoBackend]),
    ]  # fmt: skip
    fsdp = data.get("fsdp_config") or {}
    for key, known in (
        ("sharding_strategy", FSDP_SHARDING_STRATEGY),
        ("state_dict_type", FSDP_STATE_DICT_TYPE),
        ("auto_wrap_policy", FSDP_AUTO_WRAP_POLICY),
        ("backward_prefetch", FSDP_BACKWARD_PREFETCH),
    ):
        named.append((f"fsdp_config.fsdp_{key}", fsdp.get(f"fsdp_{key}"), known))  # fmt: skip
    deepspeed = data.get("deepspeed_config") or {}
    named += [(f"deepspeed_config.{k}", v, OFFLOAD_DEVICES) for k, v in deepspeed.items() if k.endswith("_device")]
    named.append(("rdzv_backend", data.get("rdzv_backend"), _rendezvous_backends()))
    version = (data.get("fsdp_config") or {}).get("fsdp_version")
    if version is not None and version not in (1, 2):  # accelerate sets up FSDP 1 or FSDP 2
        raise UserError(
            f"{path}: fsdp_config.fsdp_version {version!r} is none of accelerate's FSDP versions 1, 2; {fix}"
        )
    for key, value, known in named:
        if isinstance(value, str) and value.upper() not in [k.upper() for k in known]:
            raise UserError(
                f"{path}: {key} {value!r} is none of {', '.join(known)}{did_you_mean(value, known)}; {fix}"
            )
