"""The accuracy-cost frontier: the packed model's Q sweep beside dense models at several image sizes,
AbsRel against encoder GFLOP, on uniform points, in the depth-edge band and on the thin band (thin structures and
small objects of synthetic scenes), all trained the same way.

    python -m depthpack.frontier --plan configs/frontier_cpu.yaml --jobs 2          # train + evaluate
    python -m depthpack.frontier --plan configs/frontier_cpu.yaml --no-train        # finished runs only

A plan (YAML) names the runs: each a training config (`base`), the overrides every run shares (`common`: the
same scenes and steps) and its own (`overrides`: one lever at a time). A plan that `varies` another holds only
what differs: its keys replace the other's, its `common` comes after the other's. The whole plan is checked
before anything trains: every key's type, every run's name (its folder under --runs, one a run) and its merged
training config. Runs whose folder holds a finished summary.json are read, not trained again (a folder whose
checkpoint trained with another config, a run of another plan of that name, is refused before anything trains);
the rest train as subprocesses, --jobs at a time, each dying with this command (a trainer holds its folder's
train.lock, so a folder another live trainer holds is refused). Every run is evaluated on the same held-out
scenes at the plan's `image` size (a model of another size sees them resized, its points scaled), at the same
query points (`points`: the point sets of python -m depthpack.eval --points, both by default; all adds the thin
band of synthetic scenes, its parts at most `thin_max_px` pixels across), with the same depth-edge band
(`band_radius` pixels of that image). A run that fails is one line naming its log; the others go on, and the
command then exits 1 saying which failed. Rows go to --out (docs/results/frontier.json by default), under the
plan's name (its file's stem) beside other plans' rows: {plans: {name: {plan, image, band_radius, [thin_max_px,]
hardware, rows}}}, a row {name, path, image, q, tokens, encoder_gflop, absrel_uniform, absrel_edge, absrel_thin,
steps, scenes, seed, device, torch, commit, patches, default}; the rows of runs evaluated now replace theirs,
the rows of every other run are kept; the figure goes to --figure.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from .core import cli
from .core.config import ModelConfig, load_yaml, parse_overrides
from .core.files import atomic_write_json, atomic_write_text, check_writable_dir
from .core.packing import chunk_plan

PLAN_KEYS = {"varies", "base", "common", "image", "queries", "band_radius", "thin_max_px", "points", "max_images",
             "device", "runs"}
RUN_KEYS = {"name", "path", "overrides", "default"}
OWN_KEYS = ("out_dir", "resume")  # the frontier sets these for each run: a plan that sets them is refused


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
    """A plan file, checked whole before anything trains: every key known and of its type, every run a
    mapping with a name of its own (and a folder of its own: names that slug alike are refused), packed or
    dense, and its merged training config built (a bad override fails here, not after hours). One ValueError
    naming the plan and every problem."""
    plan = _varied(load_yaml(path, "plan"), path)
    unknown = set(plan) - PLAN_KEYS
    if unknown:
        raise ValueError(f"plan {path}: unknown key(s) {sorted(unknown)}; known: {sorted(PLAN_KEYS)}")
    for key in ("base", "image", "runs"):
        if key not in plan:
            raise ValueError(f"plan {path}: needs {key!r}")
    problems = _plan_problems(plan)
    if not problems:  # the runs are a list of mappings
        problems = _run_problems(plan["runs"])
    if not problems:  # every name and override well formed: build each run's config
        problems = [p for r in plan["runs"] for p in _config_problems(plan, r)]
    if problems:
        raise ValueError(f"plan {path}: " + "; ".join(problems))
    return plan


def _varied(plan: dict, path: str | Path) -> dict:
    """A plan that `varies` another (one level, so each bed has one home): the other's keys, this file's
    replacing them, and this file's `common` after the other's (a later key=value wins)."""
    if "varies" not in plan:
        return plan
    src = plan["varies"]
    if not (isinstance(src, str) and src.strip()):
        raise ValueError(f"plan {path}: varies must be another plan's path, got {src!r}")
    other = load_yaml(src, "plan")
    if "varies" in other:
        raise ValueError(f"plan {path}: varies {src}, which varies {other['varies']}; a plan may vary only a plan "
                         f"that varies none")
    mine = {k: v for k, v in plan.items() if k != "varies"}
    common = [other.get("common", []), mine.get("common", [])]
    if not all(_texts(c) for c in common):  # said by the plan's own check, not spread into characters here
        return {**other, **mine}
    return {**other, **mine, "common": [*common[0], *common[1]]}


def _count(v: Any, lo: int) -> bool:
    """v is a whole number >= lo (a YAML true is not a number)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= lo


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _plan_problems(plan: dict) -> list[str]:
    """The plan's own keys, each of its type."""
    from .train.config import DEVICE_NAME

    problems = []
    if not (isinstance(plan["base"], str) and plan["base"].strip()):
        problems.append(f"base must be a training config's path, got {plan['base']!r}")
    else:
        try:
            load_yaml(plan["base"], "base config")
        except ValueError as e:
            problems.append(str(e))
    if not _texts(plan.get("common", [])):
        problems.append(f"common must be a list of key=value strings, got {plan['common']!r}")
    if not (isinstance(plan["image"], list) and len(plan["image"]) == 2 and all(_count(v, 1) for v in plan["image"])):
        problems.append(f"image must be [height, width], two positive whole numbers of pixels, got {plan['image']!r}")
    queries = plan.get("queries", [16])
    if not (isinstance(queries, list) and queries and all(_count(q, 1) for q in queries)):
        problems.append(f"queries must be a list of positive whole numbers, got {queries!r}")
    if plan.get("band_radius") is not None and not (_count(plan["band_radius"], 0) and plan["band_radius"] <= 4096):
        problems.append(f"band_radius must be a whole number of pixels in [0, 4096] or null, got {plan['band_radius']!r}")
    if plan.get("thin_max_px") is not None and not (_count(plan["thin_max_px"], 1) and plan["thin_max_px"] <= 4096):
        problems.append(f"thin_max_px must be a whole number of pixels in [1, 4096] or null, got {plan['thin_max_px']!r}")
    from .eval.evaluate import POINT_SETS

    if plan.get("points", "both") not in POINT_SETS:
        problems.append(f"points must be one of {', '.join(POINT_SETS)} (python -m depthpack.eval --points), got "
                        f"{plan['points']!r}")
    if plan.get("max_images") is not None and not _count(plan["max_images"], 1):
        problems.append(f"max_images must be a positive whole number or null, got {plan['max_images']!r}")
    device = plan.get("device", "auto")
    if not (isinstance(device, str) and DEVICE_NAME.fullmatch(device)):  # whether this machine has it: main
        problems.append(f"device must be auto, cpu, cuda or cuda:N, got {device!r}")
    runs = plan["runs"]
    if not (isinstance(runs, list) and runs and all(isinstance(r, dict) for r in runs)):
        problems.append(f"runs must be a non-empty list of mappings ({', '.join(sorted(RUN_KEYS))}), got {runs!r:.200}")
    return problems


