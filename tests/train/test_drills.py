"""Reliability drills: SIGKILL during training, resume, nothing corrupt, nothing lost.

The training CLI runs as a child process exactly as a user starts it; it is killed at random
moments (several times), then resumed until done. The run must end at the configured step count
with every checkpoint on disk verifying, and the resumed run must reach the same weights as a run
that was never interrupted (CPU float32 training is deterministic and resume restores the data
position and every RNG). The logs too: after every kill, log.csv and eval.csv hold every row up to
the step the next run resumes from, and the finished run's logs equal the uninterrupted run's.
A second drill kills at the log files' own dangerous moments (a row cut in half, right after a
resumed run rewrote log.csv, in the middle of that rewrite, in the last evaluation, after the last
checkpoint), with a real SIGKILL sent by the child to itself at that point.
"""
import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
STEPS = 40
EVAL_EVERY = 4
ARGS = ["--config", "configs/tiny.yaml", f"steps={STEPS}", "ckpt_every=3", "log_every=1", "progress=false",
        "threads=1", "eval_images=2", "data.num_samples=16", f"eval_every={EVAL_EVERY}"]
# The child of the log drill: train/train.py as users run it, with one moment at which it SIGKILLs
# itself (DRILL=moment@step). Nothing in depthpack knows about it.
DRILL_CHILD = r"""
import csv, io, os, runpy, signal, sys
from pathlib import Path
import depthpack.train.log as log
import depthpack.train.loop as loop

moment, _, at = os.environ["DRILL"].partition("@")
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if moment in ("log-row-cut", "eval-row-cut"):  # a kill in the middle of appending a row
    target, append = ("log.csv" if moment == "log-row-cut" else "eval.csv"), log.RunLog._append
    def cut(self, path, row):
        if path.name == target and row["step"] == int(at):
            buf = io.StringIO()
            csv.DictWriter(buf, fieldnames=list(row), lineterminator="\n").writerow(row)
            with open(path, "a") as f:
                f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            die()
        append(self, path, row)
    log.RunLog._append = cut
elif moment == "after-rewrite":  # a resumed run has just rewritten log.csv
    truncate = log.RunLog._truncate
    def rewritten(path, start_step):
        truncate(path, start_step)
        if path.name == "log.csv":
            die()
    log.RunLog._truncate = staticmethod(rewritten)
elif moment == "mid-rewrite":  # the new log.csv is written to its temporary name, not yet renamed
    replace = os.replace
    def dying_replace(src, dst, *a, **k):
        if Path(dst).name == "log.csv":
            die()
        return replace(src, dst, *a, **k)
    os.replace = dying_replace
elif moment == "final-eval":  # in the last evaluation (before the last checkpoint)
    validate = loop._validate
    def dying_validate(model, cfg, step, log):
        if step == cfg.steps:
            die()
        return validate(model, cfg, step, log)
    loop._validate = dying_validate
elif moment == "before-summary":  # every row and the last checkpoint written, summary.json not
    write_json = loop.atomic_write_json
    def dying_write(path, obj, *a, **k):
        if Path(path).name == "summary.json":
            die()
        return write_json(path, obj, *a, **k)
    loop.atomic_write_json = dying_write
sys.argv = ["train/train.py", *sys.argv[1:]]
runpy.run_path("train/train.py", run_name="__main__")
"""


