"""The frontier tool: a plan's runs trained, evaluated on the same images and band, rows and figure;
finished runs read, not trained again; costs that follow the buffer."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from depthpack.core.config import model_config
from depthpack.frontier import dense_cost, load_plan, main, packed_cost

ROOT = Path(__file__).resolve().parents[1]


def write_plan(tmp_path: Path, runs: list[dict], **kw) -> Path:
    import yaml

    plan = {"base": str(ROOT / "configs" / "tiny.yaml"), "common": ["steps=2", "data.num_samples=8", "data.num_val=2"],
            "image": [64, 64], "queries": [8, 64], "band_radius": 8, "max_images": 2, "device": "cpu", "runs": runs, **kw}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


@pytest.mark.parametrize("stream", ["oneway", "shared"])
def test_costs_follow_the_buffer(stream):
    cfg = model_config("tiny", glance_stream=stream)  # 64 patches, buckets 8..64
    t8, g8 = packed_cost(cfg, 8)
    t64, g64 = packed_cost(cfg, 64)
    assert t8 == cfg.num_prefix + 8 and t64 == cfg.num_prefix + 64 and g8 < g64
    assert dense_cost(cfg) == (t64, pytest.approx(g64))  # 64 slots hold every patch: the dense buffer
    if stream == "shared":
        assert packed_cost(cfg, 100)[1] == pytest.approx(2 * g64)  # two chunks of 64
    else:  # the prefix once, each chunk's 64 patches reading its keys: less than two whole buffers
        P, A, D, L = cfg.num_prefix, cfg.num_anchors, cfg.embed_dim, cfg.depth
        per_row = 2 * D * D * (4 + 2 * cfg.mlp_ratio)  # the four linear layers, a token
        prefix = L * (P * per_row + 4 * P * P * D) + 2 * A * 3 * 64 * D
        chunk = L * (64 * per_row + 4 * 64 * (P + 64) * D) + 2 * 64 * 3 * 64 * D
        assert packed_cost(cfg, 100)[1] == pytest.approx((prefix + 2 * chunk) / 1e9) and (prefix + 2 * chunk) / 1e9 < 2 * g64


def test_costs_count_the_attention_as_it_runs():
    """The encoder GFLOP of one buffer equals what torch's FLOP counter measures on the model's encoder (the
    attention counted from the SDPA calls it makes: one-way, the prefix rows over the prefix keys)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from depthpack import create_model
    from depthpack.frontier import buffer_gflop

    def sdpa(q_shape, k_shape, *args, **kwargs) -> int:  # QK^T and AV: 2 multiply-adds a (query, key, dim)
        B, H, S, d = q_shape
        return 4 * B * H * S * k_shape[2] * d

    ops = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: sdpa}
    for stream in ("oneway", "shared"):
        m = create_model("tiny", glance_stream=stream).eval()
        img, pts = torch.rand(1, 3, 64, 64), torch.rand(1, 8, 2) * 63
        for k in (8, 32):
            index = m.select(img, pts, k)[0]
            with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=ops) as counter:
                m.encode(img, index)
            assert counter.get_total_flops() / 1e9 == pytest.approx(buffer_gflop(m.cfg, k), rel=1e-6), (stream, k)


A = {"name": "a", "path": "packed"}