def _run_problems(runs: list[dict]) -> list[str]:
    """Each run: a name of its own that makes a folder of its own, its path, its overrides, only RUN_KEYS."""
    problems, folders = [], {}
    for i, r in enumerate(runs, 1):
        name = r.get("name")
        if not (isinstance(name, str) and name.strip()):
            problems.append(f"run {i}: its name must be text, got {name!r}")
            continue
        folder = slug(name)
        if not folder:
            problems.append(f"run {name!r}: its name has no letter or digit, so it names no folder")
        elif folder in folders:
            why = "twice" if folders[folder] == name else f"and {folders[folder]!r} share the folder {folder}"
            problems.append(f"run {name!r} {why}: every run needs a name of its own")
        folders.setdefault(folder, name)
        if set(r) - RUN_KEYS or r.get("path") not in ("packed", "dense"):
            problems.append(f"run {name!r} must have path packed or dense and only {sorted(RUN_KEYS)}")
        if not _texts(r.get("overrides", [])):
            problems.append(f"run {name!r}: overrides must be a list of key=value strings, got {r['overrides']!r}")
        if not isinstance(r.get("default", False), bool):
            problems.append(f"run {name!r}: default must be true or false, got {r['default']!r}")
    return problems


def _config_problems(plan: dict, run: dict) -> list[str]:
    """The run's merged training config builds (depthpack.train's loader), and leaves OWN_KEYS to the frontier."""
    from .train.config import load_train_config

    given = [*plan.get("common", []), *run.get("overrides", [])]
    try:
        own = [k for k in OWN_KEYS if k in parse_overrides(given)]
        if own:
            return [f"run {run['name']!r}: {', '.join(own)} are the frontier's (each run trains in --runs/its name)"]
        load_train_config(plan["base"], run_overrides(plan, run, Path(slug(run["name"]))))
    except ValueError as e:
        return [f"run {run['name']!r}: {cli.one_line(e)}"]
    return []


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


