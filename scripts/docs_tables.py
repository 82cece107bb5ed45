"""The tables of the docs, rendered from the result files in docs/results/ (so a page cannot drift from them).

    python scripts/docs_tables.py             # rewrite every generated block of README.md and docs/**/*.md
    python scripts/docs_tables.py --check     # exit 1, naming each page whose blocks differ from the results
    python scripts/docs_tables.py --figures   # also redraw docs/figures/latency_h200.png, accuracy.png, bed_schedule.png

A page holds a generated block between two markers; everything else in the page is written by hand:

    <!-- generated: NAME -->
    ...
    <!-- end generated: NAME -->

A new measurement goes into its result file (a benchmark's bench.json replaces docs/results/h200_bench.json
as it is), then this command re-renders every page that shows it. Each result file names the hardware,
torch and the commit that produced it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
FIGURES = ROOT / "docs" / "figures"
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated: (?P=name) -->)", re.S)
MARK = re.compile(r"<!-- (?:end )?generated: ([\w-]+) -->")


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def ms(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (str, int)):
        return str(v)
    return f"{v:.3f}" if v < 10 else f"{v:.2f}"


def pct(v: float) -> str:
    return f"{100 * v:+.1f}%"


def table(head: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)] + \
           ["| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]


def hardware(info: dict) -> str:
    return ", ".join(x for x in (info.get("gpu") or info.get("cpu"), f"torch {info['torch']}" if info.get("torch") else "")
                     if x)


# ---- latency ------------------------------------------------------------------------------------------
def _ok(data: dict) -> list[dict]:
    return [r for r in data["results"] if "error" not in r and r.get("median_ms") is not None]


def _commit(r: dict, info: dict) -> str:
    return r.get("commit") or info.get("commit") or "?"


def _caption(data: dict) -> str:
    rs = _ok(data)
    what = sorted({f"{r['preset']} {r['dtype']}" for r in rs})
    commits = sorted({_commit(r, data["info"]) for r in rs})
    tail = data.get("note") or f"Commit `{commits[0]}`."
    return f"{hardware(data['info'])}; {', '.join(what)}. {tail}"


def latency(data: dict, names: tuple[str, ...] | None = None, pairs: tuple | None = None, words: bool = True,
            extra: tuple[str, ...] = ("back_to_back_ms", "kernels", "commit")) -> list[str]:
    """One row per configuration, for each (batch, queries): call + sync median ms, back-to-back and kernels
    where any row has them; a commit column when the rows come from more than one commit."""
    rs = [r for r in _ok(data) if names is None or r["row"] in names]
    info = data["info"]
    pairs = pairs or tuple(sorted({(r["batch"], r["queries"]) for r in rs}))
    order = list(names) if names else list(dict.fromkeys(r["row"] for r in rs))
    at = {(r["row"], r["batch"], r["queries"]): r for r in rs}
    order = [n for n in order if any((n, *p) in at for p in pairs)]
    cols = []
    for b, q in pairs:
        cols.append((b, q, "median_ms", f"B{b} Q{q} ms"))
        for key, label in (("back_to_back_ms", "back-to-back"), ("kernels", "kernels")):
            if key in extra and any(at.get((n, b, q), {}).get(key) for n in order):
                cols.append((b, q, key, label))
    multi = "commit" in extra and len({_commit(r, info) for r in rs}) > 1
    head = ["row"] + (["what it adds"] if words else []) + [c[3] for c in cols] + (["commit"] if multi else [])
    out = []
    for n in order:
        mine = [at[(n, *p)] for p in pairs if (n, *p) in at]
        cells = [f"**{n}**" if n == "fast" else n] + ([mine[0].get("switch", "")] if words else [])
        cells += [ms(at[(n, b, q)].get(key)) if (n, b, q) in at else "" for b, q, key, _ in cols]
        if multi:
            cells.append(" / ".join(dict.fromkeys(f"`{_commit(r, info)}`" for r in mine)))
        out.append(cells)
    return table(head, out)


def block_h200_latency() -> list[str]:
    data = load("h200_bench.json")
    lines = [_caption(data), ""] + latency(data)
    for key, c in (data.get("checks") or {}).items():
        lines.append(f"- {key}: the default {c['default_ms']:.3f} ms, the best row ({c['best_row']}) "
                     f"{c['best_ms']:.3f} ms: {c['default_over_best']:.2f}x")
    return lines


def block_h200_layout() -> list[str]:
    return _layout(load("h200_scale_checks.json"))


def block_h100_layout() -> list[str]:
    data = load("h100_checks.json")
    t = load("gpu_tests.json")
    after = data["latency_after"]
    base = after["rows"]["144 thumbnail anchors"]
    rows = [[name, ms(r["median_ms"]), ms(r["p90_ms"]), ms(r["back_to_back_ms"]), r["kernels"], f"{r['gflop']:.2f}",
             f"{r['median_ms'] / base['median_ms'] - 1:+.0%}"] for name, r in after["rows"].items()]
    return _layout(data) + ["", f"Then {after['what']} (commit `{after['commit']}`):", ""] + table(
        ["layout (vits bf16, 420x560)", "B1 Q256 ms", "p90 ms", "back-to-back ms", "kernels", "GFLOP", "call vs thumbnail"],
        rows) + ["", f"The GPU tests on the same card (`pytest -m gpu`, `docs/results/gpu_tests.json`): "
                     f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped (commit `{t['commit']}`)."]


def _layout(data: dict) -> list[str]:
    """The default layout's B1 latency at 420x560 beside 144 thumbnail anchors, and the renderer, of one card."""
    lat = data["latency"]
    base = lat["144 thumbnail anchors"]
    rows = [[name, ms(r["median_ms"]), ms(r["p90_ms"]), ms(r["back_to_back_ms"]), r["kernels"], f"{r['gflop']:.2f}",
             f"{r['median_ms'] / base['median_ms'] - 1:+.0%}"] for name, r in lat.items()]
    render = [[kind, f"{r['total_ms']:.1f}", f"{r['render_ms']:.1f}", f"{r['scenes_per_s']:.0f}"]
              for kind, r in data["render"]["per_scene_ms"].items()]
    i = data["info"]
    return table(["layout (vits bf16, 420x560)", "B1 Q256 ms", "p90 ms", "back-to-back ms", "kernels", "GFLOP",
                  "call vs thumbnail"], rows) + [""] + table(
        ["scenes (420x560, batch 64)", "ms a scene", "of which cast + shade", "scenes/s"], render) + [
        "", f"{i['gpu']}, torch {i['torch']}, commit `{i['commit']}` ({i['note']})."]