@pytest.mark.parametrize("runs, keys, match", [
    ([{"name": "a", "path": "sparse"}], {}, "path packed or dense"),
    ([A, {"name": "a", "path": "dense"}], {}, "run 'a' twice: every run needs a name of its own"),
    ([{"name": "run 1", "path": "packed"}, {"name": "Run_1", "path": "dense"}], {},
     "run 'Run_1' and 'run 1' share the folder run_1: every run needs a name of its own"),
    ([{"name": "!!!", "path": "packed"}], {}, "run '!!!': its name has no letter or digit"),
    ([{"name": 5, "path": "packed"}], {}, "run 1: its name must be text, got 5"),
    ([{"name": "a", "path": "packed", "lever": 1}], {}, "only"),
    ([], {}, r"runs must be a non-empty list of mappings"),
    (["a"], {}, r"runs must be a non-empty list of mappings"),
    ([A], {"common": "steps=2"}, "common must be a list of key=value strings, got 'steps=2'"),
    ([A], {"image": 64}, r"image must be \[height, width\], two positive whole numbers of pixels, got 64"),
    ([A], {"image": [64, 0]}, r"image must be \[height, width\]"),
    ([A], {"queries": [8, 0]}, r"queries must be a list of positive whole numbers, got \[8, 0\]"),
    ([A], {"queries": 8}, "queries must be a list"),
    ([A], {"band_radius": -1}, "band_radius must be a whole number of pixels"),
    ([A], {"thin_max_px": 0}, r"thin_max_px must be a whole number of pixels in \[1, 4096\] or null, got 0"),
    ([A], {"max_images": 0}, "max_images must be a positive whole number"),
    ([A], {"device": "tpu"}, "device must be auto, cpu, cuda or cuda:N, got 'tpu'"),
    ([{**A, "overrides": "steps=2"}], {}, "run 'a': overrides must be a list of key=value strings"),
    ([{**A, "default": "yes"}], {}, "run 'a': default must be true or false"),
    ([{**A, "overrides": ["model.depth=x"]}], {}, "run 'a': ModelConfig.depth must be a number"),
    ([{**A, "overrides": ["lever=1"]}], {}, "run 'a': unknown TrainConfig key.*lever"),
    ([{**A, "overrides": ["out_dir=elsewhere"]}], {}, "run 'a': out_dir are the frontier's"),
    ([A], {"base": str(ROOT / "configs" / "none.yaml")}, "base config .*none.yaml: no such file"),
])
def test_bad_plans_are_refused_before_anything_trains(tmp_path, runs, keys, match):
    """The whole plan is checked first, each run's merged training config built: one line, nothing trained."""
    plan = write_plan(tmp_path, runs, **keys)
    with pytest.raises(ValueError, match=match):
        load_plan(plan)
    with pytest.raises(ValueError, match=match) as e:
        main(["--plan", str(plan), "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "f.json"),
              "--figure", str(tmp_path / "f.png")])
    assert str(e.value).startswith(f"plan {plan}: ") and "\n" not in str(e.value)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("frontier_*.yaml")))
def test_the_shipped_plans_pass_the_checks(name, monkeypatch):
    monkeypatch.chdir(ROOT)  # their base configs are named from the repository's root, as the docs run them
    assert load_plan(f"configs/{name}.yaml")["runs"]


def test_a_plan_that_varies_another_holds_only_what_differs(tmp_path):
    """Its keys replace the other's, its common comes after the other's (so its key=value wins); one level only."""
    import yaml

    from depthpack.frontier import run_overrides

    other = write_plan(tmp_path, [A, {"name": "b", "path": "dense"}], queries=[8])
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"varies": str(other), "common": ["steps=3"], "queries": [16]}))
    plan = load_plan(mine)
    assert [r["name"] for r in plan["runs"]] == ["a", "b"] and plan["queries"] == [16] and "varies" not in plan
    assert run_overrides(plan, plan["runs"][0], tmp_path / "a")[:4] == ["steps=2", "data.num_samples=8",
                                                                       "data.num_val=2", "steps=3"]
    chain, text = tmp_path / "chain.yaml", tmp_path / "text.yaml"
    (tmp_path / "sub").mkdir()
    chain.write_text(yaml.safe_dump({"varies": str(mine)}))
    text.write_text(yaml.safe_dump({"varies": str(other), "common": "steps=3"}))  # its common is not a list
    for path, said in ((chain, f"plan {chain}: varies {mine}, which varies {other}; a plan may vary only a plan "
                                "that varies none"),
                       (text, f"plan {text}: common must be a list of key=value strings, got 'steps=3'"),
                       (write_plan(tmp_path / "sub", [A], varies=7), "varies must be another plan's path, got 7")):
        with pytest.raises(ValueError, match=re.escape(said)):
            load_plan(path)