def run_dir(runs: Path, run: dict) -> Path:
    return runs / slug(run["name"])


def run_overrides(plan: dict, run: dict, folder: Path) -> list[str]:
    """The overrides a run trains with, on its plan's base config: common, its own, its folder."""
    return [*plan.get("common", []), *run.get("overrides", []), f"out_dir={folder}", "progress=false"]


def finished(folder: Path) -> dict | None:
    """The run's summary.json if it trained to its last step, else None."""
    try:
        s = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return s if isinstance(s, dict) and s.get("step") == s.get("steps") and "stopped_early" not in s else None


# Training keys that say how a run ran, not what it learned: a folder trained with other values is still the run.
HOW_IT_RAN = {"out_dir", "resume", "progress", "max_time_s", "ckpt_every", "keep_checkpoints", "eval_every",
              "eval_images", "eval_queries", "log_every", "num_workers", "threads", "compile", "data.root",
              "data.cache_dir"}
MODEL = ("model",)  # the run's model overrides, compared whole: an override added or dropped is a difference


def check_folders(plan: dict, todo: list[dict], runs_dir: Path) -> None:
    """Each run whose folder holds a checkpoint trained with the config the plan gives it now (what it learned:
    HOW_IT_RAN aside; a key the checkpoint does not hold is not compared): plans that vary another share their
    runs' names, so a folder of another plan would otherwise be read, or resumed, as this one. One ValueError
    naming each such folder and its first differing keys."""
    from .core.checkpoint import CheckpointError, stored_config
    from .core.config import dotted, to_dict
    from .train.config import load_train_config

    problems = []
    for run in todo:
        folder = run_dir(runs_dir, run)
        try:
            stored = dotted(stored_config(folder).get("train", {}), whole=MODEL)
        except CheckpointError:  # nothing trained yet (or nothing to read): training starts it afresh
            continue
        now = dotted(to_dict(load_train_config(plan["base"], run_overrides(plan, run, folder))), whole=MODEL)
        diff = [f"{k}={json.dumps(stored[k])} (the plan: {json.dumps(now[k])})" for k in now
                if k in stored and k not in HOW_IT_RAN and stored[k] != now[k]]
        if diff:
            problems.append(f"{folder} trained with {', '.join(diff[:3])}{', ...' if len(diff) > 3 else ''}")
    if problems:
        raise ValueError(f"--runs {runs_dir}: {'; '.join(problems)}: a run of another plan or config; give "
                         f"another --runs, or delete the folder to train the run anew")


