"""What the real-model checks share (benchmarks/real_*.py): their folders, stages and results
(`stages`), and the paths a user takes with a trained model beyond evaluation: answer, serve,
resume after a kill, push (`user_paths`)."""
