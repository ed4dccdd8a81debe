"""The IPython surfaces, one module per magic (as IPython keeps `core/magics/<topic>.py`), plus the cell glue
(`cell`) and the progress line (`progress`) they share. Each magic parses, calls its feature, displays the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.magic import Magics

# What `%load_ext jupyter_gpu` registers and `%unload_ext` removes: only magics that exist.
MAGIC_NAMES = {"line": ["gpucheck", "gputime", "batchprobe", "gpupanel", "dataprobe", "speedprobe", "gpumem",
                        "gpuprofile", "gpucells"],
               "cell": ["gputime", "batchprobe", "gpuprofile"]}


def magic_classes() -> list[type[Magics]]:
    from jupyter_gpu.magics.batchprobe import BatchProbeMagics
    from jupyter_gpu.magics.dataprobe import DataProbeMagics
    from jupyter_gpu.magics.gpucells import GpuCellsMagics
    from jupyter_gpu.magics.gpucheck import GpuCheckMagics
    from jupyter_gpu.magics.gpumem import GpuMemMagics
    from jupyter_gpu.magics.gpupanel import GpuPanelMagics
    from jupyter_gpu.magics.gpuprofile import GpuProfileMagics
    from jupyter_gpu.magics.gputime import GpuTimeMagics
    from jupyter_gpu.magics.speedprobe import SpeedProbeMagics

    return [GpuCheckMagics, GpuTimeMagics, BatchProbeMagics, GpuPanelMagics, DataProbeMagics, SpeedProbeMagics,
            GpuMemMagics, GpuProfileMagics, GpuCellsMagics]
