"""`probe_speed` on real training steps on the CPU: bf16 and fp16 autocast, channels_last and fused/foreach
optimizers really run; each is timed, judged for agreement, and undone bitwise; the CUDA-only options are skipped
with their reason."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import nn
from training_steps import (
    Training,
    assert_same_state,
    bench_models,
    convnet_with_sgd,
    mlp_with_adam,
    overflowing_in_fp16,
    state_of,
    supervised,
    tiny_mlp,
)

from jupyter_gpu.speedprobe.catalog import adopt_lines
from jupyter_gpu.speedprobe.runner import SpeedProbeError, probe_speed, run_speedprobe
from jupyter_gpu.speedprobe.runner import SpeedProbeRequest as Request

CPU_OPTIONS = ("amp-bf16", "amp-fp16", "channels-last", "fused-optimizer")
# What a CPU run of mlp_with_adam skips (channels-last: the MLP has no convolution).
CUDA_ONLY_OPTIONS = ("tf32", "cudnn-benchmark", "channels-last", "compile-reduce-overhead")


def probe(training: Training, options: tuple[str, ...] | None = None, steps: int = 3):
    return probe_speed(training.step, options=options, steps=steps, namespace=training.namespace())


def warmed_up(training: Training, steps: int = 2) -> Training:
    """A model that has trained a little: optimizer moments, gradients and the scheduler's count exist."""
    for _ in range(steps):
        training.step()
    return training


def test_every_cpu_option_runs_is_judged_and_is_undone_bitwise() -> None:
    training = warmed_up(convnet_with_sgd())
    torch.backends.cudnn.benchmark = False
    before = state_of(training)
    result = probe(training, CPU_OPTIONS)
    assert_same_state(before, state_of(training))
    assert torch.backends.cudnn.benchmark is False
    assert [trial.name for trial in result.options] == list(CPU_OPTIONS)
    for trial in result.options:
        assert trial.skipped is None and trial.error is None, trial
        assert len(trial.times) >= 5 and trial.speedup is not None and trial.speedup > 0
        assert trial.agrees is True, (trial.name, trial.agreement)
    exact = {trial.name: trial.agreement for trial in result.options if trial.name in ("channels-last",
                                                                                        "fused-optimizer")}
    assert all(agreement.update_rel_l2 < 1e-3 for agreement in exact.values()), exact
    assert result.batch_size == 8
    assert result.baseline_seconds is not None and len(result.baseline.times) >= 10  # two baseline runs
    assert result.repeatability == 0.0  # the same state and RNG: the same computation, bit for bit
    assert set(result.restored) >= {"model", "opt", "scheduler", "RNG", "global flags"}


def test_every_configuration_starts_from_the_users_weights() -> None:
    training = mlp_with_adam()
    first_weight = training.model[0].weight
    start = first_weight.detach().clone()
    seen_start = []
    inner = training.step

    def step() -> torch.Tensor:
        seen_start.append(torch.equal(first_weight.detach(), start))
        return inner()

    training.step = step
    result = probe(training, ("amp-bf16", "fused-optimizer"))
    measured = 2 + sum(trial.measured for trial in result.options) + (result.combination is not None)
    # One call per configuration sees the starting weights: its first; the later ones see trained weights.
    assert sum(seen_start) == measured


def test_skipped_options_say_why_on_the_cpu() -> None:
    # Asked by name, as the default (every option) asks them: the reason is the same, and the options that do run
    # on the CPU (compilation among them, 13 s of this test when it ran them) are other tests' business.
    result = probe(mlp_with_adam(), CUDA_ONLY_OPTIONS)
    reasons = {trial.name: trial.skipped for trial in result.options}
    assert "NVIDIA GPUs" in reasons["tf32"]
    assert "CUDA" in reasons["cudnn-benchmark"]
    assert "CUDA graphs" in reasons["compile-reduce-overhead"]
    assert "no 2-D convolutions" in reasons["channels-last"]
    for name in CUDA_ONLY_OPTIONS:
        trial = result.option(name)
        assert trial.speedup is None and trial.agrees is None and not trial.times


