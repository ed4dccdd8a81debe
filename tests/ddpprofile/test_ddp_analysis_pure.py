"""The distributed profile's arithmetic on made-up rank records (pure): exposed and overlapped communication, the
straggler, the scaling split, the mistakes' evidence, and the report's wording."""

from __future__ import annotations

import pytest

from jupyter_gpu.ddpprofile.analyse import scaling, step_comm, straggler, summarise_rank
from jupyter_gpu.ddpprofile.mistakes import find_mistakes
from jupyter_gpu.ddpprofile.render import render_html, render_text
from jupyter_gpu.ddpprofile.runner import build


def rank_record(rank: int, *, data: float, backward: float, exposed: float, buckets: int = 2, steps: int = 4,
                overlap: float = 0.002, micro: int = 1, synced_micro: int = 1, hashes: tuple[str, ...] = ("a", "b"),
                loaders: list[dict] | None = None, find_unused: int = 0) -> dict:
    """A rank that waits `data` for each batch, computes its backward in `backward` seconds, then waits `exposed`
    for the all-reduce of its last bucket; earlier buckets' all-reduces overlap the backward by `overlap`."""
    step_seconds, step_buckets, comm_buckets, backwards, ends = [], [], [], [], []
    now = 100.0
    for step in range(1 + steps):  # one warm-up step, then the profiled ones
        begin = now
        now += data
        for m in range(micro):
            start = now
            now += backward
            if m >= micro - synced_micro:
                for b in range(buckets):
                    ready = start + backward * (b + 1) / buckets
                    done = ready + (overlap if b < buckets - 1 else exposed)
                    comm_buckets.append({"step": step, "index": b, "bytes": 1 << 20, "ready": ready, "done": done})
                now += exposed
            backwards.append({"step": step, "start": start, "end": now})
        now += 0.001  # the optimizer
        ends.append(now)
        if step:
            step_seconds.append(now - begin)
            step_buckets.append({"data": data, "backward": now - begin - data - 0.001, "optimizer": 0.001})
    return {"rank": rank, "host": "node-a", "world_size": 2,
            "profile": {"device": "cpu", "step_seconds": step_seconds, "step_buckets": step_buckets,
                        "warmup_seconds": [0.1], "batch_size": 64},
            "comm": {"buckets": comm_buckets, "backwards": backwards, "step_ends": ends,
                     "settings": [{"bucket_cap_mb": 25.0, "gradient_as_bucket_view": True}],
                     "parameters": [{"count": 4, "bytes": buckets << 20}],
                     "ddp_logging": [{"backend_name": "gloo", "find_unused_parameters": find_unused,
                                      "unused_parameter_size": 0}],
                     "input_hashes": list(hashes) if rank == 0 else [h + str(rank) for h in hashes],
                     "loaders": loaders if loaders is not None else
                     [{"sampler": "DistributedSampler", "shards": True, "dataset_size": 1000, "iterable": False}],
                     "clock_pair": {"perf_counter": 0.0, "wall_ns": 0}},
            "clocks": [{"rank": 0, "offset_s": 0.0, "bound_s": 0.0, "round_trip_s": 0.0, "rounds": 0, "host": "a"},
                       {"rank": 1, "offset_s": 0.0, "bound_s": 1e-4, "round_trip_s": 2e-4, "rounds": 8, "host": "a"}]}


def test_exposed_is_the_wait_after_the_last_bucket_and_the_rest_overlapped() -> None:
    record = rank_record(0, data=0.01, backward=0.02, exposed=0.005, overlap=0.004)
    comm = step_comm(record["comm"], 1)
    assert comm.exposed == pytest.approx(0.005) and comm.buckets == 2 and comm.allreduces == 1
    assert comm.total == pytest.approx(0.009) and comm.overlapped == pytest.approx(0.004)
    summary = summarise_rank(record)
    assert summary.steps == 4 and summary.exposed == pytest.approx(0.005)
    assert summary.buckets["backward"] == pytest.approx(0.020)  # the step's backward less its wait
    assert summary.compute == pytest.approx(summary.step - 0.005)


def test_micro_batches_that_all_reduce_are_counted_and_found() -> None:
    every = summarise_rank(rank_record(0, data=0.0, backward=0.01, exposed=0.002, micro=4, synced_micro=4))
    assert every.backwards_per_step == 4 and every.allreduces_per_step == 4
    once = summarise_rank(rank_record(0, data=0.0, backward=0.01, exposed=0.002, micro=4, synced_micro=1))
    assert once.backwards_per_step == 4 and once.allreduces_per_step == 1
    records = [rank_record(r, data=0.0, backward=0.01, exposed=0.002, micro=4, synced_micro=4) for r in (0, 1)]
    codes = [f.code for f in find_mistakes(records, [summarise_rank(r) for r in records], cores=64)]
    assert "DDP_ACCUMULATION_WITHOUT_NO_SYNC" in codes


