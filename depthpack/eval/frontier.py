"""The accuracy-cost frontier: the packed model's Q sweep beside dense models at several image sizes,
AbsRel against encoder GFLOP, on uniform points, in the depth-edge band and on the thin band (thin structures and
small objects of synthetic scenes), all trained the same way.

    python -m depthpack.eval.frontier --plan configs/frontier_cpu.yaml --jobs 2          # train + evaluate
    python -m depthpack.eval.frontier --plan configs/frontier_cpu.yaml --no-train        # finished runs only

A plan (YAML) names the runs: each a training config (`base`), the overrides every run shares
(`common`: the same scenes and steps) and its own (`overrides`: one lever at a time). Runs whose
folder holds a finished summary.json are read, not trained again; the rest train as subprocesses,
--jobs at a time. Every run is evaluated on the same held-out scenes at the plan's `image` size (a
model of another size sees them resized, its points scaled), at the same query points, with the same
depth-edge band (`band_radius` pixels of that image). Rows go to --out (docs/results/frontier.json
by default): {name, path, image, q, tokens, encoder_gflop, absrel_uniform, absrel_edge, absrel_thin, steps,
scenes, seed, device, torch, commit, patches, default}; the figure to --figure.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..core import cli
from ..core.config import ModelConfig, load_yaml
from ..core.files import atomic_write_json
from ..core.packing import chunk_plan

PLAN_KEYS = {"base", "common", "image", "queries", "band_radius", "max_images", "device", "runs"}
RUN_KEYS = {"name", "path", "overrides", "default"}


def encoder_gflop(cfg: ModelConfig, rows: int, pairs: int, embedded: int) -> float:
    """GFLOP of the encoder over `rows` tokens whose attention scores `pairs` (query, key) pairs, `embedded`
    of them patch-embedded: per block the four linear layers (qkv, proj, fc1, fc2: (4 + 2 mlp_ratio) D^2
    multiply-adds a row) and attention (QK^T and AV: 2 D a pair), plus the patch embedding (3 p^2 D a token);
    a multiply-add is 2 FLOP."""
    D, p = cfg.embed_dim, cfg.patch_size
    block = 2 * rows * D * D * (4 + 2 * cfg.mlp_ratio) + 4 * pairs * D
    return (cfg.depth * block + 2 * embedded * 3 * p * p * D) / 1e9


def buffer_gflop(cfg: ModelConfig, k: int) -> float:
    """One buffer of the prefix and k patches, as it runs: one-way, the prefix rows read only the prefix."""
    P, T = cfg.num_prefix, cfg.num_prefix + k
    pairs = P * P + k * T if cfg.oneway else T * T
    return encoder_gflop(cfg, T, pairs, cfg.num_anchors + k)


def packed_cost(cfg: ModelConfig, q: int) -> tuple[int, float]:
    """(tokens per buffer, encoder GFLOP summed over the chunks) of the packed path at Q queries, as the model
    runs it: more than one chunk with the one-way prefix runs the prefix once, each chunk reading its keys."""
    n, P = cfg.num_patches, cfg.num_prefix
    chunks = [min(k, n) for _, _, k in chunk_plan(q, cfg.buckets)]
    tokens = P + max(chunks)
    if cfg.oneway and len(chunks) > 1:
        return tokens, encoder_gflop(cfg, P, P * P, cfg.num_anchors) + sum(
            encoder_gflop(cfg, k, k * (P + k), k) for k in chunks)
    return tokens, sum(buffer_gflop(cfg, k) for k in chunks)


def dense_cost(cfg: ModelConfig) -> tuple[int, float]:
    return cfg.num_prefix + cfg.num_patches, buffer_gflop(cfg, cfg.num_patches)


# ---- the plan -----------------------------------------------------------------------------------
def load_plan(path: str | Path) -> dict[str, Any]:
    """A plan file, checked: every key known, every run named once, packed or dense."""
    plan = load_yaml(path)
    unknown = set(plan) - PLAN_KEYS
    if unknown:
        raise ValueError(f"plan {path}: unknown key(s) {sorted(unknown)}; known: {sorted(PLAN_KEYS)}")
    for key in ("base", "image", "runs"):
        if key not in plan:
            raise ValueError(f"plan {path}: needs {key!r}")
    names = [r.get("name") for r in plan["runs"]]
    if len(set(names)) != len(names) or not all(names):
        raise ValueError(f"plan {path}: every run needs a name of its own, got {names}")
    for r in plan["runs"]:
        if set(r) - RUN_KEYS or r.get("path") not in ("packed", "dense"):
            raise ValueError(f"plan {path}: run {r.get('name')!r} must have path packed or dense and only {sorted(RUN_KEYS)}")
    return plan


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def run_dir(runs: Path, run: dict) -> Path:
    return runs / slug(run["name"])


def finished(folder: Path) -> dict | None:
    """The run's summary.json if it trained to its last step, else None."""
    try:
        s = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return s if s.get("step") == s.get("steps") and "stopped_early" not in s else None


