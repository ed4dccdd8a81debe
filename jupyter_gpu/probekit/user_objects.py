"""Which objects in the notebook are the user's own: instances of a class the user (or a training-loop library)
wrote, such as a `Trainer` holding `self.model`, `self.optimizer` and `self.global_step`. The probes look inside
them for training objects and loaders (`training_state`), and put back the attributes a step changes on them
(`step_variables`). Importing this module imports nothing heavy.
"""

from __future__ import annotations

import inspect

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
