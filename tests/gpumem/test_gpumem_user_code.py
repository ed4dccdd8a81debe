"""Memory the user's own code holds outside the notebook's variables is named too (issue 29, points 7-9): the
entries of a `functools.lru_cache`'d function (with `cache_clear()` offered as the release), the globals of a module
imported from the user's own folder, and the tensor a NumPy array made by `.numpy()` keeps alive through its `.base`.

Each case runs in a real IPython shell with real CPU torch. What the case holds is counted apart from %gpumem, by
the dispatch-mode `StorageCounter` %batchprobe budgets with (it sees every storage the case's cells allocate). None
of these holders may be left in the remainder that the report labels as held by objects the walk does not enter
("library objects", before this was fixed): they are the user's own function, module and array.
"""

from __future__ import annotations

import functools
import gc
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from gpumem_cases import notebook_on, run

from jupyter_gpu.batchprobe.budget import StorageCounter
from jupyter_gpu.gpumem.runner import map_memory

MIB = 1024 * 1024


@pytest.fixture
def notebook(shell):
    with notebook_on(shell, "cpu") as ready:
        yield ready


@contextmanager
def counted(cells: list[str], notebook) -> Iterator[StorageCounter]:
    """Run the cells while a counter sees every storage they allocate; the counter is closed afterwards."""
    counter = StorageCounter(torch, "cpu")
    try:
        with counter.trial():
            for cell in cells:
                run(notebook, cell)
        yield counter
    finally:
        counter.close()


def named_share(memory, held: dict[int, int]) -> float:
    """The share of the bytes the case holds that the map names by a path."""
    named = sum(entry.bytes for entry in memory.on("cpu") if entry.address in held)
    return named / sum(held.values())


def nothing_left_unnamed(memory) -> bool:
    """No remainder says the memory is held outside the notebook's names, or by a library."""
    text = str(memory)
    return memory.devices[0].unreached_bytes < MIB and "outside the notebook's names" not in text \
        and "librar" not in text


def all_names(memory) -> set[str]:
    return {name for entry in memory.entries for name in entry.names}


# 7. A functools.lru_cache'd function ----------------------------------------------------------------------------

LRU_CELL = """
import functools
@functools.lru_cache(maxsize={maxsize})
def class_prototype(k, scale=1.0):
    return torch.randn(512, 1024) * scale
class_prototype(3); class_prototype(4, scale=2.0); class_prototype('dog'); class_prototype((1, 2));
"""


@pytest.mark.parametrize("maxsize", ["None", "8"], ids=["unbounded cache", "bounded cache"])
def test_an_lru_cached_functions_entries_are_named_and_cache_clear_gives_them_back(notebook, maxsize: str) -> None:
    with counted([LRU_CELL.format(maxsize=maxsize)], notebook) as counter:
        held = counter.leftovers()
        assert sum(held.values()) >= 8 * MIB, "four 2 MiB results are cached"

        memory = notebook.run_line_magic("gpumem", "-o -q")
        assert named_share(memory, held) >= 0.99, memory.entries
        assert {"class_prototype.cache[3]", "class_prototype.cache[(4, scale=2.0)]",
                "class_prototype.cache['dog']", "class_prototype.cache[((1, 2),)]"} <= all_names(memory)
        text = str(memory)
        assert nothing_left_unnamed(memory), text
        assert "class_prototype.cache_clear()" in text  # the release is offered, with what the cache holds
        assert "class_prototype.cache_clear()" in memory._repr_html_()
        [release] = memory.releases
        assert (release.line, release.bytes) == ("class_prototype.cache_clear()", 4 * 512 * 1024 * 4)

        run(notebook, release.line)  # the line the map offers, typed as the user would
        gc.collect()
        assert sum(counter.leftovers().values()) <= MIB
        run(notebook, "assert class_prototype(5).shape == (512, 1024)")  # the function stays


