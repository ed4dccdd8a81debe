"""Which code is the user's: the rule behind every "your line" a report names and every object a probe rewinds."""

from __future__ import annotations

import logging
import os

import torch

import jupyter_gpu
from jupyter_gpu.probekit.library_code import is_library_file, library_code_prefixes


def test_notebook_cells_and_the_users_own_files_are_the_users(tmp_path):
    own = tmp_path / "train_lib.py"
    own.write_text("x = 1\n")
    assert not is_library_file(str(own), torch)
    assert not is_library_file("<ipython-input-3-5f2d1c>", torch)
    assert not is_library_file("<string>", torch)


def test_torch_the_standard_library_installed_packages_and_this_package_are_libraries():
    assert is_library_file(torch.nn.functional.__file__, torch)
    assert is_library_file(logging.__file__)
    assert is_library_file(jupyter_gpu.__file__)
    assert is_library_file("<frozen runpy>")
    # An installed package seen by its folder's name, even outside this interpreter's lists (a wheel unpacked on
    # PYTHONPATH, another environment's site-packages).
    assert is_library_file(os.path.join(os.sep, "elsewhere", "env", "site-packages", "wandb", "sdk.py"))


def test_the_hot_path_prefixes_agree_with_the_rule_for_raw_code_file_names(tmp_path):
    prefixes = library_code_prefixes(torch)
    assert torch.nn.modules.module.__file__.startswith(prefixes)
    assert logging.__file__.startswith(prefixes)
    assert "<frozen importlib._bootstrap>".startswith(prefixes)
    assert not str(tmp_path / "cell.py").startswith(prefixes)
    # Each folder ends in a separator: this package's folder does not cover a sibling of a longer name.
    package = os.path.dirname(os.path.abspath(jupyter_gpu.__file__))
    assert not os.path.join(package + "-notes", "mine.py").startswith(prefixes)
