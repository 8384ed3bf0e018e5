"""A run settled once: `settle_run` turns a parsed recipe, with its tokenizer, into one frozen
`SettledRun` that says what the run is, before its data and model load. The recipe scripts read
it, and `run.json` records it whole (`record`), where `medrecipes report`, `medrecipes card` and
the push read it; nothing works one of its facts out again.

- the method (`cpt`, `sft`, `grpo`, `dpo`, `kto`) and its script;
- the chat template the run trains or prompts with, and the token that ends a turn (SFT trains
  its answers to end there: `eos_token`; generation stops there too);
- activation checkpointing: the recipe's, or the memory plan's choice (`plan.summary`), logged once;
- under DDP, whether it looks for parameters a step leaves unused (`settle_unused_parameters`);
- GRPO: the room a prompt may take (the model's positions less `max_completion_length`) and the
  rewards with their weights and settings (built once, `reward_functions`);
- the run folder and the checkpoint it resumes from (`runs.resume`).
"""

from medrecipes.config.methods import method_named
from medrecipes.errors import UserError
from medrecipes.models.loading import positions, settle_unused_parameters
from medrecipes.models.templates import answer_end, say_dropped_bos, say_dropped_system, sft_template, turn_end
from medrecipes.plan.shape import model_config
from medrecipes.plan.summary import settle_checkpointing
from medrecipes.rewards import reward_functions
from medrecipes.runs.described import card_facts
from medrecipes.runs.record import SettledRun, read_record, update_record
from medrecipes.runs.resume import checkpoint_to_resume


def prompt_room(recipe, model_args, training_args) -> int | None:
    """GRPO: the tokens a prompt may take, the model's positions less max_completion_length (None:
    its config sets no limit); `data.grpo.fit_prompts` leaves out the prompts longer."""
    limit = positions(model_config(recipe, model_args.model_name_or_path))
    return limit - training_args.max_completion_length if limit else None


def chat_turns(
    method: str, training_args, tokenizer, system_prompt: str | None = None
) -> tuple[str | None, str | None]:
    """(template, end of turn) of a run: for SFT the template it trains with (`sft_template`, set on
    the tokenizer) and its end of turn, unless the recipe names `eos_token`; for the others the
    tokenizer's own; CPT trains on plain text, in no template (`Method.chat`). `medrecipes preview`
    shows the examples through the same. SFT's answers must end with that token in its template
    (TRL adds none to a conversation), or the model is never trained to stop. A `system_prompt` the
    template refuses stops the run here, one it leaves out is said (`say_dropped_system`), as is a
    template of the recipe's that drops the BOS the model's own starts with (`say_dropped_bos`)."""
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    template, end = _chat_turns(method, training_args, tokenizer)
    if template and own and template != own:  # a template of the recipe's, in place of the model's
        say_dropped_bos(tokenizer, own, template)
    if template and system_prompt:  # before a step: a template that refuses the turn stops the run here
        say_dropped_system(tokenizer, "system_prompt", template)
    return template, end


def _chat_turns(method: str, training_args, tokenizer) -> tuple[str | None, str | None]:
    chat = method_named(method).chat
    if chat == "none":
        return None, None
    if chat == "trains":
        template, added = sft_template(training_args, tokenizer)
        end = training_args.eos_token or turn_end(template)
        if end and end not in added and tokenizer.convert_tokens_to_ids(end) in (None, tokenizer.unk_token_id):
            raise UserError(  # TRL refuses it once its trainer is built, after the data is tokenised
                f"eos_token: {end!r} is not a token of {tokenizer.name_or_path}'s tokenizer; name one of its tokens "
                f"({tokenizer.eos_token!r} is its end), or leave eos_token out for its template's end of turn"
            )
        ending = end or tokenizer.eos_token
        if template and ending and ending not in (after := answer_end(tokenizer, template)):
            raise UserError(
                f"chat template: an assistant's answer is followed by no {ending!r} ({after!r} comes next), so the "
                "model would never be trained to stop; end the assistant turn with it, or name the token that does "
                "end it in eos_token"
            )
        return template, end
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return template, turn_end(template)


