"""Does Gemma 3 270M get better at a real medical task, and does it hold across seeds? PubMedQA in
both its settings, every stage trained with several seeds (data order and sampling) and evaluated
on the same 150 dev questions, beside the base model and the always-yes baseline.

Usage:

    make real-check-learning                   # installs the model folder, then runs this
    python benchmarks/real_learning_gemma.py [--out outputs/real-check-gemma3-270m] [--part free|required|all]
        [--seeds 1,2,3] [--ablation balance passes long-balance] [--stop-after sft] [--report-only]

It grows `make real-check MODEL=gemma3-270m` (benchmarks/real_check_gemma.py) in the same folder:
the same seeded train/dev split, and for the reasoning-required part that check's CPT model and
its answer-only SFT. Of the 350 training questions, 50 (stratified by label, seeded) are set aside
as validation questions (data/pubmedqa_val.json; the other 300 are data/pubmedqa_fit.json): the
SFT recipes score them in generate mode at every epoch (their `eval_sets`) and keep the checkpoint
with the best validation accuracy (`load_best_model_at_end`, `metric_for_best_model`). Dev is
evaluated once per trained model, at the end, and chooses nothing. Each stage leaves its result
in --out and is skipped when that result is there, so a stopped run resumes at the stage it was
in (a training stage only where its run trained with what its seeded recipe gives now: else the
check stops in one line naming the difference); out/seconds.json keeps each stage's wall time.

Per seed S (each run's folder and evaluation carry -sS; a recipe's folders are rewritten to seed
S's in out/recipes/):
  reasoning-free (the conclusion given; `pubmedqa_setting: reasoning_free`)
    sft-free       recipes/gemma3_270m_sft_pubmedqa_free.yaml (full fine-tuning), --seed S
    pairs-gold-free, dpo-free  recipes/gemma3_270m_dpo_pubmedqa_free.yaml from seed S's SFT model, on
                   gold pairs (each train question's answer against a wrong one drawn with seed S)
    pairs-free, dpo-own-free, dpo-gold-high-lr-free  the same DPO recipe on pairs of the SFT model's
                   own sampled answers, and on gold pairs, each at 4 times its learning rate
                   (DPO_RUNS); each DPO model is scored on the validation questions, then on dev
    grpo-free      recipes/gemma3_270m_grpo_pubmedqa_free.yaml, from seed S's SFT model
                   (every seed's DPO first, the cheaper stage, then every seed's GRPO)
  reasoning-required (the abstract; PubMedQA's standard setting), from the real check's CPT model
    sft-long       recipes/gemma3_270m_sft_pubmedqa_long.yaml: the conclusion, then the answer
and once: eval-base-free (log-likelihood of " yes"/" no"/" maybe"), the real check's cpt and
answer-only sft. `--ablation balance` also trains each seed's reasoning-free SFT with
`balance_answers` switched from the recipe's setting (sft-free-flip-sS), `--ablation passes` with
3 passes where the recipe trains 4, or 4 where it trains 3 (sft-free-passes-sS), for the validation
accuracy the two settings reach on the same seeds (what chooses the recipe's setting), then
evaluates each switched run on dev once, as the recipe's runs are (not with --stop-after sft).
`--ablation long-balance` (with --part required or all) trains each seed's long-answer SFT with
`balance_answers` switched (sft-long-flip-sS; balanced for one pass, as many rows as about two
unbalanced ones), each evaluated on dev after its run. The report
gives every ablation whose runs are there.

On a GPU (`--device gpu`, run by `benchmarks/gpu_session.sh learn`; seed 1 unless --seeds): bf16,
trained far past what a CPU allows (GPU_STAGES), every stage a LoRA adapter (merged for
evaluation) so that what was trained comes back from the GPU machine; no DPO. Report:
real_learning_gemma3_270m_gpu.json and .md.

The report (benchmarks/results/real_learning_gemma3_270m.json and .md, `checks.learning_report`):
each seed's figures with their 95% intervals and the checkpoint its run kept, each stage's mean,
worst seed and spread, every claim's paired difference seed by seed, the targets, the wall times.
"""

import argparse
import json
import sys
from pathlib import Path

