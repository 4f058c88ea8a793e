"""The kernels of a model's linear layers: PyTorch's default, or oneDNN with weights reordered once."""

from __future__ import annotations

import torch

from specbench.errors import SpecbenchError

LINEAR_BACKENDS = ("auto", "aten", "onednn")


class OneDNNLinear(torch.nn.Module):
    """A bias-optional linear layer whose weight oneDNN has reordered once, at load time.

    With MKL's default kernels a product with 2-16 rows repacks the whole weight on every call, so verifying a
    few draft tokens costs far more than decoding one; with a reordered weight the cost grows gently with the
    number of tokens, which is what speculative decoding lives on. The product is oneDNN's linear primitive on
    the dense input, so no conversion of activations is needed.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed_weight", linear.weight.detach().to_mkldnn(), persistent=False)
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(hidden, self.packed_weight, self.bias, "none", [], "")

    @staticmethod
    def supported() -> bool:
        """Whether this torch build has the oneDNN linear primitive (it is not part of torch's stable API)."""
        try:
            probe = OneDNNLinear(torch.nn.Linear(8, 4))
            with torch.inference_mode():
                expected = torch.nn.functional.linear(torch.ones(1, 2, 8), probe.packed_weight.to_dense(), probe.bias)
                return torch.allclose(probe(torch.ones(1, 2, 8)), expected, atol=1e-5)
        except (RuntimeError, AttributeError):
            return False


def use_linear_backend(model: torch.nn.Module, backend: str) -> None:
    """Choose the kernels of the model's linear layers: ``onednn`` (weights reordered once, see
    ``OneDNNLinear``) or ``aten`` (PyTorch's default). ``auto`` picks onednn for float32 on a CPU when this torch
    build supports it, and aten everywhere else. The choice applies to the target as a whole, so a method and
    its AR baseline always run on the same kernels."""
    if backend not in LINEAR_BACKENDS:
        raise SpecbenchError(f"run.linear_backend={backend!r} is not known; choose one of {', '.join(LINEAR_BACKENDS)}")
    parameter = next(model.parameters())
    on_cpu_float32 = parameter.device.type == "cpu" and parameter.dtype == torch.float32
    if backend == "auto":
        backend = "onednn" if on_cpu_float32 and OneDNNLinear.supported() else "aten"
    if backend == "aten":
        return
    if not on_cpu_float32 or not OneDNNLinear.supported():
        raise SpecbenchError("run.linear_backend=onednn needs a float32 model on a CPU and a torch build with oneDNN")
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, child_name, OneDNNLinear(child))