def block_cpu_latency() -> list[str]:
    data = load("cpu_bench.json")
    return [_caption(data), "", data["what"] + ".", ""] + latency(data)


def block_readme_latency() -> list[str]:
    data = load("h100_bench.json")
    return latency(data, ("fast", "dav2-compile+graph"), pairs=((1, 256), (8, 512)), words=False,
                   extra=("back_to_back_ms",)) + [
        "", f"{hardware(data['info'])}; `docs/results/h100_bench.json` names the commit."]


def block_h100_latency() -> list[str]:
    data = load("h100_bench.json")
    return [_caption(data), "", data["what"] + ".", ""] + latency(data)


def block_cpu_oneway() -> list[str]:
    data = load("cpu_oneway_ab.json")
    rows = [[r["model"], r["queries"], ms(r["oneway"]["median_ms"]), ms(r["shared"]["median_ms"]),
             pct(r["oneway_over_shared"] - 1), ms(r["oneway, chunks whole"]["median_ms"]),
             pct(r["oneway_over_chunks_whole"] - 1)] for r in data["rows"]]
    i = data["info"]
    return table(["model", "B1 Q", "one-way ms", "shared ms", "one-way vs shared (paired)",
                  "one-way, chunks whole ms", "prefix once vs chunks whole (paired)"], rows) + [
        "", f"{i['cpu']}, torch {i['torch']}, commit `{i['commit']}`; {data['what']} "
            f"(`docs/results/cpu_oneway_ab.json`)."]


def block_h200_cpp() -> list[str]:
    data = load("h200_cpp.json")
    rows = [[r["what"], r["package"], f"B{r['batch']} bucket {r['bucket']}", ms(r["median_ms"]), ms(r.get("p90_ms")),
             ms(r.get("read_median_ms")), f"`{r['commit']}`"] for r in data["results"]]
    return [f"{hardware(data['info'])}; {data['what']}.", ""] + table(
        ["what is timed", "package", "batch", "median ms", "p90 ms", "with the frame's read, median ms", "commit"], rows)


def block_h200_compile() -> list[str]:
    data = load("h200_compile.json")
    p = data["predictor"]
    buckets = sorted(p["cold_s"], key=int)
    lines = [f"{hardware(data['info'])}; {data['what']}.", ""]
    lines += table(["Predictor, compile + capture", *buckets, "all buckets, one process", "commit"],
                   [["cold s", *(p["cold_s"][b] for b in buckets), p["cold_total_s"], f"`{p['commit']}`"],
                    ["warm s", *(p["warm_s"][b] for b in buckets), p["warm_total_s"], f"`{p['commit']}`"]])
    lines += [""] + table(["AOTInductor package", "compile s", "commit"],
                          [[k["what"], k["compile_s"], f"`{k['commit']}`"] for k in data["packages"]])
    return lines


def block_h200_profile() -> list[str]:
    data = load("h200_profile.json")
    prof = data["profiles"][0]
    rows = [[k, f"{v:.1f}"] for k, v in sorted(prof["categories_us"].items(), key=lambda kv: -kv[1])]
    rows.append(["graph replay, whole forward", f"{1e3 * prof['graph_replay_ms']:.1f}"])
    return [f"{hardware(data['info'])}, commit `{data['info']['commit']}`: {data['what']}; {prof['backend']}, "
            f"{prof['kernels_per_call']} kernels per call.", ""] + table(["kernels", "busy us"], rows)


def block_h200_roofline() -> list[str]:
    r = load("h200_roofline.json")
    c = r["ceilings"]
    lines = [f"NVIDIA H200, torch {r['torch']}, commit `{r['commit']}`: {r['what']}. Ceilings measured in the run: "
             f"{c['gemm_tflops']:.0f} TFLOP/s (bf16 GEMM 8192^3), {c['copy_gb_s']:.0f} GB/s (copy, read + write). "
             f"{r['kernels_per_forward']:.0f} kernels busy {r['busy_us']:.0f} us per forward against a floor of "
             f"{r['floor_us']:.0f} us at the ceilings ({100 * r['roof']:.0f}%); graph replay back-to-back "
             f"{1e3 * r['back_to_back_ms']:.0f} us, one call + sync {1e3 * r['latency_ms']:.0f} us.", ""]
    lines += table(["category", "us per forward", "share", "launches", "GFLOP", "MB", "floor us", "roof"],
                   [[k, f"{v['us']:.1f}", f"{100 * v['share']:.0f}%", f"{v['launches']:.0f}", f"{v['gflop']:.1f}", f"{v['mb']:.0f}",
                     f"{v['floor_us']:.1f}", f"{100 * v['roof']:.0f}%"] for k, v in sorted(r["categories"].items(), key=lambda kv: -kv[1]["us"])])
    rows = []
    for k in r["kernels"][:12]:
        shapes = ", ".join("x".join(map(str, s)) for s in k["shapes"][:3] if isinstance(s, list) and s)
        rows.append([f"`{k['kernel'][:48]}`", f"{k['op'] or 'Triton'} {shapes}", f"{k['launches']:.0f}", f"{k['us']:.1f}",
                     f"{100 * k['share']:.1f}%", f"{k['tflops']:.0f}" if k["gflop"] else "", f"{k['gb_s']:.0f}", k["bound"],
                     f"{100 * k['roof']:.0f}%"])
    return lines + [""] + table(["kernel", "op, shapes", "launches", "us", "share", "TFLOP/s", "GB/s", "bound", "roof"], rows)


