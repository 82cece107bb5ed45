"""The exported program of one bucket: PackedForward, example inputs, torch.export with a check that
the graph is static, and AOTInductor's compile into a .pt2."""
from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn as nn

from ..core.config import ModelConfig
from ..core.model import DepthPack
from ..core.preprocess import frames_to_images, scale_points

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
    """The exported function: images [B,3,H,W] f32 (or, with frame, uint8 frames [B,h,w,3] in the
    frame's channel order, preprocessed inside), points [B,K,2] f32 in their pixels -> depth [B,K] f32."""

    def __init__(self, model: DepthPack, bucket: int, frame: dict | None = None):
        super().__init__()
        self.model, self.bucket, self.frame = model, bucket, frame

    def forward(self, inputs: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
        if self.frame is not None:
            size = tuple(self.model.cfg.img_size)
            inputs, points = (frames_to_images(inputs, size, self.frame["color"]),
                              scale_points(points, tuple(self.frame["size"]), size))
        return self.model.forward_packed(inputs, points, self.bucket)


def example_inputs(cfg: ModelConfig, batch: int, k: int, device, g: torch.Generator,
                   frame: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images [B,3,H,W] in [0,1) (or uint8 frames [B,h,w,3]) and points [B,K,2] inside them;
    the last quarter of each row repeats the first point, like the runners' padding."""
    if frame is not None:
        h, w = frame["size"]
        inputs = torch.randint(0, 256, (batch, h, w, 3), generator=g, dtype=torch.uint8)
    else:
        h, w = cfg.img_size
        inputs = torch.rand(batch, 3, h, w, generator=g)
    points = torch.rand(batch, k, 2, generator=g) * torch.tensor([w, h]) * (1 - 1e-6)
    pad = k // 4
    if pad:
        points[:, k - pad:] = points[:, :1]
    return inputs.to(device), points.to(device)


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


def export_program(model: DepthPack, k: int, batch: int, device, g: torch.Generator,
                   frame: dict | None = None) -> torch.export.ExportedProgram:
    inputs, points = example_inputs(model.cfg, batch, k, device, g, frame)
    with torch.no_grad():
        ep = torch.export.export(PackedForward(model, k, frame).eval(), (inputs, points), strict=False)
    problems = static_graph_problems(ep)
    if problems:
        raise ExportError(f"bucket {k}: the packed forward is not one static graph: {'; '.join(problems[:5])}")
    return ep


def compile_package(ep: torch.export.ExportedProgram, path: Path, inductor_configs: dict | None = None,
                    metadata: dict[str, str] | None = None) -> Path:
    """AOTInductor-compile the program into the .pt2 at path, with metadata (strings) stored in the
    package itself (the exporter stages the whole folder and swaps it in at the end, so a half-written
    package is never under a folder a runner reads)."""
    configs = dict(inductor_configs or {})
    if metadata:
        configs["aot_inductor.metadata"] = {**configs.get("aot_inductor.metadata", {}), **metadata}
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=configs)
    return path
