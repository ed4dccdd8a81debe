"""The classic DDP mistakes, each found from what the ranks recorded (never from the script's text), with the time
it costs a step where the records measure it. Pure Python over the ranks' JSON and their summaries.

What each reads:
- every rank trained on the same samples: the first batches' fingerprints are equal on every rank;
- `find_unused_parameters=True` with none unused: DDP's own `unused_parameter_size` is 0 on every rank;
- accumulation without `no_sync()`: more than one backward a step, and every one of them all-reduced;
- ranks x DataLoader workers beyond this machine's cores (a rank is its own process, its workers more);
- BatchNorm, not SyncBatchNorm, with a small per-rank batch: advice only, the statistics are each rank's own;
- one bucket holding every gradient: the all-reduce can only start when the backward ends (nothing overlaps);
- `gradient_as_bucket_view` off: a copy of every gradient into the buckets each step, and its memory.
"""

from __future__ import annotations

from typing import Any

from jupyter_gpu.ddpprofile.analyse import RankSummary
from jupyter_gpu.gpuprofile.result import BACKWARD
from jupyter_gpu.models import Finding
from jupyter_gpu.rendering.units import format_bytes, format_seconds

SMALL_BATCH = 32  # per-rank samples under which BatchNorm's per-rank statistics get noisy (SyncBatchNorm's docs)
SPLIT_WORTH_BYTES = 4 * 2**20
# Buckets this many a step, none of them this big: latency-bound all-reduces (a 1 MiB all-reduce on NVLink takes about
# its latency, tens of microseconds, as one of 25 MiB takes a few hundred).
MANY_BUCKETS = 16
SMALL_BUCKET_BYTES = 2**20  # gradients under this all-reduce in about a latency: more buckets, more latencies