def test_fp16_that_overflows_is_faster_but_wrong_and_never_recommended() -> None:
    training = overflowing_in_fp16()
    before = state_of(training)
    result = probe(training, ("amp-bf16", "amp-fp16"), steps=6)
    assert_same_state(before, state_of(training))
    fp16 = result.option("amp-fp16")
    assert fp16.agrees is False
    assert "GradScaler" in fp16.agreement.failure and "collapsed" in fp16.agreement.failure
    assert result.option("amp-bf16").agrees is True  # bfloat16 has float32's range
    assert result.best is None or result.best.name != "amp-fp16"
    assert result.combination is None or "amp-fp16" not in result.combination.members


def test_fp16_without_the_scaler_is_a_failure() -> None:
    # The step calls torch.autograd.backward, not loss.backward(): the probe's GradScaler never scales the loss.
    training = mlp_with_adam()
    model, opt = training.model, training.opt

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.randn(32, 16)), torch.randint(0, 4, (32,)))
        torch.autograd.backward(loss)
        opt.step()
        return loss

    result = probe_speed(step, options=("amp-fp16",), steps=3, namespace=training.namespace())
    assert result.option("amp-fp16").agrees is False
    assert "without a scaler" in result.option("amp-fp16").agreement.failure


def test_an_option_the_step_fails_under_is_reported_and_undone() -> None:
    training = warmed_up(mlp_with_adam())
    inner = training.step

    def step() -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise ValueError("this model refuses autocast")
        return inner()

    training.step = step
    before = state_of(training)
    result = probe(training, ("amp-bf16", "fused-optimizer"))
    assert_same_state(before, state_of(training))
    failed = result.option("amp-bf16")
    # The error, and the user's line it came from, with its text.
    assert failed.error.startswith("ValueError: this model refuses autocast (at test_speedprobe_runner.py, line ")
    assert failed.error.endswith('in step: `raise ValueError("this model refuses autocast")`)')
    assert failed.speedup is None
    assert result.option("fused-optimizer").error is None


def test_a_step_that_fails_at_once_is_one_sentence_and_changes_nothing() -> None:
    training = warmed_up(mlp_with_adam())
    inner = training.step
    calls = []

    def step() -> torch.Tensor:
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("shapes do not match")
        return inner()

    training.step = step
    before = state_of(training)
    with pytest.raises(SpeedProbeError, match=r"raised RuntimeError: shapes do not match \(at test_speedprobe_"
                                              r"runner\.py, line \d+, in step: `raise RuntimeError.*\) \(everything"):
        probe(training)
    assert_same_state(before, state_of(training))


def test_ctrl_c_keeps_what_was_measured_and_puts_everything_back() -> None:
    training = warmed_up(mlp_with_adam())
    inner = training.step
    calls = []

    def step() -> torch.Tensor:  # Ctrl-C in the middle of the bf16 trial, half-way through its steps
        if torch.is_autocast_enabled("cpu"):
            calls.append(1)
            if len(calls) % 4 == 0:
                raise KeyboardInterrupt
        return inner()

    training.step = step
    before = state_of(training)
    result = run_speedprobe(step, Request(options=("amp-bf16", "fused-optimizer"), steps=3),
                            namespace=training.namespace())
    assert_same_state(before, state_of(training))
    assert result.interrupted and result.baseline_seconds is not None
    with pytest.raises(KeyboardInterrupt):
        probe_speed(step, options=("amp-bf16",), steps=3, namespace=training.namespace())
    assert_same_state(before, state_of(training))


def test_a_step_that_is_not_the_same_computation_twice_is_not_judged() -> None:
    training = mlp_with_adam()
    model, opt = training.model, training.opt

    def endless_batches():
        generator = torch.Generator().manual_seed(1)  # its own generator: restoring torch's does not rewind it
        while True:
            yield torch.randn(32, 16, generator=generator), torch.randint(0, 4, (32,), generator=generator)

    batches = endless_batches()

    def step() -> torch.Tensor:  # a new batch from an iterator each call, which no snapshot rewinds
        x, y = next(batches)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    result = probe_speed(step, options=("fused-optimizer",), steps=3, namespace=training.namespace())
    assert result.repeatability is not None and result.repeatability > 0.05
    fused = result.option("fused-optimizer")
    assert fused.agrees is None and "not the same computation twice" in fused.agreement.note
    assert result.best is None  # an unjudged option is never recommended


