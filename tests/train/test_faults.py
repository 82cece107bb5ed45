"""Faults in training (issue 29), through the train command (depthpack.train.cli.main, what
train/train.py and `python -m depthpack.train` run) or depthpack.train.train: a resume that would only
rewrite the summary, a first checkpoint that never completed, checkpoints of another model, Ctrl-C."""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from depthpack.core import checkpoint as ck
from depthpack.core.files import sha256_bytes
from depthpack.train import load_train_config, train
from depthpack.train.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"
FAST = ["eval_images=1", "progress=false"]


@pytest.fixture(scope="module")
def done(tmp_path_factory) -> Path:
    """A finished tiny run: 6 steps, checkpoints at 3 and 6. Tests change copies of it."""
    out = tmp_path_factory.mktemp("faults") / "run"
    train(load_train_config(TINY, [f"out_dir={out}", *FAST]))
    return out


def command(capsys, run: Path, *over: str) -> tuple[int, list[str], list[str]]:
    """The train command on run: exit code, stdout lines, stderr lines."""
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every warning reaches the command's one-line printer
        rc = main(["--config", str(TINY), f"out_dir={run}", *FAST, *over])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.strip().splitlines()


def files(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}


def test_resume_with_fewer_steps_than_the_checkpoint_is_refused_and_the_run_kept(done, tmp_path, capsys):
    run = shutil.copytree(done, tmp_path / "run")
    before = files(run)
    rc, _, err = command(capsys, run, "steps=3", "resume=true")
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("train: error: resume: ") and "step_00000006 is at step 6, past steps=3" in err[0]
    assert files(run) == before  # summary.json (its loss, its validation), config.yaml and the logs as they were
    rc, _, err = command(capsys, run, "steps=6", "resume=true")  # at its end: the summary made again, the same
    assert rc == 0 and not err
    summary = json.loads((run / "summary.json").read_text())
    was = json.loads(before["summary.json"])
    assert summary["last_loss"] == pytest.approx(was["last_loss"], abs=1e-6)  # as log.csv rounds it
    assert summary["val"] == pytest.approx(was["val"], abs=1e-6)


def _fail_at_state(monkeypatch):
    """The disk fills up while the first checkpoint writes its training state."""
    write = ck.atomic_write_bytes

    def full(path, data, *a, **k):
        if Path(path).name == ck.STATE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return write(path, data, *a, **k)
    monkeypatch.setattr(ck, "atomic_write_bytes", full)


def test_a_first_checkpoint_that_never_completed_is_removed_and_either_start_works(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _fail_at_state(monkeypatch)
    with pytest.raises(OSError, match="No space left on device"):
        train(load_train_config(TINY, [f"out_dir={run}", *FAST, "steps=3"]))
    monkeypatch.undo()
    broken = ck.step_dir(run, 3)
    assert (broken / ck.WEIGHTS).is_file() and not (broken / ck.META).exists() and not (run / ck.LATEST).exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (broken / f".{ck.STATE}.tmp{int(dead.stdout)}").write_bytes(b"half")  # what a kill leaves instead
    fresh = shutil.copytree(run, tmp_path / "fresh")
    for folder, over in ((run, ["resume=true"]), (fresh, [])):
        rc, out, err = command(capsys, folder, "steps=3", *over)
        assert rc == 0, err
        assert err == [f"train: warning: checkpoint {ck.step_dir(folder, 3)} never completed (no meta.json: its "
                       f"write was cut short); removed it"]
        assert (f"resume: {folder} holds no checkpoint yet; starting from step 0" in out) == bool(over)
        assert json.loads(out[-1])["resumed_from"] == 0 and json.loads(out[-1])["step"] == 3
        assert _rows(folder / "log.csv") == [1, 2, 3]  # the failed attempt's rows replaced
    a, b = ck.load_model(run).state_dict(), ck.load_model(fresh).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def _foreign(run: Path, step: int, other: Path, name: str) -> None:
    """Checkpoint `step` of run gets file `name` of run `other` (another model), its hash fixed in meta.json."""
    d = ck.step_dir(run, step)
    shutil.copy(ck.step_dir(other, step) / name, d / name)
    meta = json.loads((d / ck.META).read_text())
    blob = (d / name).read_bytes()
    meta["files"][name] = {"size": len(blob), "sha256": sha256_bytes(blob)}
    (d / ck.META).write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> Path:
    """A tiny run of another model (one block, not two), checkpoints at 3 and 6."""
    out = tmp_path_factory.mktemp("faults") / "other"
    train(load_train_config(TINY, [f"out_dir={out}", *FAST, "model.depth=1"]))
    return out


@pytest.mark.parametrize("name, said", [
    (ck.WEIGHTS, "model.safetensors holds the weights of another model: tensors 14 missing (backbone.blocks.1."),
    (ck.CONFIG, "holds another model: depth 1 (the config: 2)")])
def test_resume_past_a_checkpoint_of_another_model_falls_back_in_one_line(done, other, tmp_path, capsys, name, said):
    run = shutil.copytree(done, tmp_path / "run")
    _foreign(run, 6, other, name)
    rc, out, err = command(capsys, run, "steps=8", "resume=true")
    assert rc == 0 and len(err) == 1, err
    assert err[0].startswith(f"train: warning: {ck.step_dir(run, 6)}" if name == ck.WEIGHTS else "train: warning: ")
    assert said in err[0] and err[0].endswith("; using the previous checkpoint")
    assert f"resumed from {ck.step_dir(run, 3)} at step 3" in out
    assert json.loads(out[-1])["resumed_from"] == 3 and json.loads(out[-1])["step"] == 8
    assert [d.name for d in ck.list_checkpoints(run)] == ["step_00000006", "step_00000008"]
    ck.load_model(ck.step_dir(run, 6))  # the foreign one was replaced by this run's own step 6


def test_resume_where_no_checkpoint_fits_is_one_error(done, other, tmp_path, capsys):
    run = shutil.copytree(done, tmp_path / "run")
    for step in (3, 6):
        _foreign(run, step, other, ck.WEIGHTS)
    rc, _, err = command(capsys, run, "steps=8", "resume=true")
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"train: error: no usable checkpoint in {run}: ") and err[0].count("another model") == 2
    rc, _, err = command(capsys, done, "steps=8", "resume=true", "model.depth=1")  # the config changed instead
    assert rc == 1 and len(err) == 1 and "holds another model: depth 2 (the config: 1)" in err[0], err


