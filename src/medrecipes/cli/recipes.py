"""The commands that read a recipe: validate, plan, preview, launch-plan, build-data."""

import json
import sys

from medrecipes.cli.arguments import (
    COUNT,
    Number,
    input_path,
    method_of,
    output_path,
    parse_recipe_file,
    recipe_command,
)
from medrecipes.errors import UserError

ACCELERATE_CONFIG = "the accelerate config file the run will be launched with: checked, and its processes used"


def add_commands(commands) -> None:
    """validate, plan, preview, launch-plan and build-data."""
    check = recipe_command(commands, "validate", "parse a recipe and print the resolved configuration")
    check.add_argument("--accelerate-config", type=input_path, help=ACCELERATE_CONFIG)
    check.set_defaults(func=cmd_validate)

    plan_parser = recipe_command(commands, "plan", "training math and a memory estimate per device")
    plan_parser.add_argument("--num-gpus", type=COUNT, default=1)
    plan_parser.add_argument("--gpu", default="h100-80gb", help="h100-80gb, a100-80gb, a100-40gb, l40s-48gb, ...")
    plan_parser.add_argument("--dataset-sequences", type=COUNT, help="packed training sequences, when not known")
    plan_parser.add_argument(
        "--prompt-tokens", type=Number(int, least=1), help="GRPO: tokens per prompt, typical of the data"
    )
    plan_parser.add_argument("--json", action="store_true", help="print one JSON object")
    plan_parser.set_defaults(func=cmd_plan)

    show = recipe_command(
        commands, "preview", "the first training examples as the model will see them, trained part marked"
    )
    show.add_argument("--examples", type=COUNT, default=3, help="how many (default 3)")
    show.set_defaults(func=cmd_preview)

    launch = recipe_command(commands, "launch-plan", "shell variables for a multi-node launch (recipes/launch/)")
    launch.add_argument("--nodes", type=COUNT, required=True)
    launch.add_argument(
        "--gpus-per-node", type=COUNT, help="processes a node starts (default: the accelerate config's, else 8)"
    )
    launch.add_argument("--accelerate-config", type=input_path, help=ACCELERATE_CONFIG)
    launch.set_defaults(func=cmd_launch_plan)

    build = commands.add_parser(
        "build-data", help="tokenise, pack and save a pretraining recipe's data, with a manifest"
    )
    build.add_argument("recipe", type=input_path, help="a CPT or pretraining recipe YAML file")
    build.set_defaults(func=cmd_build_data, takes_overrides=True)
    build.add_argument(
        "--out", type=output_path, help="folder to write (default: the recipe's built_data); an fsspec URL works too"
    )
    build.add_argument("--num-gpus", type=COUNT, default=1, help="processes the run will use (streaming: sets blocks)")
    build.add_argument("--force", action="store_true", help="build even when the manifest says it is up to date")


def cmd_validate(args) -> None:
    from medrecipes.config import METHODS, parse_eval_args, resolved_yaml, script_of
    from medrecipes.data.mixture import training_mixture

    method = method_of(args.recipe, args.method, (*METHODS, "eval"))
    launch, config = None, {}
    if method == "eval" and args.accelerate_config:
        raise UserError("validate: --accelerate-config is for training recipes; an eval recipe is not launched")
    if method == "eval":
        parsed, derived = (parse_eval_args([args.recipe, *args.overrides]),), {}
    else:
        if args.accelerate_config:  # read as `accelerate launch` will
            from medrecipes.plan.launch import check_accelerate_config, recipe_under_launch

            config = check_accelerate_config(args.accelerate_config)
        recipe, training_args, model_args = parse_recipe_file(
            args.recipe, method, args.overrides, to_train=True, say_notes=False
        )
        parsed = (recipe, model_args, training_args)
        training_mixture(recipe)  # what every script refuses first, before its model loads
        _check_local_inputs(method, recipe, model_args, training_args)
        if args.accelerate_config:  # the settings that depend on how many processes train, for its count
            launch = recipe_under_launch(
                config, args.accelerate_config, recipe, training_args, args.recipe, model_args.model_name_or_path
            )
        derived = recipe.derived
    print(resolved_yaml(*parsed), end="")
    for key, value in derived.items():
        print(f"# derived: {key} = {value}")
    for note in getattr(parsed[0], "notes", []):  # in the resolved recipe, and on the terminal when stdout is piped
        print(f"# note: {note}")
        print(f"warning: {note}", file=sys.stderr)
    if launch:
        print(f"# launch: {launch}")
    print(f"# {args.recipe}: valid {method} recipe ({script_of(method)})")


def _check_local_inputs(method: str, recipe, model_args, training_args) -> None:
    """What a run would refuse first among what is on this machine: a data source or data file
    that is missing or empty, a built_data folder built for other data keys or max_length or from
    files changed since, a scratch architecture that is not known, settings the model (a scratch
    one, or a local folder's config) cannot take (`check_model_settings`), those its local
    tokenizer cannot (pad_token, eos_token, the chat template's turns: `tokenizer_turns`), the
    checkpoint resume_from_checkpoint names, the eval_tasks files under eval_tasks_data_dir, and
    GRPO's questions (`_check_questions`). Hub ids, URLs, a built_data folder or pass_rate file not
    made yet and a starting model that is not there yet (an earlier stage may still be writing
    it) are left to the run, as is the tokenizer a built folder was made with."""
    import os
    from pathlib import Path

    from medrecipes.config import method_named
    from medrecipes.data.manifest import check_built_data, data_key, read_manifest, source_files
    from medrecipes.data.sources import check_local_source
    from medrecipes.evaluation.tasks import RECIPE_WORDING, TASKS, load_task
    from medrecipes.locations import is_url, saved_dataset
    from medrecipes.models.loading import check_model_settings, recipe_tokenizer, starting_model
    from medrecipes.models.scratch import scratch_config
    from medrecipes.runs.resume import check_named_checkpoint, resumes_from_output_dir
    from medrecipes.runs.settle import tokenizer_turns
    from medrecipes.usmle.loading import check_folder_split

    sources = [*(recipe.mixture.sources if recipe.mixture else []), *recipe.eval_sources.values()]
    for source in sources:
        check_local_source(source)
    for source in recipe.mixture.sources if recipe.mixture else []:  # a folder trains on its split's files
        if source.data_files is None and os.path.isdir(source.path) and not saved_dataset(source.path):
            check_folder_split(Path(source.path), source.split)
    if recipe.built_data and not is_url(recipe.built_data) and (manifest := read_manifest(recipe.built_data)):
        expected = data_key(recipe, training_args.max_length, training_args.dataset_num_proc)
        check_built_data(recipe.built_data, manifest, expected)
    if recipe.init_from_scratch and recipe.architecture:
        scratch_config(recipe.architecture)
    check_model_settings(model_args, recipe, training_args)
    local_tasks = [name for name in recipe.eval_tasks or [] if name in TASKS] if recipe.eval_tasks_data_dir else []
    for name in local_tasks:  # their benchmark files under eval_tasks_data_dir, loaded as the run loads them
        load_task(name, data_dir=recipe.eval_tasks_data_dir, limit=recipe.eval_tasks_limit, wording=RECIPE_WORDING)
    if not resumes_from_output_dir(training_args):  # a checkpoint the recipe names
        check_named_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir, recipe)
    named = recipe.tokenizer_name_or_path or starting_model(model_args)
    if named and os.path.isdir(os.path.expanduser(named)):  # a local tokenizer, read as the run reads it
        tokenizer = recipe_tokenizer(recipe, model_args)
        tokenizer_turns(method, recipe, training_args, model_args, tokenizer)
        measured = [s.pass_rate.file for s in sources if s.pass_rate]  # an earlier stage may still write one
        if (
            method_named(method).generates
            and all(source_files(s) is not None for s in sources)
            and all(os.path.isfile(os.path.expanduser(f)) for f in measured)
        ):
            _check_questions(recipe, model_args, training_args, tokenizer)


def _check_questions(recipe, model_args, training_args, tokenizer) -> None:
    """GRPO's data step, as its run takes it before the model loads (its questions are few): the
    pass_rate files' questions, and the prompts that fit beside max_completion_length."""
    from medrecipes.data.grpo import fit_prompts, grpo_data
    from medrecipes.runs.settle import prompt_room

    train, evals, _ = grpo_data(recipe, training_args.prompt_format)
    room = prompt_room(recipe, model_args, training_args)
    for where, prompts in {"dataset_mixture": train, **{f"eval_sets.{n}": d for n, d in evals.items()}}.items():
        fit_prompts(prompts, tokenizer, room, where)


