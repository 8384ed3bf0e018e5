"""What a training run is and where it stands, settled once at its start and recorded in its
output_dir: `settle` (the one function that decides the method's facts: chat template and end of
turn, activation checkpointing, GRPO's prompt room and rewards, the resume point), `resume` (the
checkpoint a run starts from), `record` (run.json, which `medrecipes report`, `card` and the push
read instead of working anything out again), `described` (what the card says of the run, recorded
once), `folder` (the output_dir as one object: its parts, its state, starting over). Below the trainers and the Hub, above the model,
data and plan layers whose answers it collects."""
