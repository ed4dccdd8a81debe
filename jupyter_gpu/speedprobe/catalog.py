"""The speed-ups `%speedprobe` knows: their names and titles, the number format each computes in, which
ones exclude each other, and the lines of code a user types to adopt them. Pure Python.

One table, read by the option parser (valid names), the runner (what to apply), the judge (which tolerance) and
the renderer (titles and code), so a new option is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

# Number formats, from the loosest to the strictest: a combination is judged by its loosest member's format.
BF16, FP16, TF32, FP32 = "bfloat16", "float16", "tf32", "float32"
FORMAT_ORDER = (BF16, FP16, TF32, FP32)
# Unit roundoff of each format (half the distance from 1 to the next number): bf16 has 8 significant bits,
# fp16 11, TF32 11, fp32 24. These are the floors of the agreement tolerance (see decide.tolerance).
UNIT_ROUNDOFF = {BF16: 2.0 ** -8, FP16: 2.0 ** -11, TF32: 2.0 ** -11, FP32: 2.0 ** -24}


@dataclass(frozen=True)
class SpeedOption:
    name: str          # what --try takes
    title: str         # how the report names it
    format: str        # the number format its arithmetic rounds to
    group: str | None  # options of one group exclude each other: a combination takes the faster


OPTIONS: tuple[SpeedOption, ...] = (  # how each is applied and undone: variants.py
    SpeedOption("amp-bf16", "bf16 autocast", BF16, "amp"),
    SpeedOption("amp-fp16", "fp16 autocast + GradScaler", FP16, "amp"),
    SpeedOption("tf32", "TF32 matmuls and convolutions", TF32, None),
    SpeedOption("cudnn-benchmark", "cudnn.benchmark", FP32, None),
    SpeedOption("channels-last", "channels_last", FP32, None),
    SpeedOption("fused-optimizer", "fused optimizer", FP32, None),
    SpeedOption("compile", "torch.compile", FP32, "compile"),
    SpeedOption("compile-reduce-overhead", "torch.compile reduce-overhead", FP32, "compile"),
)
OPTION_NAMES: tuple[str, ...] = tuple(option.name for option in OPTIONS)
BY_NAME = {option.name: option for option in OPTIONS}


def loosest_format(names: tuple[str, ...]) -> str:
    """The format a configuration's result is rounded to: that of its least precise option (fp32 for none)."""
    formats = [BY_NAME[name].format for name in names] or [FP32]
    return min(formats, key=FORMAT_ORDER.index)


def title_of(names: tuple[str, ...]) -> str:
    """"bf16 autocast + fused optimizer"; "baseline" for no option."""
    return " + ".join(BY_NAME[name].title for name in names) if names else "baseline"


@dataclass(frozen=True)
class CodeContext:
    """What the lines to adopt refer to: the user's names for the model and optimizer, where the step runs."""

    device_type: str = "cuda"                # "cuda" or "cpu"
    model: str = "model"
    optimizer: str = "opt"
    optimizer_class: str = "torch.optim.AdamW"
    fused: bool = True                       # the optimizer takes fused=True (else foreach=True is what helped)
    conv_tf32_line: str | None = None        # turns TF32 on for cuDNN convolutions, where it is off (on by default)
    unscale_before_clipping: bool = False    # the step clips gradients: with a GradScaler, unscale them first


def adopt_lines(names: tuple[str, ...], context: CodeContext) -> list[str]:
    """The code to type for a configuration, in the order it goes into a notebook: set-up first, then the step."""
    lines: list[str] = []
    chosen = set(names)
    device = context.device_type
    if "tf32" in chosen:
        # The spelling every torch since 1.12 takes, and the one inductor's own warning recommends.
        lines.append('torch.set_float32_matmul_precision("high")  # TF32 matmuls')
        if context.conv_tf32_line:
            lines.append(context.conv_tf32_line)
    if "cudnn-benchmark" in chosen:
        lines.append("torch.backends.cudnn.benchmark = True")
    if "channels-last" in chosen:
        lines += [f"{context.model} = {context.model}.to(memory_format=torch.channels_last)  # before creating the "
                  "optimizer",
                  "x = x.to(memory_format=torch.channels_last)  # each input batch, in the step"]
    if "fused-optimizer" in chosen:
        flag = "fused=True" if context.fused else "foreach=True"
        lines.append(f"{context.optimizer} = {context.optimizer_class}({context.model}.parameters(), {flag})"
                     "  # keep your other arguments")
    # torch.compile(model), not model.compile(): on torch 2.13 the latter compiles nothing for an nn.Sequential.
    if "compile" in chosen:
        lines.append(f"{context.model} = torch.compile({context.model})")
    if "compile-reduce-overhead" in chosen:
        lines.append(f'{context.model} = torch.compile({context.model}, mode="reduce-overhead")')
    if "amp-bf16" in chosen:
        lines += [f'with torch.autocast("{device}", dtype=torch.bfloat16):  # in the step',
                  f"    loss = loss_fn({context.model}(x), y)  # forward and loss only; backward stays outside"]
    if "amp-fp16" in chosen:
        lines += [f'scaler = torch.amp.GradScaler("{device}")  # once, before training',
                  f'with torch.autocast("{device}", dtype=torch.float16):  # in the step',
                  f"    loss = loss_fn({context.model}(x), y)",
                  "scaler.scale(loss).backward()"]
        if context.unscale_before_clipping:
            lines += [f"scaler.unscale_({context.optimizer})  # before clipping: clip the real gradients, not the "
                      "scaled ones",
                      "# ... your gradient clipping, unchanged ..."]
        lines += [f"scaler.step({context.optimizer})",
                  "scaler.update()"]
    return lines
