"""`%gpucheck`: is PyTorch really able to use the GPU, why not, and the exact fix.

`facts/` is the probe layer (the one door to /proc, /sys, /dev, the environment, NVML and the torch child),
`diagnose/` the pure rules (facts -> findings), `report`/`render` the result and its renderings, `run` the
end-to-end check every surface shares, `gate` the `require_gpu()` safety gate for scripts.
"""
