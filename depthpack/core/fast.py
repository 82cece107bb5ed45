"""The fast recipe: how the packed forward runs, named once for the Predictor, the export and the benchmark.

    recipe = fast_recipe("cuda", batch=1)   # what Predictor(model, device="cuda") and the export use
    REFERENCE                               # the plain model, eagerly: what every fast path is tested against
    resolve("fast" | "reference" | Recipe(...), device, batch)   # the one spelling every entry point takes

A Recipe is a set of measured winners (docs/performance.md has each one's figure and the ones that lost):
    compile        torch.compile(fullgraph, static shapes) with Inductor; combo_kernels: Inductor's
                   horizontal fusion of independent kernels; backend: "inductor", or another Dynamo
                   backend (the CPU tests' "aot_eager": the same static machinery without Inductor)
    graph          one CUDA graph per bucket and input kind, replayed
    selection      "count": the packed selection by counting (core.packing), instead of torch.topk
    gelu_epilogue  fc1 + bias + GELU as one cuBLASLt GEMM with its epilogue (tanh GELU)
    blocks         "hybrid": attention + projection + residual and fc2 + residual as two Triton kernels a
                   block (kernels.vit_block), the rest left to Inductor and cuBLAS; "timm": timm's blocks
    fold_input     the input normalization folded into the patch-embedding weights at deploy time, K padded to
                   a multiple of 8 (DepthPack.fold_input_): no pass over the whole image, aligned GEMMs
    prefix_once    more queries than the largest bucket, with the one-way glance stream: the prefix runs once per
                   image and every chunk reads its keys and values (DepthPack.packed_chunks), instead of once a
                   chunk; the eager runtime's (a static recipe runs each bucket's graph whole)
The hybrid blocks win at batch 1 and lose at batch 8 (docs/performance.md), so the recipe depends on the batch.
On a CPU the recipe is the reference model with prefix_once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

SELECTIONS = ("topk", "count")
BLOCKS = ("timm", "hybrid")


@dataclass(frozen=True)
class Recipe:
    compile: bool = False
    graph: bool = False
    selection: str = "topk"
    gelu_epilogue: bool = False
    blocks: str = "timm"
    fold_input: bool = False
    combo_kernels: bool = False
    backend: str = "inductor"
    prefix_once: bool = False

    def __post_init__(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"recipe selection {self.selection!r}: choose one of {', '.join(SELECTIONS)}")
        if self.blocks not in BLOCKS:
            raise ValueError(f"recipe blocks {self.blocks!r}: choose one of {', '.join(BLOCKS)}")
        if self.prefix_once and (self.compile or self.graph):
            raise ValueError("recipe prefix_once is the eager runtime's: a compiled or graphed recipe runs each "
                             "bucket's graph whole")

    @property
    def kernels(self) -> dict[str, Any]:
        """What the model itself runs (the rest is how the runtime compiles and replays it)."""
        return dict(selection=self.selection, gelu_epilogue=self.gelu_epilogue, blocks=self.blocks,
                    fold_input=self.fold_input)

    def inductor_options(self) -> dict[str, Any]:
        """torch.compile's options for Inductor."""
        return {"combo_kernels": True} if self.combo_kernels else {}

    def describe(self) -> dict[str, Any]:
        return dict(compile=self.compile, graph=self.graph, **self.kernels, inductor=self.inductor_options(),
                    **({"backend": self.backend} if self.backend != "inductor" else {}),
                    **({"prefix_once": True} if self.prefix_once else {}))


REFERENCE = Recipe()


def fast_recipe(device: Any, batch: int = 1) -> Recipe:
    """The fastest measured recipe for this device ("cuda", "cpu", a torch.device) and batch size."""
    kind = getattr(device, "type", str(device).split(":")[0])
    if kind != "cuda":
        return Recipe(prefix_once=True)
    return Recipe(compile=True, graph=True, selection="count", gelu_epilogue=True, fold_input=True,
                  blocks="hybrid" if batch == 1 else "timm", combo_kernels=True)


RECIPES = ("fast", "reference")


def resolve(recipe: "str | Recipe", device: Any, batch: int = 1) -> Recipe:
    """"fast" (the fastest measured recipe for the device and batch), "reference" (the plain model, eagerly)
    or a Recipe as it is; anything else is one ValueError."""
    if isinstance(recipe, Recipe):
        return recipe
    if recipe == "fast":
        return fast_recipe(device, batch)
    if recipe == "reference":
        return REFERENCE
    raise ValueError(f"recipe must be one of {', '.join(RECIPES)} or a depthpack.core.fast.Recipe, got {recipe!r}")


def without_runtime(recipe: Recipe) -> Recipe:
    """The recipe's model kernels alone: eager, no graph (a parity reference for the compiled forms)."""
    return replace(recipe, compile=False, graph=False, combo_kernels=False)
