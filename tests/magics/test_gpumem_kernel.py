"""%gpumem in a real ipykernel, where users hit these leaks: a displayed tensor kept by the output cache after
`%reset -f out` (the hidden `_`), and an out-of-memory traceback keeping the failed step's locals. Both are named,
both are given back, and the weak references die, without restarting the kernel."""

from __future__ import annotations

from jupyter_client.manager import start_new_kernel
from kernel_messages import run

SETUP = """
%load_ext jupyter_gpu
import gc, weakref, torch
shown = torch.randn(1024, 512)
"""
FAILING = """
def failing_step():
    activations = torch.randn(1024, 1024)
    return torch.empty(1 << 50)  # the CPU allocator refuses: a real out-of-memory error
failing_step()
"""


def texts(messages: list[dict]) -> str:
    parts = []
    for message in messages:
        content = message["content"]
        parts.append(content.get("text", ""))
        parts.append(content.get("data", {}).get("text/plain", ""))
        parts.append(content.get("evalue", ""))
    return "\n".join(parts)


def test_the_hidden_underscore_and_a_failed_steps_locals_are_named_and_given_back() -> None:
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        run(client, SETUP)
        run(client, "shown")
        run(client, "ref_shown = weakref.ref(shown); del shown")
        run(client, "%reset -f out")
        failed = run(client, FAILING)
        assert "can't allocate memory" in texts(failed)
        run(client, "import sys, traceback\n"
                    "[frame] = [f for f, _ in traceback.walk_tb(sys.last_traceback) if f.f_code.co_name != '<module>'"
                    " and 'activations' in f.f_locals]\n"
                    "ref_local = weakref.ref(frame.f_locals['activations']); del frame")
        report = texts(run(client, "%gpumem"))
        assert "hidden _" in report
        assert "last error: frame failing_step, local activations" in report
        assert "CUDA is not initialised" in report
        freed = texts(run(client, "%gpumem --free outputs\n%gpumem --free traceback"))
        assert "gave back 2.0 MiB on cpu" in freed and "gave back 4.0 MiB on cpu" in freed
        alive = texts(run(client, "gc.collect(); print('alive', ref_shown() is not None, ref_local() is not None)"))
        assert "alive False False" in alive
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
