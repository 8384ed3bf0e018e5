"""What the launch asked for against what accelerate set up, checked as a run starts: the
launcher's process count (`WORLD_SIZE`) and its sharding (`ACCELERATE_USE_FSDP`,
`ACCELERATE_USE_DEEPSPEED`, set from the accelerate config) are environment variables, and
accelerate falls back without a word where the machine cannot give them: each process alone
(a launch of 2 on a CPU without use_cpu), or plain data parallel (FSDP on CPU processes)."""

import logging
import os

from medrecipes.config.schema import world_size
from medrecipes.errors import UserError

logger = logging.getLogger(__name__)

# The accelerate config's sharding, as `accelerate launch` passes it, and the distributed type it asks.
SHARDING = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DEEPSPEED"}


def check_launch(args) -> None:
    """One line and exit 2 where the launcher started several processes and accelerate set each
    up alone (they would train the same run twice into one folder); a warning where the config's
    sharding gave way to plain data parallel."""
    started = world_size()
    kind = args.distributed_state.distributed_type.value if args.distributed_state else "NO"
    device = args.device.type
    if started > 1 and args.world_size == 1:
        hint = "set use_cpu: true in the recipe for CPU processes" if device == "cpu" else "check the launch config"
        raise UserError(
            f"launch: {started} processes were started but accelerate set each up alone ({kind} on {device}), so each "
            f"would train this whole run into the same output_dir; {hint}, or launch one process"
        )
    for variable, asked in SHARDING.items():
        if os.environ.get(variable, "").lower() == "true" and kind != asked and args.process_index == 0:
            logger.warning(
                "launch: %s=true (an accelerate config's %s, as accelerate launch sets it, or left in this shell's "
                "environment) asks for %s but accelerate set up %s on %s (it offers %s on GPUs only): each process "
                "holds the whole model, as with accelerate_configs/ddp.yaml",
                variable, asked, asked, kind, device, asked,
            )  # fmt: skip