# The verdict is per-operator time against this host's own one-element operator, both speeds: under the parallel
# suite's load the tiny MLP took 11 us per op (1.1 ms for 101 ops) against a 10 us line and was judged not
# overhead-bound. It runs apart, with the timing tests.
@pytest.mark.timing
def test_a_tiny_mlp_at_batch_one_is_overhead_bound_and_a_wide_one_is_not() -> None:
    tiny = probe(tiny_mlp(batch=1), ("fused-optimizer",))
    assert tiny.launch is not None and tiny.launch.launch_bound, tiny.launch
    assert tiny.launch.ops >= 20
    assert tiny.launch.op_floor is not None and 1e-8 < tiny.launch.op_floor < tiny.launch.seconds_per_op
    wide = probe(mlp_with_adam(width=512, batch=256), ("fused-optimizer",))
    assert wide.launch is not None and not wide.launch.launch_bound, wide.launch


def test_the_loss_is_compared_over_the_steps() -> None:
    result = probe(mlp_with_adam(), ("amp-bf16",), steps=8)
    agreement = result.option("amp-bf16").agreement
    assert agreement.steps == 8 and agreement.loss_drift is not None and agreement.loss_drift < 0.01
    assert agreement.update_rel_l2 is not None and math.isfinite(agreement.update_rel_l2)
    assert agreement.tolerance is not None and agreement.tolerance >= 2 ** -8


def test_a_step_that_returns_nothing_is_judged_on_the_update() -> None:
    training = mlp_with_adam()
    inner = training.step

    def step() -> None:
        inner()

    result = probe_speed(step, options=("fused-optimizer",), steps=3, namespace=training.namespace())
    agreement = result.option("fused-optimizer").agreement
    assert agreement.steps == 0 and agreement.agrees is True
    assert any("returns no loss" in note for note in result.notes)


@pytest.mark.parametrize(("step", "message"), [
    (42, "not a function"),
])
def test_bad_input_is_one_sentence(step, message) -> None:
    training = mlp_with_adam()
    with pytest.raises(SpeedProbeError, match=message):
        probe_speed(step, namespace=training.namespace())


def test_unknown_options_and_no_model_are_one_sentence() -> None:
    training = mlp_with_adam()
    with pytest.raises(SpeedProbeError, match="unknown option 'amp'; choose from amp-bf16"):
        probe_speed(training.step, options=("amp",), namespace=training.namespace())
    with pytest.raises(SpeedProbeError, match="no model or optimizer was found"):
        probe_speed(lambda: None, namespace={})
    with pytest.raises(SpeedProbeError, match="--steps must be at least 1"):
        probe_speed(training.step, steps=0, namespace=training.namespace())


def test_channels_last_with_a_fused_optimizer_after_training_agrees() -> None:
    # Converting the model leaves the optimizer's momentum buffers contiguous; fused SGD on channels_last weights
    # with those buffers computes a wrong update, so the probe converts the state with the parameters.
    training = warmed_up(convnet_with_sgd())
    before = state_of(training)
    result = probe(training, ("channels-last", "fused-optimizer"))
    assert_same_state(before, state_of(training))
    from jupyter_gpu.probekit.training_state import StateSnapshot, find_training_objects
    from jupyter_gpu.speedprobe.measure import StepRunner, relative_difference
    from jupyter_gpu.speedprobe.variants import StepSetting

    objects = find_training_objects(training.namespace(), training.step)
    snapshot = StateSnapshot.take(objects)
    runner = StepRunner.for_step(training.step, StepSetting(torch, objects, torch.device("cpu")), objects.parameters())
    baseline = runner.run((), 3, "baseline")
    snapshot.restore()
    both = runner.run(("channels-last", "fused-optimizer"), 3, "both")
    snapshot.restore()
    assert relative_difference(both.update, baseline.update) < 1e-3
    assert all(trial.agrees for trial in result.options)
    assert_same_state(before, state_of(training))


