"""python -m depthpack.data.prerender --config CFG [key=value ...]: render a training config's scene
stores (depthpack.data.store) before training, on every core: val first (always complete, at the model's
img_size), then train (at data_size if the config sets it, else the model's; stopping at --budget seconds,
keeping the first scenes done). One JSON line per split.

    python -m depthpack.data.prerender --config configs/scale.yaml --processes 14 --budget 85
"""
from __future__ import annotations

import json
import time

from ..core.config import ModelConfig, coerce_dict, deep_merge, from_dict, load_yaml, model_config, parse_overrides
from .config import DataConfig
from .store import open_store
from .synthetic import render_batch


def main(argv: list[str] | None = None) -> None:
    """python -m depthpack.data.prerender --config CFG [key=value ...]: render a training config's stores
    (its data mapping and its model's img_size; the YAML is read here, below the training layer)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m depthpack.data.prerender", description=main.__doc__)
    ap.add_argument("--config", required=True, help="a training config (its data and model.img_size)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides of the config (preset=, model.*, data.*)")
    ap.add_argument("--splits", nargs="+", default=["val", "train"], choices=("train", "val"))
    ap.add_argument("--processes", type=int, default=None, help="default: every core")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the train split (val always completes)")
    a = ap.parse_args(argv)
    y = deep_merge(load_yaml(a.config), parse_overrides(a.overrides))
    size = model_config(y.get("preset", "vits"), **coerce_dict(ModelConfig, dict(y.get("model") or {}))).img_size
    sizes = {"val": tuple(size), "train": tuple(y.get("data_size") or size)}  # the sizes training opens them at
    dcfg = from_dict(DataConfig, coerce_dict(DataConfig, dict(y.get("data") or {})))
    if dcfg.kind != "synthetic":
        raise ValueError(f"scene stores hold synthetic scenes; the config's data.kind is {dcfg.kind!r}")
    for split in a.splits:
        t0 = time.perf_counter()
        s = open_store(dcfg, split, sizes[split], render_batch, processes=a.processes, budget_s=a.budget if split == "train" else None)
        print(json.dumps({"split": split, "store": str(s.path), "n": s.n, "wanted": s.meta["wanted"],
                          "complete": s.meta["complete"], "render_s": s.meta["seconds"],
                          "open_s": round(time.perf_counter() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