import yaml
from checks.ablations import ABLATIONS, SFT_ALL, WHAT, ablation_markdown, ablations, pair_sources, switches
from checks.learning_markdown import markdown
from checks.learning_recipes import (
    DPO_RUNS,
    FOLDERS,
    GPU_STAGES,
    LABELS,
    LONG_ANSWERS,
    PAIRS,
    RATIONALE,
    RECIPES,
    SETTINGS,
    VALIDATION,
)
from checks.learning_report import eval_file, summarise
from checks.stages import RESULTS, evaluated, medrecipes, prepare, run, stage_runner, write_results
from real_check_gemma import DEFAULT_OUT, GEMMA, PUBMEDQA, stage_data
from real_check_gemma import RECIPES as CHECK_RECIPES


def stage_validation(out: Path, size: int, seed: int) -> None:
    """`size` of the training questions set aside as validation questions, in the proportions of
    their labels (scikit-learn's stratified split, seeded): data/pubmedqa_val.json, and the rest,
    data/pubmedqa_fit.json, that the recipes train on. Dev is never drawn from."""
    from sklearn.model_selection import train_test_split

    data = out / "data"
    rows = json.loads((data / "pubmedqa_train.json").read_text(encoding="utf-8"))
    ids = sorted(rows)
    fit, validation = train_test_split(
        ids, test_size=size, random_state=seed, stratify=[rows[i]["final_decision"] for i in ids]
    )
    dev = set(json.loads((data / "pubmedqa_dev.json").read_text(encoding="utf-8")))
    if dev & set(validation):
        raise SystemExit("real check: validation questions drawn from dev")
    (data / "pubmedqa_fit.json").write_text(json.dumps({i: rows[i] for i in sorted(fit)}), encoding="utf-8")
    (data / "pubmedqa_val.json").write_text(json.dumps({i: rows[i] for i in sorted(validation)}), encoding="utf-8")
    split = json.loads((data / "split.json").read_text())
    split["labels"]["validation"] = {
        d: sum(rows[i]["final_decision"] == d for i in validation) for d in LABELS.values()
    }
    split["validation"] = {"of": "train", "questions": size, "seed": seed, "stratified_by": "final_decision"}
    (data / "split.json").write_text(json.dumps(split, indent=1))


def seeded_recipe(out: Path, name: str, seed: int, recipe: str | None = None, **changes) -> str:
    """The recipe of stage `name` for seed `seed`, written to out/recipes/<its run folder>.yaml: its folders in the
    check's folder (outputs/real-check-gemma3-270m/<folder>/) those of the seed (<folder>-s<seed>/),
    its `seed` the seed, and `changes` to its top-level keys (`dataset_mixture_source` for the
    training source's keys, None taking a key out)."""
    data = yaml.safe_load(Path(recipe or RECIPES[name]).read_text())
    text = json.dumps(data)
    for folder in FOLDERS:
        text = text.replace(f"{DEFAULT_OUT}/{folder}/", f"{out}/{folder}-s{seed}/")
        text = text.replace(f'"{DEFAULT_OUT}/{folder}"', f'"{out}/{folder}-s{seed}"')
    data = json.loads(text.replace(f"{DEFAULT_OUT}/", f"{out}/"))  # the check's other folders (data, cpt)
    source = data["dataset_mixture"]["sources"][0]
    for key, value in changes.pop("dataset_mixture_source", {}).items():
        source.pop(key) if value is None else source.update({key: value})
    data.update(seed=seed, **changes)
    path = out / "recipes" / f"{Path(data['output_dir']).name}.yaml"  # one file per run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def evaluate(
    out: Path, model: Path, stage: str, setting: str, mode: str, seed: int | None, *extra: str, questions: str = "dev"
) -> Path:
    """`medrecipes eval` of `model` on the dev questions (or `questions="val"`, the validation ones) in
    `setting`: out/eval/<stage>[-sS]-pubmedqa-<mode>.json."""
    result, data = eval_file(out, stage, mode, seed), out / "data" / f"pubmedqa_{questions}.json"
    evaluated(result, model, "--tasks", "pubmedqa", "--data", f"pubmedqa={data}", "--pubmedqa_setting", setting,
              "--mode", mode, "--batch_size", "4", *extra)  # fmt: skip
    return result


def adapter_run(script: str, recipe: str, run_dir: Path, merged: Path, *overrides: str) -> None:
    """A LoRA recipe run as a user runs it (with `overrides` of its keys), its adapter then merged
    into `merged` for evaluation."""
    run(sys.executable, f"recipes/{script}.py", recipe, *overrides)
    medrecipes("merge-lora", str(run_dir / "final"), str(merged))


def pairs(out: Path, path: Path, seed: int, samples: int | None) -> None:
    """Right-against-wrong pairs of the train questions into `path`: of seed `seed`'s SFT model's own
    `samples` sampled answers to each, or where `samples` is None, the gold answer against a wrong
    one drawn with `seed` (pairs that do not depend on what the SFT model already answers right)."""
    own = ["--model", str(out / f"sft-free-s{seed}" / "final"), "--samples", str(samples)] if samples else []
    medrecipes(
        "pairs", "--mcq", str(out / "data" / "pubmedqa_fit.json"), "--pubmedqa-setting", "reasoning_free",
        *own, "--seed", str(seed), "--out", str(path),
    )  # fmt: skip


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--part", choices=["free", "required", "all"], default="all")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu", help="gpu: GPU_STAGES, LoRA, no DPO")
    parser.add_argument("--seeds", help="comma-separated training seeds (default 1,2,3; on a GPU 1)")
    parser.add_argument(
        "--ablation", nargs="+", choices=list(ABLATIONS), default=[],
        help="each seed's SFT again with one setting switched: balance_answers (balance), 3 or 4 passes (passes); "
        "the long-answer SFT's balance_answers (long-balance)",
    )  # fmt: skip
    parser.add_argument(
        "--stop-after", choices=["sft"], help="sft: the reasoning-free SFT runs only, not evaluated on dev yet"
    )
    parser.add_argument(
        "--rationale", action="store_true", help="each seed's reasoning-free GRPO with room to reason too"
    )
    parser.add_argument("--report-only", action="store_true", help="the report of what is there, no stage run")
    parser.add_argument(
        "--samples", type=int, default=8, help="answers sampled per question for the pass rate (GRPO's group size)"
    )
    parser.add_argument("--seed", type=int, default=42, help="the train/dev/validation split's seed")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in (args.seeds or ("1" if args.device == "gpu" else "1,2,3")).split(",")]
    out = prepare(args.out, (PUBMEDQA, GEMMA / "config.json"))
    stage, seconds = stage_runner(out)
    name = "real_learning_gemma3_270m" + ("_gpu" if args.device == "gpu" else "")
    if not args.report_only:
        stage("data", out / "data" / "split.json", lambda: stage_data(out, 150, 300, args.seed))
        stage("validation", out / "data" / "pubmedqa_val.json", lambda: stage_validation(out, VALIDATION, args.seed))
        if args.device == "gpu":
            gpu_stages(out, stage, args.part, seeds)
        else:
            cpu_stages(out, stage, args, seeds)
    report = summarise(out, seconds, seeds, device_name())
    if found := ablations(out, seeds):
        report["ablation"] = found
    if found := pair_sources(out, seeds):
        report["dpo_pairs"] = found
    tables = "".join(
        ablation_markdown(arms, WHAT[ABLATIONS[name].stage]) for name, arms in report.get("ablation", {}).items()
    )
    tables += ablation_markdown(report.get("dpo_pairs"), "reasoning-free DPO from SFT: validation accuracy")
    write_results(name, report, markdown(report) + tables)
    report_page(out, name, seeds)
    cards(out, name, seeds)
    return report


def run_folders(out: Path, seeds: list[int]) -> list[Path]:
    """The training runs of the check that are there, seed by seed."""
    switched = [switch.folder for switch in ABLATIONS.values()]
    stages = ("sft-free", *switched, "grpo-free", *(run[0] for run in DPO_RUNS), "sft-long", "grpo-long")
    return [out / f"{stage}-s{seed}" for stage in stages for seed in seeds if (out / f"{stage}-s{seed}").is_dir()]