def test_reading_a_cache_runs_none_of_the_users_code() -> None:
    class Loud:
        """An argument whose methods a careless reader of the cache would call."""

        def __repr__(self) -> str:
            raise AssertionError("repr ran")

        def __eq__(self, other: object) -> bool:
            raise AssertionError("eq ran")

        __hash__ = object.__hash__

    @functools.lru_cache(maxsize=2)
    def scaled(arg, k):
        return torch.ones(256, 256) * k

    loud = Loud()
    scaled(loud, 1)
    scaled(loud, 2)
    scaled(loud, 3)  # the bounded cache drops the oldest
    memory = map_memory({"scaled": scaled})
    names = all_names(memory)
    assert {"scaled.cache[(<Loud>, 2)]", "scaled.cache[(<Loud>, 3)]"} <= names
    assert memory.releases[0].bytes == 2 * 256 * 256 * 4


def test_freeing_an_lru_cached_function_says_cache_clear_keeps_it(notebook) -> None:
    with counted([LRU_CELL.format(maxsize="None")], notebook) as counter:
        report = notebook.run_line_magic("gpumem", "--free class_prototype -o -q")
        gc.collect()
        assert sum(counter.leftovers().values()) <= MIB
        assert any("class_prototype.cache_clear()" in line for line in report.next_time), report.next_time


# 8. A global of the user's own module -----------------------------------------------------------------------------

FEATSTORE = """
import functools
import torch

CACHE = {"user_feats": torch.randn(1024, 1024)}

@functools.cache
def prototype(k):
    return torch.randn(512, 512)
"""


@pytest.fixture
def user_module(tmp_path) -> Iterator[str]:
    """featstore.py in a folder of the user's own (outside the interpreter's and site-packages' folders)."""
    (tmp_path / "featstore.py").write_text(textwrap.dedent(FEATSTORE))
    sys.path.insert(0, str(tmp_path))
    try:
        yield "featstore"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("featstore", None)
        gc.collect()


def test_a_global_of_the_users_own_module_is_named_by_its_module(notebook, user_module: str) -> None:
    with counted(["import featstore\nfeatstore.prototype(1);"], notebook) as counter:
        held = counter.leftovers()
        assert sum(held.values()) >= 5 * MIB

        memory = notebook.run_line_magic("gpumem", "-o -q")
        assert named_share(memory, held) >= 0.99, memory.entries
        assert memory.entry("featstore.CACHE['user_feats']").bytes == 4 * MIB
        assert "featstore.prototype.cache[1]" in all_names(memory)
        text = str(memory)
        assert nothing_left_unnamed(memory), text
        assert "featstore.prototype.cache_clear()" in text


def test_only_modules_from_outside_the_interpreters_folders_are_roots(user_module: str) -> None:
    import featstore  # noqa: F401 - imported as the notebook would

    from jupyter_gpu.gpumem.roots import module_roots

    modules = {root.path.rsplit(".", 1)[0] for root in module_roots({})}
    assert "featstore" in modules
    assert not modules & {"torch", "torch.nn", "numpy", "functools", "json", "IPython", "jupyter_gpu"}


# 9. A NumPy array made by .numpy() ----------------------------------------------------------------------------------

def test_a_numpy_array_names_the_tensor_storage_it_keeps_alive(notebook) -> None:
    with counted(["""
encoder = nn.Linear(256, 2048)
with torch.no_grad():
    embeddings = encoder(torch.randn(512, 256)).numpy()
first_rows = embeddings[:8]
"""], notebook) as counter:
        held = counter.leftovers()
        memory = notebook.run_line_magic("gpumem", "-o -q")
        assert named_share(memory, held) >= 0.99, memory.entries
        entry = memory.entry("embeddings (NumPy array)")
        assert (entry.bytes, entry.shape) == (512 * 2048 * 4, (512, 2048))
        assert "first_rows (NumPy array)" in entry.names  # a view of the array reaches the same storage
        assert memory.coverage["cpu"] >= 0.99
        assert nothing_left_unnamed(memory), str(memory)

        notebook.run_line_magic("gpumem", "--free embeddings first_rows -o -q")
        gc.collect()
        assert sum(counter.leftovers().values()) == (256 + 1) * 2048 * 4  # the encoder's weight and bias stay
