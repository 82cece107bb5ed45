"""The export under file-system faults, through its command line: a full disk (fresh, and a re-export over
a good export) is one line and exit 1 with the earlier export untouched; a mount point as --out is filled
in place; a read-only one is refused before anything compiles. Real file systems: a tmpfs of a few MB
(the tests skip where this machine may not mount one)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
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
    disk = tmpfs(10)  # room for one tiny export (about 7 MB: a bucket and the map package), not for a second
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
    mnt = tmpfs(32)  # a re-export holds the old export (7.6 MB) and the new one beside it: 16 MB ran out in a CI run
    p = export(mnt)
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads((mnt / "manifest.json").read_text())
    assert sorted(f.name for f in mnt.iterdir()) == sorted(
        [m["buckets"][0]["file"], m["map"]["file"], "manifest.json", "reference.png", "reference.safetensors", "reference_points.csv",
         "weights.safetensors"])
    p = export(mnt, "--seed", "1")  # a re-export into the same mount point
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads((mnt / "manifest.json").read_text())["weights"]["sha256"] != m["weights"]["sha256"]
    assert not [f for f in mnt.iterdir() if f.name.startswith(".")]
    ro = tmpfs(4, ro=True)
    t0 = time.perf_counter()
    one_line_error(export(ro), "not writable", "read-only mount point")
    assert time.perf_counter() - t0 < 60  # refused before the compile (which takes about a minute here)


def _children() -> dict[int, list[int]]:
    """{pid: [child pids]} of every process now (from /proc)."""
    kids: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(stat.parent.name))
    return kids


def _descendants(pid: int) -> set[int]:
    kids, out, todo = _children(), set(), [pid]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add(k)
            todo.append(k)
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie (a reaped-late zombie holds no memory)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_export_leaves_no_process_behind_and_the_next_clears_its_temporary_folder(tmp_path, sig,
                                                                                          monkeypatch):
    """Killed while its compile child works, the exporter takes every process it started with it (the compile
    child and multiprocessing's resource tracker used to live on under PID 1, 841 MB for the tiny preset); the
    temporary folder it could not remove is removed by the next export's compile."""
    import signal
    import tempfile

    from depthpack.core.files import process_temporary_dir

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "depthpack.export", "--preset", "tiny", "--out", str(tmp_path / "exp"),
           "--buckets", "8"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        kids: set[int] = set()
        for _ in range(1200):  # until the compile child runs (its spawn command line), at most 10 minutes
            kids = _descendants(proc.pid)
            if any("spawn_main" in _cmdline(k) for k in kids) or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the export ended before its compile child was seen"
        os.kill(proc.pid, getattr(signal, sig))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    for _ in range(120):  # a few seconds when they die with the exporter; never, when they do not
        alive = [k for k in kids if _running(k)]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, f"left running after {sig}: {[_cmdline(k)[:120] for k in alive]}"
    stale = list(tmp.glob("depthpack_eps_*"))
    if sig == "SIGTERM":  # it unwinds (cli.run(sigterm=True)): its own temporary folder is gone
        assert stale == []
        return
    assert stale and all(p.name.startswith(f"depthpack_eps_{proc.pid}_") for p in stale)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with process_temporary_dir("depthpack_eps_") as mine:
        assert [p.name for p in tmp.iterdir()] == [Path(mine).name]


def test_a_compile_child_that_dies_holding_a_semaphore_is_still_one_line(tmp_path):
    """A full disk can abort the compile child while it holds a semaphore: the exporter says one error line,
    and multiprocessing's resource tracker adds no "leaked semaphore objects" warning after it. The child's
    death is staged by a compile function that takes a lock and aborts (pickled by name: the child imports it)."""
    (tmp_path / "dying.py").write_text("import multiprocessing as mp, os\n\n\ndef compile_then_abort(job):\n"
                                       "    lock = mp.get_context('spawn').Lock()\n    os.abort()\n")
    script = ("import sys, dying\nimport depthpack.deploy.package as pk\npk._compile_saved = dying.compile_then_abort\n"
              "from depthpack.deploy.cli import main\n"
              f"sys.exit(main(['--preset', 'tiny', '--out', {str(tmp_path / 'exp')!r}, '--buckets', '8']))\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    one_line_error(p, "AOTInductor compile of depthpack_k8.pt2 failed")
    after = p.stderr.replace("\r", "\n").strip().splitlines()
    assert after[-1].startswith("export: error:") and "leaked" not in p.stderr, p.stderr[-2000:]


def _signal_while_compiling(tmp_path: Path, sig) -> dict:
    """An export over a previous export folder, sent sig (to the exporter alone) once its compile child
    runs: the seconds it took to end, its exit code and stderr, the processes it had started then, and
    the previous folder's files before."""
    out = tmp_path / "exp"
    out.mkdir()
    (out / "manifest.json").write_text('{"previous": "export"}\n')  # what check_out_dir takes for an export
    (out / "depthpack_k8.pt2").write_bytes(b"the previous package")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # -X faulthandler: a hung exporter, sent SIGABRT, writes every thread's stack to its stderr (the failure says where)
    cmd = [sys.executable, "-X", "faulthandler", "-m", "depthpack.export", "--preset", "tiny", "--out", str(out),
           "--buckets", "8"]
    # SIGINT as a foreground program gets it: a test run started in the background (`cmd &`, nohup) ignores it, the
    # exporter inherits that and rightly ignores a Ctrl-C too, and would then wait on the frozen compile for good
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kids: list[int] = []
    try:
        for _ in range(1200):  # until the compile child runs, at most 10 minutes
            kids = _descendants(proc.pid)
            if any("spawn_main" in _cmdline(k) for k in kids) or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the export ended before its compile child was seen"
        time.sleep(2.0)  # into the compile
        kids = _descendants(proc.pid)
        for k in kids:  # the compile frozen: an exporter that waits for it never returns (a hang, not a slow test)
            if k != proc.pid and "resource_tracker" not in _cmdline(k):
                os.kill(k, signal.SIGSTOP)
        t0 = time.monotonic()
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=180)  # a hang guard: the compile is frozen, so an exporter waiting for it never ends
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGABRT)
            proc.wait(timeout=30)
            _kill(k for k in kids if k != proc.pid)  # a frozen child that never armed its death with the exporter holds the stderr read below
            raise AssertionError(f"the exporter hung after {sig!r}; its threads: {proc.stderr.read()[-4000:]}") from None
        took = time.monotonic() - t0
        # what outlived the exporter by 10 s, said and killed: one frozen above would hold its stderr open for good
        left = {k: _cmdline(k)[:120] for k in _gone([k for k in kids if k != proc.pid])}
        _kill(left)
        err = proc.stderr.read()  # to its end: when the resource tracker, which shares it, is gone too
    finally:
        if proc.poll() is None:
            proc.kill()
            _kill(k for k in kids if k != proc.pid)  # a hung exporter's frozen children would outlive the test
    return {"took": took, "code": proc.returncode, "err": err.replace("\r", "\n"), "kids": kids, "left": left,
            "out": out, "before": before}


