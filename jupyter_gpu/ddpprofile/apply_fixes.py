"""In one rank, for `--apply`'s second run: the mechanical DDP fixes, made without editing the script.

- DDP's constructor arguments (`find_unused_parameters=False`, `gradient_as_bucket_view=True`, `bucket_cap_mb`,
  `static_graph=True`) are
  set by wrapping `DistributedDataParallel.__init__`: what the script passed is replaced, the rest kept.
- `no_sync()` for accumulation: DDP decides in its forward whether the coming backward all-reduces
  (`require_backward_grad_sync`); with K backwards a step seen in the first run, the forwards before the K-th of each
  step are made with it off, as `with model.no_sync():` around them would.
- A `DistributedSampler`: a DataLoader made without a sampler over a map-style dataset gets one (with the shuffle
  the script asked for), so each rank reads its share.

The fixes are named in `JUPYTER_GPU_DDP_APPLY` as JSON, e.g. `{"gradient_as_bucket_view": true, "no_sync_every": 4}`.
"""

from __future__ import annotations

import json
import os
from typing import Any

APPLY_ENV = "JUPYTER_GPU_DDP_APPLY"
CONSTRUCTOR = ("find_unused_parameters", "gradient_as_bucket_view", "bucket_cap_mb", "static_graph")


def fixes_from_env() -> dict[str, Any]:
    try:
        fixes = json.loads(os.environ.get(APPLY_ENV) or "{}")
    except ValueError:
        return {}
    return fixes if isinstance(fixes, dict) else {}


def install_fixes(torch: Any, fixes: dict[str, Any]) -> list[Any]:
    """Wraps what the fixes need; returns the undo calls (in the order to call them)."""
    if not fixes:
        return []
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader

    undo: list[Any] = []
    arguments = {name: fixes[name] for name in CONSTRUCTOR if name in fixes}
    if arguments:
        original_init = DDP.__init__

        def ddp_init(ddp: Any, *args: Any, **kwargs: Any) -> None:
            original_init(ddp, *args, **{**kwargs, **arguments})

        DDP.__init__ = ddp_init
        undo.append(lambda: setattr(DDP, "__init__", original_init))
    every = int(fixes.get("no_sync_every") or 0)
    if every > 1:
        original_forward = DDP.forward
        seen = {"forwards": 0}

        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            seen["forwards"] += 1
            # Only the K-th forward of a step all-reduces; torch.is_grad_enabled() leaves evaluation forwards alone.
            if torch.is_grad_enabled():
                ddp.require_backward_grad_sync = seen["forwards"] % every == 0
            return original_forward(ddp, *args, **kwargs)

        def stepped(optimizer: Any, args: Any, kwargs: Any) -> None:
            seen["forwards"] = 0

        DDP.forward = forward
        handle = register_optimizer_step_post_hook(stepped)
        undo += [lambda: setattr(DDP, "forward", original_forward), handle.remove]
    if fixes.get("distributed_sampler"):
        original_loader_init = DataLoader.__init__

        def loader_init(loader: Any, dataset: Any, *args: Any, **kwargs: Any) -> None:
            if _can_shard(torch, dataset, args, kwargs):
                from torch.utils.data.distributed import DistributedSampler

                shuffle = bool(kwargs.pop("shuffle", False))
                kwargs["sampler"] = DistributedSampler(dataset, shuffle=shuffle)
            original_loader_init(loader, dataset, *args, **kwargs)

        DataLoader.__init__ = loader_init
        undo.append(lambda: setattr(DataLoader, "__init__", original_loader_init))
    return list(reversed(undo))


def _can_shard(torch: Any, dataset: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """A map-style dataset, no sampler or batch sampler of the script's own, a process group up, options by keyword
    (a positional `shuffle`/`sampler` is left as the script wrote it)."""
    if args or kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None:
        return False
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        return False
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