def test_a_straggler_is_named_by_its_lead_and_bucket_and_ranks_that_keep_pace_name_none() -> None:
    fast = rank_record(0, data=0.010, backward=0.02, exposed=0.032)  # waits for rank 1 in the all-reduce
    slow = rank_record(1, data=0.040, backward=0.02, exposed=0.002)
    ranks = [summarise_rank(fast), summarise_rank(slow)]
    late = straggler(ranks)
    assert late is not None and late.rank == 1 and late.bucket == "data"
    assert late.lead == pytest.approx(0.030) and late.slowest_steps == late.steps == 4
    even = [rank_record(0, data=0.010, backward=0.02, exposed=0.002),
            rank_record(1, data=0.0105, backward=0.02, exposed=0.0015)]
    assert straggler([summarise_rank(r) for r in even]) is None  # 0.5 ms of a 33 ms step: noise


def test_the_scaling_loss_is_split_into_parts_that_add_up_and_read_as_the_articles_table() -> None:
    one = summarise_rank(rank_record(0, data=0.010, backward=0.02, exposed=0.0005))
    fast = rank_record(0, data=0.012, backward=0.02, exposed=0.034)
    slow = rank_record(1, data=0.040, backward=0.02, exposed=0.006)
    profile = build([fast, slow], "train.py", 2, 4, 1, cores=64)
    profile.scaling = scaling(one, profile.ranks, profile.straggler)
    parts = dict(profile.scaling.parts)
    assert sum(parts.values()) == pytest.approx(profile.scaling.n_step - one.step)
    assert parts["exposed communication"] == pytest.approx(0.006 - 0.0005)
    assert parts["rank 1's lead (the others wait for it)"] == pytest.approx(0.028, abs=1e-3)
    assert parts["data wait"] == pytest.approx(0.002)
    assert profile.scaling.efficiency == pytest.approx(one.step / profile.scaling.n_step)
    text = render_text(profile)
    first = text.splitlines()[0]
    assert f"scaling {profile.scaling.speedup:.2f}x on 2 ({profile.scaling.efficiency:.0%})" in first
    assert "exposed all-reduce" in first and "rank 1's data wait (the others wait for it)" in first
    assert "What scaling lost:" in text and "1 (slowest)" in text
    html = render_html(profile)
    assert "<table" in html and "1 (slowest)" in html and "<script" not in html


def test_every_rank_reading_the_whole_dataset_is_found_from_either_piece_of_evidence() -> None:
    whole = [{"sampler": "RandomSampler", "shards": False, "dataset_size": 1000, "iterable": False}]
    shuffled = [rank_record(r, data=0.01, backward=0.02, exposed=0.002, loaders=whole) for r in (0, 1)]
    same = [rank_record(r, data=0.01, backward=0.02, exposed=0.002) for r in (0, 1)]
    for record in same:
        record["comm"]["input_hashes"] = ["x", "y", "z"]
    fine = [rank_record(r, data=0.01, backward=0.02, exposed=0.002) for r in (0, 1)]
    iterable = [rank_record(r, data=0.01, backward=0.02, exposed=0.002,
                            loaders=[{"sampler": "_InfiniteConstantSampler", "shards": False, "dataset_size": None,
                                      "iterable": True}]) for r in (0, 1)]

    def codes(records: list[dict]) -> set[str]:
        return {f.code for f in find_mistakes(records, [summarise_rank(r) for r in records], cores=64)}

    assert "DDP_SAME_SAMPLES_ON_EVERY_RANK" in codes(shuffled)  # each rank shuffles differently, all of it
    assert "DDP_SAME_SAMPLES_ON_EVERY_RANK" in codes(same)      # byte for byte the same batches
    assert "DDP_SAME_SAMPLES_ON_EVERY_RANK" not in codes(fine)
    assert "DDP_SAME_SAMPLES_ON_EVERY_RANK" not in codes(iterable)  # an IterableDataset shards in its own code


def test_find_unused_parameters_with_none_unused_is_found_only_then() -> None:
    on = [rank_record(r, data=0.01, backward=0.02, exposed=0.002, find_unused=1) for r in (0, 1)]
    off = [rank_record(r, data=0.01, backward=0.02, exposed=0.002, find_unused=0) for r in (0, 1)]
    used = [rank_record(r, data=0.01, backward=0.02, exposed=0.002, find_unused=1) for r in (0, 1)]
    used[1]["comm"]["ddp_logging"][0]["unused_parameter_size"] = 4096
    for records, expected in ((on, True), (off, False), (used, False)):
        found = {f.code for f in find_mistakes(records, [summarise_rank(r) for r in records], cores=64)}
        assert ("DDP_FIND_UNUSED_WITH_NONE_UNUSED" in found) is expected


