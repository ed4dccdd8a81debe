"""`%batchprobe` core: the batch-size search, out-of-memory classification, memory budgets, state restore."""
