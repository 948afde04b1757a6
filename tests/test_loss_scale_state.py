"""The loss scale a training step used, as PopTorch exposes it: the anchored
tensor ``finalLossScale`` and, with automatic loss scaling, the optimiser's
``ipu_state["lossScaleUpdateFactor"]`` (the scale over ``loss_scaling``)."""
import pytest
import torch

import poptorch


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        out = self.fc(x)
        return out, out.pow(2).sum()


def _training(loss_scaling, automatic, anchored=True):
    model = _Model().half()
    optimizer = poptorch.optim.SGD(model.parameters(), lr=0.0, loss_scaling=loss_scaling,
                                   use_combined_accum=False)
    opts = poptorch.Options().showCompilationProgressBar(False)
    opts.Training.setAutomaticLossScaling(automatic)
    if anchored:
        opts.anchorTensor("scale", "finalLossScale", poptorch.OutputMode.Final)
    return poptorch.trainingModel(model, opts, optimizer), optimizer


def _scale(optimizer):
    return float(optimizer.state_dict()["ipu_param"]["loss_scaling"])


@pytest.mark.parametrize("loss_scaling", [1.0, 4.0])
def test_final_loss_scale_is_the_scale_the_step_used(loss_scaling):
    training, optimizer = _training(loss_scaling, automatic=True)
    x = torch.ones(3, 4).half()
    training.compile(x)  # the device's state exists from then on
    for _ in range(4):
        before = _scale(optimizer)
        factor = float(optimizer.state_dict()["ipu_state"]["lossScaleUpdateFactor"])
        assert factor == before / loss_scaling
        training(x)
        final = training.getAnchoredTensor("scale")
        assert final.dim() == 0 and float(final) == before
        assert _scale(optimizer) == 2 * before  # small gradients: the rule doubled it
    training.destroy()


def test_final_loss_scale_without_automatic_scaling_is_loss_scaling():
    training, optimizer = _training(8.0, automatic=False)
    training(torch.ones(3, 4).half())
    assert float(training.getAnchoredTensor("scale")) == 8.0
    assert "lossScaleUpdateFactor" not in optimizer.state_dict()["ipu_state"]
    assert "finalLossScale" in training.getTensorNames()
    training.destroy()


def test_set_optimizer_resets_the_update_factor():
    training, optimizer = _training(2.0, automatic=True, anchored=False)
    x = torch.ones(3, 4).half()
    training(x)
    training(x)
    assert float(optimizer.state_dict()["ipu_state"]["lossScaleUpdateFactor"]) == 4.0
    optimizer.loss_scaling = 16.0
    training.setOptimizer(optimizer)
    assert float(optimizer.state_dict()["ipu_state"]["lossScaleUpdateFactor"]) == 1.0
    training.destroy()


def test_inference_has_no_loss_scale():
    opts = poptorch.Options().showCompilationProgressBar(False)
    opts.anchorTensor("scale", "finalLossScale")
    model = poptorch.inferenceModel(torch.nn.Linear(4, 2), opts)
    with pytest.raises(poptorch.Error, match="no tensor 'finalLossScale'"):
        model(torch.ones(3, 4))