def test_ranks_and_their_workers_beyond_the_cores_are_found_with_a_count_that_fits() -> None:
    records = [rank_record(r, data=0.01, backward=0.02, exposed=0.002) for r in (0, 1)]
    for record in records:
        record["comm"]["loaders"] = [{"sampler": "DistributedSampler", "shards": True, "dataset_size": 1000,
                                      "iterable": False, "batches": 8, "num_workers": 8}]
    found = {f.code: f for f in find_mistakes(records, [summarise_rank(r) for r in records], cores=8)}
    finding = found["DDP_WORKERS_OVER_CORES"]
    assert finding.evidence == {"ranks on the host": 2, "processes": 18, "cores": 8}
    assert "num_workers=3" in finding.fix[0]
    assert "DDP_WORKERS_OVER_CORES" not in {f.code for f in find_mistakes(records, [summarise_rank(r) for r in records],
                                                                           cores=32)}


def test_a_read_every_step_is_found_on_gpus_only() -> None:
    records = [rank_record(r, data=0.01, backward=0.02, exposed=0.002) for r in (0, 1)]
    for record in records:
        record["profile"]["syncs"] = [{"file": "/home/u/train.py", "line": 41, "source": "print(loss.item())",
                                       "per_step": 1.0}]
    ranks = [summarise_rank(r) for r in records]
    assert "DDP_SYNC_EVERY_STEP" not in {f.code for f in find_mistakes(records, ranks, cores=64)}  # CPU: no wait
    for record in records:
        record["profile"]["device"] = "cuda:0"
    found = {f.code: f for f in find_mistakes(records, ranks, cores=64)}
    assert "train.py:41 reads a value on the host every step (print(loss.item()))" in (
        found["DDP_SYNC_EVERY_STEP"].headline)
    for record in records:
        record["profile"]["syncs"][0]["per_step"] = 0.02  # once every 50 steps
    assert "DDP_SYNC_EVERY_STEP" not in {f.code for f in find_mistakes(records, ranks, cores=64)}


def test_bucket_sizes_far_from_the_gradients_are_found_both_ways() -> None:
    def ranks_with(buckets: int, size: int, exposed: float, backward: float) -> tuple[list[dict], list]:
        records = [rank_record(r, data=0.0, backward=backward, exposed=exposed, buckets=buckets) for r in (0, 1)]
        for record in records:
            for bucket in record["comm"]["buckets"]:
                bucket["bytes"] = size
            record["comm"]["parameters"] = [{"count": 40, "bytes": buckets * size}]
        return records, [summarise_rank(r) for r in records]

    many, summaries = ranks_with(64, 256 << 10, exposed=0.004, backward=0.02)
    found = {f.code: f for f in find_mistakes(many, summaries, cores=64)}
    assert "DDP_MANY_SMALL_BUCKETS" in found and "64 buckets a step of at most 256.0 KiB" in (
        found["DDP_MANY_SMALL_BUCKETS"].headline)
    one, summaries = ranks_with(1, 64 << 20, exposed=0.030, backward=0.040)
    found = {f.code: f for f in find_mistakes(one, summaries, cores=64)}
    assert "DDP_ONE_BUCKET" in found and "bucket_cap_mb=16" in found["DDP_ONE_BUCKET"].fix[0]
    small, summaries = ranks_with(1, 32 << 10, exposed=0.030, backward=0.040)  # a latency: splitting cannot help
    assert not {"DDP_ONE_BUCKET", "DDP_MANY_SMALL_BUCKETS"} & {f.code for f in find_mistakes(small, summaries, 64)}


def test_a_hang_is_ranks_waiting_in_a_collective_not_ranks_still_starting() -> None:
    # A clean clone's CI called three ranks' start-up a hang: 6 s at step 0, nobody in a collective. Nobody waited
    # on anybody; a rank waiting 6 s in an all-reduce for a peer is a hang.
    import time

    from jupyter_gpu.ddpprofile.launch import _waiting_in_a_collective

    now = time.time()
    starting = [{"rank": 0, "step": 0, "collective": None, "since": now - 30, "at": now},
                {"rank": 1, "step": 0, "collective": None, "since": now - 30, "at": now}]
    assert not _waiting_in_a_collective(starting, 6.0)
    waiting = [{**starting[0], "collective": "all_reduce (DDP bucket 0, 35.0 KiB)", "since": now - 7}, starting[1]]
    assert _waiting_in_a_collective(waiting, 6.0)
    just_entered = [{**starting[0], "collective": "all_reduce (DDP bucket 0, 35.0 KiB)", "since": now - 1}]
    assert not _waiting_in_a_collective(just_entered, 6.0)