def find_mistakes(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> list[Finding]:
    found: list[Finding] = []
    for check in (_same_samples, _unused_search, _static_graph, _accumulation_without_no_sync, _sync_every_step,
                  _workers_over_cores, _batch_norm, _one_bucket, _many_small_buckets, _bucket_view):
        finding = check(records, ranks, cores)
        if finding is not None:
            found.append(finding)
    return found


def _same_samples(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    """Two pieces of evidence, either enough: the first batches were byte for byte the same on every rank (a seeded
    shuffle, or none), or the loaders that fed the ranks split nothing between them (no sampler that knows the
    ranks): each rank then reads the whole dataset, in whatever order its own shuffle gives."""
    if len(records) < 2:
        return None
    hashes = [tuple(r.get("comm", {}).get("input_hashes", [])) for r in records]
    same = bool(hashes[0]) and any(hashes[0]) and all(h == hashes[0] for h in hashes)
    loaders = [loader for r in records for loader in r.get("comm", {}).get("loaders", [])]
    whole = [loader for loader in loaders if not loader["shards"] and not loader["iterable"]]
    if not same and not (loaders and len(whole) == len(loaders)):
        return None
    evidence: dict[str, Any] = {"ranks": len(records)}
    if same:
        evidence["first batches identical on every rank"] = len(hashes[0])
    if whole:
        evidence["sampler"] = whole[0]["sampler"]
        evidence["samples each rank reads"] = whole[0]["dataset_size"]
    what = (f"the first {len(hashes[0])} batches were identical on all {len(records)} ranks" if same else
            f"each rank's DataLoader ({whole[0]['sampler']}) reads all {whole[0]['dataset_size']} samples")
    return Finding(
        code="DDP_SAME_SAMPLES_ON_EVERY_RANK", severity="fail",
        headline=(f"Every rank trains on the whole dataset, not its share: {what}, so {len(records)} processes do "
                  "one process's work per epoch"),
        evidence=evidence,
        fix=["sampler = DistributedSampler(dataset)  # from torch.utils.data.distributed import DistributedSampler",
             "loader = DataLoader(dataset, batch_size=..., sampler=sampler)  # and no shuffle=True",
             "sampler.set_epoch(epoch)  # at the start of every epoch, so each epoch shuffles differently"])


def quarter_bucket_mb(gradient_bytes: int) -> float:
    """The bucket cap that splits the gradients in about four (MiB, two significant digits): the first bucket is
    all-reduced under the rest of the backward. One rule for the finding's fix and --apply's."""
    return float(f"{gradient_bytes / 4 / 2**20:.2g}")


def _ddp_logs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's first DDP's own logging data (`_get_ddp_logging_data()`), {} where it had none."""
    return [(r.get("comm", {}).get("ddp_logging") or [{}])[0] for r in records]


def _unused_search(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    logs = _ddp_logs(records)
    if not logs or not all(log.get("find_unused_parameters") == 1 for log in logs):
        return None
    if any(log.get("unused_parameter_size", 0) for log in logs):
        return None
    return Finding(
        code="DDP_FIND_UNUSED_WITH_NONE_UNUSED", severity="warn",
        headline=("find_unused_parameters=True, and no parameter went unused on any rank: DDP searches the autograd "
                  "graph after every forward for nothing"),
        evidence={"unused parameter bytes (DDP's own count)": 0},
        fix=["model = DDP(model, find_unused_parameters=False)"])


def _static_graph(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    """find_unused_parameters=True with parameters unused: DDP searches the graph after every forward for them.
    Where the same ones go unused every iteration (a frozen or skipped branch), static_graph=True finds them once."""
    logs = _ddp_logs(records)
    if not logs or not all(log.get("find_unused_parameters") == 1 for log in logs):
        return None
    unused = max(log.get("unused_parameter_size", 0) for log in logs)
    if not unused or any(log.get("static_graph") for log in logs) or \
            any((r.get("comm", {}).get("settings") or [{}])[0].get("static_graph") for r in records):
        return None
    return Finding(
        code="DDP_STATIC_GRAPH_OFF", severity="info",
        headline=(f"find_unused_parameters=True finds {format_bytes(unused)} of parameters unused: DDP searches the "
                  "autograd graph after every forward; if the same ones go unused every iteration, static_graph=True "
                  "finds them once (--apply measures it; DDP raises if the graph changes)"),
        evidence={"unused parameter bytes (DDP's own count)": unused},
        fix=["model = DDP(model, find_unused_parameters=True, static_graph=True)"])


def _accumulation_without_no_sync(records: list[dict[str, Any]], ranks: list[RankSummary],
                                  cores: int | None) -> Finding | None:
    rank = ranks[0] if ranks else None
    if rank is None or rank.backwards_per_step < 1.5 or rank.allreduces_per_step < rank.backwards_per_step - 0.01:
        return None
    extra = rank.allreduces_per_step - 1
    per_allreduce = rank.comm / rank.allreduces_per_step if rank.allreduces_per_step else 0.0
    return Finding(
        code="DDP_ACCUMULATION_WITHOUT_NO_SYNC", severity="warn",
        headline=(f"Gradient accumulation all-reduces every micro-batch: {rank.backwards_per_step:.3g} backwards a "
                  f"step, each followed by an all-reduce, where only the last one's is needed "
                  f"(about {format_seconds(extra * per_allreduce)} of all-reduce a step to save)"),
        evidence={"backwards per step": f"{rank.backwards_per_step:.3g}",
                  "all-reduces per step": f"{rank.allreduces_per_step:.3g}",
                  "all-reduce per micro-batch": format_seconds(per_allreduce)},
        fix=["with model.no_sync():  # every micro-batch but the last of each step, the forward too: DDP decides "
             "in the forward whether the backward all-reduces",
             "    loss = loss_fn(model(inputs), targets) / accumulation_steps",
             "    loss.backward()"])


def _sync_every_step(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    """A value read on the host every step on a GPU: the host waits there for the step's kernels and its NCCL
    all-reduce, so it cannot queue the next step's work under them. On the CPU a read waits for nothing (gloo's
    all-reduce is already done when the backward returns): nothing is said."""
    profile = records[0].get("profile") or {} if records else {}
    if not str(profile.get("device", "")).startswith("cuda"):
        return None
    every = [s for s in profile.get("syncs", []) if s.get("per_step", 0) >= 1]
    if not every:
        return None
    first = every[0]
    where = f"{first['file'].rsplit('/', 1)[-1]}:{first['line']}"
    return Finding(
        code="DDP_SYNC_EVERY_STEP", severity="warn",
        headline=(f"{where} reads a value on the host every step ({first['source']}): each rank waits there for "
                  "its step's kernels and all-reduce, so the next step cannot be queued under them"),
        evidence={"line": where, "reads per step": f"{first['per_step']:.3g}", "ranks": len(records)},
        fix=["log every N steps: if step % 50 == 0: print(loss.item())  # or keep a running tensor sum and read it "
             "once an epoch"])


def _workers_over_cores(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    if not cores:
        return None
    by_host: dict[str, int] = {}
    for record in records:
        workers = max((loader.get("num_workers", 0) for loader in record.get("comm", {}).get("loaders") or []),
                      default=0)
        by_host[record.get("host", "")] = by_host.get(record.get("host", ""), 0) + 1 + workers
    host, processes = max(by_host.items(), key=lambda item: item[1])
    if processes <= cores:
        return None
    ranks_here = sum(1 for r in records if r.get("host", "") == host)
    return Finding(
        code="DDP_WORKERS_OVER_CORES", severity="warn",
        headline=(f"{ranks_here} ranks and their DataLoader workers make {processes} processes on {host or 'this host'}"
                  f", which has {cores} CPU cores: the loaders take cores from each other and from the ranks"),
        evidence={"ranks on the host": ranks_here, "processes": processes, "cores": cores},
        fix=[f"DataLoader(..., num_workers={max(0, cores // ranks_here - 1)})  # about cores / ranks - 1 per rank"])


def _batch_norm(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    comm = records[0].get("comm", {}) if records else {}
    batch = (records[0].get("profile") or {}).get("batch_size") if records else None
    if not comm.get("batch_norms") or batch is None or batch >= SMALL_BATCH:
        return None
    return Finding(
        code="DDP_BATCHNORM_SMALL_RANK_BATCH", severity="info",
        headline=(f"{comm['batch_norms']} BatchNorm layers compute their statistics over each rank's {batch} samples, "
                  "not the global batch: with batches this small they are noisy (advice: not measured)"),
        evidence={"BatchNorm layers": comm["batch_norms"], "samples per rank": batch},
        fix=["model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # before DDP(model); costs an "
             "all-reduce per BatchNorm layer"])


def _one_bucket(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    rank = ranks[0] if ranks else None
    if rank is None or len(ranks) < 2 or rank.buckets_per_step > 1.01 or not rank.gradient_bytes:
        return None
    slowest_exposed = max(r.exposed for r in ranks)
    if rank.comm <= 0 or slowest_exposed < 0.5 * rank.comm:
        return None
    # Splitting helps only where there is backward compute to hide an earlier bucket under, and gradients big enough
    # that an all-reduce's time is its bytes, not its latency (a few KiB in four buckets is four latencies).
    if rank.gradient_bytes < SPLIT_WORTH_BYTES or rank.buckets.get(BACKWARD, 0.0) < 0.25 * slowest_exposed:
        return None
    cap = quarter_bucket_mb(rank.gradient_bytes)
    return Finding(
        code="DDP_ONE_BUCKET", severity="info",
        headline=(f"All {format_bytes(rank.gradient_bytes)} of gradients go in one bucket, so its all-reduce can "
                  f"start only when the backward ends: {format_seconds(slowest_exposed)} a step exposed"),
        evidence={"gradient bytes": format_bytes(rank.gradient_bytes),
                  "bucket_cap_mb": rank.settings.get("bucket_cap_mb")},
        fix=[f"model = DDP(model, bucket_cap_mb={cap:g})  # about four buckets, the first all-reduced under the "
             "backward"])


def _many_small_buckets(records: list[dict[str, Any]], ranks: list[RankSummary],
                        cores: int | None) -> Finding | None:
    """The other side of the bucket size: a cap far below the gradients' size makes many small all-reduces, each
    paying a collective's latency (DDP's default 25 MiB exists for this)."""
    rank = ranks[0] if ranks else None
    if rank is None or len(ranks) < 2 or rank.kind != "all_reduce" or rank.buckets_per_step < MANY_BUCKETS:
        return None
    if not rank.bucket_bytes or max(rank.bucket_bytes) >= SMALL_BUCKET_BYTES or not rank.gradient_bytes:
        return None
    return Finding(
        code="DDP_MANY_SMALL_BUCKETS", severity="info",
        headline=(f"{rank.buckets_per_step:.0f} buckets a step of at most {format_bytes(max(rank.bucket_bytes))} for "
                  f"{format_bytes(rank.gradient_bytes)} of gradients: each all-reduce pays a collective's latency"),
        evidence={"buckets per step": f"{rank.buckets_per_step:.0f}",
                  "bucket_cap_mb": rank.settings.get("bucket_cap_mb"),
                  "gradient bytes": format_bytes(rank.gradient_bytes)},
        fix=["model = DDP(model, bucket_cap_mb=25)  # DDP's default: a few large buckets, the first under the "
             "backward"])


def _bucket_view(records: list[dict[str, Any]], ranks: list[RankSummary], cores: int | None) -> Finding | None:
    rank = ranks[0] if ranks else None
    if rank is None or len(ranks) < 2 or rank.settings.get("gradient_as_bucket_view") is not False:
        return None
    if not rank.gradient_bytes:
        return None
    return Finding(
        code="DDP_GRADIENT_COPY", severity="info",
        headline=(f"gradient_as_bucket_view is off: each step copies {format_bytes(rank.gradient_bytes)} of "
                  "gradients into the buckets and keeps both (advice: not measured)"),
        evidence={"gradient bytes": format_bytes(rank.gradient_bytes)},
        fix=["model = DDP(model, gradient_as_bucket_view=True)  # unless the code replaces p.grad tensors itself"])