ONEDNN_BLOCK = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability())


@pytest.mark.skipif(ONEDNN_BLOCK is None or not torch.backends.mkldnn.is_available(),
                    reason="oneDNN's x86 1x1 kernels are not what this CPU runs")
def test_channels_last_is_not_tried_where_onednn_would_crash_the_kernel() -> None:
    # A ResNet's narrow stage downsamples through Conv2d(8, 16, 1, stride=2): in channels_last its weight gradient
    # made torch 2.13 kill the process with SIGSEGV on 64x64 images (oneDNN issue #6035), here and in a notebook.
    from jupyter_gpu.probekit.training_state import find_training_objects
    from jupyter_gpu.speedprobe.variants import StepSetting, why_not

    torch.manual_seed(0)
    narrow = ONEDNN_BLOCK // 2  # a stage narrower than this CPU's vector block: 8 channels on AVX-512, 4 on AVX2
    model = bench_models().ResNet(widths=(narrow, 2 * narrow, 4 * narrow))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    images, labels = torch.randn(4, 3, 64, 64), torch.randint(0, 10, (4,))
    train_step = supervised(model, optimizer, lambda: (images, labels)).step

    namespace = {"model": model, "optimizer": optimizer}
    result = probe_speed(train_step, options=("channels-last",), steps=2, namespace=namespace)
    skipped = result.option("channels-last").skipped
    assert skipped is not None and "oneDNN issue #6035" in skipped and f"`blocks.2.shortcut.0`, {narrow}" in skipped
    assert f"fewer than {ONEDNN_BLOCK} input channels" in skipped

    setting = StepSetting(torch, find_training_objects(namespace, train_step), torch.device("cpu"))
    setting.forward_only = True  # evaluation computes no weight gradient
    assert why_not("channels-last", setting) is None
    setting.forward_only = False
    for module in model.modules():
        if isinstance(module, nn.Conv2d) and module.kernel_size == (1, 1):
            module.weight.requires_grad_(False)  # frozen shortcuts: no weight gradient either
    assert why_not("channels-last", setting) is None
    wide = bench_models().ResNet(widths=(ONEDNN_BLOCK, 2 * ONEDNN_BLOCK, 4 * ONEDNN_BLOCK))  # none under the block
    setting = StepSetting(torch, find_training_objects({"model": wide, "optimizer": optimizer}, train_step),
                          torch.device("cpu"))
    assert why_not("channels-last", setting) is None


def test_the_code_to_adopt_names_every_optimizer_with_the_model_it_updates() -> None:
    # A GAN's step: two models, two optimizers (one with parameter groups), and a loss module with no parameters.
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
    critic = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-4)
    opt_d = torch.optim.Adam([{"params": critic[0].parameters()}, {"params": critic[2].parameters(), "lr": 1e-4}])
    criterion = nn.BCEWithLogitsLoss()
    real, noise = torch.randn(32, 16), torch.randn(32, 8)

    def gan_step():
        fake = generator(noise)
        opt_d.zero_grad()
        loss_d = criterion(critic(real), torch.ones(32, 1)) + criterion(critic(fake.detach()), torch.zeros(32, 1))
        loss_d.backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = criterion(critic(fake), torch.ones(32, 1))
        loss_g.backward()
        opt_g.step()
        return loss_g

    namespace = {"generator": generator, "critic": critic, "opt_g": opt_g, "opt_d": opt_d, "criterion": criterion}
    result = probe_speed(gan_step, options=("fused-optimizer",), steps=3, namespace=namespace)
    from jupyter_gpu.speedprobe.catalog import adopt_lines

    lines = adopt_lines(("fused-optimizer", "compile"), result.code_context)
    assert sorted(lines) == [
        "critic = torch.compile(critic)",
        "generator = torch.compile(generator)",
        "opt_d = torch.optim.Adam(..., fused=True)  # your parameters and other arguments, unchanged",
        "opt_g = torch.optim.Adam(generator.parameters(), fused=True)  # keep your other arguments",
    ]
    fp16 = adopt_lines(("amp-fp16",), result.code_context)
    assert sorted(fp16[-3:-1]) == ["scaler.step(opt_d)", "scaler.step(opt_g)"] and fp16[-1] == "scaler.update()"
    assert sorted(note for note in result.notes if "fused=True" in note) == [
        "fused-optimizer: opt_d (Adam): fused=True", "fused-optimizer: opt_g (Adam): fused=True"]