def report_page(out: Path, name: str, seeds: list[int]) -> None:
    """`medrecipes report` of the stages' runs and every evaluation in the folder, as
    benchmarks/results/<name>_report.html: the training curves beside the figures above."""
    page = out / f"{name}_report.html"
    medrecipes("report", *map(str, run_folders(out, seeds)), str(out / "eval"), "--output", str(page), "--overwrite",
               "--title", "Gemma 3 270M learns PubMedQA: both settings, seed by seed")  # fmt: skip
    (RESULTS / page.name).write_bytes(page.read_bytes())


def cards(out: Path, name: str, seeds: list[int]) -> list[Path]:
    """`medrecipes card` of each finished run with its dev evaluation, as a push would write it,
    into out/cards/<run>/; each card's text also as benchmarks/results/<name>_cards/<run>.md (its
    plots are the report page's). A LoRA run's (DPO, the long-answer SFT) dev evaluation is of its
    merge-lora output, which names the adapter it folded in."""
    written = []
    for folder in run_folders(out, seeds):
        evaluation = out / "eval" / f"{folder.name}-pubmedqa-generate.json"
        if (folder / "final").is_dir() and evaluation.exists():
            card = out / "cards" / folder.name
            medrecipes("card", str(folder), str(evaluation), "--output", str(card), "--overwrite",
                       "--repo-id", f"gemma3-270m-pubmedqa-{folder.name}")  # fmt: skip
            copy = RESULTS / f"{name}_cards" / f"{folder.name}.md"
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text((card / "README.md").read_text())
            written.append(copy)
    return written


def cpu_stages(out: Path, stage, args, seeds: list[int]) -> None:
    free, required = SETTINGS["free"], SETTINGS["required"]

    def trained(name: str, done: Path, method: str, recipe: str) -> None:
        """A stage that runs recipes/<method>.py on `recipe`, checked against it once done."""
        stage(name, done, lambda: run(sys.executable, f"recipes/{method}.py", recipe), (method, recipe))

    if args.part in ("free", "all"):
        stage("eval-base-free", eval_file(out, "base-free", "loglik"),
              lambda: evaluate(out, GEMMA, "base-free", free, "loglik", None))  # fmt: skip
        for s in seeds:
            trained(f"sft-free-s{s}", out / f"sft-free-s{s}" / "final", "sft", seeded_recipe(out, "sft-free", s))
        for switch in switches(args.ablation, "sft-free"):  # the same seeds with one setting switched
            for s in seeds:
                recipe, run_dir = seeded_recipe(out, "sft-free", s, **switch.switched(out, s)), f"{switch.folder}-s{s}"
                trained(run_dir, out / run_dir / "final", "sft", recipe)
        if args.stop_after == "sft":
            return
        for folder in (switch.folder for switch in switches(args.ablation, "sft-free")):  # dev once for each
            for s in seeds:
                switched = out / f"{folder}-s{s}" / "final"
                stage(f"eval-{folder}-s{s}", eval_file(out, folder, "generate", s),
                      lambda s=s, folder=folder, switched=switched: evaluate(out, switched, folder, free, "generate", s))  # fmt: skip
        for s in seeds:  # the pipeline a user runs, seed by seed: SFT on its part, then RL on the other
            pipeline(out, stage, trained, s, args.samples, args.rationale)
            # Beside it, the SFT recipe on every training question: is RL worth it, or SFT on everything?
            everything, run_dir = seeded_recipe(out, "sft-free", s, **SFT_ALL.switched(out, s)), f"sft-all-free-s{s}"
            trained(run_dir, out / run_dir / "final", "sft", everything)
            stage(f"eval-sft-all-free-s{s}", eval_file(out, "sft-all-free", "generate", s),
                  lambda s=s, run_dir=run_dir: evaluate(out, out / run_dir / "final", "sft-all-free", free, "generate", s))  # fmt: skip
    if args.part in ("required", "all"):
        # The real check's CPT model, where that check has not made it yet; the long-answer SFT first,
        # the stage this part is for, then the answer-only SFT it is compared with.
        cpt, answer_only = out / "cpt" / "final", out / "sft-merged"
        trained("cpt", cpt, "cpt", CHECK_RECIPES["cpt"])
        runs = [("sft-long", None)] + [(switch.folder, switch) for switch in switches(args.ablation, "sft-long")]
        for folder, switch in runs:  # the recipe's runs, then each ablation's (the same seeds, one setting switched)
            for s in seeds:
                changes = switch.switched(out, s) if switch else {}
                long, recipe = out / f"{folder}-s{s}-merged", seeded_recipe(out, "sft-long", s, **changes)
                stage(f"{folder}-s{s}", long, lambda s=s, folder=folder, long=long, recipe=recipe: adapter_run(
                    "sft", recipe, out / f"{folder}-s{s}", long), ("sft", recipe))  # fmt: skip
                stage(f"eval-{folder}-s{s}", eval_file(out, folder, "generate", s),
                      lambda s=s, folder=folder, long=long: evaluate(out, long, folder, required, "generate", s, *LONG_ANSWERS))  # fmt: skip
        for s in seeds:  # GRPO with room to reason from each seed's long-answer SFT, on the questions it did not see
            start = out / f"sft-long-s{s}-merged"
            rl_stage(out, stage, trained, "grpo-long", s, args.samples, LONG_ANSWERS, model_name_or_path=str(start))
        stage("sft", answer_only, lambda: adapter_run("sft", CHECK_RECIPES["sft"], out / "sft", answer_only),
              ("sft", CHECK_RECIPES["sft"]))  # fmt: skip
        stage("eval-sft-answer-only", eval_file(out, "sft", "generate"),
              lambda: evaluate(out, answer_only, "sft", required, "generate", None))  # fmt: skip


