"""Durable writes: a file privfed writes lands whole or not at all, and a write that fails names its file.

- `write_atomically(path, write, private)`: a temp file in the same folder, `write(fh)`, fsync,
  `os.replace`, then the folder's fsync. On any failure the temp file is removed and the previous file,
  if any, is untouched: a full disk never leaves a cut checkpoint, ledger or summary.json behind.
- `fsync_dir(folder)`: makes a rename or a creation in `folder` durable. Only "this platform or file
  system cannot" errors are ignored; an I/O error is raised, since a lost directory entry loses the
  whole file (a ledger's later appends are fsynced in place, into the lost file).
- `naming(path)`: an OSError that names no file (an fsync's EIO says only "Input/output error") is
  re-raised naming `path`, so the one-line error a user sees says which file, on which disk, failed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

# fsync of a directory handle: refused by some platforms and file systems, which is not an I/O error
_CANNOT_FSYNC_DIRS = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EISDIR}


@contextlib.contextmanager
def naming(path: str | os.PathLike) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # no directory handles here (e.g. Windows): the rename or creation is as durable as it gets
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_FSYNC_DIRS:
            raise OSError(exc.errno, exc.strerror, str(folder)) from exc
    finally:
        os.close(fd)


def write_atomically(path: Path, write: Callable[[BinaryIO], object], private: bool = False) -> os.stat_result:
    """Replace `path` by what `write(fh)` writes; returns the new file's stat (os.replace keeps the inode).
    `private`: owner-only (0600: checkpoints and node state hold non-private functions of client data).
    Otherwise the file keeps the old one's permissions, or gets those `open()` would give a new file
    (mkstemp's 0600 would hide results from the other users or containers that read them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with naming(path):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            if not private:
                _chmod_like_open(fd, path)
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
                written = os.fstat(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)
    return written


def _chmod_like_open(fd: int, path: Path) -> None:
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o666 & ~_umask()
    try:
        os.fchmod(fd, mode)
    except OSError:  # a file system that refuses chmod (a CIFS or vfat share): its own modes apply
        pass


def _umask() -> int:
    try:  # Linux: read it without changing it (os.umask sets it, racing other threads' file creation)
        return next(int(line.split()[1], 8) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask
