"""The speed-ups `%speedprobe` knows: their names and titles, the number format each computes in, which
ones exclude each other, and the lines of code a user types to adopt them. Pure Python.

One table, read by the option parser (valid names), the runner (what to apply), the judge (which tolerance) and
the renderer (titles and code), so a new option is added in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from jupyter_gpu.speedprobe.step_code import ForwardCode

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
    forward_only_title: str | None = None  # its title for a step that trains nothing, where that differs


OPTIONS: tuple[SpeedOption, ...] = (  # how each is applied and undone: variants.py
    SpeedOption("amp-bf16", "bf16 autocast", BF16, "amp"),
    SpeedOption("amp-fp16", "fp16 autocast + GradScaler", FP16, "amp", forward_only_title="fp16 autocast"),
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


def title_of(names: tuple[str, ...], forward_only: bool = False) -> str:
    """"bf16 autocast + fused optimizer"; "baseline" for no option; `forward_only`: for a step that trains nothing
    (no GradScaler to name)."""
    if not names:
        return "baseline"
    return " + ".join((forward_only and BY_NAME[name].forward_only_title) or BY_NAME[name].title for name in names)


@dataclass(frozen=True)
class OptimizerCode:
    """How the user's code names one optimizer: its variable, its class, and what it was given to optimise."""

    name: str = "opt"
    class_path: str = "torch.optim.AdamW"
    # "model.parameters()" where it optimises exactly one model's parameters in one group; None otherwise (parameter
    # groups, a subset, several models), where the line keeps the user's own first argument.
    parameters: str | None = "model.parameters()"
    fused: bool = True  # it takes fused=True (else foreach=True is what helped)


@dataclass(frozen=True)
class CodeContext:
    """What the lines to adopt refer to: the user's names for the models and optimizers, where the step runs."""

    device_type: str = "cuda"                # "cuda" or "cpu"
    models: tuple[str, ...] = ("model",)     # the models with parameters, each changed by layout and compile lines
    optimizers: tuple[OptimizerCode, ...] = (OptimizerCode(),)
    conv_tf32_line: str | None = None        # turns TF32 on for cuDNN convolutions, where it is off (on by default)
    unscale_before_clipping: bool = False    # the step clips gradients: with a GradScaler, unscale them first
    forward_only: bool = False               # the step trains nothing (evaluation, inference): no loss, no scaler
    forward: ForwardCode | None = None       # the step's own forward lines, where its source could be read

    @property
    def model(self) -> str:
        """The model the autocast example calls."""
        return self.models[0] if self.models else "model"

    @property
    def fused(self) -> bool:
        """Every optimizer takes fused=True."""
        return all(optimizer.fused for optimizer in self.optimizers)


def _optimizer_line(optimizer: OptimizerCode) -> str:
    flag = "fused=True" if optimizer.fused else "foreach=True"
    if optimizer.parameters is None:
        return (f"{optimizer.name} = {optimizer.class_path}(..., {flag})  # your parameters and other arguments, "
                "unchanged")
    return f"{optimizer.name} = {optimizer.class_path}({optimizer.parameters}, {flag})  # keep your other arguments"


# Where the step's own forward lines could not be quoted (no source, a backward inside a loop of micro-batches, two
# losses, its own autocast), the line stands for them and says so: `loss_fn`, `x` and `y` are not the notebook's.
TEMPLATE = "# stands for your step's forward and loss lines"


def _indented(lines: tuple[str, ...]) -> list[str]:
    return ["    " + line for line in lines]


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
    forward = context.forward
    # channels_last that converts the input in the model's call, beside autocast, which quotes that call: the
    # converted call goes inside the autocast block instead of a second call of the model before it.
    converted = forward.converted_call if forward is not None and chosen & {"amp-bf16", "amp-fp16"} else None
    if "channels-last" in chosen:
        lines += [f"{model} = {model}.to(memory_format=torch.channels_last)  # before creating the optimizer"
                  for model in context.models]
        if converted is not None and forward is not None:
            forward = replace(forward, lines=(converted, *forward.lines[1:]))
        else:
            # Where the step's source did not show the model's input (a lifted loop body's step calls the body),
            # no variable is named: `x = x.to(...)` had named one the user's loop does not have.
            lines.append(forward.channels_last if forward and forward.channels_last else
                         f"# and each input batch, where the step calls {context.model}: "
                         "batch = batch.to(memory_format=torch.channels_last), by its own name")
    if "fused-optimizer" in chosen:
        lines += [_optimizer_line(optimizer) for optimizer in context.optimizers]
    # torch.compile(model), not model.compile(): on torch 2.13 the latter compiles nothing for an nn.Sequential.
    if "compile" in chosen:
        lines += [f"{model} = torch.compile({model})" for model in context.models]
    if "compile-reduce-overhead" in chosen:
        lines += [f'{model} = torch.compile({model}, mode="reduce-overhead")' for model in context.models]
    if context.forward_only:
        for name, dtype in (("amp-bf16", "bfloat16"), ("amp-fp16", "float16")):
            if name in chosen:
                lines += [f'with torch.autocast("{device}", dtype=torch.{dtype}):  # around the forward',
                          *_indented(forward.lines if forward else (f"out = {context.model}(x)  {TEMPLATE}",))]
        return lines
    if "amp-bf16" in chosen:
        lines += [f'with torch.autocast("{device}", dtype=torch.bfloat16):  # in the step, '
                  + ("around these lines of it; backward stays outside" if forward else
                     "around the forward and loss; backward stays outside"),
                  *_indented(forward.lines if forward else (f"loss = loss_fn({context.model}(x), y)  {TEMPLATE}",))]
    if "amp-fp16" in chosen:
        loss = forward.loss if forward and forward.loss else "loss"
        lines += [f'scaler = torch.amp.GradScaler("{device}")  # once, before training',
                  f'with torch.autocast("{device}", dtype=torch.float16):  # in the step'
                  + (", around these lines of it" if forward else ""),
                  *_indented(forward.lines if forward else (f"loss = loss_fn({context.model}(x), y)  {TEMPLATE}",)),
                  f"scaler.scale({loss}).backward()"]
        if context.unscale_before_clipping:
            lines += [f"scaler.unscale_({optimizer.name})  # before clipping: clip the real gradients, not the "
                      "scaled ones" for optimizer in context.optimizers]
            lines.append("# ... your gradient clipping, unchanged ...")
        lines += [f"scaler.step({optimizer.name})" for optimizer in context.optimizers]
        lines.append("scaler.update()")
    return lines