# ---- the subprocesses: trainers and evaluators that die with the frontier -------------------------
class RunFailed(Exception):
    """A run's training or evaluation failed; the message names its log."""


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent() -> Callable[[], None] | None:
    """What a child runs between fork and exec: the kernel kills it (SIGKILL) when the thread that started it
    dies, however the frontier dies (SIGKILL too); a parent gone before that is an exit. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    parent = os.getpid()

    def child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
    return child


class Children:
    """The subprocesses of this frontier, each in its own process group (what it starts goes with it), and
    each killed with the frontier (_die_with_parent). stop() kills every live group and starts none after. Each
    child gets its share of the cores (OMP_NUM_THREADS): an evaluator at torch's default takes them all beside
    --jobs trainers (a trainer's own threads= still sets its count)."""

    def __init__(self, jobs: int = 1) -> None:
        self.lock = threading.Lock()  # also serializes the forks: one child between fork and exec at a time
        self.live: set[subprocess.Popen] = set()
        self.stopping = False
        self.env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))}

    def call(self, cmd: list[str], log) -> int:
        """cmd's exit code, its output into the open file log."""
        with self.lock:
            if self.stopping:
                raise RunFailed("stopped before it started")
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=_die_with_parent(), env=self.env)
            self.live.add(p)
        try:
            return p.wait()
        finally:
            with self.lock:
                self.live.discard(p)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            for p in self.live:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # the group: the trainer and any worker it started
                except ProcessLookupError:
                    pass


def _terminated(signum: int, frame) -> None:
    print("frontier: terminated; stopping its trainers and evaluators", file=sys.stderr, flush=True)
    raise SystemExit(128 + signum)  # the exit code of an uncaught SIGTERM, through the finally that stops the children


# ---- one run: trained, evaluated, its rows --------------------------------------------------------
def call(children: Children, cmd: list[str], log: Path, what: str) -> None:
    """Run a command with its output appended to log; RunFailed naming the log and its last line if it fails."""
    with open(log, "a") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = children.call(cmd, f)
    if rc:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = f": {lines[-1][:300]}" if lines and lines[-1] != " ".join(cmd) else ""
        raise RunFailed(f"{what} failed (exit {rc}){last}; its log: {log}")


def train_run(children: Children, plan: dict, run: dict, folder: Path, log: Path) -> None:
    call(children, [sys.executable, "-m", "depthpack.train", "--config", plan["base"], *run_overrides(plan, run, folder),
                    *(["resume=true"] if (folder / "latest.json").is_file() else [])], log, f"training {run['name']!r}")


def render_stores(children: Children, plan: dict, todo: list[dict], runs_dir: Path) -> None:
    """Each scene store (data.cache_dir) the runs to train and their evaluations open, rendered once here by
    python -m depthpack.data.prerender on every core, before any trainer starts: the runs of a plan share their
    stores, and trainers started together would each render the same file at once."""
    from .data.store import store_key
    from .train.config import load_train_config

    seen, h, w = set(), *plan["image"]
    for run in todo:
        folder = run_dir(runs_dir, run)
        given = run_overrides(plan, run, folder)
        cfg = load_train_config(plan["base"], given)
        if not cfg.data.cache_dir or cfg.data.kind != "synthetic" or finished(folder) is not None:
            continue
        size = tuple(cfg.model_config().img_size)
        wanted = [*([] if cfg.data.fresh else [(given, "train", cfg.scene_size, cfg.data.num_samples)]),
                  (given, "val", size, cfg.data.num_val),  # the trainer's stores (data.fresh: no train store)
                  ([*given, f"model.img_size=[{h},{w}]"], "val", (h, w), cfg.data.num_val)]  # the frontier's evaluation
        for overrides, split, at, n in wanted:
            key = store_key(cfg.data, split, at, n)
            if key in seen:
                continue
            seen.add(key)
            budget = ["--budget", str(cfg.data.render_budget_s)] if split == "train" and cfg.data.render_budget_s else []
            call(children, [sys.executable, "-m", "depthpack.data.prerender", "--config", plan["base"], *overrides,
                            "--splits", split, *budget], runs_dir / "stores.log", f"rendering the store {key}")


