"""Public recipes a user would follow instead of tfopt, run side by side with it by the benchmarks."""