def pipeline(out: Path, stage, trained, s: int, samples: int, rationale: bool = False) -> None:
    """Seed `s`'s reasoning-free pipeline: its SFT (on the recipe's part) evaluated; that model's pass
    rate on the GRPO recipe's part (`medrecipes pass-rate`, `samples` answers a question); DPO on the
    gold pairs the pass rate keeps, scored on the validation questions, then dev; GRPO on the questions
    it keeps, its checkpoint chosen on validation, then dev; with `rationale`, GRPO with room to reason
    beside it, on the same questions as its own prompt's pass rate keeps them."""
    free = SETTINGS["free"]
    sft = out / f"sft-free-s{s}" / "final"
    stage(f"eval-sft-free-s{s}", eval_file(out, "sft-free", "loglik", s), lambda: (
        evaluate(out, sft, "sft-free", free, "generate", s), evaluate(out, sft, "sft-free", free, "loglik", s),
    ))  # fmt: skip
    # The GRPO recipe's pass rates (rl_stage measures them) are what DPO's filter reads too
    rates = out / f"pass-rate-free-s{s}" / "pass_rate.jsonl"
    grpo_recipe = seeded_recipe(out, "grpo-free", s)
    stage(rates.parent.name, rates, lambda: medrecipes(
        "pass-rate", grpo_recipe, "--samples", str(samples), "--seed", str(s)))  # fmt: skip
    for name, source, changes in DPO_RUNS:
        data, folder = out / f"{PAIRS[source]}-s{s}" / "pairs_train.jsonl", out / f"{name}-s{s}"
        stage(f"pairs{PAIRS[source].removeprefix('preference')}-s{s}", data,
              lambda data=data, source=source: pairs(out, data, s, samples if source == "own" else None))  # fmt: skip
        recipe = seeded_recipe(out, "dpo-free", s, dataset_mixture_source={"path": str(data)},
                               output_dir=str(folder), **changes)  # fmt: skip
        dpo = folder / "merged"
        stage(f"{name}-s{s}", dpo, lambda folder=folder, dpo=dpo, recipe=recipe: adapter_run(
            "dpo", recipe, folder, dpo), ("dpo", recipe))  # fmt: skip
        # The validation questions first (what compares DPO runs), then dev once
        stage(f"eval-{name}-validation-s{s}", eval_file(out, f"{name}-validation", "generate", s),
              lambda name=name, dpo=dpo: evaluate(out, dpo, f"{name}-validation", free, "generate", s,
                                                   questions="val"))  # fmt: skip
        stage(f"eval-{name}-s{s}", eval_file(out, name, "generate", s),
              lambda name=name, dpo=dpo: evaluate(out, dpo, name, free, "generate", s))  # fmt: skip
    rl_stage(out, stage, trained, "grpo-free", s, samples)
    if rationale:
        rl_stage(out, stage, trained, "grpo-free-rationale", s, samples, RATIONALE)


