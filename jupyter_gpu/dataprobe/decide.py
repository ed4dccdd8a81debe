"""The pure decisions of `%dataprobe`: which settings to try, the verdict, and which setting to recommend.

Everything here works on numbers already measured, so it is tested with plain pytest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jupyter_gpu.dataprobe.result import Trial, spread
from jupyter_gpu.dataprobe.settings import DEFAULT_PREFETCH, LoaderSettings

# The verdict reads the share of the loop the step waited for data. Below 10% a perfect loader would buy at
# most 1.11x: tuning the loader is not where the time is. Above 30% it would buy at least 1.43x.
COMPUTE_BOUND_BELOW = 0.10
INPUT_BOUND_ABOVE = 0.30
# A recommendation must reach this share of the best throughput the sweep saw (the 10% goal).
WITHIN_BEST = 0.90
# Between two settings this close, the cheaper one (fewer workers, less memory held) is recommended.
CHEAPER_WITHIN = 0.05
# A stated prediction is "confirmed" when the check lands within 15% of it (the research's goal).
PREDICTION_TOLERANCE = 0.15
LARGER_PREFETCH = 4
# A loop within 5% of the step alone has nothing left to gain from the loader: more workers cannot beat the step.
CEILING_SHARE = 0.95
# The step alone measured this much slower than the loop with it: the two measures disagree (see
# perfect_loader_speedup).
DISAGREE_BELOW = 0.25
# More workers past the best count: two counts in a row this much slower mean oversubscription, not noise.
SLOWER_BY = 0.10
# A loop that waits for data less than this share of its time gains at most that much from more loading power.
KEEPS_UP_BELOW = 0.05
# Doubling the workers must buy more than this to be worth measuring the next count (0 -> 1 excepted: a first
# worker moves the loading off the loop, which can pay off only once the count after it is measured too).
PAYS_OFF_ABOVE = 0.05
# W workers load at most W times what the kernel's own process loads alone (each runs the same fetch and collate,
# then hands the batch over). The margin covers a noisy baseline, and a page cache warmer than the first pass found it:
# a count is left out only when even this much more could not reach a rate already measured.
WORKER_BOUND_MARGIN = 1.5
# Batch load times that vary less than this (standard deviation over mean, at num_workers=0): the workers finish
# their batches in turn, the default queue (prefetch_factor=2) is never drained by one slow batch, and a deeper one
# has nothing to absorb.
STEADY_LOADS_BELOW = 0.10


def verdict(wait_fraction: float) -> str:
    """input-bound / compute-bound / balanced from the share of the loop spent waiting for data."""
    if wait_fraction >= INPUT_BOUND_ABOVE:
        return "input-bound"
    if wait_fraction < COMPUTE_BOUND_BELOW:
        return "compute-bound"
    return "balanced"


def perfect_loader_speedup(step_alone: float | None, together: float | None) -> float | None:
    """How much faster the loop would run if batches arrived instantly: the step alone over the loop. A little
    below 1 is noise (a loop cannot beat its own step); far below it the two measures disagree (the machine's
    speed changed between them: 10,775 samples/s alone against 39,597 in the loop), and no figure is given: shown
    as 1.0x beside "waited for data 27% of the loop" it contradicted the wait."""
    if not step_alone or not together:
        return None
    if step_alone < (1 - DISAGREE_BELOW) * together:
        return None
    return max(1.0, step_alone / together)


def worker_counts(cpus: int, current: int) -> list[int]:
    """0, 1, 2, 4, ... up to the CPUs this process may use, that count itself, and the user's own."""
    counts = {0, current}
    count = 1
    while count <= cpus:
        counts.add(count)
        count *= 2
    counts.add(max(cpus, 1))
    return sorted(counts)


def first_stage(counts: Iterable[int], *, pin_memory: bool) -> list[LoaderSettings]:
    """The worker sweep: each count with torch's default prefetch, persistent workers, pinned on a GPU."""
    return [LoaderSettings(count, DEFAULT_PREFETCH, persistent_workers=True, pin_memory=pin_memory)
            for count in sorted(set(counts))]


