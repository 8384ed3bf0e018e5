"""The parts of benchmarks/train_throughput.py, by concern: the cases and their data (`cases`), the
arms a case runs (`arms`: ours and the plain trainer; `plain_loop`: the loop a user writes),
measuring a run (`measure`, `op_census`) and the results of a case (`results`)."""
