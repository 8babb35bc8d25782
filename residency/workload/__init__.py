"""The workload: the seeded diffusion pipeline, its multi-rank HTTP service and the profiler
hook."""