def block_h200_fold_ab() -> list[str]:
    d = load("h200_b8_variants.json")
    rows = [r for r in d["rows"] if r["run"] == 3]
    return table(["point", "variant", "call + sync ms", "back-to-back ms", "spells (call)", "spells (back-to-back)"],
                 [[r["point"], r["variant"], f"{r['median_ms']:.3f}", f"{r['b2b_ms']:.4f}",
                   " ".join(f"{v:.3f}" for v in r["call_spells"]), " ".join(f"{v:.4f}" for v in r["b2b_spells"])]
                  for r in rows])


def block_dropped() -> list[str]:
    data = load("dropped.json")
    rows, paras = [], []
    for e in data["dropped"]:
        for f in e["figures"]:
            bq = f"B{f['batch']} Q{f['queries']}" if f["queries"] else "-"
            rows.append([e["name"], bq, f["metric"], ms(f["value"]), f"{ms(f['against_value'])} ({f['against']})",
                         f"`{f['commit']}`"])
        where = ", ".join(f"`{e['last_at']}:{p}`" for p in e["paths"])
        added = f", added in `{e['added']}`" if e.get("added") else ""
        paras += [f"**{e['name']}** (`{e['code']}`; last in {where}{added}). {e['why']}", ""]
    pr = data["probes"]
    paras.append("Probe scripts that measured the above and left with it:")
    paras += [f"- `{pr['last_at']}:{s['path']}`: {s['what']}." for s in pr["scripts"]]
    return table(["dropped", "B, Q", "metric", "value", "against", "commit"], rows) + [""] + paras


# ---- accuracy -----------------------------------------------------------------------------------------
def _absrel(v) -> str:
    return "" if v is None else f"{v:.4f}"


def _gap(r: dict) -> str:
    p, d = r.get("packed_absrel"), r.get("dense_absrel")
    return pct(p / d - 1) if p is not None and d else ""


def _runs(rows: list[dict]) -> str:
    runs = dict.fromkeys((r.get("gpu") or r.get("cpu"), r.get("torch"), r.get("commit")) for r in rows)
    return "; ".join(f"{hw}, torch {t}, commit `{c}`" for hw, t, c in runs)


def block_accuracy() -> list[str]:
    data = load("accuracy.json")
    rows = [[r["layout"] + (" (default)" if r["default"] else ""), r["q"], r["tokens"], r["encoder_gflop"],
             _absrel(r["packed_absrel"]), _absrel(r["dense_absrel"]), _gap(r), r["steps"]] for r in data["rows"]]
    return table(["layout", "Q", "tokens", "encoder GFLOP", "packed AbsRel", "dense AbsRel", "packed vs dense",
                  "training steps"], rows) + ["", f"Runs: {_runs(data['rows'])}. Source: `docs/results/accuracy.json`."]


def block_equal_tokens() -> list[str]:
    """Q = 256 at the same training length: each packed layout beside the dense models a user could run
    instead at a smaller image size, with the B1 latency the same benchmark measured."""
    data = load("accuracy.json")
    rs = [r for r in data["rows"] if r["q"] == 256 and r.get("b1_ms") is not None]
    rows = [[r["layout"], r["image"], r["tokens"], r["encoder_gflop"], "packed" if r["packed_absrel"] is not None else "dense",
             _absrel(r["packed_absrel"] if r["packed_absrel"] is not None else r["dense_absrel"]), ms(r["b1_ms"]),
             r["steps"]] for r in rs]
    return table(["model", "image", "tokens", "encoder GFLOP", "path", "AbsRel at Q = 256", "B1 ms", "training steps"],
                 rows) + ["", f"Runs: {_runs(rs)}. Source: `docs/results/accuracy.json` (b1_ms) and "
                          "`docs/results/context_ab.json` (the commands)."]


def block_readme_accuracy() -> list[str]:
    data = load("accuracy.json")
    rs = [r for r in data["rows"] if r["default"]]
    rows = [[r["q"], r["tokens"], r["encoder_gflop"], _absrel(r["packed_absrel"]), _absrel(r["dense_absrel"]), _gap(r)]
            for r in rs]
    dense = rs[0].get("dense_tokens"), rs[0].get("dense_encoder_gflop")
    note = f" The dense path runs {dense[0]} tokens ({dense[1]} GFLOP)." if dense[0] else ""
    hw = "; ".join(dict.fromkeys(f"{r.get('gpu') or r.get('cpu')}, torch {r.get('torch')}" for r in rs))
    return table(["queries", "tokens", "encoder GFLOP", "packed AbsRel", "dense AbsRel", "packed vs dense"], rows) + [
        "", f"{rs[0]['preset']} at {rs[0]['image']}, {rs[0]['layout']}, {rs[0]['steps']} training steps, {rs[0]['data']}."
        f"{note} Trained on {hw}; `docs/results/accuracy.json` names the commit."]