def tokenizer_turns(method: str, recipe, training_args, model_args, tokenizer) -> tuple[str | None, str | None]:
    """The recipe's pad_token, set on the tokenizer, and its turns (`chat_turns`), each checked
    against the tokenizer: what a run settles of them, and `medrecipes validate` checks."""
    pad = getattr(training_args, "pad_token", None)
    if pad is not None and pad not in tokenizer.get_vocab():  # TRL refuses it once its trainer is built
        raise UserError(
            f"pad_token: {pad!r} is not a token of {model_args.model_name_or_path}'s tokenizer; name one of its "
            f"tokens ({tokenizer.pad_token or tokenizer.eos_token!r} pads by default), or leave pad_token out"
        )
    if pad is not None:  # set on the tokenizer, as TRL asks in deprecating its own key (parse.LIBRARY_KEYS_KEPT)
        tokenizer.pad_token = pad
    return chat_turns(method, training_args, tokenizer, recipe.system_prompt)


def settle_run(method: str, recipe, training_args, model_args, tokenizer) -> SettledRun:
    """What the run of `method` is, decided here alone, written back where the trainers read it
    (`eos_token`, activation checkpointing) and recorded in run.json. GRPO's reward entries and
    their weights (`reward_weights`) were checked when the recipe was parsed; their functions are
    built here."""
    trains = method_named(method)
    template, end_of_turn = tokenizer_turns(method, recipe, training_args, model_args, tokenizer)
    if trains.chat == "trains":
        training_args.eos_token = end_of_turn  # answers are trained to end at the turn's end
    room, rewards, functions = None, (), ()
    if trains.generates:
        if training_args.prompt_format == "chat" and template is None:
            raise UserError(
                f"model_name_or_path: the tokenizer of '{model_args.model_name_or_path}' has no chat template; "
                "use prompt_format: plain for a pretrained model, or start from a chat model (recipes/sft.py)"
            )
        room = prompt_room(recipe, model_args, training_args)
        functions, _ = reward_functions(training_args.rewards)  # checked, with their weights, when parsed
        weights = training_args.reward_weights
        rewards = tuple(
            {**entry, "weight": weight} for entry, weight in zip(training_args.rewards, weights, strict=True)
        )
    if training_args.world_size > 1:  # DDP's search for unused parameters, where the recipe leaves it
        settle_unused_parameters(model_config(recipe, model_args.model_name_or_path), training_args)
    by_plan = getattr(training_args, "checkpointing_by_plan", False)
    settle_checkpointing(recipe, training_args, model_args)  # SFT, DPO, KTO where the recipe left it to the plan
    by = "recipe" if not by_plan else "plan" if trains.plans_checkpointing else "default"
    run = SettledRun(
        method=method,
        output_dir=training_args.output_dir,
        resume_from=checkpoint_to_resume(training_args, recipe),
        activation_checkpointing=bool(getattr(training_args, "activation_checkpointing", False)),
        checkpointing_by=by,
        chat_template=template,
        end_of_turn=end_of_turn,
        prompt_room=room,
        rewards=rewards,
        reward_funcs=tuple(functions),
    )
    before = (read_record(training_args.output_dir) or {}).get("settled") or {}
    if run.resume_from and before.get("chat_template") not in (None, template):
        raise UserError(
            f"output_dir {training_args.output_dir}: the run resumes with another chat template than it trained with "
            "(the tokenizer's template or chat_template_path changed since it started), and the rest of it would "
            "train on other turns; restore the template, or start over in another output_dir"
        )
    entries = {"settled": run.record()}
    # The card's facts hash the data files whole: worked out by the process that writes, once per
    # run (a resumed run keeps those it recorded when it started).
    if training_args.should_save and "card" not in (read_record(training_args.output_dir) or {}):
        entries["card"] = card_facts(recipe, model_args, training_args)
    update_record(training_args, **entries)
    return run
