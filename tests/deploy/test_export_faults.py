"""The export under file-system faults, through its command line: a full disk (fresh, and a re-export over
a good export) is one line and exit 1 with the earlier export untouched; a mount point as --out is filled
in place; a read-only one is refused before anything compiles. Real file systems: a tmpfs of a few MB
(the tests skip where this machine may not mount one)."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture
def tmpfs(tmp_path):
    """mount(size_mb, ro=False) -> a fresh tmpfs mount point under tmp_path; unmounted afterwards."""
    mounted = []

    def mount(size_mb: int, ro: bool = False) -> Path:
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        opts = f"size={size_mb}M" + (",ro" if ro else "")
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(d)], capture_output=True, text=True)
        if p.returncode != 0:
            pytest.skip(f"this machine cannot mount a tmpfs: {p.stderr.strip()[:120]}")
        mounted.append(d)
        return d
    yield mount
    for d in mounted:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def export(out: Path, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "depthpack.export", "--preset", "tiny", "--out", str(out), "--buckets", "8", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def one_line_error(p: subprocess.CompletedProcess, *words: str) -> str:
    """The last stderr line is the one error (progress bars may precede it); nothing else is an error or a traceback."""
    assert p.returncode == 1, (p.returncode, p.stderr[-2000:])
    text = p.stderr.replace("\r", "\n")
    assert "Traceback" not in text and "terminate called" not in text and "frame #" not in text, text[-2000:]
    errors = [ln for ln in text.splitlines() if ln.startswith("export: error:")]
    assert len(errors) == 1, text[-2000:]
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def test_full_disk_fresh_and_over_an_earlier_export(tmpfs):
    disk = tmpfs(6)  # room for one tiny export (about 4 MB), not for a second one beside it
    first = export(disk / "exp")
    assert first.returncode == 0, first.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in (disk / "exp").iterdir()}
    again = export(disk / "exp", "--seed", "1")  # another model: its packages and weights are new files
    one_line_error(again, "no space left")
    assert {p.name: p.read_bytes() for p in (disk / "exp").iterdir()} == before  # the earlier export, whole
    assert [p.name for p in disk.iterdir()] == ["exp"]  # no staging folder left behind
    from depthpack.runtime.aoti import load_runners
    load_runners(disk / "exp" / "manifest.json", "cpu")  # and it still loads
    tiny = tmpfs(1)
    one_line_error(export(tiny / "exp"), "no space left")
    assert list(tiny.iterdir()) == []


def test_mount_point_is_filled_in_place_and_read_only_is_refused_first(tmpfs):
    mnt = tmpfs(16)
    p = export(mnt)
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads((mnt / "manifest.json").read_text())
    assert sorted(f.name for f in mnt.iterdir()) == sorted(
        [m["buckets"][0]["file"], "manifest.json", "reference.png", "reference.safetensors", "reference_points.csv",
         "weights.safetensors"])
    p = export(mnt, "--seed", "1")  # a re-export into the same mount point
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((mnt / "manifest.json").read_text())["weights"]["sha256"] != m["weights"]["sha256"]
    assert not [f for f in mnt.iterdir() if f.name.startswith(".")]
    ro = tmpfs(4, ro=True)
    t0 = time.perf_counter()
    one_line_error(export(ro), "not writable", "read-only mount point")
    assert time.perf_counter() - t0 < 60  # refused before the compile (which takes about a minute here)