def cmd_plan(args) -> None:
    from medrecipes.config.library_checks import warmup_note
    from medrecipes.plan.summary import format_plan, plan

    method = method_of(args.recipe, args.method)
    recipe, training_args, model_args = parse_recipe_file(args.recipe, method, args.overrides)
    result = plan(
        recipe,
        training_args,
        model_args,
        args.recipe,
        args.num_gpus,
        args.gpu,
        args.dataset_sequences,
        args.prompt_tokens,
    )
    print(json.dumps(result, indent=2) if args.json else format_plan(result))
    steps = result["total_steps"]  # a run of max_steps was told at parse; one of epochs is told here
    if steps and training_args.max_steps <= 0 and (note := warmup_note(training_args, steps)):
        print(f"warning: {args.recipe}: {note}", file=sys.stderr)
    if training_args.use_cpu:  # the plan is of GPUs, which this recipe would leave idle
        print(f"warning: {args.recipe} has use_cpu: true, so it trains on CPUs, not on the {args.num_gpus} x "
              f"{args.gpu} planned; set use_cpu: false for the run this plans", file=sys.stderr)  # fmt: skip


def cmd_preview(args) -> None:
    from medrecipes.logs import setup_logging
    from medrecipes.preview import preview

    setup_logging()
    method = method_of(args.recipe, args.method)
    print(preview(method, *parse_recipe_file(args.recipe, method, args.overrides), count=args.examples))


def cmd_launch_plan(args) -> None:
    import shlex

    from medrecipes.plan.launch import launch_plan

    recipe, training_args, model_args = parse_recipe_file(
        args.recipe, method_of(args.recipe, args.method), args.overrides
    )
    # The accelerate config's processes a machine, unless --gpus-per-node says otherwise (node.sh passes the plan's).
    per_node, said = args.gpus_per_node or 8, None
    if args.accelerate_config:
        from medrecipes.plan.launch import check_accelerate_config

        config = check_accelerate_config(args.accelerate_config)
        machines = max(int(config.get("num_machines") or 1), 1)
        theirs = int(config.get("num_processes") or 1) // machines or 1
        if args.gpus_per_node is None:
            per_node = theirs
        elif args.gpus_per_node != theirs:
            said = (
                f"# note: {args.accelerate_config} starts {theirs} process{'es' if theirs > 1 else ''} a machine, and "
                f"--gpus-per-node {args.gpus_per_node} replaces it (the launch passes NUM_PROCESSES); give one of them"
            )
    values = launch_plan(recipe, training_args, args.recipe, args.nodes, per_node)
    values["MODEL"] = model_args.model_name_or_path or ""
    for key, value in values.items():
        print(f"{key}={shlex.quote(str(value))}")
    # Notes on stderr: stdout is read by the launch script as shell assignments.
    if said:
        print(said, file=sys.stderr)
    if training_args.use_cpu:
        print(
            f"# note: {args.recipe} has use_cpu: true, so its {values['NUM_PROCESSES']} processes would train on CPUs "
            "and leave the GPUs idle; set use_cpu: false to train on them",
            file=sys.stderr,
        )


def cmd_build_data(args) -> None:
    from medrecipes.data.build import build_data
    from medrecipes.data.decontamination import format_report

    method_of(
        args.recipe,
        None,
        ("cpt",),
        " (the token blocks of pretraining; the other methods build their data as they start)",
    )
    recipe, training_args, model_args = parse_recipe_file(args.recipe, "cpt", args.overrides)
    if args.num_gpus > 1 and not recipe.mixture.streaming:
        checked = ", its token budget only checked to divide over them" if recipe.global_batch_tokens else ""
        print(f"warning: build-data --num-gpus {args.num_gpus} sets the blocks a streamed build holds, and "
              f"{args.recipe} does not stream: the build is the same for any number of processes{checked}",
              file=sys.stderr)  # fmt: skip
    manifest, built = build_data(recipe, training_args, model_args, args.recipe, args.out, args.num_gpus, args.force)
    out = args.out or recipe.built_data
    shares = ", ".join(f"{name} {n:,}" for name, n in manifest["tokens_per_source"].items())
    print(f"{out}: {'built' if built else 'up to date, not rebuilt'}: {manifest['train']['blocks']:,} training blocks")
    print(f"tokens per source: {shares}")
    if manifest["decontamination"]:
        print(format_report(manifest["decontamination"]))
