"""Training: the recipes' trainers and what a run needs around them (its folder, resuming, callbacks,
throughput, multiple-choice accuracy during training)."""