def _cached_eval(out: Path, key: str) -> dict | None:
    """out/eval.json when it was made for this plan's key and reads as an evaluation; garbage: one warning
    naming the file, and None (evaluated again)."""
    done = out / "eval.json"
    try:
        if not (done.is_file() and (out / "plan.json").read_text() == key):
            return None
    except OSError:  # no plan.json: made by hand, or cut short
        return None
    try:
        result = json.loads(done.read_text())
        if not all(isinstance(r["abs_rel"], (int, float)) and r["path"] and r["queries"] for r in result["bands"]["uniform"]["rows"]):
            raise ValueError("a row without its path, queries or abs_rel")
    except (ValueError, KeyError, TypeError, IndexError) as e:
        warnings.warn(f"{done}: not an evaluation ({type(e).__name__}: {cli.one_line(e)[:200]}); evaluating it again")
        return None
    return result


def thin_max_px(plan: dict) -> int:
    """The thin band's width in pixels of the plan's images: its thin_max_px, or the evaluation's default."""
    from .data.queries import THIN_MAX_PX

    return plan.get("thin_max_px") or THIN_MAX_PX


def _has_thin(plan: dict) -> bool:
    """Whether the plan's point sets hold the thin band."""
    from .eval.evaluate import POINT_SETS

    return "thin" in POINT_SETS[plan.get("points", "both")]


def _plan_value(plan: dict, key: str):
    """What a plan evaluated with, as its document in --out records it (thin_max_px only where the thin band is)."""
    if key == "thin_max_px":
        return thin_max_px(plan) if _has_thin(plan) else None
    return plan.get(key)


def eval_run(children: Children, plan: dict, run: dict, folder: Path, cfg: ModelConfig, log: Path) -> dict:
    """eval.json of the run on the plan's images, points and band (evaluated once, then read)."""
    out = folder / "frontier_eval"
    points = plan.get("points", "both")
    key = {k: plan.get(k) for k in ("image", "queries", "band_radius", "max_images")}
    if _has_thin(plan):
        key["thin_max_px"] = thin_max_px(plan)
    key = json.dumps({**key, "points": points} if points != "both" else key, sort_keys=True)  # "both": as before it
    cached = _cached_eval(out, key)
    if cached is not None:
        return cached
    h, w = plan["image"]
    paths = ["packed", "dense", "glance"] if run["path"] == "packed" else ["dense"]
    if run["path"] == "packed" and not cfg.glance_depth:
        paths.remove("glance")
    cmd = [sys.executable, "-m", "depthpack.eval", "--checkpoint", str(folder), "--out", str(out), "--queries",
           *[str(q) for q in plan.get("queries", [16, 64, 256])], "--points", points, "--anchors", "on",
           "--image-size", f"{w}x{h}", "--paths", *paths, "--figure-images", "0", "--no-progress",
           "--device", plan.get("device", "auto")]
    if plan.get("band_radius") is not None:
        cmd += ["--band-radius", str(plan["band_radius"])]
    if _has_thin(plan):
        cmd += ["--thin-max-px", str(thin_max_px(plan))]
    if plan.get("max_images"):
        cmd += ["--max-images", str(plan["max_images"])]
    call(children, cmd, log, f"evaluating {run['name']!r}")
    atomic_write_text(out / "plan.json", key)
    return json.loads((out / "eval.json").read_text())


