"""The ranked plan: each cause of a slow distributed step with the time it loses per step (where measured) and the
exact change, the costliest first. Pure Python over the built profile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyter_gpu.ddpprofile.analyse import RankSummary, bucket_title
from jupyter_gpu.ddpprofile.mistakes import SPLIT_WORTH_BYTES, quarter_bucket_mb
from jupyter_gpu.gpuprofile.result import DATA
from jupyter_gpu.rendering.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from jupyter_gpu.ddpprofile.result import DistributedProfile, PlanItem

# A cause under this share of the step is left out of the plan: within the noise of a few profiled steps.
LEAST_SHARE = 0.03


def make_plan(profile: DistributedProfile) -> list[PlanItem]:
    from jupyter_gpu.ddpprofile.result import PlanItem

    items: list[PlanItem] = []
    ranks = profile.ranks
    if not ranks:
        return items
    step = max(r.step for r in ranks)
    late = profile.straggler
    slowest = next((r for r in ranks if late is not None and r.rank == late.rank), max(ranks, key=lambda r: r.compute))
    codes = {f.code for f in profile.findings}
    if len(ranks) > 1 and slowest.exposed >= LEAST_SHARE * step:
        gradient = slowest.gradient_bytes or 0
        if slowest.kind == "reduce_scatter":
            change = ("more compute to hide the reduce-scatters under: a larger batch per rank; with accumulation, "
                      "model.set_requires_gradient_sync(False) on the micro-batches before the last (FSDP2)")
        elif "DDP_ONE_BUCKET" in codes:
            change = next(f.fix[0] for f in profile.findings if f.code == "DDP_ONE_BUCKET")
        elif gradient < SPLIT_WORTH_BYTES:
            # A few MiB all-reduce in about a latency: fewer bytes change little, fewer all-reduces per sample do.
            change = (f"fewer all-reduces per sample ({format_bytes(gradient)} of gradients all-reduce in about a "
                      "latency): a larger batch per rank, or accumulate micro-batches under model.no_sync()")
        else:
            change = ("ddp.register_comm_hook(dist.group.WORLD, default_hooks.bf16_compress_hook)  # NCCL; half the "
                      "bytes (fp16_compress_hook elsewhere); from torch.distributed.algorithms.ddp_comm_hooks "
                      "import default_hooks")
        what = "reduce-scatter" if slowest.kind == "reduce_scatter" else "all-reduce"
        items.append(PlanItem(f"exposed {what}: {format_seconds(slowest.exposed)} a step after the backward, "
                              f"{slowest.overlapped / slowest.comm:.0%} of it overlapped" if slowest.comm else
                              f"exposed {what}: {format_seconds(slowest.exposed)} a step", slowest.exposed, change))
    if late is not None and late.lead >= LEAST_SHARE * step:
        what = bucket_title(late.bucket)
        if late.bucket == DATA:
            change = _data_change(late.rank, slowest, [r for r in ranks if r.rank != late.rank])
        else:
            change = f"rank {late.rank}'s {what} is slower than the others': look at its device and its CPU share"
        items.append(PlanItem(f"straggler: rank {late.rank} {format_seconds(late.lead)} a step behind, in its {what} "
                              f"({format_seconds(late.its_seconds)} against {format_seconds(late.others_seconds)} on "
                              "the others)", late.lead, change))
    for finding in profile.findings:
        if finding.code == "DDP_ACCUMULATION_WITHOUT_NO_SYNC":
            rank = ranks[0]
            per = rank.comm / rank.allreduces_per_step if rank.allreduces_per_step else 0.0
            saved = per * (rank.allreduces_per_step - 1)
            items.append(PlanItem("accumulation without no_sync(): an all-reduce every micro-batch", saved,
                                  "with model.no_sync():  # forward and backward of every micro-batch but the last"))
        elif finding.code in ("DDP_SAME_SAMPLES_ON_EVERY_RANK", "DDP_FIND_UNUSED_WITH_NONE_UNUSED",
                              "DDP_WORKERS_OVER_CORES"):
            items.append(PlanItem(finding.headline, None, finding.fix[0]))
    scaling = profile.scaling
    if scaling is not None:
        data = dict(scaling.parts).get("data wait", 0.0)
        if data >= LEAST_SHARE * step:
            items.append(PlanItem(f"every rank waits longer for data than one process did "
                                  f"(+{format_seconds(data)} a step)", data,
                                  "%dataprobe on one rank's loader, with ranks x num_workers kept within the cores"))
    return sorted(items, key=lambda item: -(item.seconds if item.seconds is not None else -1.0))


def _data_change(rank: int, slow: RankSummary, others: list[RankSummary]) -> str:
    """What to change on a rank that waits longer for data than the others: fewer workers than theirs is named as
    such; with as many, its samples cost more (a slower disk, another dataset shard), which more workers hide."""
    mine = slow.loader_workers
    theirs = max((r.loader_workers or 0) for r in others) if others else 0
    if mine is not None and mine < theirs:
        return (f"rank {rank}'s DataLoader has {mine} workers where the others have {theirs}: "
                f"DataLoader(..., num_workers={theirs}) on every rank")
    has = f" (it has num_workers={mine})" if mine is not None else ""
    return (f"rank {rank}'s samples take longer to load than the others'{has}: more workers on its DataLoader, or "
            "find why its data is slower (its disk, its shard); %dataprobe on its loader measures the settings")


def mechanical_fixes(profile: DistributedProfile) -> dict[str, object]:
    """The fixes `--apply` can make without editing the script, from what the first run found: each one only where
    its finding is (a fix that cannot apply to this run is never tried)."""
    codes = {f.code: f for f in profile.findings}
    fixes: dict[str, object] = {}
    if "DDP_FIND_UNUSED_WITH_NONE_UNUSED" in codes:
        fixes["find_unused_parameters"] = False
    if "DDP_STATIC_GRAPH_OFF" in codes:
        fixes["static_graph"] = True
    if "DDP_GRADIENT_COPY" in codes:
        fixes["gradient_as_bucket_view"] = True
    if "DDP_MANY_SMALL_BUCKETS" in codes:
        fixes["bucket_cap_mb"] = 25.0
    if "DDP_ONE_BUCKET" in codes and profile.ranks and profile.ranks[0].gradient_bytes:
        fixes["bucket_cap_mb"] = quarter_bucket_mb(profile.ranks[0].gradient_bytes)
    if "DDP_ACCUMULATION_WITHOUT_NO_SYNC" in codes and profile.ranks:
        fixes["no_sync_every"] = round(profile.ranks[0].backwards_per_step)
    if "DDP_SAME_SAMPLES_ON_EVERY_RANK" in codes:
        fixes["distributed_sampler"] = True
    return fixes


FIX_LINES = {
    "find_unused_parameters": "DDP(model, find_unused_parameters=False)",
    "gradient_as_bucket_view": "DDP(model, gradient_as_bucket_view=True)",
    "static_graph": "DDP(model, static_graph=True)",
    "bucket_cap_mb": "DDP(model, bucket_cap_mb={value})",
    "no_sync_every": "with model.no_sync(): forward and backward of the first {less} micro-batches of each step",
    "distributed_sampler": "DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=...))",
}


def fix_line(name: str, value: object) -> str:
    less = int(value) - 1 if isinstance(value, int | float) else 0
    return FIX_LINES[name].format(value=value, less=less)
