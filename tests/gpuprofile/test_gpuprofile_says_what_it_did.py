"""Issue 52, point 3: %%gpuprofile says in its first lines what it did to the cell. A 3-epoch training cell returned
after about 1.5 s, its epoch prints never appeared, and nothing in the report said that the loop was stopped after
the warm-up and profiled steps and the model, optimizer and RNG put back: a user who missed the docs believed the
model trained.

Cells (public loops, tests/fixtures/public_loops.py): the CIFAR-10 tutorial's two-epoch loop (stopped, put back),
the same with --keep (stopped, kept), and the Quickstart's train() over a loader shorter than the profile (the cell
ends by itself). First run, before the change: 3 of 3 failed (no such line).
"""

from __future__ import annotations

from loop_checks import profile
from public_loops import CIFAR, CIFAR_RUN, QUICKSTART, QUICKSTART_RUN

from jupyter_gpu.gpuprofile.render import render_html, render_text


def first_lines(result, count: int = 3) -> str:
    return "\n".join(render_text(result).splitlines()[:count])


def test_a_stopped_loop_says_so_and_that_the_cell_did_not_train(ip) -> None:
    result = profile(ip, CIFAR, CIFAR_RUN)
    head = first_lines(result)
    assert "stopped the loop after" in head.lower(), head
    assert "1 warm-up" in head and "3 profiled" in head, head
    assert all(name in head for name in ("net", "optimizer", "RNG")) and "put back" in head, head
    assert "so the cell did not train" in head and "--keep" in head, head
    assert "of the 2 epochs" not in head  # it does not guess what it did not count
    # In the notebook too: the line right under the headline.
    assert "so the cell did not train" in render_html(result).split("</div>")[1]


def test_with_keep_it_says_the_steps_are_kept(ip) -> None:
    result = profile(ip, CIFAR, CIFAR_RUN.replace("--warmup 1", "--warmup 1 --keep"))
    head = first_lines(result)
    assert "stopped the loop after" in head.lower(), head
    assert "kept" in head and "did not train" not in head, head


def test_a_cell_that_ends_by_itself_is_not_said_to_be_stopped(ip) -> None:
    # 640 samples in batches of 64: 10 optimizer steps, fewer than 2 warm-up + 20 profiled + the traced steps.
    result = profile(ip, QUICKSTART, QUICKSTART_RUN.replace("--steps 3", "--steps 20").replace("--warmup 1",
                                                                                             "--warmup 2"))
    head = first_lines(result)
    assert "stopped the loop" not in head.lower(), head
    assert "the cell ran to its end" in head.lower() and "put back" in head, head