def _rows(path: Path) -> list[int]:
    return [int(line.split(",")[0]) for line in path.read_text().splitlines()[1:]]


def test_ctrl_c_stops_as_a_kill_does_with_one_line(tmp_path):
    """A real SIGINT to a real training process (python -m depthpack.train): exit code 130, one line on
    stderr naming the checkpoint a resume continues from, every checkpoint complete, the log whole;
    resume=true goes on from there."""
    run = tmp_path / "run"
    # PYTHONFAULTHANDLER: a process that outlives its Ctrl-C is sent SIGABRT below and prints every thread's stack
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "depthpack.train", "--config", str(TINY), f"out_dir={run}", *FAST,
                             "steps=100000", "threads=1", "data.num_samples=16"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # a shell's background job (`.ci/run &`) ignores SIGINT, and a child inherits that:
                            # give the run what a terminal gives it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300  # a loaded 2-core machine takes a while to import torch
    while time.time() < deadline and proc.poll() is None:  # training, past its first checkpoint
        if (run / "log.csv").is_file() and len(_rows(run / "log.csv")) >= 4:
            break
        time.sleep(0.05)
    rows_at_signal = _rows(run / "log.csv") if (run / "log.csv").is_file() else []
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"Ctrl-C did not end the run in 60 s ({len(rows_at_signal)} log rows when it was sent); its "
                    f"threads when aborted:\n{err[-6000:]}")
    assert proc.returncode == 130, (proc.returncode, out[-2000:], err[-3000:])
    step = json.loads((run / ck.LATEST).read_text())["step"]
    assert err.splitlines() == [f"train: interrupted; {run} keeps its checkpoints up to step {step} (resume=true "
                                f"continues from it)"]
    for d in ck.list_checkpoints(run):
        ck.verify_checkpoint(d)
    rows = _rows(run / "log.csv")
    assert step >= 3 and rows == list(range(1, len(rows) + 1)) and len(rows) >= step
    assert not (run / "summary.json").exists()  # no end was reached
    summary = train(load_train_config(TINY, [f"out_dir={run}", *FAST, f"steps={step + 1}", "data.num_samples=16",
                                             "resume=true"]))
    assert (summary["resumed_from"], summary["step"]) == (step, step + 1)
    assert _rows(run / "log.csv") == list(range(1, step + 2))


def test_a_folder_a_live_trainer_holds_is_refused_and_a_dead_ones_lock_taken_over(done, tmp_path, capsys):
    """Every trainer holds its run folder's train.lock (its PID in it): a second trainer is refused while the
    holder lives, whoever started either; a holder killed (its PID left in the file) is taken over with one
    warning; a clean end leaves the file empty."""
    from depthpack.train.run_folder import LOCK

    run = shutil.copytree(done, tmp_path / "run")
    hold = ("import sys\nfrom depthpack.core.files import pid_lock\nwith pid_lock(sys.argv[1], 'x'):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(run / LOCK)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"  # it holds the lock from here on
        before = files(run)
        rc, _, err = command(capsys, run, "steps=8", "resume=true")
        assert rc == 1 and err == [f"train: error: out_dir {run} is in use by process {holder.pid}, still running "
                                   f"(its lock: {run / LOCK}); wait for it to end, or end it"], err
        assert files(run) == before
    finally:
        holder.kill()
        holder.wait()
    assert (run / LOCK).read_text().strip() == str(holder.pid)  # killed: its PID stays behind
    rc, _, err = command(capsys, run, "steps=8", "resume=true")
    assert rc == 0 and len(err) == 1, err
    assert err[0] == f"train: warning: {run / LOCK}: a lock left by process {holder.pid}, which is gone (killed?); taking it over"
    assert (run / LOCK).read_text() == ""
