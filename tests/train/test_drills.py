"""Reliability drills: SIGKILL during training, resume, nothing corrupt, nothing lost.

The training CLI runs as a child process exactly as a user starts it; it is killed at random
moments (several times), then resumed until done. The run must end at the configured step count
with every checkpoint on disk verifying, and the resumed run must reach the same weights as a run
that was never interrupted (CPU float32 training is deterministic and resume restores the data
position and every RNG).
"""
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
ARGS = ["--config", "configs/tiny.yaml", f"steps={STEPS}", "ckpt_every=3", "log_every=1", "progress=false",
        "threads=1", "eval_images=2", "data.num_samples=16"]


def _train(out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "train/train.py", *ARGS, f"out_dir={out}", *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def _weights(run: Path) -> dict[str, torch.Tensor]:
    from depthpack.core.checkpoint import latest_checkpoint, load_weights_bytes

    d, blobs = latest_checkpoint(run)
    return load_weights_bytes(blobs["model.safetensors"], d)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path):
    from depthpack.core.checkpoint import latest_checkpoint, list_checkpoints, verify_checkpoint

    ref = tmp_path / "uninterrupted"
    _finish(_train(ref))
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
    assert kills >= 2, "the drill must actually kill running trainings"
    _finish(_train(run, "resume=true"))
    latest = json.loads((run / "latest.json").read_text())
    assert latest["step"] == STEPS
    for d in list_checkpoints(run):
        verify_checkpoint(d)
    a, b = _weights(ref), _weights(run)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, f"resumed run diverged from the uninterrupted one by {worst}"


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
    from depthpack.runtime.predictor import Predictor, compile_counter

    torch.set_num_threads(1)
    model = randomize_(create_model("tiny")).eval()
    pred = Predictor(model, device="cpu", backend="compile", batch_size=1, compile_backend="aot_eager")
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
