"""What killed writers leave behind, and who cleans it up (depthpack.core.files)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from depthpack.core.files import publish_dir, remove_stale_temporaries, staging_dir

FILES_PY = Path(__file__).resolve().parents[2] / "depthpack" / "core" / "files.py"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_temporaries_of_dead_writers_go_live_ones_stay(tmp_path):
    dead = _dead_pid()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        stale = [tmp_path / f".latest.json.tmp{dead}", tmp_path / f".model.safetensors.tmp{dead}"]
        live = [tmp_path / f".latest.json.tmp{sleeper.pid}", tmp_path / f".log.csv.tmp{os.getpid()}"]
        other = [tmp_path / "latest.json", tmp_path / f"notes.tmp{dead}", tmp_path / f".x.tmp{dead}.bak"]
        for p in stale + live + other:
            p.write_bytes(b"half")
        assert sorted(remove_stale_temporaries(tmp_path)) == sorted(stale)
        assert all(p.exists() for p in live + other) and not any(p.exists() for p in stale)
    finally:
        sleeper.kill()
        sleeper.wait()


# A publisher on a platform without an atomic exchange, SIGKILLed between its two renames (the old
# version moved aside, the new one not yet in place). files.py is loaded on its own: no torch start-up.
KILLED_PUBLISH = r"""
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("files", sys.argv[1])
files = importlib.util.module_from_spec(spec)
spec.loader.exec_module(files)
files._exchange = lambda a, b: False
rename = os.rename
def rename_then_die(src, dst):
    rename(src, dst)
    if ".old-" in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)
os.rename = rename_then_die
files.publish_dir(sys.argv[2], sys.argv[3])
"""


def test_publish_killed_between_renames_is_restored_by_the_next_publisher(tmp_path):
    dest = tmp_path / "deployed"
    dest.mkdir()
    (dest / "manifest.json").write_text("old")
    new = tmp_path / f".deployed.staging-{_dead_pid()}"  # as if its builder had died too
    new.mkdir()
    (new / "manifest.json").write_text("new")
    proc = subprocess.run([sys.executable, "-c", KILLED_PUBLISH, str(FILES_PY), str(new), str(dest)])
    assert proc.returncode == -signal.SIGKILL
    assert not dest.exists() and len(list(tmp_path.glob(".deployed.old-*"))) == 1  # the window the kill hit

    staged = staging_dir(dest)  # the next export starts: the old complete version is put back first
    assert (dest / "manifest.json").read_text() == "old"
    assert not list(tmp_path.glob(".deployed.old-*"))
    (staged / "manifest.json").write_text("newer")
    publish_dir(staged, dest)
    assert (dest / "manifest.json").read_text() == "newer"
    assert [p.name for p in tmp_path.iterdir()] == ["deployed"]  # the dead builder's staging folder is gone too