def test_bad_outputs_and_a_folder_plan_are_one_line_before_anything_trains(tmp_path):
    plan = write_plan(tmp_path, [A])
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    ok = {"--plan": str(plan), "--runs": str(tmp_path / "runs"), "--out": str(tmp_path / "f.json"),
          "--figure": str(tmp_path / "f.png")}
    for flag, value, said in (("--plan", tmp_path / "adir", f"plan {tmp_path / 'adir'}: is a folder, not a file"),
                              ("--figure", tmp_path / "adir", f"--figure {tmp_path / 'adir'} is a folder: give the PNG"),
                              ("--out", tmp_path / "adir", f"--out {tmp_path / 'adir'} is a folder: give the JSON"),
                              ("--runs", tmp_path / "afile", f"--runs {tmp_path / 'afile'} is a file, not a folder"),
                              ("--out", tmp_path / "afile", f"--out {tmp_path / 'afile'}: not a frontier rows file")):
        with pytest.raises(ValueError) as e:
            main([x for k, v in {**ok, flag: str(value)}.items() for x in (k, v)])
        assert str(e.value).startswith(said) and "\n" not in str(e.value), str(e.value)
        assert not (tmp_path / "runs" / "a").exists()
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_plan_for_a_device_this_machine_lacks_is_refused_before_anything_trains(tmp_path):
    plan = write_plan(tmp_path, [A], device="cuda")
    with pytest.raises(ValueError, match=f"^plan {plan}: device cuda: CUDA is not available on this machine$"):
        main(frontier_args(tmp_path, plan, tmp_path / "runs"))
    assert not (tmp_path / "runs").exists()


def test_nothing_to_write_is_refused_and_the_rows_kept(tmp_path):
    """--no-train with no finished run: one line, and --out as it was (it had rows of other runs)."""
    plan = write_plan(tmp_path, [A, {"name": "b", "path": "dense"}])
    out = tmp_path / "f.json"
    other = {"plan": "configs/other.yaml", "image": [32, 32], "band_radius": 4, "rows": [{"name": "x", "q": 4}]}
    out.write_text(json.dumps({"plans": {plan.stem: {"image": [64, 64], "band_radius": 8, "rows": [{"name": "a", "q": 8}]},
                                         "other": other}}))
    before = out.read_bytes()
    args = ["--plan", str(plan), "--runs", str(tmp_path / "runs"), "--out", str(out), "--figure", str(tmp_path / "f.png")]
    with pytest.raises(ValueError, match=f"nothing to write: none of the 2 runs is finished and --no-train trains none; "
                                         f"{out} left as it was"):
        main(args + ["--no-train"])
    assert out.read_bytes() == before and not (tmp_path / "f.png").exists()
    out.write_text(json.dumps({"plan": str(plan), "image": [128, 128], "band_radius": 8, "rows": []}))  # one plan's file
    with pytest.raises(ValueError, match=rf"holds rows of plan {plan.stem} evaluated with image \[128, 128\], this plan's "
                                         r"image is \[64, 64\]"):
        main(args + ["--no-train"])


def test_a_full_disk_leaves_the_old_figure_whole(tmp_path, monkeypatch):
    import errno
    import os

    from depthpack.core import files
    from depthpack.frontier import figure

    rows = [{"name": "p", "path": "packed", "q": q, "encoder_gflop": g, "absrel_uniform": 0.2, "absrel_edge": 0.3,
             "default": True, "seed": 0} for q, g in ((8, 0.1), (64, 0.4))]
    png = tmp_path / "f.png"
    png.write_bytes(b"the old figure")

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left on device"):
        figure(rows, png)
    monkeypatch.undo()
    assert png.read_bytes() == b"the old figure" and sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]
    assert figure(rows, png).read_bytes().startswith(b"\x89PNG")