def one_run(children: Children, plan: dict, run: dict, runs_dir: Path, no_train: bool) -> list[dict] | None:
    """The rows of one run, trained first unless finished; None when --no-train leaves it out. RunFailed or a
    ValueError (a finished run without a checkpoint, say) when it fails."""
    from .core.checkpoint import CheckpointError, stored_config

    folder = run_dir(runs_dir, run)
    log = runs_dir / f"{slug(run['name'])}.log"
    t0 = time.perf_counter()
    if finished(folder) is None:
        if no_train:
            print(f"frontier: {run['name']}: not finished, left out (--no-train)", flush=True)
            return None
        train_run(children, plan, run, folder, log)
        if finished(folder) is None:  # max_time_s, say: never evaluated (and cached) before its last step
            raise RunFailed(f"training {run['name']!r} ended before its last step (its summary.json); the next "
                            f"frontier resumes it; its log: {log}")
    try:
        stored = stored_config(folder)
    except CheckpointError as e:  # a finished run whose checkpoints were deleted, say
        raise RunFailed(f"{folder} is finished (summary.json) but holds no checkpoint to evaluate "
                        f"({cli.one_line(e)[:300]})") from None
    from .core.config import stored_model_config

    cfg = stored_model_config(stored["model"])
    result = eval_run(children, plan, run, folder, cfg, log)
    print(f"frontier: {run['name']}: done in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows_of(plan, run, cfg, stored, result, finished(folder) or {})


def rows_of(plan: dict, run: dict, cfg: ModelConfig, stored: dict, result: dict, summary: dict) -> list[dict]:
    """The frontier rows of one evaluated run (cfg, stored: its model and stored config): per path it was
    evaluated on, per Q."""
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
    from .eval.viz import _plt, save_figure

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
    return save_figure(fig, path, dpi=100)


# ---- the command --------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = cli.Parser(prog="python -m depthpack.frontier", description=__doc__.split("\n\n")[0], name="frontier",
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
    return a


def check_outputs(a: argparse.Namespace) -> Path:
    """--out and --figure files in folders that take them, --runs a folder: refused before anything trains
    (each one line); the runs folder."""
    for flag, path, kind in (("--out", Path(a.out), "JSON"), ("--figure", Path(a.figure), "PNG")):
        if path.is_dir():
            raise ValueError(f"{flag} {path} is a folder: give the {kind} file's name")
        check_writable_dir(path.parent, f"{flag}'s folder")
    return check_writable_dir(a.runs, "--runs")


def read_plans(out: Path) -> dict[str, dict]:
    """The plans --out holds, by name (plan_name; none when it does not exist): {name: {plan, image, band_radius,
    hardware, rows}}. A file of one plan (the format before several) is read as that plan. One ValueError when it
    is not a rows file."""
    if not out.exists():
        return {}
    try:
        doc = json.loads(out.read_text())
        plans = doc["plans"] if "plans" in doc else {plan_name(doc["plan"]): doc}
        for entry in plans.values():
            if not all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in entry["rows"]):
                raise ValueError("a row without a name")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--out {out}: not a frontier rows file ({type(e).__name__}: {cli.one_line(e)[:200]}), and "
                         f"its rows would be lost: move it away or give another --out") from None
    return plans


def plan_name(path: str | Path) -> str:
    """A plan's name in the rows file: its file's stem (configs/frontier_cpu.yaml: frontier_cpu)."""
    return Path(path).stem


def old_rows(plans: dict[str, dict], name: str, plan: dict, out: Path) -> list[dict]:
    """The rows --out holds for this plan, to keep those of runs not evaluated now; one ValueError when they were
    evaluated on other images or another band."""
    entry = plans.get(name)
    if entry is None:
        return []
    for key in ("image", "band_radius", "thin_max_px"):
        if entry.get(key) != _plan_value(plan, key):
            raise ValueError(f"--out {out} holds rows of plan {name} evaluated with {key} {entry.get(key)!r}, this "
                             f"plan's {key} is {_plan_value(plan, key)!r}: they would not compare; give another --out")
    return entry["rows"]


def merge_rows(plan: dict, old: list[dict], new: dict[str, list[dict]]) -> list[dict]:
    """The rows of each run evaluated now (new, by name) replace its old ones; every other old row stays, marked the
    default as the plan marks it. In the plan's order, then the old rows of runs the plan no longer names."""
    kept: dict[str, list[dict]] = {}
    default = {r["name"]: bool(r.get("default")) for r in plan["runs"]}  # the plan says which run is the default
    for r in old:
        kept.setdefault(r["name"], []).append({**r, "default": default.get(r["name"], False) and r["path"] == "packed"})
    names = [r["name"] for r in plan["runs"]]
    return [r for name in names + [n for n in kept if n not in names] for r in new.get(name, kept.get(name, []))]


