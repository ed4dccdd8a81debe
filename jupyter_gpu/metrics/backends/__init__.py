"""Where GPU metrics come from: `base` (the protocol, its error, `JUPYTER_GPU_BACKEND`), `select` (which backend a
spec names) and the implementations `nvml`, `simulated`, `replay` and `claims`. Import what you need from its
module: this package imports nothing, so getting a type never loads every backend.
"""