RUNS = [{"name": "packed default", "path": "packed", "default": True, "overrides": []},
        {"name": "dense 32x32", "path": "dense", "overrides": ["train_path=dense", "model.img_size=[32,32]",
                                                               "model.buckets=[16]"]}]


def frontier_args(tmp_path: Path, plan: Path, runs: Path) -> list[str]:
    return ["--plan", str(plan), "--runs", str(runs), "--out", str(tmp_path / "new" / "f.json"),
            "--figure", str(tmp_path / "f.png")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The two runs of RUNS trained and evaluated once: (folder, plan, runs folder, args, rows document)."""
    tmp = tmp_path_factory.mktemp("frontier")
    plan = write_plan(tmp, RUNS)
    args = frontier_args(tmp, plan, tmp / "runs") + ["--jobs", "2"]
    return tmp, plan, tmp / "runs", args, main(args)


def copy_of(trained, tmp_path: Path) -> tuple[list[str], Path]:
    """A copy of the trained runs and their rows: (the frontier's arguments on them, the runs folder)."""
    tmp, plan, runs, _, doc = trained
    shutil.copytree(runs, tmp_path / "runs")
    (tmp_path / "new").mkdir()
    shutil.copy(tmp / "new" / "f.json", tmp_path / "new" / "f.json")
    return frontier_args(tmp_path, plan, tmp_path / "runs"), tmp_path / "runs"


def rows_by_run(doc: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in doc["rows"]:
        out.setdefault(r["name"], []).append(json.dumps(r, sort_keys=True))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.slow
def test_a_plan_trains_evaluates_and_reads_finished_runs(trained):
    tmp_path, _, runs, args, doc = trained
    rows = {(r["name"], r["path"], r["q"]): r for r in doc["rows"]}
    # the packed model: its packed sweep, its own dense path and its glance depth; the dense model: dense only
    assert set(rows) == {("packed default", p, q) for p in ("packed", "dense", "glance") for q in (8, 64)} | \
        {("dense 32x32", "dense", q) for q in (8, 64)}
    for r in doc["rows"]:
        assert 0 < r["absrel_uniform"] < 10 and 0 < r["absrel_edge"] < 10 and r["steps"] == 2 and r["device"]
        assert r["default"] == (r["name"] == "packed default" and r["path"] == "packed")
    assert rows[("dense 32x32", "dense", 8)]["image"] == "32x32" and rows[("dense 32x32", "dense", 8)]["patches"] == 16
    assert rows[("packed default", "packed", 8)]["encoder_gflop"] < rows[("packed default", "dense", 8)]["encoder_gflop"]
    assert (tmp_path / "f.png").stat().st_size > 0
    assert json.loads((tmp_path / "new" / "f.json").read_text()) == {"plans": {Path(args[1]).stem: doc}}  # its folder made

    summary = runs / "packed_default" / "summary.json"
    before = summary.stat().st_mtime_ns
    again = main(args + ["--only", "packed default", "--no-train"])  # read, not trained; the other rows kept
    assert summary.stat().st_mtime_ns == before
    assert rows_by_run(again) == rows_by_run(doc)
    with pytest.raises(ValueError, match="not runs of"):
        main(args + ["--only", "nobody"])


@pytest.mark.slow
def test_a_folder_trained_with_another_config_is_refused_by_name(trained, tmp_path):
    """A plan that varies the trained one shares its runs' names: its frontier on their folders is one error naming
    each folder and key, read or resumed never; a key of how a run ran (eval_every) is not a difference."""
    import yaml

    args, runs = copy_of(trained, tmp_path)
    before = (tmp_path / "new" / "f.json").read_bytes()
    for common, said in ((["lr=0.001"], "lr=0.0003 (the plan: 0.001)"),
                         (["data.thin_width_ref=128"], "data.thin_width_ref=560 (the plan: 128)")):
        varied = tmp_path / "varied.yaml"
        varied.write_text(yaml.safe_dump({"varies": args[1], "common": common}))
        for extra in ([], ["--no-train"]):
            with pytest.raises(ValueError) as e:
                main([*args[:1], str(varied), *args[2:], *extra])
            msg = str(e.value)
            assert msg.startswith(f"--runs {runs}: {runs / 'packed_default'} trained with {said}; "
                                  f"{runs / 'dense_32x32'} trained with {said}: a run of another plan"), msg
            assert "\n" not in msg
    assert (tmp_path / "new" / "f.json").read_bytes() == before
    varied.write_text(yaml.safe_dump({"varies": args[1], "common": ["eval_every=5"]}))
    assert rows_by_run(main([*args[:1], str(varied), *args[2:], "--no-train"])) == rows_by_run(trained[4])


@pytest.mark.slow
def test_rows_of_runs_not_evaluated_now_are_kept_without_only(trained, tmp_path):
    """--no-train leaves out a run that is not finished: its rows in --out stay, --only or not."""
    args, runs = copy_of(trained, tmp_path)
    (runs / "dense_32x32" / "summary.json").unlink()
    doc = main(args + ["--no-train"])
    assert rows_by_run(doc) == rows_by_run(trained[4])
    assert json.loads((tmp_path / "new" / "f.json").read_text())["plans"][Path(args[1]).stem] == doc


@pytest.mark.slow
def test_a_garbage_cached_evaluation_is_evaluated_again_with_a_warning(trained, tmp_path):
    args, runs = copy_of(trained, tmp_path)
    cached = runs / "packed_default" / "frontier_eval" / "eval.json"
    cached.write_text('{"bands": {"uniform": {"rows": [{"path": "packed"}]}}}')
    with pytest.warns(UserWarning, match=f"{cached}: not an evaluation .*; evaluating it again"):
        doc = main(args + ["--no-train", "--only", "packed default"])
    want = {(r["name"], r["path"], r["q"]): r["absrel_uniform"] for r in trained[4]["rows"]}
    assert {(r["name"], r["path"], r["q"]): r["absrel_uniform"] for r in doc["rows"]} == pytest.approx(want)
    assert json.loads(cached.read_text())["bands"]["uniform"]["rows"]


@pytest.mark.slow
def test_failed_runs_are_one_line_each_and_the_others_go_on(trained, tmp_path, capsys):
    """A finished run whose checkpoints were deleted, a run whose training fails, one that stops before its last
    step (max_time_s): one line each naming the folder or the log, the other run's rows written, theirs kept,
    and one error saying three failed."""
    tmp, plan, _, _, doc = trained
    args, runs = copy_of(trained, tmp_path)
    shutil.rmtree(runs / "dense_32x32" / "checkpoints")
    broken = {"name": "broken", "path": "packed", "overrides": ["data.kind=folder", f"data.root={tmp_path / 'none'}"]}
    cut = {"name": "cut", "path": "packed", "overrides": ["max_time_s=1e-6"]}
    args[1] = str(write_plan(tmp_path, [*RUNS, broken, cut]))
    out = tmp_path / "new" / "f.json"
    with pytest.raises(ValueError) as e:
        main(args)
    assert str(e.value) == (f"3 of 4 runs failed ('dense 32x32', 'broken', 'cut'; each said above with its log); the "
                            f"rows of the others are in {out}")
    err = sorted(ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("frontier: run "))
    assert len(err) == 3, err
    assert err[0].startswith(f"frontier: run 'broken' failed: training 'broken' failed (exit 1): train: error: data root "
                             f"{tmp_path / 'none'}: no such folder; its log: {runs / 'broken.log'}")
    assert err[1] == (f"frontier: run 'cut' failed: training 'cut' ended before its last step (its summary.json); the "
                      f"next frontier resumes it; its log: {runs / 'cut.log'}")
    assert err[2].startswith(f"frontier: run 'dense 32x32' failed: {runs / 'dense_32x32'} is finished (summary.json) "
                             f"but holds no checkpoint to evaluate")
    assert not (runs / "cut" / "frontier_eval").exists()
    assert rows_by_run(json.loads(out.read_text())["plans"][Path(args[1]).stem]) == rows_by_run(doc)


@pytest.mark.slow
def test_a_figure_that_cannot_be_written_is_one_line_after_the_rows(trained, tmp_path, monkeypatch):
    import errno

    from depthpack import frontier

    args, _ = copy_of(trained, tmp_path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(frontier, "figure", full)
    with pytest.raises(ValueError, match=rf"^--figure {tmp_path / 'f.png'}: cannot be written \(No space left on "
                                         rf"device\); the rows are in {tmp_path / 'new' / 'f.json'}$"):
        main(args + ["--no-train"])


# ---- the trainers die with the frontier ---------------------------------------------------------------------
def _wait_for(what, proc: subprocess.Popen, deadline_s: float = 600):
    """what() once it is not None, polled; a failure if proc (the frontier) ends first or the deadline passes
    (far beyond any run here: the test waits on an event, never on a time)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = what()
        if got is not None:
            return got
        assert proc.poll() is None or proc.returncode in (-9, 143), proc.communicate()
        time.sleep(0.2)
    pytest.fail("waited 600 s")


def _holder(lock: Path) -> int | None:
    text = lock.read_text().strip() if lock.is_file() else ""
    return int(text) if text else None


def _gone(pid: int) -> bool | None:
    """True when pid has ended (no process, or a zombie nobody reaped), else None."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return True if state in ("Z", "X") else None


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_trainer_dies_with_the_frontier(tmp_path, sig):
    """A frontier killed (SIGKILL: the kernel kills its children) or terminated (SIGTERM: it kills their process
    groups, exit 143) leaves no trainer writing its run folder."""
    plan = write_plan(tmp_path, [{"name": "long", "path": "packed", "overrides": ["steps=100000"]}])
    cmd = [sys.executable, "-m", "depthpack.frontier", *frontier_args(tmp_path, plan, tmp_path / "runs")]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        trainer = _wait_for(lambda: _holder(tmp_path / "runs" / "long" / "train.lock"), proc)  # training now
        assert _gone(trainer) is None
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == (-9 if sig == signal.SIGKILL else 143), err
        if sig == signal.SIGTERM:
            assert err.strip().splitlines()[-1] == "frontier: terminated; stopping its trainers and evaluators", err
        _wait_for(lambda: _gone(trainer), proc)
    finally:
        proc.kill()
        proc.wait()


def test_a_plan_names_its_point_sets(tmp_path):
    """points: the evaluation's point sets (both by default; all adds the thin band); anything else is refused before
    anything trains."""
    assert load_plan(write_plan(tmp_path, [A], points="all"))["points"] == "all"
    with pytest.raises(ValueError, match="points must be one of uniform, edge, thin, both, all"):
        load_plan(write_plan(tmp_path, [A], points="corners"))


def test_kept_rows_follow_the_plans_default():
    """A plan that moves its default to another run: the old default's kept rows are no longer marked default."""
    from depthpack.frontier import merge_rows

    plan = {"runs": [{"name": "old", "path": "packed"}, {"name": "new", "path": "packed", "default": True}]}
    old = [{"name": "old", "path": "packed", "q": 8, "default": True}, {"name": "gone", "path": "packed", "q": 8, "default": True}]
    new = {"new": [{"name": "new", "path": "packed", "q": 8, "default": True}]}
    rows = merge_rows(plan, old, new)
    assert [(r["name"], r["default"]) for r in rows] == [("old", False), ("new", True), ("gone", False)]


def test_rows_of_another_thin_band_are_not_mixed_with_new_ones(tmp_path):
    """thin_max_px (the thin band's width, 4 px by default) is part of what rows were evaluated on: --out rows of the
    plan evaluated with another width, or before the band had one, are refused, not merged."""
    from depthpack.frontier import old_rows

    plan = load_plan(write_plan(tmp_path, [A], points="all"))
    entry = {"image": plan["image"], "band_radius": plan.get("band_radius"), "rows": [{"name": "a"}]}
    with pytest.raises(ValueError, match="evaluated with thin_max_px None, this plan's thin_max_px is 4"):
        old_rows({"p": entry}, "p", plan, tmp_path / "f.json")
    assert old_rows({"p": {**entry, "thin_max_px": 4}}, "p", plan, tmp_path / "f.json") == [{"name": "a"}]
    plan8 = load_plan(write_plan(tmp_path, [A], points="all", thin_max_px=8))
    with pytest.raises(ValueError, match="evaluated with thin_max_px 4, this plan's thin_max_px is 8"):
        old_rows({"p": {**entry, "thin_max_px": 4}}, "p", plan8, tmp_path / "f.json")
    both = load_plan(write_plan(tmp_path, [A]))  # no thin band: no width to match
    assert old_rows({"p": entry}, "p", both, tmp_path / "f.json") == [{"name": "a"}]


def test_each_child_gets_its_share_of_the_cores(tmp_path, monkeypatch):
    from depthpack.frontier import Children

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    for jobs, want in [(1, "16"), (12, "1"), (4, "4"), (32, "1")]:
        out = tmp_path / f"{jobs}.txt"
        with open(out, "w") as f:
            assert Children(jobs).call([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"], f) == 0
        assert out.read_text().strip() == want


def test_shared_scene_stores_are_rendered_once_before_any_trainer(tmp_path):
    """Runs that share data.cache_dir share their stores: each one the trainers and the evaluation open is rendered
    once, at the size it is opened at (the train split at data_size), and a finished run's stores are not asked for."""
    import numpy as np

    from depthpack.frontier import Children, render_stores

    scenes = tmp_path / "scenes"
    plan = load_plan(write_plan(tmp_path, [{"name": "a", "path": "packed"}, {"name": "b", "path": "packed", "overrides": ["seed=1"]},
                                           {"name": "c", "path": "packed", "overrides": ["data.seed=3"]}],
                                common=["steps=2", "data.num_samples=8", "data.num_val=2", f"data.cache_dir={scenes}",
                                        "data_size=[128,128]"]))
    runs = tmp_path / "runs"
    (runs / "c").mkdir(parents=True)
    (runs / "c" / "summary.json").write_text(json.dumps({"step": 2, "steps": 2}))
    render_stores(Children(1), plan, plan["runs"], runs)
    commands = [ln for ln in (runs / "stores.log").read_text().splitlines() if ln.startswith(sys.executable)]
    assert len(commands) == 2 and all("data.seed=3" not in c for c in commands)  # a/b: train 128 and val 64; c: done
    shapes = {p.name.split("_")[1]: np.load(p, mmap_mode="r").shape for p in scenes.glob("*.npy")}
    assert sorted(shapes) == ["train", "val"] and len(list(scenes.glob("*.npy"))) == 2
    assert [shapes["train"][0], shapes["val"][0]] == [8, 2] and shapes["train"][1] > 3 * shapes["val"][1]  # 128 px, 64 px
    fresh = load_plan(write_plan(tmp_path, [{"name": "f", "path": "packed"}], common=[
        "steps=2", "data.num_samples=8", "data.num_val=3", f"data.cache_dir={scenes}", "data.fresh=true"]))
    render_stores(Children(1), fresh, fresh["runs"], runs)  # scenes rendered every step: only the val store
    assert len(list(scenes.glob("*train*n8*.npy"))) == 1 and len(list(scenes.glob("*val*n3*.npy"))) == 1
