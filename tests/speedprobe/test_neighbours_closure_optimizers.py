"""%speedprobe's fp16 option on steps whose optimizer steps through a closure (issue 50, "Also"). GradScaler cannot
step a closure optimizer: `GradScaler.step(optimizer, closure)` raises "Closure use is not currently supported if
GradScaler is enabled." (torch/amp/grad_scaler.py). The probe must say that is why fp16 is not tried, never judge
fp16 "wrong" on a loss its unscaled closure made drift. Each case is written as the public code cited beside it."""

from __future__ import annotations

import torch
from torch import nn

from jupyter_gpu.speedprobe.runner import probe_speed


def fp16(step, namespace):
    return probe_speed(step, options=("amp-fp16",), steps=2, namespace=namespace).option("amp-fp16")


def assert_closure_named(trial) -> None:
    # Skipped, with the reason, and neither judged (agrees or wrong) nor reported as the step's failure.
    told = trial.skipped or ""
    assert "closure" in told and "GradScaler" in told, (trial.skipped, trial.error, trial.agreement)
    assert trial.error is None and trial.agreement is None


def test_lbfgs_on_an_input_image_as_the_neural_style_transfer_tutorial():
    # pytorch/tutorials advanced_source/neural_style_tutorial.py: optimizer = optim.LBFGS([input_img]); each step is
    # optimizer.step(closure), the closure runs the frozen cnn and backward on the style and content losses.
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).requires_grad_(False)
    target = cnn(torch.rand(1, 3, 16, 16))
    input_img = torch.rand(1, 3, 16, 16, requires_grad=True)
    optimizer = torch.optim.LBFGS([input_img])

    def run_style_transfer():
        def closure():
            with torch.no_grad():
                input_img.clamp_(0, 1)
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(cnn(input_img), target)
            loss.backward()
            return loss
        return optimizer.step(closure)

    assert_closure_named(fp16(run_style_transfer, {"cnn": cnn, "input_img": input_img, "optimizer": optimizer}))


def lbfgs_training():
    """pytorch/pytorch docs/source/optim.rst, "optimizer.step(closure)": LBFGS re-evaluates the function several
    times. The step and the notebook it runs in."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x, y = torch.randn(32, 8), torch.randn(32, 1)

    def train_step():
        def closure():
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss
        return optimizer.step(closure)

    return train_step, {"model": model, "optimizer": optimizer}


def test_lbfgs_training_a_model_as_the_torch_optim_docs_show():
    assert_closure_named(fp16(*lbfgs_training()))


def test_sgd_stepped_through_a_closure_as_the_torch_optim_docs_show():
    # pytorch/pytorch docs/source/optim.rst: "for input, target in dataset: def closure(): ... optimizer.step(closure)"
    # works with any optimizer; SGD's closure is optional, so only the call shows it.
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 8), torch.randint(0, 2, (16,))

    def train_step():
        def closure():
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        return optimizer.step(closure)

    assert_closure_named(fp16(train_step, {"model": model, "optimizer": optimizer}))


class SAM(torch.optim.Optimizer):
    """Sharpness-aware minimisation as davda54/sam's sam.py writes it: step(closure) takes an ascent step, runs the
    closure (a second forward and backward), then the base optimizer's descent step."""

    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is not None, "Sharpness Aware Minimization requires closure, but it was not provided"
        closure = torch.enable_grad()(closure)
        norm = torch.norm(torch.stack([p.grad.norm(2) for g in self.param_groups for p in g["params"]
                                       if p.grad is not None]), 2)
        for group in self.param_groups:
            scale = group["rho"] / (norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                e_w = p.grad * scale
                p.add_(e_w)
                self.state[p]["e_w"] = e_w
        self.zero_grad()
        closure()
        for group in self.param_groups:
            for p in group["params"]:
                if "e_w" in self.state[p]:
                    p.sub_(self.state[p]["e_w"])
        self.base_optimizer.step()


def test_sam_with_its_closure_as_davda54_sam_readme():
    # davda54/sam README: loss = loss_function(output, model(input)); loss.backward();
    # optimizer.step(closure) with closure() doing a second forward and backward.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = SAM(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))

    def train_step():
        def closure():
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step(closure)
        optimizer.zero_grad()
        return loss

    assert_closure_named(fp16(train_step, {"model": model, "optimizer": optimizer}))


def test_bf16_is_still_tried_with_a_closure_optimizer():
    # The guard: autocast alone needs no GradScaler, so bf16 runs (and is judged) on the LBFGS step.
    train_step, namespace = lbfgs_training()
    trial = probe_speed(train_step, options=("amp-bf16",), steps=2, namespace=namespace).option("amp-bf16")
    assert trial.skipped is None and trial.error is None
