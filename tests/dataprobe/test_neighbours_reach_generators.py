"""Issue 50, cause 1 (%dataprobe): the generators a loader reaches below its top level, through `random_split`/
`Subset`/`ConcatDataset`, a collator object, a dataset's transform, and a notebook global its `__getitem__` names,
are put back after the probe. Each case is written as its public source writes it; real IPython shell, real
DataLoader workers (`--workers 0,2`), real CPU torch and NumPy. What a user notices: the next draw of each generator
after the probe is the one they would have had without it.
"""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from jupyter_gpu.dataprobe.result import DataProbeResult


def dataprobe(ip: InteractiveShell, line: str) -> DataProbeResult:
    result = ip.run_line_magic("dataprobe", f"{line} -o -q")
    assert isinstance(result, DataProbeResult)
    return result


# The generator state as the user would read it: NumPy's bit generator state, a torch.Generator's bytes, random's.
STATE = """
def _state_of(g):
    import random, numpy as np, torch
    if isinstance(g, torch.Generator):
        return g.get_state().tolist()
    if isinstance(g, np.random.Generator):
        return repr(g.bit_generator.state)
    return g.getstate()
"""

# -- 1. random_split of a dataset that augments with its own NumPy generator ---------------------------------------
# torch.utils.data.random_split (https://pytorch.org/docs/stable/data.html#torch.utils.data.random_split) over a
# dataset holding `self.rng = np.random.default_rng(seed)` as NumPy recommends for new code
# (https://numpy.org/doc/stable/reference/random/generator.html), the shape of a seeded augmentation dataset such as
# `AugmentationDataset(dataset, augmentation, seed)` that wraps a base dataset.
RANDOM_SPLIT = STATE + """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, random_split

class NoisyPoints(Dataset):
    def __init__(self, n=512, seed=0):
        self.x = torch.randn(n, 8)
        self.rng = np.random.default_rng(seed)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        noise = torch.from_numpy(self.rng.normal(0, 0.1, 8)).float()
        return self.x[i] + noise, i % 3

full_ds = NoisyPoints()
train_ds, val_ds = random_split(full_ds, [448, 64], generator=torch.Generator().manual_seed(42))
train_loader = DataLoader(train_ds, batch_size=32, shuffle=True)
"""

# -- 2. ConcatDataset of two sources, each drawing with its own random.Random --------------------------------------
# torch.utils.data.ConcatDataset (https://pytorch.org/docs/stable/data.html#torch.utils.data.ConcatDataset) of
# per-source datasets, each augmenting with `self.rng = random.Random(seed)` and `self.rng.random() < self.p_aug`
# (the misalignment augmentation of a sign-language dataset wrapper found by the code search, `apply_aug =
# self.rng.random() < self.p_aug`).
CONCAT = STATE + """
import random
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset

class Source(Dataset):
    def __init__(self, n, seed, p_aug=0.5):
        self.x = torch.randn(n, 8)
        self.rng = random.Random(seed)
        self.p_aug = p_aug
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        apply_aug = self.rng.random() < self.p_aug
        return (self.x[i].flip(0) if apply_aug else self.x[i]), i % 2

source_a, source_b = Source(256, 1), Source(256, 2)
mixed = ConcatDataset([source_a, source_b])
mixed_loader = DataLoader(mixed, batch_size=32, shuffle=True)
"""

