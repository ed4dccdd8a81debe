"""`LoaderSettings`: one DataLoader configuration, its keyword arguments as torch accepts them, and the line to
paste. Checked against a real `torch.utils.data.DataLoader`."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from jupyter_gpu.dataprobe import decide
from jupyter_gpu.dataprobe.settings import DEFAULT_PREFETCH, LoaderSettings

EVERY_SWEPT_SETTING = sorted({
    *decide.first_stage([0, 1, 2, 4], pin_memory=False),
    *decide.first_stage([0, 1, 2, 4], pin_memory=True),
    *decide.second_stage(decide.first_stage([0, 1, 2], pin_memory=True), gpu=True),
    *decide.second_stage(decide.first_stage([0, 1, 2], pin_memory=False), gpu=False),
})


@pytest.fixture(scope="module")
def dataset() -> TensorDataset:
    return TensorDataset(torch.arange(40, dtype=torch.float32).reshape(20, 2), torch.arange(20))


def test_without_workers_prefetch_and_persistence_are_normalised_away() -> None:
    assert LoaderSettings(0, prefetch_factor=4, persistent_workers=True) == LoaderSettings(0)
    assert LoaderSettings(0, 4, True).prefetch_factor is None and not LoaderSettings(0, 4, True).persistent_workers
    assert LoaderSettings(0, pin_memory=True) != LoaderSettings(0)  # pinning matters without workers too
    assert len({LoaderSettings(0, 2, True), LoaderSettings(0, 4, False), LoaderSettings(0)}) == 1


def test_workers_get_torchs_default_prefetch() -> None:
    assert LoaderSettings(2).prefetch_factor == DEFAULT_PREFETCH == 2
    assert LoaderSettings(2) == LoaderSettings(2, 2)


def test_negative_workers_are_refused() -> None:
    with pytest.raises(ValueError, match="num_workers must be 0 or more, not -1"):
        LoaderSettings(-1)


def test_cost_orders_fewer_workers_then_shallower_queues_then_no_pinning_first() -> None:
    order = sorted([LoaderSettings(4), LoaderSettings(2, 4), LoaderSettings(2, pin_memory=True), LoaderSettings(2),
                    LoaderSettings(0)], key=lambda s: s.cost)
    assert order == [LoaderSettings(0), LoaderSettings(2), LoaderSettings(2, pin_memory=True), LoaderSettings(2, 4),
                     LoaderSettings(4)]
    # Persistent workers cost less than workers restarted every epoch (start-up paid once).
    assert LoaderSettings(2, persistent_workers=True).cost < LoaderSettings(2, persistent_workers=False).cost


def test_torch_refuses_a_prefetch_factor_without_workers_which_is_why_kwargs_leaves_it_out(
        dataset: TensorDataset) -> None:
    with pytest.raises(ValueError, match="prefetch_factor"):
        DataLoader(dataset, num_workers=0, prefetch_factor=2)
    assert LoaderSettings(0, 2, True).kwargs() == {"num_workers": 0, "pin_memory": False}


# The sweep goes up to the CPUs of the machine it runs on; on this 2-core one torch warns about 4 workers.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("settings", EVERY_SWEPT_SETTING, ids=lambda s: s.label())
def test_every_swept_setting_builds_a_real_dataloader_with_those_settings(
        settings: LoaderSettings, dataset: TensorDataset) -> None:
    loader = DataLoader(dataset, batch_size=4, **settings.kwargs())
    assert loader.num_workers == settings.num_workers
    assert loader.pin_memory == settings.pin_memory
    assert loader.persistent_workers == settings.persistent_workers
    assert loader.prefetch_factor == settings.prefetch_factor


@pytest.mark.parametrize("settings", [LoaderSettings(0), LoaderSettings(1, 4, persistent_workers=True),
                                      LoaderSettings(2, 2, persistent_workers=False)], ids=lambda s: s.label())
def test_a_loader_built_from_kwargs_yields_every_sample(settings: LoaderSettings, dataset: TensorDataset) -> None:
    loader = DataLoader(dataset, batch_size=4, **settings.kwargs())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about a bad worker count or pinning without a device
        features = torch.cat([batch[0] for batch in loader])
    assert torch.equal(features, dataset.tensors[0])


def test_kwargs_of_a_setting_with_workers() -> None:
    assert LoaderSettings(4, 4, persistent_workers=True, pin_memory=True).kwargs() == {
        "num_workers": 4, "pin_memory": True, "prefetch_factor": 4, "persistent_workers": True}


@pytest.mark.parametrize(("settings", "arguments"), [
    (LoaderSettings(4, 2, persistent_workers=True, pin_memory=True),
     "num_workers=4, pin_memory=True, persistent_workers=True"),
    (LoaderSettings(2, 4), "num_workers=2, prefetch_factor=4"),
    (LoaderSettings(1), "num_workers=1"),
    (LoaderSettings(0, pin_memory=True), "num_workers=0, pin_memory=True"),
    (LoaderSettings(0, 4, True), "num_workers=0"),
])
def test_code_is_the_line_to_paste(settings: LoaderSettings, arguments: str) -> None:
    assert settings.code("train_loader") == f"train_loader = DataLoader(..., {arguments})  # keep your other arguments"
    assert settings.code().startswith("loader = DataLoader(")


def test_the_pasted_arguments_build_the_recommended_loader(dataset: TensorDataset) -> None:
    settings = LoaderSettings(2, 4, persistent_workers=True, pin_memory=True)
    arguments = settings.code().split("DataLoader(..., ")[1].split(")")[0]
    loader = eval(f"DataLoader(dataset, batch_size=4, {arguments})", {"DataLoader": DataLoader, "dataset": dataset})
    assert (loader.num_workers, loader.prefetch_factor, loader.persistent_workers, loader.pin_memory) == (
        2, 4, True, True)


@pytest.mark.parametrize(("settings", "label"), [
    (LoaderSettings(0), "0 workers (main process)"),
    (LoaderSettings(0, pin_memory=True), "0 workers (main process) · pinned"),
    (LoaderSettings(1), "1 worker · prefetch 2"),
    (LoaderSettings(4, 4, persistent_workers=True, pin_memory=True), "4 workers · prefetch 4 · persistent · pinned"),
])
def test_label(settings: LoaderSettings, label: str) -> None:
    assert settings.label() == label


def test_to_dict() -> None:
    assert LoaderSettings(2, persistent_workers=True).to_dict() == {
        "num_workers": 2, "prefetch_factor": 2, "persistent_workers": True, "pin_memory": False}