def block_focal() -> list[str]:
    data = load("focal.json")
    rows = [[r["run"], r["rig"], r["focal_input"], _absrel(r["packed_absrel_q16"]), _absrel(r["packed_absrel_q64"])]
            for r in data["rows"]]
    i = data["info"]
    return table(["run", "rig", "focal input", "packed AbsRel Q16", "Q64"], rows) + [
        "", f"{data['what']}. {i['cpu']}, torch {i['torch']}, commit `{i['commit']}`."]


def block_demo_accuracy() -> list[str]:
    data = load("demo_accuracy.json")
    rows = [[r["q"], _absrel(r["packed_absrel"]), _absrel(r["packed_absrel_edge"]), _absrel(r["dense_absrel"]),
             _absrel(r["glance_absrel"]), _absrel(r["constant_absrel"]), f"{r['constant_absrel'] / r['packed_absrel']:.2f}x"]
            for r in data["rows"]]
    i = data["info"]
    return table(["queries", "packed", "packed, edge band", "dense", "its glance depth (the coarse map)", "best constant",
                  "constant / packed"], rows) + [
        "", f"{data['what']}. {i['cpu']}, torch {i['torch']}, commit `{i['commit']}`."]


# ---- the accuracy-cost frontier (docs/results/frontier.json, written by python -m depthpack.frontier) ----
def _frontier_caption(data: dict) -> str:
    rows = data["rows"]
    one = lambda key: ", ".join(sorted({str(r[key]) for r in rows}))  # noqa: E731
    return (f"{data['plan']}: every run {one('steps')} steps on the same {one('scenes')} scenes, evaluated on the same "
            f"held-out {rows[0]['eval_image']} images (depth-edge band: {data['band_radius']} px"
            + (f"; thin band: parts at most {data['thin_max_px']} px across" if data.get("thin_max_px") else "")
            + f"). {one('device')}, "
            f"torch {one('torch')}, commit `{one('commit')}`. Source: `docs/results/frontier.json`.")


def _frontier(plan: str = "frontier_cpu") -> dict:
    """One plan's rows document in frontier.json (its plans by name; a file of one plan is that plan)."""
    data = load("frontier.json")
    return data["plans"][plan] if "plans" in data else data


def _dense_trained(rows: list[dict]) -> set[str]:
    """The runs trained dense (no packed rows): the downscale-and-run-dense models."""
    return {r["name"] for r in rows if r["path"] == "dense"} - {r["name"] for r in rows if r["path"] == "packed"}


def block_frontier() -> list[str]:
    data = _frontier()
    dense_trained = _dense_trained(data["rows"])
    keep = [r for r in data["rows"] if r["path"] == "packed" or r["name"] in dense_trained
            or any(d["default"] and d["name"] == r["name"] for d in data["rows"])]
    rows = [[r["name"] + (" **(default)**" if r["default"] else ""),
             {"glance": "its glance depth", "dense": "dense" if r["name"] in dense_trained else "its dense path"}.get(
                 r["path"], "packed"), r["image"], r["q"], r["tokens"], f"{r['encoder_gflop']:.3f}",
             _absrel(r["absrel_uniform"]), _absrel(r["absrel_edge"])] for r in keep]
    return table(["model", "path", "image", "Q", "tokens", "encoder GFLOP", "AbsRel uniform", "AbsRel edge band"],
                 rows) + ["", _frontier_caption(data)]


BANDS = (("absrel_uniform", "uniform"), ("absrel_edge", "edge"), ("absrel_thin", "thin"))


def _model_of(name: str) -> str:
    """A run's model: its name without the seed ("X, seed 1" is X at another seed)."""
    return name.split(", seed ")[0]


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return sum(vals) / len(vals) if vals else None


def _averaged(rows: list[dict]) -> list[dict]:
    """One row per (model, path, Q): the AbsRels averaged over its seeds, "seeds" how many."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((_model_of(r["name"]), r["path"], r["q"]), []).append(r)
    return [dict(g[0], name=m, seeds=len(g), **{k: _mean(g, k) for k, _ in BANDS}) for (m, _, _), g in groups.items()]


def _dense_curve(rows: list[dict], q: int, gflop: float, key: str) -> tuple[float, str]:
    """The frontier a user of dense models has at this cost: the best dense-trained model (seeds averaged) that
    costs no more encoder GFLOP (the cheapest one where none does), at Q's points: (AbsRel, which model)."""
    mine = [r for r in rows if r["q"] == q and r.get(key) is not None]
    fits = [r for r in mine if r["encoder_gflop"] <= gflop * (1 + 1e-6)] or \
        [min(mine, key=lambda r: r["encoder_gflop"])]
    best = min(fits, key=lambda r: r[key])
    return best[key], best["name"]


