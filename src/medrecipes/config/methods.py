"""The training methods, each declared once: what its recipes parse into, the data it takes, how it
meets the chat template, and what the plan and the run settle for it. Everything that branches on
a method reads it from here (`parse_recipe`, `medrecipes` and its `--method`, the settled run,
the plan, the preview), so a new method is one `register_method` call and one recipe script,
which names its data and its trainer (docs/architecture.md, "The methods")."""

import dataclasses
from collections.abc import Callable
from typing import Literal

from transformers import TrainingArguments

from medrecipes.config import checks, library_checks
from medrecipes.config.trainer_configs import CPTConfig, MedDPOConfig, MedGRPOConfig, MedKTOConfig, MedSFTConfig
from medrecipes.errors import UserError

# A check of one method's recipes beyond those every recipe gets: (recipe, training args, path).
Check = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class Method:
    name: str  # the run record's, the card's tag and `--method`'s word for it
    config: type[TrainingArguments]  # the training arguments its recipes parse into
    formats: tuple[str, ...]  # the source formats its training and eval data may take
    # How its examples meet a chat template: "none" (plain text), "trains" (SFT: the template the
    # recipe names, its answers trained to end the turn) or "prompts" (the tokenizer's own).
    chat: Literal["none", "trains", "prompts"]
    generates: bool = False  # samples answers while it trains (GRPO): rewards, prompt room, generation memory
    preference: Literal["pairs", "answers"] | None = None  # scores chosen against rejected, or labelled answers
    plans_checkpointing: bool = False  # the memory plan may choose activation checkpointing (`checkpointing_by_plan`)
    checks: tuple[Check, ...] = ()  # run in this order when a recipe is parsed, before its derived settings
    script: str = ""  # the recipe script, by default recipes/<name>.py

    def __post_init__(self):
        if not self.script:
            object.__setattr__(self, "script", f"recipes/{self.name}.py")

    @property
    def sequences_per_example(self) -> int:
        """Sequences one example puts through the model together: a pair's chosen and rejected answer."""
        return 2 if self.preference == "pairs" else 1


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add a method to those every command knows; a name is registered once."""
    if method.name in METHODS or method.name == "eval":
        raise ValueError(f"a method named {method.name!r} is registered already")
    METHODS[method.name] = method
    return method


def method_named(name: str) -> Method:
    if name not in METHODS:
        raise UserError(f"unknown method '{name}'; one of {', '.join(METHODS)}")
    return METHODS[name]


def method_of_args(training_args) -> Method:
    """The method whose recipes parse into `training_args`' class (the plan reads a parsed recipe)."""
    kind = type(training_args)
    found = [m for m in METHODS.values() if m.config is kind] or [
        m for m in METHODS.values() if isinstance(training_args, m.config)
    ]
    if not found:
        raise ValueError(f"no method parses into {kind.__name__}")
    return found[0]


def check_formats(recipe, method: Method, path: str) -> None:
    """Every source, for training or evaluation, in a format the method trains on."""
    for where, source in checks.named_sources(recipe).items():
        if source.format not in method.formats:
            layouts = " or ".join(f"format: {f}" for f in method.formats)
            hint = (
                " (medrecipes pairs --mcq FILE --out PAIRS.jsonl builds them from questions)"
                if method.preference
                else ""
            )
            raise UserError(
                f"{path}: {where}: format {source.format} is not what {method.name.upper()} trains on; "
                f"give {layouts} rows{hint}"
            )


def _dpo_reference(recipe, args, path: str) -> None:
    library_checks.check_dpo_reference(args, path)


def _sampling(recipe, args, path: str) -> None:
    library_checks.check_sampling(args, path)
    library_checks.check_generation_config(args, path)
    if note := library_checks.sampling_note(args):
        recipe.notes.append(note)


register_method(Method("cpt", CPTConfig, formats=("text", "usmle"), chat="none"))
register_method(
    Method(
        "sft",
        MedSFTConfig,
        formats=("text", "usmle", "chat"),
        chat="trains",
        plans_checkpointing=True,
        checks=(checks.check_sft_sources,),
    )
)
register_method(
    Method(
        "grpo",
        MedGRPOConfig,
        formats=("usmle",),
        chat="prompts",
        generates=True,
        checks=(checks.resolve_grpo, _sampling),
    )
)
register_method(
    Method(
        "dpo",
        MedDPOConfig,
        formats=("preference",),
        chat="prompts",
        preference="pairs",
        plans_checkpointing=True,
        checks=(_dpo_reference, checks.check_one_layout),
    )
)
register_method(
    Method(
        "kto",
        MedKTOConfig,
        formats=("preference", "unpaired"),
        chat="prompts",
        preference="answers",
        plans_checkpointing=True,
        checks=(checks.check_one_layout,),
    )
)
