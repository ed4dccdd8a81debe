"""Training loops written the way tutorials write them, profiled on the real GPU as a new user would (a step of
scripts/gpu-check.sh): `%%gpuprofile` on each, then the probe commands its report prints, pasted as they are.

    python3 scripts/gpu_trials.py --out trials.json [--timeout 90]

- a ResNet-style CNN with BatchNorm, a Dataset and a DataLoader with 2 workers, SGD with momentum, StepLR, nested
  epoch loops, `running_loss += loss.item()` and a print every 10 batches, under `%%gpuprofile --apply` (the fixes
  that need no edit, applied and the loop re-run: on the H200 its `%speedprobe` found channels_last 1.23x);
- a small transformer encoder with AdamW, dict batches, bf16 autocast, gradient accumulation over 2 micro-batches,
  `clip_grad_norm_` and a cosine schedule;
- an MLP with Adam in a `train_one_epoch()` function, under the line form `%gpuprofile train_one_epoch()`;
- nanoGPT's shape: no DataLoader, `xb, yb = get_batch()` from a token stream on the device, an evaluation every 100
  iterations, then `%speedprobe profile_train_step` on the step the profile lifted from it.

Each report is shown whole as the cell's Out[n] (the log keeps it); the JSON record (gpu_magics.py's format)
keeps its first lines. Without a GPU the loops run on the CPU, smaller, to rehearse this script; the record says so.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "bench"))  # the benches' models: ResNet, EncoderClassifier, MLP
sys.path.insert(0, str(HERE))

from gpu_magics import Session, command_line  # noqa: E402  (after the path above)

SETUP = """
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from models import ResNet, EncoderClassifier, MLP

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SCALE = 1 if device.type == "cuda" else 4  # smaller on the CPU rehearsal
"""

RESNET = """
class RandomImages(Dataset):
    def __init__(self, count):
        self.images = torch.randn(count, 3, 32, 32)
        self.labels = torch.randint(0, 10, (count,))
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, index):
        return self.images[index], self.labels[index]

torch.manual_seed(0)
train_loader = DataLoader(RandomImages(8192 // SCALE), batch_size=128 // SCALE, shuffle=True, num_workers=2)
net = ResNet((32, 64, 128) if SCALE == 1 else (8, 16, 32)).to(device)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.5)
"""

RESNET_LOOP = """%%gpuprofile --steps 20 --warmup 5 --apply -o -q
for epoch in range(4):
    net.train()
    running_loss = 0.0
    for i, (inputs, labels) in enumerate(train_loader):
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
        if i % 10 == 9:
            print(f"[{epoch + 1}, {i + 1:5d}] loss: {running_loss / 10:.3f}")
            running_loss = 0.0
    scheduler.step()
"""

TRANSFORMER = """
class Tokens(Dataset):
    def __init__(self, count, length=128):
        self.tokens = torch.randint(0, 8000, (count, length))
        self.labels = torch.randint(0, 2, (count,))
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "label": self.labels[index]}

