"""Every CLI's promise about errors, through the real command in a subprocess: a refusal is exit code 1
and exactly one line on stderr, `NAME: error: WHAT` naming the problem, never a traceback; damage that
has a safe way round (a corrupt newest checkpoint, a garbage log row) is one warning line and the
run goes on. One row per case of the issue (items 7 and 9); the cases run 3 at a time."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
TRAIN = [sys.executable, str(ROOT / "train" / "train.py")]
EVAL = [sys.executable, "-m", "depthpack.eval"]
EXPORT = [sys.executable, str(ROOT / "export" / "export.py")]
BENCH = [sys.executable, "-m", "depthpack.bench"]
DATA = [sys.executable, "-m", "depthpack.data"]
DEMO = [sys.executable, str(ROOT / "scripts" / "demo.py")]
FAST = ["progress=false", "threads=1", "eval_images=1", "data.num_samples=8"]  # train overrides of every case


@dataclass
class W:
    """The files the cases point at (made once per module)."""
    tmp: Path
    run: Path  # a tiny run with checkpoints at steps 3 and 6

    def __getattr__(self, name):
        return self.tmp / name


@dataclass
class Case:
    id: str
    argv: Callable[[W], list[str]]
    expect: str  # text the one stderr line must hold
    rc: int = 1
    prepare: Callable[[W], None] = field(default=lambda w: None)

    def __repr__(self):
        return self.id


def _copy_run(w: W, name: str) -> Path:
    d = w.tmp / name
    shutil.copytree(w.run, d)
    return d


def _drop_sha256(w: W) -> None:
    d = _copy_run(w, "no_sha")
    meta = d / "checkpoints" / "step_00000006" / "meta.json"
    m = json.loads(meta.read_text())
    del m["files"]["model.safetensors"]["sha256"]
    meta.write_text(json.dumps(m))


def _garbage_log_row(w: W) -> None:
    d = _copy_run(w, "garbage_log")
    log = d / "log.csv"
    lines = log.read_text().splitlines()
    lines.insert(3, "garbage,row")
    log.write_text("\n".join(lines) + "\n")


def _wrong_config(w: W) -> None:
    """Only one checkpoint left, its config.json another program's (rehashed, so only its structure is wrong)."""
    from depthpack.core.files import sha256_bytes

    d = _copy_run(w, "wrong_config")
    shutil.rmtree(d / "checkpoints" / "step_00000003")
    ck = d / "checkpoints" / "step_00000006"
    blob = b'["not", "a", "depthpack", "config"]'
    (ck / "config.json").write_bytes(blob)
    meta = json.loads((ck / "meta.json").read_text())
    meta["files"]["config.json"] = {"size": len(blob), "sha256": sha256_bytes(blob)}
    (ck / "meta.json").write_text(json.dumps(meta))


def _corrupt_run(w: W) -> None:
    d = _copy_run(w, "corrupt")
    for ck in (d / "checkpoints").iterdir():
        weights = ck / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])


def _unwritable(w: W) -> str:
    if os.geteuid() == 0:  # root writes through any mode bits: a folder under /proc takes no file
        return "/proc/depthpack_unwritable/run"
    d = w.tmp / "readonly"
    d.mkdir(exist_ok=True)
    d.chmod(0o500)
    return str(d / "run")