def test_the_code_to_adopt_names_only_what_the_step_used_of_a_notebook_with_other_models() -> None:
    # As on the H200: a notebook with a ResNet loop, a transformer and an MLP. The ResNet's step was told to
    # convert and compile all three models and got a fused-optimizer note for all three optimizers.
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    encoder = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))  # an earlier experiment's, idle
    adamw = torch.optim.AdamW(encoder.parameters())
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))

    def profile_step(batch):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        return loss

    def train_step():  # as %%gpuprofile's ready step: it names the loop body's function, not the models
        return profile_step((x, y))

    namespace = {"net": net, "optimizer": optimizer, "encoder": encoder, "adamw": adamw}
    result = probe_speed(train_step, options=("fused-optimizer",), steps=3, namespace=namespace)
    from jupyter_gpu.speedprobe.catalog import adopt_lines

    assert sorted(adopt_lines(("fused-optimizer", "compile"), result.code_context)) == [
        "net = torch.compile(net)",
        "optimizer = torch.optim.SGD(net.parameters(), fused=True)  # keep your other arguments"]
    assert [note for note in result.notes if "fused=True" in note] == [
        "fused-optimizer: optimizer (SGD): fused=True"]


def test_the_fused_optimizer_line_names_the_model_the_optimizer_was_made_from_not_its_compiled_wrapper() -> None:
    # `opt = Adam(model.parameters())` then `cmodel = torch.compile(model)`: the line to adopt said
    # `Adam(cmodel.parameters(), fused=True)`, a name the user's optimizer line never had.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # The eager backend: the same OptimizedModule wrapper the naming is about, without Inductor's code generation
    # (47 s of a clean clone's CI, cold cache, for a test of a name).
    cmodel = torch.compile(model, backend="eager")
    x, y = torch.randn(64, 16), torch.randint(0, 4, (64,))

    def train_step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(cmodel(x), y)
        loss.backward()
        opt.step()
        return loss

    namespace = {"model": model, "opt": opt, "cmodel": cmodel}
    result = probe_speed(train_step, options=("fused-optimizer",), steps=2, namespace=namespace)
    from jupyter_gpu.speedprobe.catalog import adopt_lines

    assert adopt_lines(("fused-optimizer",), result.code_context) == [
        "opt = torch.optim.Adam(model.parameters(), fused=True)  # keep your other arguments"]


def test_channels_last_agrees_on_a_cnn_with_dropout_after_its_convolutions() -> None:
    # The PyTorch MNIST example's Net: Dropout on the pooled conv activations. On channels_last activations dropout
    # draws its mask in memory order, so from the same seed it zeroes other elements than the baseline (the update
    # differed by 0.95, and channels_last was called wrong); the agreement run draws the baseline's masks.
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
                          nn.Linear(8 * 13 * 13, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 10))
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    data, target = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))

    def train_step():
        optimizer.zero_grad()
        loss = nn.functional.nll_loss(nn.functional.log_softmax(model(data), dim=1), target)
        loss.backward()
        optimizer.step()
        return loss

    result = probe_speed(train_step, options=("channels-last",), steps=3,
                         namespace={"model": model, "optimizer": optimizer})
    trial = result.option("channels-last")
    assert trial.agrees is True and trial.agreement.update_rel_l2 < 1e-3, trial.agreement
    assert any("dropout draws its masks in the baseline's order" in note for note in result.notes)
    assert torch.nn.functional.dropout.__module__ == "torch.nn.functional"  # put back