def _targets(plan: str) -> list[str]:
    """The default against the best dense-trained model of no more cost, per band, seeds averaged; its coarse map
    against the smallest dense model."""
    data = _frontier(plan)
    raw = data["rows"]
    name = _model_of(next(r["name"] for r in raw if r["default"]))
    rows = _averaged(raw)
    bands = [(k, b) for k, b in BANDS if any(r.get(k) is not None for r in rows)]
    dense_trained = [r for r in rows if r["name"] in {_model_of(n) for n in _dense_trained(raw)}]
    own = {(r["path"], r["q"]): r for r in rows if r["name"] == name}
    packed = sorted((r for (path, _), r in own.items() if path == "packed"), key=lambda r: r["q"])
    out = []
    for r in packed:
        if r["q"] > r["patches"] // 4:
            continue
        cells = [r["q"], f"{r['encoder_gflop']:.3f}", _dense_curve(dense_trained, r["q"], r["encoder_gflop"], "absrel_uniform")[1]]
        for key, _ in bands:
            d, _ = _dense_curve(dense_trained, r["q"], r["encoder_gflop"], key)  # in each band its best
            cells += [_absrel(r[key]), _absrel(d), pct(r[key] / d - 1)]
        d = own[("dense", r["q"])]["absrel_uniform"]
        out.append(cells + [_absrel(d), pct(r["absrel_uniform"] / d - 1)])
    head = ["Q", "encoder GFLOP", "best dense model at no more cost (uniform)"] + [
        c for _, b in bands for c in (f"packed {b}", f"dense {b}", "packed vs dense")] + [
        "its dense path uniform", "packed vs its dense path"]
    seeds = packed[0]["seeds"]
    lines = table(head, out) + [
        "", f"The default ({name}, {seeds} seed{'s' if seeds > 1 else ''} averaged) at each Q up to a quarter of its "
            f"{packed[0]['patches']} patches, against the best dense-trained model that costs no more encoder GFLOP "
            f"(seeds averaged where there are two), at the same points (in each band its best)."]
    small = min(dense_trained, key=lambda r: r["encoder_gflop"])["image"]
    glance = []
    for q in sorted(r["q"] for r in packed):
        g = own.get(("glance", q))
        d = min((r for r in dense_trained if r["image"] == small and r["q"] == q), key=lambda r: r["absrel_uniform"],
                default=None)
        if g and d:
            glance.append([q, d["name"]] + [c for key, _ in bands for c in (_absrel(g[key]), _absrel(d[key]),
                                                                             pct(g[key] / d[key] - 1))])
    if glance:
        lines += [""] + table(["Q", f"best dense {small} model"] + [
            c for _, b in bands for c in (f"its glance depth {b}", f"dense {b}", "glance vs dense")], glance) + [
            "", f"The coarse map of the same packed calls (the glance depth at the points) against the best "
                f"dense-trained model of the smallest size ({small}) at the same points."]
    return lines


def block_frontier_targets() -> list[str]:
    return _targets("frontier_cpu")


def block_frontier_detail_targets() -> list[str]:
    return _targets("frontier_cpu_detail")


def _bands_table(plan: str) -> list[str]:
    """Every row of a plan evaluated in the three bands."""
    data = _frontier(plan)
    rows = [[r["name"] + (" **(default)**" if r["default"] else ""), r["path"], r["image"], r["q"], r["tokens"],
             f"{r['encoder_gflop']:.3f}", *(_absrel(r.get(k)) for k, _ in BANDS)] for r in data["rows"]]
    return table(["model", "path", "image", "Q", "tokens", "encoder GFLOP", "AbsRel uniform", "AbsRel edge band",
                  "AbsRel thin band"], rows) + ["", _frontier_caption(data).replace("frontier.json`.",
                                                                                    f"frontier.json` (plan {plan}).")]


def block_frontier_detail() -> list[str]:
    return _bands_table("frontier_cpu_detail")


def block_frontier_fences() -> list[str]:
    return _bands_table("frontier_cpu_detail_fences")


def block_frontier_fences_targets() -> list[str]:
    return _targets("frontier_cpu_detail_fences")


def block_frontier_gpu_detail() -> list[str]:
    return _bands_table("frontier_gpu_detail")


def block_frontier_gpu_detail_targets() -> list[str]:
    return _targets("frontier_gpu_detail")


def block_frontier_gpu_detail_w256() -> list[str]:
    return _bands_table("frontier_gpu_detail_w256")


def block_frontier_gpu_detail_w256_targets() -> list[str]:
    return _targets("frontier_gpu_detail_w256")


BEDS = {"frontier_cpu_detail_demo_counts": "the demo's counts (1.5 thin, 1 small a scene)",
        "frontier_cpu_detail": "5 thin, 5 small a scene (the bed)",
        "frontier_cpu_detail_w64": "5 and 5, sized for 64 px (2-8 px at 128)",
        "frontier_cpu_detail_fences": "5 and 5, and 4 fences a scene",
        "frontier_gpu_detail": "the bed at 8000 steps, on a GPU (frontier_gpu_detail)",
        "frontier_gpu_detail_w256": "the bed at 8000 steps, sized for 256 px (0.5-2 px at 128; frontier_gpu_detail_w256)"}


def block_frontier_headroom() -> list[str]:
    """What resolution buys a dense model on each resolution bed tried: each dense-trained size against the smallest."""
    plans = load("frontier.json")["plans"]
    rows = []
    for plan, bed in BEDS.items():
        if plan not in plans:
            continue
        data = plans[plan]
        dense = [r for r in _averaged(data["rows"]) if r["name"] in {_model_of(n) for n in _dense_trained(data["rows"])}]
        small = min(dense, key=lambda r: r["encoder_gflop"])
        base = {r["q"]: r for r in dense if r["name"] == small["name"]}
        rows += [[bed, f"{r['image']} against {small['image']}", r["q"], f"{data.get('thin_max_px')} px",
                  *(c for k, _ in BANDS for c in (_absrel(r[k]), pct(r[k] / base[r["q"]][k] - 1)))]
                 for r in sorted(dense, key=lambda r: (r["encoder_gflop"], r["q"])) if r["name"] != small["name"]]
    return table(["bed", "dense models", "Q's points", "thin band"] + [
        c for _, b in BANDS for c in (f"AbsRel {b}", "vs the smaller")], rows)


def _model_side(model: str) -> int:
    """The image side of a bed model's name: "dense 128x128, one-way glance" -> 128."""
    return int(model.split()[1].split("x")[0])