CASES = [
    # ---- train (issue item 9, plus item 7's steps=true) -----------------------------------------
    Case("train-out-dir-is-a-file", lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={w.afile}", *FAST],
         "is a file"),
    Case("train-out-dir-under-a-file", lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={w.afile}/run", *FAST],
         "lies under the file"),
    Case("train-out-dir-unwritable", lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={_unwritable(w)}", *FAST],
         "cannot be written"),
    Case("train-out-dir-empty", lambda w: [*TRAIN, "--config", str(TINY), *FAST, "out_dir="], "out_dir"),
    Case("train-steps-1.5", lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={w.r1}", *FAST, "steps=1.5"],
         "steps must be an integer"),
    Case("train-missing-config", lambda w: [*TRAIN, "--config", str(w.nothing / "c.yaml"), *FAST], "no such file"),
    Case("train-invalid-yaml", lambda w: [*TRAIN, "--config", str(w.bad_yaml), *FAST], "not valid YAML"),
    Case("train-unknown-argument", lambda w: [*TRAIN, "--config", str(TINY), "--bogus"], "unrecognized arguments"),
    Case("train-checkpoint-config-wrong-structure",
         lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={w.wrong_config}", *FAST, "steps=8", "resume=true"],
         "config.json: not a depthpack checkpoint config", prepare=_wrong_config),
    # damage with a safe way round: one warning line naming the file, and the run goes on
    Case("train-meta-without-sha256-falls-back",
         lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={w.no_sha}", *FAST, "steps=8", "resume=true"],
         "meta.json is corrupt: its entry for model.safetensors lacks a size and sha256", rc=0, prepare=_drop_sha256),
    Case("train-garbage-log-row-is-dropped",
         lambda w: [*TRAIN, "--config", str(TINY), f"out_dir={w.garbage_log}", *FAST, "steps=8", "resume=true"],
         "log.csv:4: dropping a row that does not parse", rc=0, prepare=_garbage_log_row),
    # ---- evaluate ---------------------------------------------------------------------------------
    Case("eval-out-is-a-file", lambda w: [*EVAL, "--checkpoint", str(w.run), "--out", str(w.afile)], "is a file"),
    Case("eval-cuda-without-cuda", lambda w: [*EVAL, "--checkpoint", str(w.run), "--device", "cuda"],
         "CUDA is not available"),
    Case("eval-unknown-argument", lambda w: [*EVAL, "--checkpoint", str(w.run), "--bogus"], "unrecognized arguments"),
    # ---- export -----------------------------------------------------------------------------------
    Case("export-out-is-a-file", lambda w: [*EXPORT, "--preset", "tiny", "--out", str(w.afile)], "is a file"),
    # ---- bench (item 9 and item 7) ------------------------------------------------------------------
    Case("bench-out-is-a-file", lambda w: [*BENCH, "--preset", "tiny", "--device", "cpu", "--out", str(w.afile)],
         "is a file"),
    Case("bench-cuda-without-cuda", lambda w: [*BENCH, "--preset", "tiny", "--device", "cuda"], "CUDA is not available"),
    Case("bench-unknown-preset", lambda w: [*BENCH, "--preset", "huge", "--device", "cpu"], "unknown preset"),
    Case("bench-corrupt-checkpoint", lambda w: [*BENCH, "--checkpoint", str(w.corrupt), "--device", "cpu",
                                                "--out", str(w.b1)], "no usable checkpoint", prepare=_corrupt_run),
    Case("bench-nothing-to-measure", lambda w: [*BENCH, "--device", "cpu", "--rows", "none"], "no row to measure"),
    # ---- data -----------------------------------------------------------------------------------------
    Case("data-figure-in-a-missing-folder", lambda w: [*DATA, "--figure", str(w.nothing / "dir" / "x.png")],
         "does not exist"),
    # ---- demo -----------------------------------------------------------------------------------------
    Case("demo-out-is-a-file", lambda w: [*DEMO, "--out", str(w.afile), "--skip", "train", "eval", "export", "cpp",
                                          "bench", "bag"], "is a file, not a folder"),
]
NAMES = {"train": "train", "depthpack.eval": "eval", "export": "export", "depthpack.bench": "bench",
         "depthpack.data": "data", "demo.py": "demo"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from depthpack.train import load_train_config, train

    tmp = tmp_path_factory.mktemp("cli")
    run = tmp / "run"
    train(load_train_config(TINY, [f"out_dir={run}", "steps=6", "ckpt_every=3", "eval_images=1"]))
    (tmp / "afile").write_text("not a folder\n")
    (tmp / "bad_yaml").write_text("steps: [1,\n")
    (tmp / "list_yaml").write_text("- steps\n")
    return W(tmp, run)


@pytest.fixture(scope="module")
def results(request, world):
    """Run the cases this session selected, 3 at a time (each pays Python + torch start-up)."""
    wanted = [item.callspec.params["case"] for item in request.session.items
              if getattr(item, "module", None) is request.module and hasattr(item, "callspec")
              and isinstance(item.callspec.params.get("case"), Case)]
    done_prep: set = set()
    for case in wanted:
        if case.prepare.__name__ not in done_prep:
            case.prepare(world)
            done_prep.add(case.prepare.__name__)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def one(case):
        return case.id, subprocess.run(case.argv(world), cwd=ROOT, env=env, capture_output=True, text=True,
                                       timeout=600)
    with ThreadPoolExecutor(3) as pool:
        return dict(pool.map(one, wanted))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cli_refusal_is_one_line_exit_1(case, results):
    if case.id.endswith("cuda-without-cuda") and torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")
    p = results[case.id]
    name = next(v for k, v in NAMES.items() if k in " ".join(p.args[:3]))
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert p.returncode == case.rc, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    if case.rc == 1:
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert lines[0].startswith(f"{name}: error: ") and case.expect in lines[0], lines[0]
    else:  # one warning line naming the damage; the run finished
        warned = [ln for ln in p.stderr.splitlines() if ln.startswith(f"{name}: warning: ")]
        assert len(warned) == 1 and case.expect in warned[0], p.stderr
        assert json.loads(p.stdout.strip().splitlines()[-1])["step"] == 8


# ---- the same contract in-process (cheaper: no Python + torch start-up per case) ------------------
def _main_of(name: str):
    import importlib.util

    if name == "eval":
        from depthpack.eval.evaluate import main
        return main
    if name == "bench":
        from depthpack.bench.ladder import main
        return main
    if name == "export":  # export/export.py hands on to the package's command
        from depthpack.deploy.cli import _main
        return _main
    path = ROOT / name / f"{name}.py"  # train/train.py, export/export.py
    spec = importlib.util.spec_from_file_location(f"{name}_cli", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


IN_PROCESS = [
    ("train", lambda w: ["--config", str(TINY), f"out_dir={w.p1}", "steps=true"], "steps must be a number"),
    ("train", lambda w: ["--config", str(TINY), f"out_dir={w.p1}", "model=3"], "model must be a mapping"),
    ("train", lambda w: ["--config", str(w.list_yaml)], "must hold a mapping"),
    ("train", lambda w: ["--config", str(w.tmp)], ": is a folder, not a file"),
    ("train", lambda w: ["--config", str(TINY), f"out_dir={w.p1}", "model.buckets=x"], "buckets[0] must be a number"),
    ("train", lambda w: ["--config", str(TINY), f"out_dir={w.p1}", "device=tpu"], "device must be auto, cpu, cuda"),
    ("eval", lambda w: ["--checkpoint", str(w.nothing)], "does not exist"),
    ("eval", lambda w: ["--checkpoint", str(w.corrupt), "--out", str(w.p2)], "no usable checkpoint"),
    ("eval", lambda w: ["--checkpoint", str(w.run), "--batch-size", "0"], "--batch-size 0: must be >= 1"),
    ("eval", lambda w: ["--checkpoint", str(w.run), "--max-images", "0"], "--max-images 0: must be >= 1"),
    ("eval", lambda w: ["--checkpoint", str(w.run), "--queries", "16", "0"], "--queries [16, 0]: must be each >= 1"),
    ("eval", lambda w: ["--checkpoint", str(w.run), "--edge-frac", "nan"], "--edge-frac nan"),
    ("eval", lambda w: ["--checkpoint", str(w.run), "--figure-images", "-1"], "--figure-images -1"),
    ("export", lambda w: ["--preset", "tiny", "--out", str(w.afile / "x")], "lies under the file"),
    ("export", lambda w: ["--checkpoint", str(w.corrupt), "--out", str(w.p3)], "no usable checkpoint"),
]


@pytest.mark.parametrize("name, argv, expect", IN_PROCESS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(IN_PROCESS)])
def test_cli_refusal_in_process(name, argv, expect, world, capsys):
    from depthpack.core import cli

    if not (world.tmp / "corrupt").exists():
        _corrupt_run(world)
    try:
        rc = cli.run(name, _main_of(name), argv(world))
    except SystemExit as e:  # argparse-level refusals exit from inside
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"{name}: error: ") and expect in err[0], err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_train_device_cuda_without_cuda_is_refused_before_anything_is_written(tmp_path):
    from depthpack.train import load_train_config, train

    with pytest.raises(ValueError, match="device=cuda: CUDA is not available"):
        train(load_train_config(TINY, [f"out_dir={tmp_path / 'r'}", "device=cuda"]))
    assert not (tmp_path / "r").exists()


