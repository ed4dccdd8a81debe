"""Profile a distributed training run rank by rank: start it (torchrun's command, or N local ranks of a script or
a notebook cell), read every rank's records, and build the report; with scaling, run it once more with one process
per node and set the two against each other."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jupyter_gpu.ddpprofile import launch
from jupyter_gpu.ddpprofile.analyse import RankSummary, scaling, straggler, summarise_rank
from jupyter_gpu.ddpprofile.apply_fixes import APPLY_ENV
from jupyter_gpu.ddpprofile.clocks import ClockOffset, clock_finding, offsets_line
from jupyter_gpu.ddpprofile.mistakes import find_mistakes
from jupyter_gpu.ddpprofile.plan import fix_line, make_plan, mechanical_fixes
from jupyter_gpu.ddpprofile.result import AppliedFixes, DistributedProfile
from jupyter_gpu.gpuprofile.request import DEFAULT_STEPS, DEFAULT_WARMUP

Progress = Callable[[str], None]
Builder = Callable[[Path], list[tuple[list[str], dict[str, str]]]]


def profile_torchrun(argv: Sequence[str], *, steps: int = DEFAULT_STEPS, warmup: int = DEFAULT_WARMUP,
                     with_scaling: bool = False, apply: bool = False,
                     hang_seconds: float = launch.DEFAULT_HANG_SECONDS, progress: Progress | None = None,
                     output: Progress | None = None) -> DistributedProfile:
    """`torchrun [OPTIONS] SCRIPT [ARGS]`, profiled in every rank (and with one process per node, for scaling; and
    again with the mechanical fixes, for --apply)."""
    command = launch.torchrun_command(argv)
    world = launch.torchrun_world(launch.parse_torchrun(argv)[1])

    def commands(argv_: list[str], extra: dict[str, str]) -> Builder:
        return lambda out: [(argv_, {**os.environ, **launch.profile_env(out, steps, warmup), **extra})]

    def once(argv_: list[str], world_: int | None, extra: dict[str, str]) -> DistributedProfile:
        return _profile(commands(argv_, extra), " ".join(argv), world_, steps, warmup, hang_seconds, progress,
                        output)

    profile = once(command, world, {})
    if with_scaling and profile.ok:
        profile = _with_scaling(profile, once(launch.torchrun_command(_one_per_node(list(argv))), None, {}))
    if apply and profile.ok:
        profile = _with_fixes(profile, lambda extra: once(command, world, extra))
    return profile


def profile_script(script: str, args: Sequence[str] = (), *, processes: int = 2, steps: int = DEFAULT_STEPS,
                   warmup: int = DEFAULT_WARMUP, with_scaling: bool = False, apply: bool = False,
                   hang_seconds: float = launch.DEFAULT_HANG_SECONDS, progress: Progress | None = None,
                   output: Progress | None = None, shown_as: str | None = None) -> DistributedProfile:
    """A script (or a notebook cell written to one) in `processes` local ranks, as torchrun's standalone mode."""
    name = shown_as or " ".join([script, *args])

    def once(count: int, extra: dict[str, str]) -> DistributedProfile:
        def build(out: Path) -> list[tuple[list[str], dict[str, str]]]:
            base = {**os.environ, **launch.profile_env(out, steps, warmup), **extra}
            return launch.local_commands(script, list(args), count, base_env=base)

        return _profile(build, name, count, steps, warmup, hang_seconds, progress, output)

    profile = once(processes, {})
    if with_scaling and profile.ok:
        profile = _with_scaling(profile, once(1, {}))
    if apply and profile.ok:
        profile = _with_fixes(profile, lambda extra: once(processes, extra))
    return profile


def _profile(commands: Builder, shown: str, world: int | None,
             steps: int, warmup: int, hang_seconds: float, progress: Progress | None,
             output: Progress | None) -> DistributedProfile:
    with tempfile.TemporaryDirectory(prefix="jupyter-gpu-ddp-") as folder:
        out = Path(folder)
        run = launch.run(commands(out), out, world or 1, hang_seconds=hang_seconds, progress=progress,
                         stream_output=output)
    return build(run.records, shown, world, steps, warmup, failure=run.failure, seconds=run.seconds)


