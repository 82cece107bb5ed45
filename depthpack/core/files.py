"""Files a user relies on: written atomically (a reader sees the old file or the new one, never half of
one) and identified by sha256.

A write goes to a temporary name in the same folder (`.NAME.tmpPID`), is fsynced, then renamed over
the final name (os.replace is atomic on POSIX) and the folder is fsynced. A kill at any moment leaves
at most a stray temporary file, which `remove_stale_temporaries` clears.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterator

_TMP = re.compile(r"^\..+\.tmp(\d+)$")


def fsync_dir(path: str | Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temporary_name(path: str | Path) -> Path:
    """Where an atomic write of `path` stages its bytes: hidden, in the same folder, per process."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def atomic_write_bytes(path: str | Path, data: bytes, mode: int | None = None) -> None:
    """Write data to path through a temporary file in the same folder + fsync + os.replace (with
    the file mode set before the swap, when given: nobody sees the file without it)."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str, mode: int | None = None) -> None:
    atomic_write_bytes(path, text.encode(), mode)


def atomic_write_json(path: str | Path, obj: Any, sort_keys: bool = True) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys) + "\n")


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete `.NAME.tmpPID` files left in folder by killed writers (never a live process's own)."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        m = _TMP.match(p.name)
        if m and p.is_file() and not _alive(int(m[1])):
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def pid_lock(path: str | Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the file path for the block, the file naming this process's PID. flock: the
    kernel drops it when the holder dies, however it dies, so only a live holder refuses the next one (one
    ValueError naming `what` and its PID); a PID a dead holder left is taken over with one warning. A clean end
    empties the file (nothing to take over)."""
    import fcntl

    path = Path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        left = os.pread(fd, 64, 0).decode(errors="replace").strip()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f"process {left}" if left.isdigit() else "another process"
            raise ValueError(f"{what} is in use by {holder}, still running (its lock: {path}); wait for it to end, "
                             f"or end it") from None
        left = os.pread(fd, 64, 0).decode(errors="replace").strip()  # read again: the file is ours now
        if left and left != str(os.getpid()):
            warnings.warn(f"{path}: a lock left by process {left}, which is gone (killed?); taking it over")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing drops the lock


def process_temporary_dir(prefix: str):
    """tempfile.TemporaryDirectory named for this process (PREFIX<pid>_...), after removing those of the
    same prefix whose process is gone: a killed process cannot remove its own, so the next one does."""
    import shutil
    import tempfile

    for p in Path(tempfile.gettempdir()).glob(f"{prefix}*_*"):
        pid = p.name[len(prefix):].split("_", 1)[0]
        if p.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{prefix}{os.getpid()}_")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_writable_dir(path: str | Path, what: str) -> Path:
    """Create folder `path` if needed and prove it takes a file; a ValueError naming `what` if not
    (a file in the way, a path under a file, no permission, an empty name)."""
    if path is None or str(path).strip() == "":
        raise ValueError(f"{what}: an empty path is not a folder")
    path = Path(path)
    for parent in [path, *path.parents]:
        if parent.exists() and not parent.is_dir():
            where = "is a file" if parent == path else f"lies under the file {parent}"
            raise ValueError(f"{what} {path} {where}, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe.tmp{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be written: {e.strerror or e}") from None
    return path


# ---- folders: build aside, swap in ---------------------------------------------------------------
_RENAME_EXCHANGE = 2
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276}


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes
    import platform

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    args = (-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE)  # AT_FDCWD = -100
    fn = getattr(libc, "renameat2", None)
    if fn is not None:
        rc = fn(ctypes.c_int(args[0]), ctypes.c_char_p(args[1]), ctypes.c_int(args[2]), ctypes.c_char_p(args[3]),
                ctypes.c_uint(args[4]))
    elif platform.machine() in _SYS_RENAMEAT2:
        rc = libc.syscall(ctypes.c_long(_SYS_RENAMEAT2[platform.machine()]), ctypes.c_int(args[0]),
                          ctypes.c_char_p(args[1]), ctypes.c_int(args[2]), ctypes.c_char_p(args[3]), ctypes.c_uint(args[4]))
    else:
        return False
    if rc == 0:
        return True
    err = ctypes.get_errno()
    import errno as _errno
    if err in (_errno.EINVAL, _errno.ENOSYS, _errno.ENOTSUP, _errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))


def staging_dir(dest: str | Path) -> Path:
    """A fresh sibling folder to build the next version of dest in (same filesystem, so it can be
    swapped in); stale ones of killed builders are removed first."""
    dest = Path(dest)
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)
    restore_interrupted_publish(dest)
    for p in parent.glob(f".{dest.name}.*-*"):
        pid = p.name.rsplit("-", 1)[-1]
        if p.is_dir() and pid.isdigit() and not _alive(int(pid)):
            import shutil
            shutil.rmtree(p, ignore_errors=True)
    staged = parent / f".{dest.name}.staging-{os.getpid()}"
    if staged.exists():
        import shutil
        shutil.rmtree(staged)
    staged.mkdir()
    return staged


def publish_into(staged: str | Path, dest: str | Path, last: str) -> None:
    """Fill the folder dest, which cannot itself be swapped (a mount point), with the complete folder
    staged inside it: each file renamed into place, `last` (the file readers start from) last, then the
    files of the previous version that the new one lacks removed. A reader sees the old `last` or the new
    one; files that `last` names are checked by their hash, so a mix is refused, never read."""
    import shutil

    staged, dest = Path(staged), Path(dest)
    fsync_dir(staged)
    names = sorted((p.name for p in staged.iterdir()), key=lambda n: n == last)
    for name in names:
        os.replace(staged / name, dest / name)
    fsync_dir(dest)
    for p in dest.iterdir():
        if p.name not in names and p != staged:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    shutil.rmtree(staged, ignore_errors=True)


def restore_interrupted_publish(dest: str | Path) -> bool:
    """Where publish_dir had no atomic exchange and was killed between its two renames, dest is missing
    and its previous version waits in `.NAME.old-PID`: put it back (True if it did). Never touches the
    folder of a live publisher."""
    dest = Path(dest)
    if dest.exists():
        return False
    olds = [p for p in dest.parent.glob(f".{dest.name}.old-*")
            if p.is_dir() and p.name.rsplit("-", 1)[-1].isdigit() and not _alive(int(p.name.rsplit("-", 1)[-1]))]
    if not olds:
        return False
    os.rename(max(olds, key=lambda p: p.stat().st_mtime), dest)
    fsync_dir(dest.parent)
    return True


def publish_dir(staged: str | Path, dest: str | Path) -> None:
    """Make the complete folder `staged` the folder `dest`: an atomic exchange where the platform has
    one (Linux), so a kill at any moment leaves dest as the old complete version or the new one; the
    old version is then deleted."""
    import shutil

    staged, dest = Path(staged), Path(dest)
    fsync_dir(staged)
    if not dest.exists():
        os.rename(staged, dest)
    elif _exchange(staged, dest):
        shutil.rmtree(staged, ignore_errors=True)  # it now holds the old version
    else:  # no atomic exchange here: two renames, the old version kept until the new one is in place
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.rename(dest, old)
        os.rename(staged, dest)
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(dest.parent)