def second_stage(leaders: Sequence[LoaderSettings], *, gpu: bool) -> list[LoaderSettings]:
    """Around the best worker counts: a deeper prefetch queue and, on a GPU, pinning toggled; for the best count
    also workers restarted every epoch (what persistent_workers saves)."""
    found: list[LoaderSettings] = []
    for rank, lead in enumerate(leaders):
        if lead.num_workers == 0:
            variants = [LoaderSettings(0, pin_memory=not lead.pin_memory)] if gpu else []
        else:
            variants = [LoaderSettings(lead.num_workers, LARGER_PREFETCH, lead.persistent_workers, lead.pin_memory)]
            if rank == 0:
                variants.append(LoaderSettings(lead.num_workers, lead.prefetch_factor, not lead.persistent_workers,
                                               lead.pin_memory))
            if gpu:
                variants.append(LoaderSettings(lead.num_workers, lead.prefetch_factor, lead.persistent_workers,
                                               not lead.pin_memory))
        found.extend(variant for variant in variants if variant not in found and variant not in leaders)
    return found


def at_ceiling(rate: float | None, ceiling: float | None) -> bool:
    """Whether the loop already runs at the step's own speed (the ceiling a perfect loader would reach)."""
    return rate is not None and ceiling is not None and rate >= CEILING_SHARE * ceiling


def keeps_up(wait_fraction: float | None) -> bool:
    """Whether the loop barely waits for data: a perfect loader would buy it at most KEEPS_UP_BELOW."""
    return wait_fraction is not None and wait_fraction < KEEPS_UP_BELOW


def stop_adding_workers(measured: Sequence[tuple[int, float, float | None]], ceiling: float | None) -> str | None:
    """Why the worker sweep can stop after these (count, samples/s, share of the loop spent waiting) results, in
    the order run; None to go on.

    Either measure says the loader keeps up: the loop at the step's own speed, or the loop hardly waiting (the
    handover of each batch from a worker costs the loop time the wait does not show, so on a busy host the loop
    may never reach 95% of the step alone while the wait is already near zero)."""
    if not measured:
        return None
    count, rate, wait = measured[-1]
    workers = f"{count} worker{'s' if count != 1 else ''}"
    if at_ceiling(rate, ceiling):
        return f"the loop already ran at the step's own speed with {workers}"
    if count > 0 and keeps_up(wait):
        return f"the loop waited for data only {wait:.0%} of the time with {workers}"
    if len(measured) >= 2:
        previous_count, previous, _ = measured[-2]
        if previous_count > 0 and rate < previous * (1 + PAYS_OFF_ABOVE):
            return (f"{workers} were not {PAYS_OFF_ABOVE:.0%} faster than {previous_count} (more workers stopped "
                    "paying off)")
    best = max(rate for _, rate, _ in measured)
    if len(measured) >= 3 and all(rate < (1 - SLOWER_BY) * best for _, rate, _ in measured[-2:]):
        return "the last two worker counts were each more than 10% slower than the best (too many processes)"
    return None


def more_in_flight_did_not_pay(measured: Sequence[tuple[int, float, float | None]]) -> bool:
    """Whether the last doubling of the workers bought under PAYS_OFF_ABOVE: it doubled the batches in flight (each
    worker holds prefetch_factor of them) and the loading done at once. A deeper prefetch queue adds batches in
    flight without more loading at once, so it cannot buy what doubling the workers did not; and workers restarted
    every epoch (persistent_workers=False) only add their start-up. Neither variant is worth a trial then."""
    if len(measured) < 2:
        return False
    (previous_count, previous, _), (count, rate, _) = measured[-2], measured[-1]
    return previous_count > 0 and count > previous_count and rate < previous * (1 + PAYS_OFF_ABOVE)


def workers_called_for(counts: Sequence[int], loader_rate: float | None, ceiling: float | None) -> int | None:
    """The fewest of `counts` (above 0) whose workers could load as fast as the step runs, from the loader alone in
    one process (`loader_rate`, samples/s) and the step alone (`ceiling`); the most there is when none could; None
    without both figures."""
    above = sorted(count for count in counts if count > 0)
    if not above or not loader_rate or not ceiling:
        return None
    return next((count for count in above if count * loader_rate >= ceiling), above[-1])


def cannot_reach(count: int, loader_rate: float, rate: float) -> bool:
    """Whether `count` workers could not load `rate` samples/s, however well they ran: at most `count` times one
    process's `loader_rate`, with WORKER_BOUND_MARGIN to spare."""
    return count * loader_rate * WORKER_BOUND_MARGIN < rate