def build(records: list[dict[str, Any]], command: str, world: int | None, steps: int, warmup: int, *,
          failure: str | None = None, seconds: float = 0.0, cores: int | None = None) -> DistributedProfile:
    """The report from every rank's record (pure, apart from counting this machine's cores)."""
    usable = [r for r in records if r.get("profile") and r["profile"].get("step_seconds")]
    world = world or (records[0].get("world_size") if records else 0) or len(records)
    profile = DistributedProfile(command=command, world=world, steps=steps, warmup=warmup, failure=failure,
                                 seconds=seconds)
    if not usable:
        if failure is None:
            profile.failure = ("No rank completed a profiled step: the script ended first (fewer --steps, or check "
                               "that it calls optimizer.step()).")
        return profile
    first = usable[0]["profile"]
    profile.device = first.get("device", "")
    ranks = [summarise_rank(r) for r in usable]
    profile.ranks = ranks
    profile.backend = (usable[0].get("backend")
                       or (usable[0].get("comm", {}).get("ddp_logging") or [{}])[0].get("backend_name") or "")
    fsdp = any(r.kind == "reduce_scatter" or r.gather for r in ranks)
    if fsdp:
        profile.backend = f"FSDP, {profile.backend}" if profile.backend else "FSDP"
        profile.notes.append("FSDP: its reduce-scatters are read as DDP's all-reduces are (ready when FSDP issues "
                             "them, done when they complete; exposed is what the backward waited for after the last "
                             "one); its all-gathers, before each forward and backward, are shown as their time.")
    elif not any(r.get("comm", {}).get("settings") for r in usable):
        profile.notes.append("Neither DistributedDataParallel nor FSDP's collectives were called: the "
                             "communication columns are empty.")
    profile.straggler = straggler(ranks)
    offsets = _offsets(usable[0].get("clocks"))
    if offsets:
        profile.clocks = [{"rank": o.rank, "offset_s": o.offset_s, "bound_s": o.bound_s, "host": o.host}
                          for o in offsets]
        profile.clock_line = offsets_line(offsets)
        spread = step_end_spread(usable, offsets)
        if spread is not None:
            profile.clock_line += f"; aligned by it, the ranks' optimizer steps end within {spread * 1e3:.2f} ms"
        profile.clock_finding = clock_finding(offsets)
    elif usable[0].get("clocks"):
        profile.notes.append(f"The clocks could not be compared: {usable[0]['clocks'][0].get('error')}.")
    profile.findings = find_mistakes(usable, ranks, cores if cores is not None else os.cpu_count())
    for record in usable:
        if record["profile"].get("error"):
            profile.notes.append(f"Rank {record['rank']}: {record['profile']['error']}")
    if len(usable) < world:
        here = ", ".join(str(r["rank"]) for r in usable)
        profile.notes.append(f"This machine ran rank {here} of {world}: every rank's records are gathered on the "
                             "node of rank 0, and its report covers them all.")
    profile.plan = make_plan(profile)
    return profile


def step_end_spread(records: list[dict[str, Any]], offsets: list[ClockOffset]) -> float | None:
    """The median, over the steps all ranks made, of how far apart the ranks' optimizer steps ended once every
    rank's stamps are put on rank 0's clock (perf_counter to wall clock by the pair each rank read together)."""
    by_rank = {o.rank: o for o in offsets}
    ends: list[list[float]] = []
    for record in records:
        comm = record.get("comm", {})
        pair, offset = comm.get("clock_pair"), by_rank.get(record["rank"])
        if not pair or offset is None:
            return None
        shift = pair["wall_ns"] / 1e9 - pair["perf_counter"] - offset.offset_s
        # The profiled steps only: after them the profile times its own hooks on a one-parameter step of its own.
        first = len(record["profile"].get("warmup_seconds", []))
        profiled = comm.get("step_ends", [])[first:first + len(record["profile"]["step_seconds"])]
        ends.append([end + shift for end in profiled])
    count = min((len(e) for e in ends), default=0)
    if count == 0 or len(ends) < 2:
        return None
    spreads = sorted(max(e[k] for e in ends) - min(e[k] for e in ends) for k in range(count))
    return spreads[len(spreads) // 2]


def _offsets(raw: Any) -> list[ClockOffset]:
    if not isinstance(raw, list) or not raw or "error" in raw[0]:
        return []
    fields = ("rank", "offset_s", "bound_s", "round_trip_s", "rounds", "host")
    return [ClockOffset(**{k: item[k] for k in fields if k in item}) for item in raw]


def _with_scaling(profile: DistributedProfile, one: DistributedProfile) -> DistributedProfile:
    if not one.ok:
        profile.notes.append(f"Scaling: the one-process run failed: {one.failure}")
        return profile
    baseline = RankSummary(**{**one.ranks[0].__dict__})
    profile.scaling = scaling(baseline, profile.ranks, profile.straggler)
    profile.plan = make_plan(profile)
    return profile


def _with_fixes(profile: DistributedProfile,
                run_again: Callable[[dict[str, str]], DistributedProfile]) -> DistributedProfile:
    """--apply: the run again with the mechanical fixes its findings call for, set against the first."""
    fixes = mechanical_fixes(profile)
    if not fixes:
        profile.notes.append("--apply: nothing to apply without editing the script: none of the findings has a "
                             "mechanical fix (find_unused_parameters, gradient_as_bucket_view, bucket_cap_mb, "
                             "no_sync for accumulation, a DistributedSampler).")
        return profile
    after = run_again({APPLY_ENV: json.dumps(fixes)})
    lines = [(name, fix_line(name, value)) for name, value in fixes.items()]
    if not after.ok:
        profile.applied = AppliedFixes(lines, 0.0, 0.0, None, None, 0.0, 0.0, failure=after.failure)
        return profile
    before_codes = {f.code for f in profile.findings}
    profile.applied = AppliedFixes(
        fixes=lines, before_step=_mean_step(profile), after_step=_mean_step(after),
        before_batches=profile.ranks[0].batches_per_epoch, after_batches=after.ranks[0].batches_per_epoch,
        before_allreduces=profile.ranks[0].allreduces_per_step, after_allreduces=after.ranks[0].allreduces_per_step,
        gone=sorted(before_codes - {f.code for f in after.findings}))
    return profile


def _mean_step(profile: DistributedProfile) -> float:
    return sum(r.step for r in profile.ranks) / len(profile.ranks)


def _one_per_node(argv: list[str]) -> list[str]:
    """The same torchrun command with one process per node."""
    out, skip = [], False
    for index, item in enumerate(argv):
        if skip:
            skip = False
            continue
        if item in ("--nproc-per-node", "--nproc_per_node"):
            out.extend([item, "1"])
            skip = index + 1 < len(argv)
            continue
        if item.startswith(("--nproc-per-node=", "--nproc_per_node=")):
            out.append(item.split("=")[0] + "=1")
            continue
        out.append(item)
    return out