def block_bed_levers() -> list[str]:
    """Each lever tried on the resolution bed on one GPU, sweep by sweep: dense 128x128 against dense 64x64 per Q
    and band, seeds averaged (each seed's lead beside it), and the two models' training loss at the end
    (docs/results/bed_levers.json)."""
    data = load("bed_levers.json")
    out = []
    for sweep in data["sweeps"]:
        rows, levers = [], {}
        for r in sweep["rows"]:
            levers.setdefault(r["lever"], {}).setdefault(r["model"], []).append(r)
        for lever, models in levers.items():
            small, big = (models[m] for m in sorted(models, key=_model_side))
            seeds = sorted({r["seed"] for r in small} & {r["seed"] for r in big})

            def mean(rs, key):
                vals = [r.get(key) for r in rs if r["seed"] in seeds]
                return None if not vals or None in vals else sum(vals) / len(vals)

            def by_seed(key):  # the lead of each seed, where there are several
                pairs = [(next(r for r in small if r["seed"] == s).get(key), next(r for r in big if r["seed"] == s).get(key))
                         for s in seeds]
                return "" if len(seeds) < 2 or any(None in p for p in pairs) else \
                    " [" + ", ".join(pct(b / a - 1) for a, b in pairs) + "]"
            loss = [mean(small, "train_silog_last_500_steps"), mean(big, "train_silog_last_500_steps")]
            for q in (16, 64, 256):
                cells = []
                for _, band in BANDS:
                    key = f"absrel_{band}_q{q}"
                    a, b = mean(small, key), mean(big, key)
                    cells.append(f"{a:.4f} / {b:.4f} ({pct(b / a - 1)}){by_seed(key)}" if a is not None and b is not None
                                 else " / ".join("not evaluated" if v is None else f"{v:.4f}" for v in (a, b)))
                steps = sorted({r["steps"] for r in small}) + sorted({r["steps"] for r in big})  # a cut run: 64 / 128
                rows.append([lever, steps[0] if len(set(steps)) == 1 else " / ".join(map(str, steps)), len(seeds), q, *cells,
                             f"{loss[0]:.4f} / {loss[1]:.4f} ({pct(loss[1] / loss[0] - 1)})" if q == 16 else ""])
        out += table(["lever", "steps", "seeds", "Q", "AbsRel uniform, 64 / 128", "AbsRel edge band, 64 / 128",
                      "AbsRel thin band, 64 / 128", "training SiLog, last 500 steps, 64 / 128"], rows) + [
            "", f"{sweep['gpu']}, torch {sweep['torch']}, commit `{sweep['commit']}`: `{sweep['command']}`; seeds "
                f"averaged, each seed's lead in brackets. Source: `docs/results/bed_levers.json`.", ""]
    return out[:-1]


def block_train_throughput() -> list[str]:
    data = load("train_throughput.json")
    rows = [[r["config"], r["batch"], "yes" if r["graph"] else "no", f"{r['images_s']:.0f}", f"{r['data_ms']:.1f}",
             f"{r['compute_ms']:.1f}", r["what"], f"`{r['commit']}`"] for r in data["rows"]]
    return table(["config", "batch", "graph=true", "images/s", "data ms", "compute ms", "measured by", "commit"], rows) + [
        "", f"{hardware(data['info'])}; {data['what']}."]


# ---- the Orin predictions (docs/results/orin.json, written by scripts/orin.py) ----------------------
def block_orin_answer() -> list[str]:
    rep = load("orin.json")
    g = rep["goal"]
    verdict = ("met across the whole band" if g["met_whole_band"] else
               "met at the central estimate, not across the whole band" if g["met_central"] else "not met")
    c = g["limit_reached_when"]
    parts = [f"the fixed per-kernel costs are {c['floor_scale']:.2f}x the clock-scaled H200 ones (central 1)"
             if c["floor_scale"] is not None else "",
             f"the tensor efficiency is {c['target_eff']:.2f} (central {g['central_eff']:.2f})" if c["target_eff"] is not None else "",
             f"the DRAM efficiency is {c['target_mem_eff']:.2f} (central 0.75)" if c["target_mem_eff"] is not None else ""]
    parts = [p for p in parts if p]
    cross = ("With the other assumptions central, it reaches the limit when " + ", or when ".join(parts) + "."
             if parts else "No single assumption within its range moves it past the limit.")
    lines = [f"{g['what']}, goal {g['limit_ms']:.0f} ms: predicted **{g['ms']:.2f} ms**, band {g['ms_low']:.2f}-"
             f"{g['ms_high']:.2f} ms, **{verdict}**. {cross} Of the central {g['ms']:.2f} ms, "
             f"{g['fixed_costs_us'] / 1e3:.2f} ms are the fixed costs of the {g['kernels']} launches. Where it goes (us): "
             + ", ".join(f"{k} {v:.0f}" for k, v in sorted(g["breakdown_us"].items(), key=lambda kv: -kv[1])) + ".", ""]
    rows = []
    for path in ("packed", "dense"):
        rs = [r for r in rep["predictions"] if r["device"] == "agx_orin_64" and r["path"] == path]
        rows.append([f"{path} ms (band)"] + [f"{r['ms']:.2f} ({r['ms_low']:.2f}-{r['ms_high']:.2f})" for r in rs])
    qs = [r["queries"] for r in rep["predictions"] if r["device"] == "agx_orin_64" and r["path"] == "packed"]
    return lines + table(["AGX Orin 64GB, B1"] + [f"Q{q}" for q in qs], rows)


def block_orin_summary() -> list[str]:
    g = load("orin.json")["goal"]
    return [f"Predicted for {g['what']}: **{g['ms']:.2f} ms**, band {g['ms_low']:.2f}-{g['ms_high']:.2f} ms "
            f"(`docs/results/orin.json`)."]


