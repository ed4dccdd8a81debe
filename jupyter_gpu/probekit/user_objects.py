"""Which objects in the notebook are the user's own: instances of a class the user (or a training-loop library)
wrote, such as a `Trainer` holding `self.model`, `self.optimizer` and `self.global_step`. The probes look inside
them for training objects and loaders (`training_state`), and put back the attributes a step changes on them
(`step_variables`), but only on objects of classes the user wrote: a library's objects (a wandb run, a logging
Logger, a library Trainer) keep state outside Python too (a server's step counter, the logger registry), which a
rewind would put out of step. Importing this module imports nothing heavy.
"""

from __future__ import annotations

import inspect
import os
import sys

from jupyter_gpu.probekit.library_code import is_library_file

# Objects whose attributes are never training state of the user's: the shell's own, and torch's and the standard
# library's (a DataLoader's attributes are its dataset and sampler; torch's training objects are found themselves).
_FOREIGN_MODULES = ("builtins", "IPython", "ipykernel", "jupyter_client", "traitlets", "torch", "typing", "types",
                    "collections", "functools", "jupyter_gpu", "numpy", "pandas", "matplotlib", "tqdm")


def holds_attributes(value: object) -> bool:
    """An instance of a class of the user's (or of a library's training loop, such as a Trainer), whose attributes
    may hold the model, optimizer and scheduler: not a class, module or function, and not of a class from torch (a
    model's own attributes are its parameters and submodules) or the shell."""
    if isinstance(value, type) or inspect.ismodule(value) or inspect.isroutine(value):
        return False
    try:
        attributes = vars(value)
    except TypeError:  # no __dict__ (slots, builtins)
        return False
    foreign = any((getattr(cls, "__module__", "") or "").split(".")[0] in _FOREIGN_MODULES
                  for cls in type(value).__mro__ if cls is not object)
    return isinstance(attributes, dict) and not foreign


def written_by_the_user(value: object) -> bool:
    """An object `holds_attributes` accepts whose class the user wrote: in the notebook (`__main__`) or in a file
    outside the standard library and the installed packages (their own `train_lib.py`, an editable install's
    source)."""
    if not holds_attributes(value):
        return False
    name = getattr(type(value), "__module__", "") or ""
    if name == "__main__":
        return True  # the notebook's classes (or a script's, run by python)
    path = getattr(sys.modules.get(name), "__file__", None)
    return path is not None and not is_library_file(os.path.abspath(path))
