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
    """Fresh random weights of a sensible size (depthpack.core.model.random_weights_): with timm's init
    (LayerScale 1e-5) the blocks are nearly the identity, which would let a broken mask or a wrong
    selection pass unnoticed."""
    from depthpack.core.model import random_weights_

    return random_weights_(model, seed, scale)


@pytest.fixture
def tiny():
    from depthpack import create_model

    return randomize_(create_model("tiny")).eval()


@pytest.fixture(autouse=True, scope="session")
def _many_compiled_predictors():
    """Dynamo keeps recompile_limit (8) compiled entries per code object, and every (model instance, bucket,
    batch) of the suite's many predictors is one entry of packed_core: raised, as the benchmark raises it."""
    from depthpack.bench.ladder import raise_recompile_limit

    raise_recompile_limit()


def with_buckets(model, buckets):
    """A copy of model whose bucket ladder is an export's (the same chunking as its packages)."""
    import copy
    import dataclasses

    same = copy.deepcopy(model)
    same.cfg = dataclasses.replace(same.cfg, buckets=tuple(buckets))
    return same


def load_script(name: str):
    """scripts/NAME.py as a module (the scripts are run by path, not installed), cached once loaded; its own
    folder on sys.path as when it runs, for the scripts that import each other."""
    import importlib.util
    import sys
    from pathlib import Path

    if name in sys.modules:
        return sys.modules[name]
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    if str(scripts) not in sys.path:
        sys.path.append(str(scripts))
    spec = importlib.util.spec_from_file_location(name, scripts / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