def block_orin_predictions() -> list[str]:
    rep = load("orin.json")
    rows = [[r["device_name"], r["path"], r["queries"], r["tokens"], r["kernels"], f"{r['gflop']:.1f}", f"{r['ms']:.2f}",
             f"{r['ms_low']:.2f}-{r['ms_high']:.2f}"] for r in rep["predictions"]]
    fam = [[r["device_name"], r["model"], r["kernels"], r["gflop"], f"{r['ms']:.1f}", f"{r['ms_low']:.1f}-{r['ms_high']:.1f}"]
           for r in rep["dense_family"]]
    return table(["device", "path", "Q", "tokens", "kernels", "GFLOP", "predicted ms", "band ms"], rows) + [
        "", "Dense models of the same family, TensorRT-style (fused epilogues, flash attention), fp16, GPU time only:",
        ""] + table(["device", "model", "kernels", "GFLOP", "predicted ms", "band ms"], fam)


def block_orin_fit() -> list[str]:
    rep = load("orin.json")
    hp, gen = rep["h200_params"], rep["h200_fit_from_generic_start"]
    rows = [[e["id"], f"{e['measured_us']:.1f}", f"{e['predicted_us']:.1f}", f"{e['error_pct']:+.1f}%"]
            for e in rep["h200_calibration"]]
    bound = ", ".join(rep["h200_at_bound"]) or "none"
    return table(["H200 point", "measured us", "predicted us", "error"], rows) + [
        "", f"{len(rows)} points; RMS log error {rep['h200_rms_log_error']:.3f}. Fitted (H200 units): "
        + ", ".join(f"{k} {v:g}" for k, v in hp.items()) + f". At a bound of their range: {bound}. From a generic start "
        f"the fit ends at RMS {gen['rms_log_error']:.3f} and predicts {gen['goal_ms']:.3f} ms for the goal point "
        f"instead of {rep['goal']['ms']:.3f}."]


def block_orin_calibration() -> list[str]:
    rep = load("orin.json")
    oc = rep["orin_calibration"]
    rows = [[e["id"], e["stack"], e["gflop"], f"{e['measured_ms']:.2f}", f"{e['predicted_ms']:.2f}", f"{e['error_pct']:+.1f}%",
             e["source"]] for e in oc["points"]]
    cc = oc["cross_check"]
    rows += [[f"{cc['id']}, {'with' if v['da3_aux'] else 'without'} DA3's aux head (cross-check, not fitted)", "trt10.3",
              v["gflop"], f"{cc['measured_ms']:.2f}", f"{v['predicted_ms']:.2f}", f"{v['error_pct']:+.1f}%", cc["source"]]
             for v in cc["variants"]]
    st = oc["stacks"]
    corners = rep["orin_transfer"]["effs_per_corner"]
    return table(["published point", "stack", "GFLOP", "measured ms", "predicted ms", "error", "source"], rows) + [
        "", f"Fitted (central assumptions): TensorRT 10.3 target_eff {st['trt10.3']['target_eff']:.3f}, host overhead "
        f"{st['trt10.3']['host_ms']:.2f} ms (two parameters, two points: the cross-check is the test); TensorRT 8.5 "
        f"target_eff {st['trt8.5']['target_eff']:.3f}, host {st['trt8.5']['host_ms']:.2f} ms on four points (shown, "
        f"not used). target_eff per corner, with / without DA3's aux head / fitting the cross-check: "
        + "; ".join(f"{c} {v['with_da3_aux']:.3f} / {v['without_da3_aux']:.3f} / {v['cross_check']:.3f}"
                    for c, v in corners.items()) + "."]


def block_orin_batch8() -> list[str]:
    rep = load("orin.json")
    bench = {(r["row"], r["batch"], r["queries"]): r for r in load("h200_bench.json")["results"] if "error" not in r}
    measured = {"packed": bench.get(("fast", 8, 512)), "dense": bench.get(("dense-fast", 8, 512))}
    rows = []
    for r in rep["batch8"]:
        if r["device"] == "h200":
            m = measured[r["path"]]
            band = f"measured {m['back_to_back_ms']:.3f} back-to-back" if m and m.get("back_to_back_ms") else ""
        else:
            band = f"{r['ms_low']:.1f}-{r['ms_high']:.1f}"
        rows.append([r["device_name"], r["path"], r["gflop"], f"{r['ms']:.3f}" if r["device"] == "h200" else f"{r['ms']:.1f}", band])
    return table(["device", "path", "GFLOP", "predicted ms", "band ms (H200: the measurement)"], rows)


def block_orin_devices() -> list[str]:
    rep = load("orin.json")
    rows = [[d["name"], d["sms"], d["clock_ghz"], f"{d['peak_tflops']:.1f}", d["mem_gbs"], d["l2_mb"], d["derivation"],
             "; ".join(d["sources"])] for d in rep["devices"].values()]
    return table(["device", "SMs", "clock GHz", "dense FP16 TFLOP/s", "DRAM GB/s", "L2 MB", "derivation", "sources"], rows)


BLOCKS = {name[len("block_"):].replace("_", "-"): fn for name, fn in list(globals().items()) if name.startswith("block_")}


# ---- pages --------------------------------------------------------------------------------------------
def render(text: str, where: str = "page") -> str:
    """text with every generated block re-rendered; unknown or unclosed blocks are a ValueError."""
    opened = MARK.findall(text)
    closed = [m.group("name") for m in BLOCK.finditer(text)]
    if len(opened) != 2 * len(closed):
        raise ValueError(f"{where}: a generated block is not closed (blocks found: {', '.join(closed) or 'none'})")
    for name in closed:
        if name not in BLOCKS:
            raise ValueError(f"{where}: unknown generated block {name!r}; known: {', '.join(sorted(BLOCKS))}")
    return BLOCK.sub(lambda m: m.group(1) + "\n".join(BLOCKS[m.group("name")]()) + "\n" + m.group(4), text)