def call(cmd: list[str], log: Path, what: str) -> None:
    """Run a command with its output appended to log; one error naming the log if it fails."""
    with open(log, "a") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc:
        raise RuntimeError(f"{what} failed (exit {rc}); its log: {log}")


def train_run(plan: dict, run: dict, folder: Path, log: Path) -> None:
    call([sys.executable, "-m", "depthpack.train", "--config", plan["base"], *plan.get("common", []),
          *run.get("overrides", []), f"out_dir={folder}", "progress=false",
          *(["resume=true"] if (folder / "latest.json").is_file() else [])], log, f"training {run['name']!r}")


def eval_run(plan: dict, run: dict, folder: Path, log: Path) -> dict:
    """eval.json of the run on the plan's images, points and band (evaluated once, then read)."""
    out = folder / "frontier_eval"
    points = "all" if _data_kind(folder) == "synthetic" else "both"  # the thin band: synthetic scenes carry it
    key = json.dumps({**{k: plan.get(k) for k in ("image", "queries", "band_radius", "max_images")}, "points": points},
                     sort_keys=True)
    done = out / "eval.json"
    if done.is_file() and (out / "plan.json").is_file() and (out / "plan.json").read_text() == key:
        return json.loads(done.read_text())
    h, w = plan["image"]
    paths = ["packed", "dense", "glance"] if run["path"] == "packed" else ["dense"]
    if run["path"] == "packed" and not _model_cfg(folder).glance_depth:
        paths.remove("glance")
    cmd = [sys.executable, "-m", "depthpack.eval", "--checkpoint", str(folder), "--out", str(out), "--queries",
           *[str(q) for q in plan.get("queries", [16, 64, 256])], "--points", points, "--anchors", "on",
           "--image-size", f"{w}x{h}", "--paths", *paths, "--figure-images", "0", "--no-progress",
           "--device", plan.get("device", "auto")]
    if plan.get("band_radius") is not None:
        cmd += ["--band-radius", str(plan["band_radius"])]
    if plan.get("max_images"):
        cmd += ["--max-images", str(plan["max_images"])]
    call(cmd, log, f"evaluating {run['name']!r}")
    (out / "plan.json").write_text(key)
    return json.loads(done.read_text())


def _data_kind(folder: Path) -> str:
    from ..core.checkpoint import stored_config

    return stored_config(folder).get("train", {}).get("data", {}).get("kind", "synthetic")


def _model_cfg(folder: Path) -> ModelConfig:
    from ..core.checkpoint import stored_config
    from ..core.config import stored_model_config

    return stored_model_config(stored_config(folder)["model"])


def rows_of(plan: dict, run: dict, folder: Path, result: dict, summary: dict) -> list[dict]:
    """The frontier rows of one evaluated run: per path it was evaluated on, per Q."""
    from ..core.checkpoint import stored_config

    cfg = _model_cfg(folder)
    stored = stored_config(folder)
    train = stored.get("train", {})
    bands = result["bands"]
    h, w = plan["image"]
    meta = {"image": f"{cfg.img_size[0]}x{cfg.img_size[1]}", "steps": train.get("steps"),
            "scenes": "fresh" if train.get("data", {}).get("fresh") else summary.get("throughput", {}).get("scenes"),
            "seed": train.get("seed"), "device": summary.get("device_name") or summary.get("device"),
            "torch": summary.get("torch"), "commit": summary.get("commit"), "patches": cfg.num_patches,
            "eval_image": f"{h}x{w}"}
    out = []
    for path in sorted({r["path"] for r in bands["uniform"]["rows"]}):
        for q in sorted({r["queries"] for r in bands["uniform"]["rows"] if r["path"] == path}):
            def get(band):
                return next((r["abs_rel"] for r in bands.get(band, {}).get("rows", [])
                             if r["path"] == path and r["queries"] == q and r["anchors"] is not False), None)
            tokens, gflop = dense_cost(cfg) if path == "dense" else packed_cost(cfg, q)
            out.append({"name": run["name"], "path": path, "q": q, "tokens": tokens, "encoder_gflop": round(gflop, 3),
                        "absrel_uniform": get("uniform"), "absrel_edge": get("edge"), "absrel_thin": get("thin"), **meta,
                        "default": bool(run.get("default")) and path == "packed"})
    return out