def recurring_load_variation(loads: Sequence[float]) -> float | None:
    """How much the batches' load times vary (standard deviation over mean) once the slowest one is set aside: one
    slow batch in the whole measurement (a stall, the OS holding the process up on a busy machine) says nothing
    about the others, and a slow batch that recurs is seen again. None with fewer than 4 batches."""
    return spread(sorted(loads)[:-1])


def deeper_queue_can_pay(load_variation: float | None) -> bool:
    """Whether a deeper prefetch queue could beat the default: only when batches take uneven times to load (a slow
    one holds its worker while the others fill the queue); unknown variation (the user's loader had workers) counts
    as uneven."""
    return load_variation is None or load_variation >= STEADY_LOADS_BELOW


def restarts_show(epochs: int) -> bool:
    """Whether workers restarted at each epoch's end could cost anything a trial times: only when an epoch ended
    within the trial (a longer epoch pays the start-up once per epoch, which no window includes)."""
    return epochs > 1


def fell_behind(verified: float | None, rival: float | None) -> bool:
    """Whether the recommendation, measured again on a fresh loader, fell under WITHIN_BEST of the rate another
    setting showed in the sweep: the sweep's windows flattered it, and the other is measured again before choosing."""
    return verified is not None and rival is not None and verified < WITHIN_BEST * rival


def of_mode(trials: Iterable[Trial], mode: str) -> list[Trial]:
    """The trials timed one way (the loader alone, or the loop): their rates compare only with each other."""
    return [trial for trial in trials if trial.mode == mode]


def pooled(trials: Iterable[Trial]) -> dict[LoaderSettings, list[float]]:
    """Every window measured for each setting, over all the trials that ran it without an error and without
    yielding the same data once per worker (duplicated samples are no throughput)."""
    windows: dict[LoaderSettings, list[float]] = {}
    for trial in trials:
        if trial.error is None and trial.rates and not trial.duplicates:
            windows.setdefault(trial.settings, []).extend(trial.rates)
    return windows


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def ranking(trials: Iterable[Trial]) -> list[tuple[LoaderSettings, float]]:
    """Settings by pooled median samples/s, best first; ties go to the cheaper setting."""
    rates = {settings: median(windows) for settings, windows in pooled(trials).items()}
    return sorted(rates.items(), key=lambda item: (-item[1], item[0].cost))


def leaders(trials: Iterable[Trial], count: int = 2) -> list[LoaderSettings]:
    return [settings for settings, _ in ranking(trials)[:count]]


def pooled_wait(trials: Iterable[Trial]) -> dict[LoaderSettings, float]:
    """The mean share of the loop spent waiting for data, per setting, over its trials in the loop."""
    waits: dict[LoaderSettings, list[float]] = {}
    for trial in trials:
        if trial.error is None and trial.wait_fraction is not None and not trial.duplicates:
            waits.setdefault(trial.settings, []).append(trial.wait_fraction)
    return {settings: sum(values) / len(values) for settings, values in waits.items()}


def recommend(trials: Iterable[Trial]) -> tuple[LoaderSettings, float, float] | None:
    """(setting, its pooled median, the best pooled median) once the leaders were measured again.

    The best setting, unless a cheaper one is within CHEAPER_WITHIN of it and, in the loop, keeps up with room to
    spare (waits under COMPUTE_BOUND_BELOW): more workers than needed cost memory and CPU the main process needs,
    but a setting that only just keeps up on a quiet moment falls behind on a busy one. Either way the choice is
    within WITHIN_BEST of the best.
    """
    trials = list(trials)
    ranked = ranking(trials)
    if not ranked:
        return None
    waits = pooled_wait(trials)
    best_settings, best = ranked[0]
    chosen, chosen_rate = best_settings, best
    for settings, rate in ranked[1:]:
        spare = settings not in waits or waits[settings] < COMPUTE_BOUND_BELOW
        if rate >= best * (1 - CHEAPER_WITHIN) and settings.cost < chosen.cost and spare:
            chosen, chosen_rate = settings, rate
    return chosen, chosen_rate, best


def prediction_holds(predicted: float, verified: float) -> bool:
    return abs(verified - predicted) <= PREDICTION_TOLERANCE * predicted