def _kill(pids) -> None:
    for k in pids:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(k, signal.SIGKILL)


def _gone(pids: set[int], seconds: float = 10.0) -> list[int]:
    """Those of pids still running after up to `seconds`."""
    for _ in range(int(seconds / 0.25)):
        alive = [k for k in pids if _running(k)]
        if not alive:
            break
        time.sleep(0.25)
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_ctrl_c_ends_the_compile_at_once_and_leaves_the_previous_export(tmp_path):
    """Ctrl-C (SIGINT) while a package compiles: the exporter ends its compile child and the compilers
    under it instead of waiting for the package being compiled (the compile is frozen, so waiting would never
    return), one line, exit 130; the previous export in --out is as it was, no staging folder beside it."""
    r = _signal_while_compiling(tmp_path, signal.SIGINT)
    assert r["code"] == 130, (r["code"], r["took"], r["err"][-2000:])
    assert r["err"].strip().splitlines()[-1] == "export: interrupted" and "Traceback" not in r["err"], r["err"][-2000:]
    assert not r["left"], f"left running: {list(r['left'].values())}"
    assert {p.name: p.read_bytes() for p in r["out"].iterdir()} == r["before"]
    assert [p.name for p in tmp_path.iterdir()] == ["exp"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_sigterm_unwinds_without_a_resource_tracker_warning(tmp_path):
    """SIGTERM while a package compiles: one line, exit 143, and nothing after it (the default action died
    at once, and multiprocessing's resource tracker then warned of the pool's leaked semaphores, 2 lines);
    the compile child ended, the previous export as it was."""
    r = _signal_while_compiling(tmp_path, signal.SIGTERM)
    lines = r["err"].strip().splitlines()
    assert r["code"] == 143 and lines[-1] == "export: terminated", r["err"][-2000:]
    assert "resource_tracker" not in r["err"] and "leaked" not in r["err"] and "Traceback" not in r["err"], r["err"][-2000:]
    assert not r["left"], f"left running: {list(r['left'].values())}"
    assert {p.name: p.read_bytes() for p in r["out"].iterdir()} == r["before"]