def rl_stage(out: Path, stage, trained, name: str, s: int, samples: int, reading=(), **changes) -> None:
    """GRPO recipe `name` for seed `s` (with `changes` to its keys): its start model's pass rate on its
    questions with its own prompt, the run on those its filter keeps, and its dev evaluation (read
    with `reading`: how long an answer may be and where its letter is)."""
    recipe = seeded_recipe(out, name, s, **changes)
    rates = out / f"pass-rate-{name.removeprefix('grpo-')}-s{s}" / "pass_rate.jsonl"
    stage(
        rates.parent.name, rates, lambda: medrecipes("pass-rate", recipe, "--samples", str(samples), "--seed", str(s))
    )
    final = out / f"{name}-s{s}" / "final"
    trained(f"{name}-s{s}", final, "grpo", recipe)
    setting = yaml.safe_load(Path(recipe).read_text())["dataset_mixture"]["sources"][0].get("pubmedqa_setting")
    stage(
        f"eval-{name}-s{s}",
        eval_file(out, name, "generate", s),
        lambda: evaluate(out, final, name, setting or SETTINGS["required"], "generate", s, *reading),
    )


def gpu_stages(out: Path, stage, part: str, seeds: list[int]) -> None:
    """The GPU run's stages, seed by seed: each a LoRA run from the model before it, merged into
    <stage>-sS-merged for evaluation; the adapters stay in <stage>-sS/final."""

    def lora(name: str, script: str, start: Path, s: int) -> Path:
        recipe = RECIPES[name]
        merged, folder = out / f"{name}-s{s}-merged", out / f"{name}-s{s}"
        # The seed is the seeded recipe's; the start and the folder are the GPU run's own.
        overrides = ["--model_name_or_path", str(start), "--output_dir", str(folder), *GPU_STAGES[name]]
        seeded = seeded_recipe(out, name, s, recipe)
        if script == "grpo":  # the start model's pass rate on the recipe's questions, which its filter reads
            rates = out / f"pass-rate-{name.removeprefix('grpo-')}-s{s}" / "pass_rate.jsonl"
            stage(rates.parent.name, rates, lambda: medrecipes(
                "pass-rate", seeded, "--model_name_or_path", str(start), "--seed", str(s)))  # fmt: skip
        stage(f"{name}-s{s}", merged, lambda: adapter_run(script, seeded, folder, merged, *overrides),
              (script, seeded, *overrides))  # fmt: skip
        return merged

    free, required = SETTINGS["free"], SETTINGS["required"]
    for s in seeds:
        if part in ("free", "all"):
            stage("eval-base-free", eval_file(out, "base-free", "loglik"),
                  lambda: evaluate(out, GEMMA, "base-free", free, "loglik", None))  # fmt: skip
            sft = lora("sft-free", "sft", GEMMA, s)
            stage(f"eval-sft-free-s{s}", eval_file(out, "sft-free", "generate", s),
                  lambda s=s, sft=sft: evaluate(out, sft, "sft-free", free, "generate", s))  # fmt: skip
            grpo = lora("grpo-free", "grpo", sft, s)
            stage(f"eval-grpo-free-s{s}", eval_file(out, "grpo-free", "generate", s),
                  lambda s=s, grpo=grpo: evaluate(out, grpo, "grpo-free", free, "generate", s))  # fmt: skip
        if part in ("required", "all"):
            long = lora("sft-long", "sft", GEMMA, s)
            stage(f"eval-sft-long-s{s}", eval_file(out, "sft-long", "generate", s),
                  lambda s=s, long=long: evaluate(out, long, "sft-long", required, "generate", s, *LONG_ANSWERS))  # fmt: skip
            grpo = lora("grpo-long", "grpo", long, s)
            stage(f"eval-grpo-long-s{s}", eval_file(out, "grpo-long", "generate", s),
                  lambda s=s, grpo=grpo: evaluate(out, grpo, "grpo-long", required, "generate", s, *LONG_ANSWERS))  # fmt: skip


if __name__ == "__main__":
    main()