def evaluation_step(training: Training) -> Callable[[], None]:
    """An evaluation loop's step, as a profile lifts it: eval mode, inference_mode, a metric read off the outputs,
    nothing returned; the optimizer still sits in the notebook beside it (it trained earlier)."""
    model = training.model
    counts = {"correct": 0}

    def step() -> None:
        model.eval()
        x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
        with torch.inference_mode():
            counts["correct"] += int((model(x).argmax(1) == y).sum().item())

    return step


def test_a_forward_only_step_is_judged_on_its_outputs_without_a_scaler_or_an_optimizer() -> None:
    training = warmed_up(mlp_with_adam())  # the last training step's gradients are still there
    step = evaluation_step(training)
    before = state_of(training)
    result = probe_speed(step, options=("amp-bf16", "amp-fp16", "fused-optimizer"), steps=3,
                         namespace=training.namespace())
    assert_same_state(before, state_of(training))
    fp16, bf16 = result.option("amp-fp16"), result.option("amp-bf16")
    for trial in (fp16, bf16):
        assert trial.agrees is True, trial.agreement  # not "fp16 without a scaler: ... loss.backward()"
        assert trial.agreement.compared == "outputs" and 0 < trial.agreement.update_rel_l2 < trial.agreement.tolerance
    assert fp16.title == "fp16 autocast"  # no GradScaler: there are no gradients to scale
    assert fp16.agreement.tolerance < bf16.agreement.tolerance  # fp16 keeps 3 more bits
    assert "trains nothing" in result.option("fused-optimizer").skipped
    assert any("judged on its models' outputs" in note for note in result.notes)
    lines = "\n".join(adopt_lines(("amp-fp16",), result.code_context))
    assert "GradScaler" not in lines and "backward" not in lines
    # The step's own forward statement, as it is written, inside the autocast block.
    assert lines.splitlines()[1:] == ['    with torch.inference_mode():',
                                      '        counts["correct"] += int((model(x).argmax(1) == y).sum().item())']


def test_a_forward_pass_that_overflows_in_fp16_is_wrong_on_its_outputs() -> None:
    training = overflowing_in_fp16()
    model = training.model

    def step() -> None:
        with torch.no_grad():
            model(torch.randn(16, 8) * 1e3)  # predictions, returned as nothing: only the outputs can tell

    result = probe_speed(step, options=("amp-bf16", "amp-fp16"), steps=3, namespace=training.namespace())
    fp16 = result.option("amp-fp16")
    assert fp16.agrees is False and "outputs became NaN or inf" in fp16.agreement.failure
    assert result.option("amp-bf16").agrees is True
    assert result.best is None or result.best.name != "amp-fp16"


def test_a_step_that_only_accumulates_gradients_is_still_training() -> None:
    # Gradient accumulation: backward on every call, no optimizer step in it; fp16 must still go through the scaler.
    training = mlp_with_adam()
    model = training.model

    def step() -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(torch.randn(32, 16)), torch.randint(0, 4, (32,)))
        torch.autograd.backward(loss)  # not loss.backward(): the probe's GradScaler cannot reach it
        return loss

    result = probe_speed(step, options=("amp-fp16",), steps=3, namespace=training.namespace())
    fp16 = result.option("amp-fp16")
    assert fp16.title == "fp16 autocast + GradScaler" and fp16.agreement.compared == "update"
    assert fp16.agrees is False and "without a scaler" in fp16.agreement.failure


def test_samples_per_second_counts_every_micro_batch_of_an_accumulating_step() -> None:
    training = mlp_with_adam()
    model, opt = training.model, training.opt

    def step() -> torch.Tensor:  # four micro-batches of 8, one optimizer step
        opt.zero_grad()
        for _ in range(4):
            loss = nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))) / 4
            loss.backward()
        opt.step()
        return loss

    result = probe_speed(step, options=("fused-optimizer",), steps=3, namespace=training.namespace())
    assert result.batch_size == 8 and result.batches_per_step == 4
    assert result.samples_per_second(result.baseline) == pytest.approx(32 / result.baseline.seconds)
    assert "4 batches of 8 per step" in str(result)