# -- 3. a masking collator holding a torch.Generator, shaped like transformers' MLM collator -----------------------
# huggingface/transformers src/transformers/data/data_collator.py, DataCollatorForLanguageModeling: a dataclass
# collator with `mlm_probability` and a `seed` from which it keeps `self.generator`, drawing its mask with
# `torch.bernoulli(probability_matrix, generator=self.generator)`; passed as `collate_fn=data_collator`.
COLLATOR = STATE + """
from dataclasses import dataclass
import torch
from torch.utils.data import DataLoader, Dataset

class Tokens(Dataset):
    def __init__(self, n=512, length=16):
        self.ids = torch.randint(5, 100, (n, length))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i]}

@dataclass
class MaskingCollator:
    mask_token_id: int = 4
    mlm_probability: float = 0.15
    seed: int = 0
    def __post_init__(self):
        self.generator = torch.Generator().manual_seed(self.seed)
    def __call__(self, examples):
        input_ids = torch.stack([e["input_ids"] for e in examples])
        labels = input_ids.clone()
        probability_matrix = torch.full(labels.shape, self.mlm_probability)
        masked_indices = torch.bernoulli(probability_matrix, generator=self.generator).bool()
        labels[~masked_indices] = -100
        input_ids[masked_indices] = self.mask_token_id
        return {"input_ids": input_ids, "labels": labels}

data_collator = MaskingCollator()
mlm_loader = DataLoader(Tokens(), batch_size=32, shuffle=True, collate_fn=data_collator)
"""

# -- 4. a notebook-global generator the dataset's __getitem__ draws from -------------------------------------------
# NumPy's quick start: `rng = np.random.default_rng()` at the top, then `rng.integers(...)`/`rng.random()` wherever a
# draw is needed (https://numpy.org/doc/stable/reference/random/index.html); here a random crop in `__getitem__`.
GLOBAL_RNG = STATE + """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

rng = np.random.default_rng(12345)

def random_crop(image, size):
    top = rng.integers(0, image.shape[1] - size + 1)
    left = rng.integers(0, image.shape[2] - size + 1)
    return image[:, top:top + size, left:left + size]

class Images(Dataset):
    def __init__(self, n=256):
        self.images = torch.rand(n, 3, 20, 20)
    def __len__(self):
        return len(self.images)
    def __getitem__(self, i):
        return random_crop(self.images[i], 16), i % 10

crop_loader = DataLoader(Images(), batch_size=32, shuffle=True)
"""

# -- 5. a transform object holding a torch.Generator, inside the dataset --------------------------------------------
# A `GeneratorRandomCrop(RandomCrop)` that takes `generator: torch.Generator` and draws its offsets from
# `self.generator` (found by the code search: torchvision's RandomCrop made reproducible), held as
# `dataset.transform` as torchvision datasets hold theirs.
TRANSFORM = STATE + """
import torch
from torch.utils.data import DataLoader, Dataset

class GeneratorRandomFlip:
    def __init__(self, p=0.5, generator=None):
        self.p = p
        self.generator = generator
    def __call__(self, x):
        if torch.rand(1, generator=self.generator).item() < self.p:
            return x.flip(-1)
        return x

class Samples(Dataset):
    def __init__(self, transform=None, n=256):
        self.x = torch.rand(n, 3, 8, 8)
        self.transform = transform
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        x = self.x[i]
        return (self.transform(x) if self.transform is not None else x), i % 10

flip = GeneratorRandomFlip(generator=torch.Generator().manual_seed(7))
flip_loader = DataLoader(Samples(transform=flip), batch_size=32, shuffle=True)
"""

CASES = {
    "random_split": (RANDOM_SPLIT, "train_loader", "full_ds.rng"),
    "concat": (CONCAT, "mixed_loader", "source_b.rng"),
    "collator": (COLLATOR, "mlm_loader", "data_collator.generator"),
    "global_rng": (GLOBAL_RNG, "crop_loader", "rng"),
    "transform": (TRANSFORM, "flip_loader", "flip.generator"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_generator_the_loader_reaches_below_its_top_level_is_put_back(ip: InteractiveShell, case: str) -> None:
    source, loader, generator = CASES[case]
    ip.run_cell(source).raise_error()
    ip.run_cell(f"_before = _state_of({generator})").raise_error()
    result = dataprobe(ip, f"{loader} --workers 0,2 --seconds 1")
    assert result.trials, result
    ip.run_cell(f"_after = _state_of({generator})").raise_error()
    assert ip.user_ns["_after"] == ip.user_ns["_before"], f"{generator} moved during the probe"
