"""Multi-GPU readiness: topology, launch methods, the host settings NCCL needs, and a checked all-reduce."""
