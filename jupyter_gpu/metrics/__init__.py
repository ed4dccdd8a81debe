"""Live GPU metrics: the `Sample` model (`sample`), its alerts, the sampler thread and the hub that shares one
per process, the recording file format, and `backends/` (NVML, simulated scenarios, replayed recordings).
"""