# ---- the figure ---------------------------------------------------------------------------------
def figure(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """AbsRel against encoder GFLOP, uniform points, the edge band and (where rows have it) the thin band side by
    side: each packed model's Q sweep as a line, each model's own dense path and the dense-trained models as points."""
    from .viz import _plt

    plt = _plt()
    bands = [("absrel_uniform", "uniform points"), ("absrel_edge", "depth-edge band")]
    if any(r.get("absrel_thin") is not None for r in rows):
        bands.append(("absrel_thin", "thin band (thin structures, small objects)"))
    fig, axes = plt.subplots(1, len(bands), figsize=(6 * len(bands), 7), sharex=True)
    packed_names = sorted({r["name"] for r in rows if r["path"] == "packed"})
    dense_trained = sorted({r["name"] for r in rows if r["path"] == "dense"} - set(packed_names))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (key, label) in zip(axes, bands):
        for i, name in enumerate(packed_names):
            pts = sorted((r["encoder_gflop"], r.get(key), r["q"]) for r in rows if r["name"] == name and r["path"] == "packed"
                         and r.get(key) is not None)
            if not pts:
                continue
            c = colors[i % len(colors)]
            default = any(r["default"] for r in rows if r["name"] == name)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=c, lw=2.2 if default else 1.2,
                    label=f"{name} (packed, Q sweep)" + (" [default]" if default else ""))
            for x, y, q in pts:
                ax.annotate(f"Q{q}", (x, y), textcoords="offset points", xytext=(3, 4), fontsize=7, color=c)
            glance = [(r["encoder_gflop"], r.get(key)) for r in rows if r["name"] == name and r["path"] == "glance"
                      and r.get(key) is not None]
            if glance:
                ax.plot(*zip(*sorted(glance)), "x:", color=c, lw=0.8, label=f"{name}: its glance depth")
        curve = []
        for name in dense_trained:  # at the largest Q's points (the most points): one marker a model
            mine = [r for r in rows if r["name"] == name and r.get(key) is not None]
            if mine:
                r = max(mine, key=lambda r: r["q"])
                ax.plot(r["encoder_gflop"], r.get(key), "s", color="black", mfc="none")
                ax.annotate(name, (r["encoder_gflop"], r.get(key)), textcoords="offset points", xytext=(4, -10), fontsize=7)
                curve += [(r["encoder_gflop"], r.get(key))] if not r["seed"] else []
        front = []
        for g, a in sorted(curve):  # each model better than every cheaper one
            if not front or a < front[-1][1]:
                front.append((g, a))
        if front:  # the best dense model at no more cost, out to the dearest point of the figure
            front.append((max(r["encoder_gflop"] for r in rows), front[-1][1]))
            ax.step(*zip(*front), "--", where="post", color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("encoder GFLOP per image (log)")
        ax.set_ylabel(f"AbsRel, {label} (lower is better)")
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].plot([], [], "s--", color="black", mfc="none", lw=0.8,
                 label="dense-trained models, run dense (at the largest Q's points); "
                       "the line: the best one at no more cost")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.022 * ((len(labels) + 1) // 2), 1, 0.96))
    if title:
        fig.suptitle(title, fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---- the command --------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> dict:
    ap = cli.Parser(prog="python -m depthpack.eval.frontier", description=__doc__.split("\n\n")[0], name="frontier",
                    epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="the plan: a YAML file (see above)")
    ap.add_argument("--runs", default="runs/frontier", help="where the runs' folders are (one per run)")
    ap.add_argument("--out", default="docs/results/frontier.json", help="the rows (JSON)")
    ap.add_argument("--figure", default="docs/figures/frontier.png", help="the figure (PNG)")
    ap.add_argument("--jobs", type=int, default=1, help="runs trained and evaluated at once")
    ap.add_argument("--no-train", action="store_true", help="read and evaluate finished runs only")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="these runs of the plan only")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error(f"--jobs {a.jobs}: must be >= 1")
    plan = load_plan(a.plan)
    runs_dir = Path(a.runs)
    runs_dir.mkdir(parents=True, exist_ok=True)
    todo = [r for r in plan["runs"] if a.only is None or r["name"] in a.only]
    if a.only and len(todo) != len(a.only):
        raise ValueError(f"--only: {sorted(set(a.only) - {r['name'] for r in todo})} are not runs of {a.plan}")

    def one(run: dict) -> list[dict]:
        folder = run_dir(runs_dir, run)
        log = runs_dir / f"{slug(run['name'])}.log"
        t0 = time.perf_counter()
        if finished(folder) is None:
            if a.no_train:
                print(f"frontier: {run['name']}: not finished, left out (--no-train)", flush=True)
                return []
            train_run(plan, run, folder, log)
        result = eval_run(plan, run, folder, log)
        print(f"frontier: {run['name']}: done in {time.perf_counter() - t0:.0f} s", flush=True)
        return rows_of(plan, run, folder, result, finished(folder) or {})
    with ThreadPoolExecutor(a.jobs) as pool:
        rows = [r for rs in pool.map(one, todo) for r in rs]
    old = json.loads(Path(a.out).read_text()).get("rows", []) if a.only and Path(a.out).is_file() else []
    rows = [r for r in old if r["name"] not in {t["name"] for t in todo}] + rows
    doc = {"plan": str(a.plan), "image": plan["image"], "band_radius": plan.get("band_radius"),
           "hardware": ", ".join(sorted({str(r["device"]) for r in rows})) or platform.machine(), "rows": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(a.out, doc, sort_keys=False)
    fig = figure(rows, a.figure, f"{Path(a.plan).stem}: AbsRel on {len(rows) and rows[0]['eval_image']} held-out images")
    print(f"frontier: {len(rows)} rows in {a.out}; {fig}")
    return doc


def run() -> None:
    sys.exit(cli.run("frontier", main))


if __name__ == "__main__":
    run()
