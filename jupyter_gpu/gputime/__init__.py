"""`%%gputime`: synchronised, repeated timing of a cell, with operator counts, memory and GPU busy fraction.

Pure core: `stats`, `ops`, `result`, `advice`, `render`, `compare`, `cell`. Probe layer (touches torch or
NVML, only what the kernel already initialised): `opcount`, `clock`, `availability`, `busy`, `runner`.
"""
