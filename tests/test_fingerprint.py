"""probekit.fingerprint: each kind of thing a probe must leave as it was is seen to move, and named by what moved;
what is back (also by a restore that copies the bytes back into the same objects) compares equal. Real CPU torch."""

from __future__ import annotations

import random

import numpy as np
import torch
from torch import nn

from jupyter_gpu.probekit.fingerprint import GLOBAL_RNG, Custom, Fingerprint, device_checksum, sampler_of
from jupyter_gpu.probekit.reach import Reached


def trained() -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2)


def step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()


def test_nothing_moved_verifies_every_claim_in_order() -> None:
    model, opt, sched = trained()
    check = Fingerprint.take([("model", model), ("opt", opt), ("sched", sched), ("RNG", GLOBAL_RNG)])
    verdict = check.verify()
    assert verdict.restored == ["model", "opt", "sched", "RNG"] and verdict.changes == []


def test_a_training_step_moves_each_object_and_says_what() -> None:
    model, opt, sched = trained()
    check = Fingerprint.take([("model", model), ("opt", opt), ("sched", sched), ("RNG", GLOBAL_RNG)])
    step(model, opt)
    sched.step()
    verdict = check.verify()
    assert verdict.restored == []
    lines = verdict.not_restored
    assert lines[0].startswith("model (Sequential): ") and "weights" in lines[0] and "buffers" in lines[0], lines
    assert lines[1] == "opt (Adam): state created for 4 parameters, not restored", lines
    assert lines[2] == "sched (StepLR): last_epoch 0 → 1, not restored", lines
    assert lines[3] == "RNG (global random generators): torch generator advanced, not restored", lines


def test_bytes_copied_back_into_the_same_tensors_verify() -> None:
    model, _, _ = trained()
    saved = [p.detach().clone() for p in model.parameters()]
    check = Fingerprint.take([("model", model)])
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
        for param, copy in zip(model.parameters(), saved, strict=True):
            param.copy_(copy)
    assert check.verify().restored == ["model"]


def test_one_flipped_bit_and_a_swap_are_seen_on_the_cpu_and_by_the_device_rule() -> None:
    weights = torch.randn(1000)
    check = Fingerprint.take([("w", weights)])
    before = int(device_checksum(torch, weights.view(torch.int32)))
    weights.view(torch.int32)[17] ^= 1
    assert check.verify().not_restored == ["w (Tensor): value changed, not restored"]
    assert int(device_checksum(torch, weights.view(torch.int32))) != before
    weights.view(torch.int32)[17] ^= 1
    swapped = weights.clone()
    swapped[[3, 4]] = weights[[4, 3]]
    assert int(device_checksum(torch, swapped.view(torch.int32))) != before
    assert int(device_checksum(torch, weights.view(torch.int32))) == before


def test_generators_of_every_library_by_their_own_words() -> None:
    gens = [torch.Generator().manual_seed(1), np.random.default_rng(2), np.random.RandomState(3), random.Random(4)]
    reached = [Reached(f"g{i}", g, "generator") for i, g in enumerate(gens)]
    check = Fingerprint.take([], reached)
    torch.rand(2, generator=gens[0])
    gens[1].random()
    gens[2].rand()
    gens[3].random()
    assert check.verify().not_restored == [
        "g0 (torch Generator): advanced, not restored", "g1 (NumPy Generator): advanced, not restored",
        "g2 (NumPy RandomState): advanced, not restored", "g3 (random.Random): advanced, not restored"]
    assert check.reached_generators() == ["g0", "g1", "g2", "g3"]


def test_variables_by_binding_length_and_value() -> None:
    ns = {"global_step": 14, "losses": [0.5], "history": {"train": [1.0]}, "name": "run"}
    reached = [Reached(name, value, "variable") for name, value in ns.items()]
    check = Fingerprint.take([], reached, namespace=ns)
    ns["global_step"] = 38
    ns["losses"].extend([0.4, 0.3])
    ns["history"]["train"].append(0.9)
    del ns["name"]
    verdict = check.verify(["global_step", "losses", "history['train']"])
    assert verdict.restored == []
    assert verdict.not_restored == ["global_step (int): 14 → 38, not restored",
                                    "losses (list): length 1 → 3, not restored",
                                    "history (dict): value changed, not restored",
                                    "name (str): deleted, not restored"]


def test_a_claimed_attribute_is_checked_by_its_variable_and_unknown_names_are_not_claimed() -> None:
    class Trainer:
        def __init__(self) -> None:
            self.global_step = 3

    trainer = Trainer()
    check = Fingerprint.take([], [Reached("trainer", trainer, "variable")], namespace={"trainer": trainer})
    assert check.verify(["trainer.global_step", "never_seen"]).restored == ["trainer.global_step"]
    trainer.global_step = 4
    verdict = check.verify(["trainer.global_step"])
    assert verdict.restored == [] and verdict.not_restored == ["trainer (Trainer): value changed, not restored"]


def test_the_sampler_claim_and_a_custom_reader() -> None:
    gen = torch.Generator().manual_seed(0)
    loader = torch.utils.data.DataLoader(list(range(10)), shuffle=True, generator=gen)
    flags = {"tf32": False}
    check = Fingerprint.take([("sampler", sampler_of(loader)), ("global flags", Custom("switches",
                                                                                       lambda: flags["tf32"]))])
    list(loader)
    flags["tf32"] = True
    assert check.verify().not_restored == ["sampler (sampler and its generators): state changed, not restored",
                                           "global flags (switches): state changed, not restored"]


def test_a_training_object_claimed_and_reached_is_checked_once_under_the_claims_name() -> None:
    model, opt, _ = trained()
    check = Fingerprint.take([("opt", opt)], [Reached("train_step_fn → optimizer", opt, "optimizer"),
                                              Reached("model", model, "module")])
    step(model, opt)
    names = [change.path for change in check.verify().changes]
    assert names == ["opt", "model"]