def _train(out: Path, *extra: str, drill: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    head = [sys.executable, "train/train.py"] if drill is None else [sys.executable, "-c", DRILL_CHILD]
    if drill is not None:
        env["DRILL"] = drill
    return subprocess.Popen([*head, *ARGS, f"out_dir={out}", *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _rows(path: Path) -> list[dict]:
    """The rows of a log file that parse completely (a row a kill cut short is not one)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return [r for r in reader if None not in r and None not in r.values() and r["step"].isdigit()]


def _resume_step(run: Path) -> int:
    from depthpack.core.checkpoint import latest_checkpoint

    found = latest_checkpoint(run)
    return 0 if found is None else int(found[0].name[5:])


def _same_row(a: dict, b: dict, columns) -> bool:
    return all(a[c] == b[c] if c in ("step", "q", "bucket", "lr") else
               abs(float(a[c]) - float(b[c])) <= 1e-5 * max(1.0, abs(float(b[c]))) for c in columns)


LOG_COLUMNS = ("step", "loss", "silog", "lr", "q", "bucket", "grad_norm")  # not the timings


def _check_logs_after_kill(run: Path, ref: Path) -> int:
    """Every row up to the step the next run resumes from is there, once, equal to the uninterrupted
    run's (rows after it may be there too: the resumed run drops them). Returns that step."""
    s = _resume_step(run)
    for name, columns in (("log.csv", LOG_COLUMNS), ("eval.csv", None)):
        want = [r for r in _rows(ref / name) if int(r["step"]) <= s]
        have = [r for r in _rows(run / name) if int(r["step"]) <= s]
        assert [r["step"] for r in have] == [r["step"] for r in want], (name, s, have, want)
        for a, b in zip(have, want):
            assert _same_row(a, b, columns or [c for c in b if c != "step"]), (name, a, b)
    return s


def _check_logs_complete(run: Path, ref: Path) -> None:
    for name, columns in (("log.csv", LOG_COLUMNS), ("eval.csv", None)):
        have, want = _rows(run / name), _rows(ref / name)
        raw = (run / name).read_text().splitlines()
        assert len(raw) == len(have) + 1, f"{name} holds rows that do not parse: {raw}"
        assert [r["step"] for r in have] == [r["step"] for r in want], name
        for a, b in zip(have, want):
            assert _same_row(a, b, columns or [c for c in b if c != "step"]), (name, a, b)
    assert not list(run.glob(".*.tmp*")), "temporaries of killed writers were left behind"
    val, ref_val = (json.loads((d / "summary.json").read_text())["val"] for d in (run, ref))
    assert val.keys() == ref_val.keys() and all(abs(val[k] - ref_val[k]) <= 1e-5 for k in ref_val)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The same run, never interrupted."""
    ref = tmp_path_factory.mktemp("drill") / "uninterrupted"
    _finish(_train(ref))
    return ref


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from depthpack.core.checkpoint import latest_checkpoint, load_weights_bytes

    d, blobs = latest_checkpoint(run)
    return load_weights_bytes(blobs["model.safetensors"], d)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path, reference):
    from depthpack.core.checkpoint import latest_checkpoint, list_checkpoints, verify_checkpoint

    ref = reference
    run = tmp_path / "killed"
    rng = random.Random(1234)
    kills = 0
    for attempt in range(4):
        proc = _train(run, "resume=true")
        # wait until the child is really training (a step logged since it started), then kill it at a
        # random moment: inside a step, during a checkpoint write, or between them
        log = run / "log.csv"
        start_rows = len(log.read_text().splitlines()) if log.is_file() else 0
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if log.is_file() and len(log.read_text().splitlines()) > start_rows:
                break
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.communicate(timeout=60)
        # whatever the kill interrupted, the newest checkpoint that verifies is found (never an error)
        found = latest_checkpoint(run)
        if found is not None:
            verify_checkpoint(found[0])
        _check_logs_after_kill(run, ref)  # and every log row up to it
    assert kills >= 2, "the drill must actually kill running trainings"
    _finish(_train(run, "resume=true"))
    latest = json.loads((run / "latest.json").read_text())
    assert latest["step"] == STEPS
    for d in list_checkpoints(run):
        verify_checkpoint(d)
    _check_logs_complete(run, ref)
    a, b = _weights(ref), _weights(run)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, f"resumed run diverged from the uninterrupted one by {worst}"


@pytest.mark.slow
def test_sigkill_at_the_log_files_moments_then_resume(tmp_path, reference):
    run = tmp_path / "killed"
    moments = [  # (the kill, what it must leave behind)
        ("log-row-cut@7", lambda: "7,".encode() in (run / "log.csv").read_bytes().splitlines()[-1][:3]),
        ("after-rewrite", lambda: _rows(run / "log.csv")[-1]["step"] == "6"),
        ("mid-rewrite", lambda: list(run.glob(".log.csv.tmp*"))),
        (f"eval-row-cut@{3 * EVAL_EVERY}", lambda: not (run / "eval.csv").read_text().endswith("\n")),
        ("final-eval", lambda: _resume_step(run) == STEPS - STEPS % 3 and _rows(run / "log.csv")[-1]["step"] == str(STEPS)),
        ("before-summary", lambda: _resume_step(run) == STEPS and not (run / "summary.json").exists()),
    ]
    for drill, left in moments:
        proc = _train(run, "resume=true", drill=drill)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == -9, f"{drill}: the child was not killed at its moment\n{out[-3000:]}"
        assert left(), f"{drill}: the kill did not land where it should"
        _check_logs_after_kill(run, reference)
    out = _finish(_train(run, "resume=true"))
    assert f"resumed from {run / 'checkpoints' / f'step_{STEPS:08d}'}" in out
    _check_logs_complete(run, reference)  # the cut rows dropped, the last evaluation done, no temporaries


def test_truncated_checkpoint_falls_back_to_previous(tmp_path):
    from depthpack.core.checkpoint import latest_checkpoint, list_checkpoints
    from depthpack.core.checkpoint import load_model

    run = tmp_path / "run"
    _finish(_train(run, "steps=4"))
    newest = list_checkpoints(run)[-1]
    w = newest / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])  # a crash-truncated file
    with pytest.warns(UserWarning, match="truncated or corrupt"):
        d, _ = latest_checkpoint(run)
    assert d == list_checkpoints(run)[-2]
    with pytest.warns(UserWarning, match=str(w.name)):
        load_model(run)  # loads the previous one, says which file was bad


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
def test_soak_10000_calls_equal_eager_no_recompile_flat_memory():
    """10,000 calls of random query counts across the buckets and chunks beyond them, through the
    compiled Predictor (aot_eager on the CPU: Inductor there costs ~50 s a bucket; the Inductor and
    CUDA-graph version runs on the H200 in tests/test_predictor.py): every answer equals the eager
    model's, nothing recompiles after warmup, and the process memory stays flat."""
    from conftest import randomize_
    from depthpack import create_model
    from depthpack.core.fast import Recipe
    from depthpack.runtime.engines import compile_counter
    from depthpack.runtime.predictor import Predictor

    torch.set_num_threads(1)
    model = randomize_(create_model("tiny")).eval()
    pred = Predictor(model, device="cpu", recipe=Recipe(compile=True, backend="aot_eager"), batch_size=1)
    pred.warmup()
    g = torch.Generator().manual_seed(3)
    sets = []
    for q in [1, 5, 8, 9, 16, 17, 31, 33, 63, 64, 65, 100, 128, 129, 150, 200]:
        images, points = torch.rand(1, 3, 64, 64, generator=g), torch.rand(1, q, 2, generator=g) * 63.999
        with torch.no_grad():
            sets.append((images, points, model(images, points)))
    for images, points, _ in sets:  # every chunk shape once, then count
        pred.predict(images, points)
    compiles, rss0 = compile_counter(), _rss_bytes()
    order = torch.randint(0, len(sets), (10_000,), generator=g).tolist()
    for i in order:
        images, points, ref = sets[i]
        got = pred.predict(images, points)
        assert got.shape == ref.shape
        assert (got - ref).abs().max() <= 1e-5
    assert compile_counter() == compiles, "recompiled after warmup"
    growth = _rss_bytes() - rss0
    assert growth < 32 * 2**20, f"memory grew by {growth / 2**20:.1f} MiB over 10,000 calls"


def test_a_run_removes_the_temporaries_of_killed_writers_and_keeps_live_ones(tmp_path):
    """Killed runs leave `.NAME.tmpPID` files (latest.json, half-written weights, a log rewrite); the
    next run removes those of dead processes when it starts, and never those of a live one."""
    from depthpack.core.checkpoint import list_checkpoints
    from depthpack.train import load_train_config, train

    def cfg(*extra):
        return load_train_config(ROOT / "configs" / "tiny.yaml", [f"out_dir={run}", "eval_images=1", *extra])

    run = tmp_path / "run"
    train(cfg("steps=3"))
    ckpt = list_checkpoints(run)[-1]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        stale = [run / f".latest.json.tmp{dead.pid}", run / f".log.csv.tmp{dead.pid}",
                 ckpt / f".model.safetensors.tmp{dead.pid}", ckpt / f".state.pt.tmp{dead.pid}"]
        live = [run / f".latest.json.tmp{sleeper.pid}", ckpt / f".model.safetensors.tmp{sleeper.pid}"]
        for p in stale + live:
            p.write_bytes(b"half a file")
        summary = train(cfg("steps=4", "resume=true"))
        assert summary["resumed_from"] == 3 and summary["step"] == 4
        assert not [p for p in stale if p.exists()], "temporaries of dead writers were left"
        assert all(p.read_bytes() == b"half a file" for p in live), "a live writer's temporary was touched"
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_log_resumed_across_a_change_of_columns_keeps_every_value(tmp_path):
    """log.csv written with a column the current loop no longer logs (or without one it now logs): the rows
    appended on resume line up under one header and no old value is dropped."""
    import csv

    from depthpack.train.log import RunLog

    (tmp_path / "log.csv").write_text("step,loss,distill,lr\n10,0.5,0.1,0.001\n20,0.4,0.2,0.001\n")
    log = RunLog(tmp_path, start_step=20, enabled=True)
    log.log({"step": 30, "loss": 0.3, "lr": 0.001, "q": 64})
    log.log({"step": 40, "loss": 0.2, "lr": 0.001, "q": 32})
    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["10", "20", "30", "40"]
    assert [r["distill"] for r in rows] == ["0.1", "0.2", "", ""] and [r["q"] for r in rows] == ["", "", "64", "32"]
    assert all(None not in r for r in rows)
    assert log.logged(40) == {"loss": 0.2, "lr": 0.001, "q": 32.0}  # a column the row lacks is not a number
