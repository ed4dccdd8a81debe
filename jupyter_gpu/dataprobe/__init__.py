"""`%dataprobe`: is the input pipeline starving the training step, and which DataLoader settings fix it."""