# ---- figures ------------------------------------------------------------------------------------------
def figures() -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    FIGURES.mkdir(parents=True, exist_ok=True)
    data = load("h200_bench.json")
    rs = _ok(data)
    pairs = sorted({(r["batch"], r["queries"]) for r in rs})
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.2 * len(pairs), 4.6), dpi=90)
    for ax, (b, q) in zip(list(getattr(axes, "flat", [axes])), pairs):
        mine = [r for r in rs if (r["batch"], r["queries"]) == (b, q)][::-1]
        colors = ["tab:green" if r["row"] == "fast" else "tab:gray" if r["row"].startswith(("masked", "dense", "dav2"))
                  else "tab:blue" for r in mine]
        ax.barh([r["row"] for r in mine], [r["median_ms"] for r in mine], color=colors)
        for i, r in enumerate(mine):
            ax.text(r["median_ms"], i, f" {ms(r['median_ms'])}", va="center", fontsize=7)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("ms, one call + sync (log)")
        ax.set_title(f"batch {b}, {q} queries", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
    fig.suptitle(f"vits 518 bf16 on {data['info'].get('gpu')}: latency per row (green: the default; "
                 "docs/results/h200_bench.json)", fontsize=10)
    fig.tight_layout()
    out = [FIGURES / "latency_h200.png"]
    fig.savefig(out[0])
    plt.close(fig)

    acc = load("accuracy.json")["rows"]
    fig, ax = plt.subplots(figsize=(7.2, 4.2), dpi=90)
    families = list(dict.fromkeys(r["layout"].split(",")[0] for r in acc))  # "64 anchors, 512 slots" -> "64 anchors"
    for layout in dict.fromkeys(r["layout"] for r in acc):
        mine = [r for r in acc if r["layout"] == layout and r.get("packed_absrel") is not None]
        if mine:
            variant = "," in layout
            ax.plot([r["encoder_gflop"] for r in mine], [r["packed_absrel"] for r in mine],
                    ("s" if variant else "o") + ("-" if len(mine) > 1 else ""), mfc="none" if variant else None,
                    color=f"C{families.index(layout.split(',')[0])}", label=f"{layout}, packed")
            for r in mine:
                ax.annotate(f"Q{r['q']}", (r["encoder_gflop"], r["packed_absrel"]), fontsize=6,
                            xytext=(3, 3), textcoords="offset points")
    dense = {(r["dense_encoder_gflop"], r["dense_absrel"], r["q"]) for r in acc if r.get("dense_encoder_gflop")}
    if dense:
        ax.scatter([d[0] for d in dense], [d[1] for d in dense], marker="^", color="k", s=14, label="dense, same points")
    ax.set_xscale("log")
    ax.set_xlabel("encoder GFLOP per image (log)")
    ax.set_ylabel("AbsRel (lower is better)")
    ax.grid(alpha=0.3, which="both", lw=0.4)
    ax.legend(fontsize=7)
    ax.set_title("accuracy against compute: packed layouts and the dense path", fontsize=9)
    fig.tight_layout()
    out.append(FIGURES / "accuracy.png")
    fig.savefig(out[1])
    plt.close(fig)
    out.append(_schedule_figure(plt))
    return out


def _schedule_figure(plt) -> Path:
    """The long runs of the resolution bed's lever sweeps: each model's training SiLog against the step, and the
    larger model's lead over the smaller (docs/results/bed_levers.json, a sweep's curves)."""
    sweep = next(s for s in reversed(load("bed_levers.json")["sweeps"]) if s.get("curves"))
    fig, (ax, lead) = plt.subplots(1, 2, figsize=(10.4, 4.0), dpi=90)
    levers = list(dict.fromkeys(c["lever"] for c in sweep["curves"]))
    for i, lever in enumerate(levers):
        pair = sorted((c for c in sweep["curves"] if c["lever"] == lever), key=lambda c: _model_side(c["model"]))
        for c, style in zip(pair, ("--", "-")):
            ax.plot(*zip(*c["train_silog"]), style, color=f"C{i}", lw=1.2, label=f"{c['model'].split(',')[0]}, {lever}")
        small, big = (dict(map(tuple, c["train_silog"])) for c in pair)
        steps = sorted(set(small) & set(big))
        lead.plot(steps, [100 * (big[k] / small[k] - 1) for k in steps], "-", color=f"C{i}", lw=1.2, label=lever)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("training SiLog (log)")
    ax.legend(fontsize=6)
    lead.axhline(0, color="k", lw=0.5)
    lead.set_xlabel("step")
    lead.set_ylabel("dense 128x128 against dense 64x64, %")
    lead.legend(fontsize=6)
    for a in (ax, lead):
        a.grid(alpha=0.3, which="both", lw=0.4)
    w = sweep["curves"][0]["window_steps"]
    fig.suptitle(f"the resolution bed on {sweep['gpu']}: training loss over the schedule (means of {w} steps; "
                 "docs/results/bed_levers.json)", fontsize=9)
    fig.tight_layout()
    path = FIGURES / "bed_schedule.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page differs from its results")
    ap.add_argument("--figures", action="store_true", help="also redraw the figures drawn from the results")
    args = ap.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        new = render(text, str(page.relative_to(ROOT)))
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not args.check:
                page.write_text(new)
    if args.check:
        if stale:
            print(f"docs_tables: error: not rendered from docs/results/: {', '.join(stale)} "
                  "(run python scripts/docs_tables.py)", file=sys.stderr)
            return 1
        return 0
    drawn = figures() if args.figures else []
    print(json.dumps(dict(rewritten=stale, figures=[str(p.relative_to(ROOT)) for p in drawn])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
