"""The exported program of one bucket: PackedForward, example inputs, torch.export with a check that
the graph is static, and AOTInductor's compile into a .pt2."""
from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn as nn

from ..core.config import ModelConfig
from ..core.model import DepthPack

# ATen ops that read tensor values into the host or make shapes data-dependent (by base name)
FORBIDDEN_OPS = {"nonzero", "nonzero_static", "_local_scalar_dense", "item", "unique", "_unique", "_unique2",
                 "unique_consecutive", "unique_dim", "masked_select", "_assert_scalar", "_assert_async",
                 "sym_constrain_range", "sym_constrain_range_for_size", "argwhere"}


class ExportError(ValueError):
    """Anything that stops an export: the message says what and what to do."""


def cast_model(model: DepthPack, dtype: torch.dtype, device: torch.device) -> DepthPack:
    """A copy in the compute dtype on the device (the selection priorities and offset frequencies are
    integer buffers inside DepthPack, so the cast leaves them exact)."""
    model = copy.deepcopy(model).to(device=device, dtype=dtype)
    model.fused_embed = False  # the packages hold the torch reference path; Inductor fuses it itself
    return model.eval()


class PackedForward(nn.Module):
    """The exported function: images [B,3,H,W] f32, points [B,K,2] f32 -> depth [B,K] f32."""

    def __init__(self, model: DepthPack, bucket: int):
        super().__init__()
        self.model, self.bucket = model, bucket

    def forward(self, images: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        return self.model.forward_packed(images, points, self.bucket)


def example_inputs(cfg: ModelConfig, batch: int, k: int, device, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [B,3,H,W] in [0,1) and points [B,K,2] inside them; the last quarter of each row
    repeats the first point, like the runners' padding."""
    H, W = cfg.img_size
    images = torch.rand(batch, 3, H, W, generator=g)
    points = torch.rand(batch, k, 2, generator=g) * torch.tensor([W, H]) * (1 - 1e-6)
    pad = k // 4
    if pad:
        points[:, k - pad:] = points[:, :1]
    return images.to(device), points.to(device)


def static_graph_problems(ep: torch.export.ExportedProgram) -> list[str]:
    """What makes the exported graph data-dependent or dynamic (empty list: a static graph)."""
    problems = [f"range constraint on {s}" for s in ep.range_constraints]
    for node in ep.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            if node.target.__name__.split(".")[0] in FORBIDDEN_OPS:
                problems.append(f"data-dependent op {node.target} ({node.name})")
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and not all(isinstance(s, int) for s in val.shape):
            problems.append(f"symbolic shape {tuple(val.shape)} at {node.name}")
    return problems


def export_program(model: DepthPack, k: int, batch: int, device, g: torch.Generator) -> torch.export.ExportedProgram:
    images, points = example_inputs(model.cfg, batch, k, device, g)
    with torch.no_grad():
        ep = torch.export.export(PackedForward(model, k).eval(), (images, points), strict=False)
    problems = static_graph_problems(ep)
    if problems:
        raise ExportError(f"bucket {k}: the packed forward is not one static graph: {'; '.join(problems[:5])}")
    return ep


def compile_package(ep: torch.export.ExportedProgram, path: Path, inductor_configs: dict | None = None) -> Path:
    """AOTInductor-compile the program into the .pt2 at path (the exporter stages the whole folder and
    swaps it in at the end, so a half-written package is never under a folder a runner reads)."""
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=dict(inductor_configs or {}))
    return path
