"""`%speedprobe`: what AMP, TF32, channels_last, cudnn.benchmark, fused optimizers and torch.compile buy on the
user's own training step, each measured like `%%gputime` and checked for numerical agreement with the step as it
is. Pure modules: catalog, result, decide, render; probe layer: flags, variants, measure, runner."""
