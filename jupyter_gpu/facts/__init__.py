"""Facts about this machine, its Python and the notebook kernel, gathered without starting CUDA in the kernel:
what `%gpucheck` diagnoses from, and what `%gpucheck --distributed`, `%dataprobe` and `%batchprobe` read too.

A room of its own: it imports no feature room (checked by tests/test_architecture.py). The snapshot schema is
docs/facts-schema.md.
"""
