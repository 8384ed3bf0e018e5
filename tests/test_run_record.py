"""What a run leaves behind: monitoring in its logs, a mirror of its checkpoints, and on a
(local stand-in) Hub its model with a card that records how it was made."""

import json
import math
import os
import re

import pytest
import yaml
from checks.hub_standin import HubStandIn
from conftest import PYTHON, ROOT, card_record, log_history, run
from huggingface_hub import ModelCard
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from medrecipes.mirror import COMPLETE
from medrecipes.plan.shape import flops_per_token, model_shape

# A run pushed end to end with its checkpoints and card: make test-long.
pytestmark = [pytest.mark.slow, pytest.mark.long]

SECRET = "hf_standinSecretToken0123456789"
PRICE, PEAK = 2.5, 0.5


@pytest.fixture(scope="module")
def pushed_run(tiny_model, tmp_path_factory):
    import subprocess

    tmp = tmp_path_factory.mktemp("record")
    out, mirror = tmp / "run", tmp / "mirror"
    with HubStandIn() as hub:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "HF_ENDPOINT": hub.url,
            "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        args = [
            "recipes/tiny_cpt.yaml",
            *("--model_name_or_path", tiny_model, "--output_dir", out),
            *("--max_steps", "8", "--save_steps", "4", "--eval_steps", "4", "--logging_steps", "2"),
            *("--push_to_hub", "true", "--hub_model_id", "med/tiny-cpt", "--hub_token", SECRET),
            *("--push_checkpoint_revisions", "true", "--checkpoint_mirror_url", f"file://{mirror}"),
            *("--gpu_hour_price", str(PRICE), "--peak_tflops", str(PEAK)),
            *("--eval_tasks", "usmle", "--eval_tasks_limit", "8"),
        ]
        result = subprocess.run(
            [PYTHON, "recipes/cpt.py", *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True
        )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, mirror, hub, result


def train_logs(out) -> list[dict]:
    return [e for e in log_history(out) if "loss" in e and "learning_rate" in e]


def test_training_logs_carry_throughput_mfu_time_and_cost(pushed_run, tiny_model):
    from transformers import AutoConfig

    out, _, _, result = pushed_run
    logs = train_logs(out)
    assert [e["step"] for e in logs] == [2, 4, 6, 8]
    shape = model_shape(AutoConfig.from_pretrained(tiny_model))
    for entry in logs:
        assert entry["num_input_tokens_seen"] == entry["step"] * 8 * 128
        assert entry["tokens_per_second"] > 0 and math.isfinite(entry["grad_norm"])
        # MFU is the FLOPs of those tokens per second over the peak: 128-token packed blocks.
        expected = entry["tokens_per_second"] * flops_per_token(shape, 128) / (PEAK * 1e12)
        assert entry["mfu"] == pytest.approx(expected, rel=1e-6)
        assert entry["cost_remaining"] == pytest.approx(entry["eta_hours"] * PRICE)
        assert entry["cost_so_far"] == pytest.approx(entry["elapsed_hours"] * PRICE)
    assert logs[-1]["eta_hours"] == 0 and logs[0]["eta_hours"] > 0
    assert "tok/s | MFU" in result.stdout
    events = EventAccumulator(str(next((out / "runs").iterdir()))).Reload()
    assert {"train/mfu", "train/tokens_per_second", "train/cost_remaining"} <= set(events.Tags()["scalars"])


def test_each_checkpoint_is_mirrored_whole(pushed_run):
    out, mirror, _, _ = pushed_run
    assert sorted(p.name for p in mirror.iterdir()) == ["checkpoint-4", "checkpoint-8"]
    for copy in mirror.iterdir():
        assert (copy / COMPLETE).is_file() and (copy / "optimizer.pt").is_file()
    local = out / "checkpoint-8"
    for file in local.iterdir():
        assert (mirror / "checkpoint-8" / file.name).read_bytes() == file.read_bytes(), file.name
    assert not (out / "_snapshots").exists() or not any((out / "_snapshots").iterdir())


def test_each_checkpoint_has_its_weights_on_a_branch(pushed_run):
    _, _, hub, _ = pushed_run
    revisions = hub.repos["med/tiny-cpt"]
    for branch in ("checkpoint-4", "checkpoint-8"):
        assert "model.safetensors" in revisions[branch] and "config.json" in revisions[branch]
        assert "optimizer.pt" not in revisions[branch]


def test_model_card_is_a_record_of_the_run(pushed_run, tiny_model):
    out, _, hub, result = pushed_run
    main = hub.repos["med/tiny-cpt"]["main"]
    assert "model.safetensors" in main and "recipe.yaml" in main
    text = main["README.md"].decode()
    card = ModelCard(text)
    assert {"medrecipes", "cpt", "medical"} <= set(card.data.tags)
    assert f"CPT of `{tiny_model}`" in text
    # Data sources with their share of the mixture and a content hash as revision.
    assert "| `json` |  | train | data/medical_text/train.jsonl | sha256:" in text and "| 80.0% | text |" in text
    assert "data/usmle_sample/train.jsonl" in text and "| 20.0% | usmle |" in text
    assert "No decontamination result was recorded for this run" in text
    assert "| medical_text_loss |" in text and "| usmle_perplexity |" in text
    assert "| optimizer steps | 8 |" in text and "| tokens seen | 8,192 |" in text
    assert "on 1 x CPU, 1 node, one process." in text and "python recipes/cpt.py recipe.yaml" in text
    assert "learning_rate: 0.003" in text and "push_checkpoint_revisions: true" in text
    assert "recipes/cpt.py recipes/tiny_cpt.yaml" in text
    # The token authenticated every request and appears nowhere in what was pushed or printed.
    assert {auth for _, _, auth in hub.requests} == {f"Bearer {SECRET}"}
    pushed = [content for revision in hub.repos["med/tiny-cpt"].values() for content in revision.values()]
    for content in [*pushed, result.stdout.encode(), result.stderr.encode()]:
        assert SECRET.encode() not in content
    assert not hub.unknown


def test_model_card_has_the_sections_of_a_medical_release(pushed_run):
    _, _, hub, _ = pushed_run
    main = hub.repos["med/tiny-cpt"]["main"]
    text = main["README.md"].decode()
    for heading in (
        "## Intended use",
        "## Out-of-scope use",
        "### What these results do not say",
        "## Limitations and biases",
    ):
        assert heading in text, heading
    flat = " ".join(text.split())  # the card's paragraphs are wrapped
    assert "not medical advice" in flat and "Clinical decision making" in flat
    assert "is not clinical competence" in flat and "was not checked against the evaluation sets" in flat
    splits = "json train (data/medical_text/train.jsonl); json train (data/usmle_sample/train.jsonl)"
    assert f"Splits trained on: {splits}" in flat
    # The multiple-choice result with its interval, in the text and as model-index metadata.
    row = next(line for line in text.splitlines() if line.startswith("| usmle | loglik | 8 |"))
    f1 = r"\d\.\d{3} \(\d\.\d{3}-\d\.\d{3}\)"  # macro-F1 with its interval
    assert re.fullmatch(rf"\| usmle \| loglik \| 8 \| \d+\.\d% \| \d+\.\d%-\d+\.\d% \| {f1} \|", row), row
    metadata = yaml.safe_load(text.split("---")[1])
    (entry,) = metadata["model-index"]
    (result,) = entry["results"]
    assert result["task"]["type"] == "multiple-choice" and result["dataset"]["name"] == "usmle"
    (metric,) = result["metrics"]
    assert metric["type"] == "accuracy" and 0 <= metric["value"] <= 1
    assert f"{metric['value']:.1%}" in row
    # The run's plots, in the repository and shown in the card.
    images = re.findall(r"!\[[^\]]+\]\((images/[a-z]+\.png)\)", text)
    assert {"images/loss.png", "images/accuracy.png"} <= set(images)
    for path in images:
        assert main[path].startswith(b"\x89PNG") and len(main[path]) > 5000, path


def test_pushed_recipe_runs_the_same_settings_again(pushed_run, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from medrecipes.config import parse_recipe, resolved_recipe

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # rerun where the Hub is reachable: it pushes too
    monkeypatch.setenv("HF_TOKEN", "hf_user")  # and knows the token (the stand-in is gone by now)
    monkeypatch.setattr("huggingface_hub.HfApi.whoami", lambda self, token=None: {"name": "user"})

    _, _, hub, _ = pushed_run
    text = hub.repos["med/tiny-cpt"]["main"]["recipe.yaml"].decode()
    assert "hub_token" not in text
    (tmp_path / "recipe.yaml").write_text(text)
    parsed = parse_recipe("cpt", [str(tmp_path / "recipe.yaml")])
    assert parsed[1].max_steps == 8 and parsed[1].learning_rate == 0.003 and parsed[0].checkpoint_mirror_url
    recipe, args, model_args = parsed
    assert yaml.safe_load(text) == resolved_recipe(recipe, model_args, args)


PQAL = {
    str(i): {"QUESTION": f"Does treatment {i} work?", "CONTEXTS": ["A trial."], "LONG_ANSWER": f"Treatment {i} worked.",
             "final_decision": ("yes", "no", "maybe")[i % 3]}
    for i in range(6)
}  # fmt: skip


def test_a_card_made_after_training_has_the_later_evaluations(pushed_run, tmp_path):
    """`medrecipes card`: the card a push writes, for a run evaluated after it finished (here on
    PubMedQA in its reasoning-free setting, named as such), made from the run's folder alone."""

    from conftest import run_ok

    out, _, hub, _ = pushed_run
    record = json.loads((out / "run.json").read_text())
    assert record["finished"]["hardware"] == "1 x CPU, 1 node, one process"
    assert (
        record["command"].startswith("python recipes/cpt.py recipes/tiny_cpt.yaml") and SECRET not in record["command"]
    )
    assert "--hub_token <redacted>" in record["command"]
    questions = tmp_path / "ori_pqal.json"
    questions.write_text(json.dumps(PQAL))
    evaluation = tmp_path / "eval.json"
    run_ok(PYTHON, "-m", "medrecipes.cli", "eval", "--model", out / "final", "--tasks", "pubmedqa",
           "--data", f"pubmedqa={questions}", "--pubmedqa_setting", "reasoning_free", "--output", evaluation)  # fmt: skip
    card = tmp_path / "card"
    run_ok(
        PYTHON,
        "-m",
        "medrecipes.cli",
        "card",
        out,
        evaluation,
        "--output",
        card,
        "--repo-id",
        "med/tiny-cpt",
    )
    text = (card / "README.md").read_text()
    pushed = hub.repos["med/tiny-cpt"]["main"]["README.md"].decode()
    report = json.loads(evaluation.read_text())["tasks"]["pubmedqa"]
    row = next(
        line
        for line in text.splitlines()
        if line.startswith("| pubmedqa (reasoning_free) (ori_pqal.json) | loglik | 6 |")
    )
    assert f"| {report['accuracy']:.1%} |" in row
    assert not any(line.startswith("| pubmedqa |") for line in text.splitlines())  # never the standard score
    # The rest is the pushed card's: the run's own evaluation, data, hardware, command and plots.
    usmle = next(line for line in pushed.splitlines() if line.startswith("| usmle | loglik | 8 |"))
    assert usmle in text
    assert "on 1 x CPU, 1 node, one process." in text and "python recipes/cpt.py recipe.yaml" in text
    assert "recipes/cpt.py recipes/tiny_cpt.yaml" in text and SECRET not in text
    for line in ("| optimizer steps | 8 |", "| tokens seen | 8,192 |", "| 80.0% | text |"):
        assert line in text and line in pushed
    assert {"loss.png", "accuracy.png"} <= {p.name for p in (card / "images").iterdir()}
    assert (card / "recipe.yaml").read_text() == hub.repos["med/tiny-cpt"]["main"]["recipe.yaml"].decode()
    # Made again only with --overwrite; a file that is not an eval output is one line.
    again = run(PYTHON, "-m", "medrecipes.cli", "card", out, "--output", card)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    bad = run(PYTHON, "-m", "medrecipes.cli", "card", out, out / "run.json", "--output", tmp_path / "c2")
    assert bad.returncode == 2 and "not a `medrecipes eval --output` file" in bad.stderr
    assert not (tmp_path / "c2").exists()


def test_a_benchmarks_name_on_the_card_names_the_local_file_it_was_scored_on(tmp_path):
    """`eval --data mine.jsonl` scores a user's file under the default task's name (medqa_4opt): the
    card says which file, where a reader would take the name for the benchmark's own questions."""
    from medrecipes.hub.card import mcq_results, task_label

    mine = tmp_path / "mine.jsonl"
    mine.write_text("{}\n")
    report = {"source": str(mine), "n": 2, "accuracy": 0.5, "mode": "loglik"}
    assert task_label("medqa_4opt", report) == "medqa_4opt (mine.jsonl)"
    assert task_label("pubmedqa (reasoning_free)", report) == "pubmedqa (reasoning_free) (mine.jsonl)"
    assert task_label("usmle", report) == "usmle"  # a name of the user's own claims no benchmark
    hub = {**report, "source": "GBaker/MedQA-USMLE-4-options-hf"}
    assert task_label("medqa_4opt", hub) == "medqa_4opt"
    (result,) = mcq_results({"medqa_4opt": report})
    assert (result.dataset_name, result.dataset_type) == ("medqa_4opt (mine.jsonl)", "medqa_4opt (mine.jsonl)")


def test_a_score_on_the_runs_own_training_data_is_said_and_kept_out_of_the_hubs_results(tmp_path):
    """An evaluation of the file the run trained on (or a copy of it) measures how well it learnt
    that file: its table row says so, and the card's model-index, which the Hub shows as the
    model's results, leaves it out. A held-out file is a result."""
    import shutil

    from medrecipes.config import parse_recipe
    from medrecipes.hub.card import model_card

    record = card_record("sft", parse_recipe("sft", ["recipes/tiny_sft.yaml"]), "1 CPU", "python recipes/sft.py")
    copy = shutil.copy("data/usmle_sample/train.jsonl", tmp_path / "copy.jsonl")
    reports = {
        name: {"source": source, "n": 60, "accuracy": 0.9, "ci95": [0.8, 0.95], "mode": "loglik"}
        for name, source in (("seen", "data/usmle_sample/train.jsonl"), ("copied", str(copy)),
                             ("held_out", "data/usmle_sample/test.jsonl"))
    }  # fmt: skip
    summary = {"steps": 1, "tokens_seen": 1024, "training_time": "0:30:00", "final_train_loss": 2.0}
    card = model_card("med/x", record, summary, {}, reports)
    assert [r.dataset_name for r in card.data.eval_results] == ["held_out"]
    for name in ("seen", "copied"):
        assert f"| {name} (its training data: not held out) | loglik | 60 |" in str(card)
    assert "| held_out | loglik | 60 |" in str(card)


def test_decontamination_result_goes_into_the_card():
    from medrecipes.config import parse_recipe
    from medrecipes.hub.card import model_card

    record = card_record(
        "cpt",
        parse_recipe("cpt", ["recipes/tiny_cpt.yaml"]),
        "8 x NVIDIA H100 80GB HBM3, 1 node, DeepSpeed ZeRO-3",
        "python recipes/cpt.py recipes/tiny_cpt.yaml",
    )
    record["card"]["decontamination"] = "- medqa_us_4opt_test: 3 of 1273 items found in the training data"
    summary = {"steps": 1, "tokens_seen": 1024, "training_time": "0:30:00", "final_train_loss": 2.0}
    text = str(model_card("med/x", record, summary, {"eval_medical_text_loss": 2.5}))
    assert "- medqa_us_4opt_test: 3 of 1273 items found in the training data" in text
    assert "| training time | 0:30:00 |" in text and "8 x NVIDIA H100 80GB HBM3, 1 node, DeepSpeed ZeRO-3" in text
    assert "| medical_text_loss | 2.5 |" in text


def test_a_card_takes_evaluations_of_the_runs_own_weights_only(tmp_path):
    """An eval file names the weights it scored by their fingerprint: one of final/'s weights, under
    any path (a copy), goes in the card; another model's is one line; an eval file from before
    fingerprints counts only when it names final/ itself."""
    import shutil

    from medrecipes.errors import UserError
    from medrecipes.hub.card import _check_scored_model
    from medrecipes.locations import weights_fingerprint

    final, other = tmp_path / "run" / "final", tmp_path / "other"
    for folder, weights in ((final, b"the run's weights"), (other, b"another model's")):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(weights)
    copy = shutil.copytree(final, tmp_path / "copy")

    def eval_file(model, fingerprint) -> str:
        path = tmp_path / f"eval-{abs(hash((str(model), fingerprint)))}.json"
        path.write_text(json.dumps({"tasks": {}, "settings": {"model": str(model), "model_fingerprint": fingerprint}}))
        return str(path)

    assert weights_fingerprint(str(copy)) == weights_fingerprint(str(final)) != weights_fingerprint(str(other))
    _check_scored_model(eval_file(copy, weights_fingerprint(str(copy))), str(final))
    _check_scored_model(eval_file(final, None), str(final))
    for model, fingerprint in ((other, weights_fingerprint(str(other))), (other, None), (final, "sha256:0")):
        with pytest.raises(UserError, match=rf"it evaluated {model} .*not this run's model {final}"):
            _check_scored_model(eval_file(model, fingerprint), str(final))