torch.manual_seed(0)
text_loader = DataLoader(Tokens(4096 // SCALE), batch_size=64 // SCALE, shuffle=True, num_workers=2,
                         pin_memory=device.type == "cuda")
encoder = EncoderClassifier(vocabulary=8000, sequence=128, width=256 // SCALE, heads=8 // SCALE,
                            feedforward=1024 // SCALE, layers=4).to(device)
adamw = torch.optim.AdamW(encoder.parameters(), lr=3e-4, weight_decay=0.01)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(adamw, T_max=1000)
accumulation = 2
"""

TRANSFORMER_LOOP = """%%gpuprofile --steps 16 --warmup 4 -o -q
for epoch in range(6):
    encoder.train()
    for step, batch in enumerate(text_loader):
        tokens = batch["input_ids"].to(device, non_blocking=True)
        labels = batch["label"].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = encoder(tokens)
            loss = nn.functional.cross_entropy(logits, labels) / accumulation
        loss.backward()
        if (step + 1) % accumulation == 0:
            torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
            adamw.step()
            cosine.step()
            adamw.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item() * accumulation:.4f}")
"""

MLP_SETUP = """
from torch.utils.data import TensorDataset

torch.manual_seed(0)
mlp = MLP((784, 2048, 2048, 10)).to(device)
adam = torch.optim.Adam(mlp.parameters(), lr=1e-3)
digits = DataLoader(TensorDataset(torch.randn(16384 // SCALE, 784), torch.randint(0, 10, (16384 // SCALE,))),
                    batch_size=256, shuffle=True)

def train_one_epoch():
    mlp.train()
    total, correct = 0, 0
    for x, y in digits:
        x, y = x.to(device), y.to(device)
        adam.zero_grad()
        out = mlp(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        adam.step()
        correct += (out.argmax(1) == y).sum().item()
        total += y.numel()
    return correct / total
"""

# nanoGPT's shape: no DataLoader, random windows of a token stream on the device, an evaluation every 100 iterations
# under no_grad, the model returning (logits, loss), AdamW.
NANO = """
torch.manual_seed(0)
block, vocab = 64, 96
stream = torch.randint(0, vocab, (200_000 // SCALE,), device=device)  # not `tokens`: the transformer's loop sets it

class TinyGPT(nn.Module):
    def __init__(self, width=256, layers=4):
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(block), persistent=False)
    def forward(self, idx, targets=None):
        x = self.embed(idx) + self.position(torch.arange(idx.shape[1], device=idx.device))
        logits = self.head(self.blocks(x, mask=self.causal, is_causal=True))
        loss = None if targets is None else nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

def get_batch(batch_size=64):
    ix = torch.randint(len(stream) - block - 1, (batch_size,), device=device)
    x = torch.stack([stream[i:i + block] for i in ix.tolist()])
    y = torch.stack([stream[i + 1:i + block + 1] for i in ix.tolist()])
    return x, y

@torch.no_grad()
def estimate_loss():
    gpt.eval()
    losses = [gpt(*get_batch())[1].item() for _ in range(5)]
    gpt.train()
    return sum(losses) / len(losses)

gpt = TinyGPT().to(device)
gpt_optimizer = torch.optim.AdamW(gpt.parameters(), lr=3e-4)
"""

NANO_LOOP = """%%gpuprofile --steps 20 --warmup 5 -o -q
for it in range(300):
    if it % 100 == 0:
        print(f"step {it}: val loss {estimate_loss():.4f}")
    xb, yb = get_batch()
    logits, loss = gpt(xb, yb)
    gpt_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    gpt_optimizer.step()
"""


def whole_text(value: Any) -> tuple[str, list[str]]:
    """Records a report's first lines (the shell has shown it whole as Out[n], and the log keeps it)."""
    if value is None:
        return "(no result)", []
    text = str(value)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (" ".join(lines[0].split()) if lines else repr(value)), lines[:40]


def run(out: Path, limit: int) -> int:
    session = Session(out, limit)
    shell = session.shell
    shell.run_line_magic("load_ext", "jupyter_gpu")
    import torch

    if torch.cuda.is_available():
        session.report.update(device="cuda", gpu=torch.cuda.get_device_name(0))
    else:
        session.report.update(device="cpu", note="no GPU: the loops ran on the CPU, smaller, to rehearse this script")
    session.save()
    for setup in (SETUP, RESNET, TRANSFORMER, MLP_SETUP, NANO):
        _, error, _, _ = session.cell(setup)
        if error is not None:
            session.report["note"] = f"a setup cell failed: {type(error).__name__}: {error}"
            session.save()
            return 1
    session.magic("resnet %%gpuprofile --apply", RESNET_LOOP, describe=whole_text, limit=2 * limit)
    # One compiled option, not three: on the H200 compile, reduce-overhead and their combination took 45 s of the
    # 90 s this probe ran, and the check's whole budget is under ten minutes.
    session.magic("resnet %speedprobe", "%speedprobe profile_train_step --steps 8 "
                  "--try amp-bf16,channels-last,fused-optimizer,compile-reduce-overhead -o -q", describe=whole_text,
                  limit=2 * limit)
    session.magic("resnet %batchprobe", "%batchprobe profile_sized_step --max-seconds 20 -o -q", describe=whole_text)
    session.magic("resnet %dataprobe", "%dataprobe train_loader --step profile_step --workers 0,2,4 --seconds 20 -o -q",
                  describe=whole_text)
    session.magic("transformer %%gpuprofile", TRANSFORMER_LOOP, describe=whole_text)
    session.magic("mlp %gpuprofile", "%gpuprofile -o -q --steps 20 --warmup 5 train_one_epoch()", describe=whole_text)
    # A loop without a DataLoader: lifted around its optimizer step, and its step repeatable for %speedprobe.
    session.magic("nanogpt %%gpuprofile", NANO_LOOP, describe=whole_text)
    session.magic("nanogpt %speedprobe",
                  "%speedprobe profile_train_step --steps 6 --try amp-bf16,fused-optimizer -o -q", describe=whole_text)
    return session.exit_code()


def main(argv: list[str] | None = None) -> int:
    return command_line(argv, __doc__.splitlines()[0], run)


if __name__ == "__main__":
    sys.exit(main())