def run_plan(plan: dict, todo: list[dict], runs_dir: Path, a: argparse.Namespace) -> tuple[dict, list[str]]:
    """Every run of todo, --jobs at a time: the rows of those evaluated now (by name) and the names of those
    that failed (each said in one line as it fails). SIGTERM, Ctrl-C or an error stops every trainer and
    evaluator, and starts none after."""
    children, failed = Children(a.jobs), set()

    def attempt(run: dict) -> list[dict] | None:
        try:
            return one_run(children, plan, run, runs_dir, a.no_train)
        except (RunFailed, ValueError, OSError) as e:
            if not children.stopping:  # stopped: killed on purpose, said by the command
                failed.add(run["name"])
                print(f"frontier: run {run['name']!r} failed: {cli.one_line(e)}", file=sys.stderr, flush=True)
            return None
    main_thread = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    pool = ThreadPoolExecutor(a.jobs)
    try:
        if not a.no_train:
            try:
                render_stores(children, plan, todo, runs_dir)
            except RunFailed as e:  # every run needs its stores: one error, no trainer started
                raise ValueError(str(e)) from None
        results = [f.result() for f in [pool.submit(attempt, r) for r in todo]]
    finally:
        children.stop()
        pool.shutdown(wait=True, cancel_futures=True)
        if main_thread:
            signal.signal(signal.SIGTERM, before)
    new = {r["name"]: rows for r, rows in zip(todo, results) if rows is not None}
    return new, [r["name"] for r in todo if r["name"] in failed]


def main(argv: list[str] | None = None) -> dict:
    """The rows document written to --out; a ValueError (one line) when a run failed, after the others' rows
    are written, or when nothing was evaluated (--out then left as it was)."""
    a = parse_args(argv)
    plan = load_plan(a.plan)
    todo = [r for r in plan["runs"] if a.only is None or r["name"] in a.only]
    if a.only and len(todo) != len(a.only):
        raise ValueError(f"--only: {sorted(set(a.only) - {r['name'] for r in todo})} are not runs of {a.plan}")
    from .eval.evaluate import resolve_device

    resolve_device(plan.get("device", "auto"), f"plan {a.plan}: device")  # the runs are evaluated here
    runs_dir = check_outputs(a)
    plans, name = read_plans(Path(a.out)), plan_name(a.plan)
    old = old_rows(plans, name, plan, Path(a.out))
    check_folders(plan, todo, runs_dir)
    new, failed = run_plan(plan, todo, runs_dir, a)
    said = f"{len(failed)} of {len(todo)} runs failed ({', '.join(map(repr, failed))}; each said above with its log)"
    if not new:
        why = said if failed else f"none of the {len(todo)} runs is finished and --no-train trains none"
        raise ValueError(f"nothing to write: {why}; {a.out} left as it was")
    rows = merge_rows(plan, old, new)
    doc = {"plan": str(a.plan), "image": plan["image"], "band_radius": plan.get("band_radius"),
           **({"thin_max_px": thin_max_px(plan)} if _plan_value(plan, "thin_max_px") is not None else {}),
           "hardware": ", ".join(sorted({str(r["device"]) for r in rows})) or platform.machine(), "rows": rows}
    atomic_write_json(a.out, {"plans": {**plans, name: doc}}, sort_keys=False)
    try:
        fig = figure(rows, a.figure, f"{Path(a.plan).stem}: AbsRel on {rows[0].get('eval_image')} held-out images")
    except OSError as e:  # a full disk, say: the PNG is written atomically, so none is left half written
        raise ValueError(f"--figure {a.figure}: cannot be written ({e.strerror or e}); the rows are in {a.out}") from None
    print(f"frontier: {len(rows)} rows in {a.out}; {fig}")
    if failed:
        raise ValueError(f"{said}; the rows of the others are in {a.out}")
    return doc


def run() -> None:
    sys.exit(cli.run("frontier", main))


if __name__ == "__main__":
    run()
