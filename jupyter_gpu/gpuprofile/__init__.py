"""%%gpuprofile: where each step of the user's own training loop goes, how far from the device's limit, and what to fix
first."""