# ---- Ctrl-C while the command still imports torch ------------------------------------------------
INTERRUPT_AT_TORCH = '''import sys


class InterruptAtTorch:  # the user's Ctrl-C, landing exactly while torch is imported
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, InterruptAtTorch())
'''
STARTS = [("train", ["-m", "depthpack.train", "--config", str(TINY)]), ("train", [str(ROOT / "train" / "train.py")]),
          ("eval", ["-m", "depthpack.eval", "--checkpoint", "runs/x"]), ("bench", ["-m", "depthpack.bench"]),
          ("export", ["-m", "depthpack.export", "--preset", "tiny", "--out", "x"]),
          ("export", [str(ROOT / "export" / "export.py"), "--preset", "tiny", "--out", "x"]),
          ("bag", ["-m", "depthpack.bag", "info", "x"]), ("demo", [str(ROOT / "scripts" / "demo.py"), "--out", "x"]),
          ("data", ["-m", "depthpack.data", "--figure", "x.png"])]


@pytest.mark.parametrize("name, argv", STARTS, ids=[" ".join(a[:2]) for _, a in STARTS])
def test_ctrl_c_while_torch_imports_is_one_line(name, argv, tmp_path):
    """The package and the commands import torch lazily, inside core.cli.run: a Ctrl-C then is one line and
    exit code 130, like a Ctrl-C later on, never a traceback through the imports."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AT_TORCH)  # Python imports it at start-up
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    p = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (130, f"{name}: interrupted\n"), p.stderr[-2000:]
