"""The autoload block in an environment's ipython_kernel_config.py: merged into what is there, removed alone."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from jupyter_gpu.autoload.config import BEGIN, END, add_block, config_file, read_block, remove_block
from jupyter_gpu.autoload.install import AutoloadError, read_state, switch_off, switch_on

USER_CONFIG = """c = get_config()  # noqa
c.IPKernelApp.extensions = ["my_extension"]
c.InteractiveShell.colors = "linux"
"""


def test_the_file_is_the_one_ipython_reads_for_every_kernel_of_the_environment(tmp_path):
    from IPython.core import application

    assert config_file(tmp_path) == tmp_path / "etc" / "ipython" / "ipython_kernel_config.py"
    # IPython's own list of the folders it reads has this environment's: the same rule, checked on IPython.
    assert os.path.dirname(config_file(sys.prefix)) in application.ENV_CONFIG_DIRS + application.SYSTEM_CONFIG_DIRS


def test_adding_keeps_the_users_lines_and_puts_the_block_last():
    merged = add_block(USER_CONFIG, watch=False)
    assert merged.startswith(USER_CONFIG)
    assert merged.rstrip().endswith(END)
    assert 'c.IPKernelApp.extensions.append("jupyter_gpu.autoload")' in merged
    assert read_block(merged).on and not read_block(merged).watch


def test_adding_twice_changes_nothing_and_watch_rewrites_the_block_in_place():
    once = add_block(USER_CONFIG, watch=False)
    assert add_block(once, watch=False) == once
    watched = add_block(once, watch=True)
    assert watched.count(BEGIN) == 1 and read_block(watched).watch
    assert watched.startswith(USER_CONFIG)
    assert add_block(watched, watch=False) == once  # `on` without --watch turns the sampler setting off again


def test_removing_takes_only_our_block_and_restores_the_file():
    assert remove_block(add_block(USER_CONFIG, watch=True)) == USER_CONFIG
    after = "c.InteractiveShell.autocall = 1\n"
    edited = add_block(USER_CONFIG, watch=False) + after  # the user appended a line after our block
    assert remove_block(edited) == USER_CONFIG + after
    assert remove_block(USER_CONFIG) == USER_CONFIG
    assert remove_block(add_block("", watch=False)) == ""


def test_a_block_that_lost_its_end_marker_is_refused_not_guessed(tmp_path):
    broken = USER_CONFIG + BEGIN + "\nc.IPKernelApp.extensions.append('jupyter_gpu.autoload')\n"
    path = config_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    for action in (lambda: switch_on(tmp_path, watch=False), lambda: switch_off(tmp_path),
                   lambda: read_state(tmp_path)):
        with pytest.raises(AutoloadError, match="fix or delete it by hand"):
            action()
    assert path.read_text() == broken


def test_switching_on_and_off_in_an_environment_folder(tmp_path):
    path = config_file(tmp_path)
    change = switch_on(tmp_path, watch=False)
    assert change.changed and path.is_file() and read_state(tmp_path)[1].on
    assert not switch_on(tmp_path, watch=False).changed
    off = switch_off(tmp_path)
    assert off.changed and off.file_removed and not path.exists()  # nothing else was in it
    assert not switch_off(tmp_path).changed


def test_switching_off_keeps_a_shared_file_and_its_mode(tmp_path):
    path = config_file(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(USER_CONFIG)
    path.chmod(0o600)
    switch_on(tmp_path, watch=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_state(tmp_path)[1].watch
    off = switch_off(tmp_path)
    assert off.changed and not off.file_removed
    assert path.read_text() == USER_CONFIG
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind


def test_a_missing_or_unwritable_environment_is_one_sentence(tmp_path):
    with pytest.raises(AutoloadError, match=r"There is no environment at .*nope: pass --prefix"):
        switch_on(tmp_path / "nope", watch=False)
    (tmp_path / "etc").write_text("")  # a file where the folder must go: unwritable even for root
    with pytest.raises(AutoloadError, match=r"Cannot write .*ipython_kernel_config.py .*or pass --prefix"):
        switch_on(tmp_path, watch=False)
