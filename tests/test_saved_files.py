"""`SavedFiles`: what a profiled loop writes with torch.save is put back, for real on disk."""

from __future__ import annotations

import io
import os

import torch

from jupyter_gpu.probekit.saved_files import SavedFiles


def test_an_old_file_comes_back_a_new_one_goes_and_a_file_object_is_left_alone(tmp_path) -> None:
    kept, made = tmp_path / "best.pt", tmp_path / "ckpt" / "epoch1.pt"
    kept.write_bytes(b"old")
    made.parent.mkdir()
    buffer = io.BytesIO()
    real_save = torch.save
    with SavedFiles(torch) as saves:
        torch.save({"w": torch.ones(2)}, str(kept))
        torch.save({"w": torch.ones(2)}, kept)  # again, as a Path: the old file is still the one kept aside
        torch.serialization.save({"w": torch.zeros(1)}, made)
        torch.save({"w": torch.zeros(1)}, buffer)
        assert torch.load(kept)["w"].tolist() == [1.0, 1.0]  # the loop reads what it wrote
    assert torch.save is real_save and torch.serialization.save is real_save
    assert kept.read_bytes() == b"old" and not made.exists()
    assert sorted(os.listdir(tmp_path)) == ["best.pt", "ckpt"]
    assert saves.restored == [str(kept), str(made)] and saves.failed == []
    assert torch.load(io.BytesIO(buffer.getvalue()))["w"].tolist() == [0.0]


def test_restoring_twice_puts_back_the_saves_made_in_between(tmp_path) -> None:
    path = tmp_path / "last.pt"
    path.write_bytes(b"old")
    with SavedFiles(torch) as saves:
        torch.save(1, path)
        saves.restore()
        assert path.read_bytes() == b"old"
        torch.save(2, path)  # a second run of the loop
    assert path.read_bytes() == b"old" and saves.restored == [str(path)]


def test_a_file_that_cannot_be_put_back_is_named_with_where_the_old_one_is(tmp_path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    path = folder / "best.pt"
    path.write_bytes(b"old")
    with SavedFiles(torch) as saves:
        torch.save(1, path)
        path.unlink()
        path.mkdir()  # a directory now stands where the file was: os.replace cannot put the file there
        (path / "x").write_text("x")
    assert len(saves.failed) == 1 and str(path) in saves.failed[0] and ".best.pt.jupyter-gpu-" in saves.failed[0]
    backup = next(folder.glob(".best.pt.jupyter-gpu-*.bak"))
    assert backup.read_bytes() == b"old"

