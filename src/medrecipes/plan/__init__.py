"""Planning a run before it is launched: the model's shape and FLOPs, memory per device by strategy,
the GPUs planned for, and a multi-node launch."""
