import os

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is present (the H200 via the device tool); elsewhere they skip."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def randomize_(model: torch.nn.Module, seed: int = 0, scale: float = 0.5) -> torch.nn.Module:
    """Give every parameter a fresh random value of a sensible size, so that attention between tokens
    really matters (timm's init with LayerScale 1e-5 makes blocks nearly the identity, which would let
    a broken mask or a wrong selection pass unnoticed)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) * scale / fan_in**0.5)
            elif name.endswith("gamma"):  # LayerScale
                p.fill_(1.0)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture
def tiny():
    from depthpack import create_model

    return randomize_(create_model("tiny")).eval()
