"""A run's output_dir as one object, `RunFolder`: where each of its parts lies (final/, run.json,
the benchmark reports of its evaluations, its model card, the staging of its saves, its
checkpoints), what state it is in (the checkpoint it resumes from, whether it finished, the
trainer state a report reads) and starting over. The scripts, the trainers, the report, the card,
the push and the CLI ask it, so a part of the folder is named and a rule of its state decided in
this one place."""

import glob
import os
import re
import shutil
from dataclasses import dataclass

from medrecipes.outputs.checkpoints import CHECKPOINT, TRAINER_STATE, newest_complete_checkpoint
from medrecipes.outputs.records import STAGING
from medrecipes.runs.record import CARD, EVAL_TASKS, FINAL, RECORD, finished_entry, read_record
from medrecipes.runs.resume import resume_point

STEP_REPORT = re.compile(r"step-(\d+)\.json$")
# The trainer's metrics files at the folder's top (`Trainer.save_metrics`).
METRICS = ("all_results.json", "train_results.json", "eval_results.json")


@dataclass(frozen=True)
class RunFolder:
    path: str

    @property
    def final(self) -> str:
        """The finished model, written last (renamed into place whole)."""
        return os.path.join(self.path, FINAL)

    @property
    def record_file(self) -> str:
        return os.path.join(self.path, RECORD)

    @property
    def card(self) -> str:
        """The model card, written whole beside final/ by the push."""
        return os.path.join(self.path, CARD)

    @property
    def staging(self) -> str:
        """Where checkpoints and final/ are written before they are renamed into place."""
        return os.path.join(self.path, STAGING)

    def eval_report(self, step: int) -> str:
        """The benchmark report of the evaluation at `step`."""
        return os.path.join(self.path, EVAL_TASKS, f"step-{step}.json")

    def eval_reports(self) -> dict[int, str]:
        """{step: report file} of the evaluations the run has written, by step."""
        found = {}
        for path in glob.glob(os.path.join(self.path, EVAL_TASKS, "step-*.json")):
            if m := STEP_REPORT.search(path):
                found[int(m.group(1))] = path
        return dict(sorted(found.items()))

    def record(self) -> dict | None:
        """run.json, read (`runs.record.read_record`): None where the run has not started."""
        return read_record(self.path)

    def trainer_state(self) -> str | None:
        """The trainer_state.json a report reads: the one written at the end, or the newest
        checkpoint's (the newest log history the run wrote, whether or not it resumes from there)."""
        top = os.path.join(self.path, TRAINER_STATE)
        if os.path.isfile(top):
            return top
        checkpoint = newest_complete_checkpoint(self.path)
        return os.path.join(checkpoint, TRAINER_STATE) if checkpoint else None

    def resume_point(self) -> tuple[str | None, list[tuple[str, str, bool]]]:
        """The checkpoint the run resumes from and those set aside with why (`runs.resume`)."""
        return resume_point(self.path)

    def finished(self, record: dict | None = None) -> dict | None:
        """What the record (`record`, or run.json) says of the run's end where it finished: the
        record says so and final/ is there; else None."""
        record = self.record() if record is None else record
        return finished_entry(self.path, record or {})

    def has_results(self) -> bool:
        """A checkpoint or a final model in the folder, or the folder a saved model or checkpoint
        itself (its trainer state or weights at the top): a run's work that another may not replace."""
        return os.path.isdir(self.path) and any(
            name in (FINAL, TRAINER_STATE) or CHECKPOINT.match(name) or name.endswith(".safetensors")
            for name in os.listdir(self.path)
        )

    def start_over(self) -> list[str]:
        """Remove everything an earlier run wrote here that a new one must not find (its record,
        checkpoints and their staging, final model, trainer state and metrics, the benchmark
        reports of its evaluations and its model card, which would be read as the new run's);
        returns the names removed. The folder's claim and lock stay."""
        state = {FINAL, STAGING, TRAINER_STATE, *METRICS, EVAL_TASKS, CARD, RECORD}
        removed = sorted(n for n in os.listdir(self.path) if n in state or CHECKPOINT.match(n))
        for name in removed:
            path = os.path.join(self.path, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        return removed