def test_a_gan_step_calling_its_generator_twice_for_two_optimizers_is_one_batch() -> None:
    torch.manual_seed(0)
    generator, critic = nn.Linear(8, 16), nn.Linear(16, 1)
    opt_g, opt_d = torch.optim.Adam(generator.parameters()), torch.optim.Adam(critic.parameters())

    def step() -> None:
        real = torch.randn(32, 16)
        opt_d.zero_grad()
        (critic(generator(torch.randn(32, 8)).detach()).mean() - critic(real).mean()).backward()
        opt_d.step()
        opt_g.zero_grad()
        (-critic(generator(torch.randn(32, 8))).mean()).backward()
        opt_g.step()

    namespace = {"G": generator, "D": critic, "opt_g": opt_g, "opt_d": opt_d}
    result = probe_speed(step, options=("fused-optimizer",), steps=3, namespace=namespace)
    assert result.batch_size == 32 and result.batches_per_step == 1


def test_a_dcgan_step_calling_its_discriminator_three_times_is_one_batch() -> None:
    # The DCGAN tutorial's order: D on the real batch first (so D is the model the batch size is read from), then
    # on the fakes for D's step, then again for G's. Its 3 calls over 2 optimizer steps had read as gradient
    # accumulation of 2 batches, and doubled the step's samples/s.
    torch.manual_seed(0)
    generator, discriminator = nn.Linear(8, 16), nn.Linear(16, 1)
    opt_g, opt_d = torch.optim.Adam(generator.parameters()), torch.optim.Adam(discriminator.parameters())
    bce = nn.BCEWithLogitsLoss()

    def step() -> torch.Tensor:
        real, ones, zeros = torch.randn(64, 16), torch.ones(64, 1), torch.zeros(64, 1)
        opt_d.zero_grad()
        bce(discriminator(real), ones).backward()
        fake = generator(torch.randn(64, 8))
        bce(discriminator(fake.detach()), zeros).backward()
        opt_d.step()
        opt_g.zero_grad()
        loss_g = bce(discriminator(fake), ones)
        loss_g.backward()
        opt_g.step()
        return loss_g

    namespace = {"netG": generator, "netD": discriminator, "optG": opt_g, "optD": opt_d, "criterion": bce}
    result = probe_speed(step, options=("fused-optimizer",), steps=3, namespace=namespace)
    assert result.batch_size == 64 and result.batches_per_step == 1
    assert "gradient accumulation" not in str(result)


def test_bf16_on_a_step_that_evaluates_under_no_grad_before_it_trains_gets_every_gradient() -> None:
    # nanoGPT's loop evaluates every N iterations inside the loop body. With autocast around the whole step and its
    # weight cache on, the evaluation's casts (made under no_grad, without autograd history) were reused by the
    # training forward: 12 of this GPT's attention and feed-forward parameters got no gradient, the first update
    # was 0.68 times the baseline's, and correct bf16 was called "faster but wrong".
    torch.manual_seed(0)
    block, vocab, width = 64, 96, 128
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.1, batch_first=True, norm_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    embed, head = nn.Embedding(vocab, width), nn.Linear(width, vocab)
    causal = nn.Transformer.generate_square_subsequent_mask(block)
    parameters = [*embed.parameters(), *encoder.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(parameters, lr=3e-4)
    stream = torch.randint(0, vocab, (50_000,))

    def gpt(idx: torch.Tensor) -> torch.Tensor:
        return head(encoder(embed(idx), mask=causal, is_causal=True))

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(stream) - block - 1, (16,)).tolist()
        return (torch.stack([stream[i:i + block] for i in ix]), torch.stack([stream[i + 1:i + block + 1] for i in ix]))

    def train_step() -> torch.Tensor:
        encoder.eval()
        with torch.no_grad():
            gpt(batch()[0])  # the loop's estimate_loss()
        encoder.train()
        xb, yb = batch()
        loss = nn.functional.cross_entropy(gpt(xb).flatten(0, 1), yb.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    namespace = {"embed": embed, "encoder": encoder, "head": head, "optimizer": optimizer}
    result = probe_speed(train_step, options=("amp-bf16",), steps=3, namespace=namespace)
    agreement = result.option("amp-bf16").agreement
    assert agreement.agrees is True, agreement.failure
    assert 0.9 < agreement.update_scale < 1.1
