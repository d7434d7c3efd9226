"""One writer per journal: a lock file next to it that holds the writer's pid.

The lock is an exclusive `flock` on `FILE-lock`, which the kernel drops when its holder dies,
so the lock of a killed process (SIGKILL included) is free for the next one; the pid in the
file only names the holder in the error a second writer gets. The file is never deleted: a
process waiting on a deleted inode could otherwise hold a lock nobody else sees. Where `flock`
does not exist, the file is created exclusively and a lock whose pid is no longer alive is
taken over.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tokentrail.errors import JournalError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)


def lock_path(path: Path) -> Path:
    return Path(f"{path}-lock")


class JournalLock:
    """Held from `acquire` until `release` (or the holder's death)."""

    def __init__(self, path: Path) -> None:
        self.journal = path
        self.path = lock_path(path)
        self._fd: int | None = None

    def acquire(self) -> None:
        if fcntl is not None:
            self._flock()
        else:  # pragma: no cover - not POSIX
            self._exclusive_create()

    def _flock(self) -> None:
        assert fcntl is not None
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JournalError(f"journal {self.journal}: cannot open {self.path} ({exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(fd)
            os.close(fd)
            raise JournalError(
                f"journal {self.journal} is in use by process {holder or '(unknown pid)'} "
                f"(lock {self.path}); stop that process or give this one another journal"
            ) from None
        stale = _read_pid(fd)
        if stale and stale != os.getpid():
            logger.info("journal %s: took over the lock of process %s, gone", self.journal, stale)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _exclusive_create(self) -> None:  # pragma: no cover - not POSIX
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                with open(self.path, "rb") as f:
                    holder = _parse_pid(f.read())
                if holder and _alive(holder):
                    raise JournalError(
                        f"journal {self.journal} is in use by process {holder} (lock {self.path})"
                    ) from None
                logger.info("journal %s: took over the lock of process %s", self.journal, holder)
                self.path.unlink(missing_ok=True)
                continue
            os.write(fd, f"{os.getpid()}\n".encode())
            self._fd = fd
            return
        raise JournalError(f"journal {self.journal}: cannot take the lock {self.path}")

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        if fcntl is None:  # pragma: no cover - not POSIX
            os.close(self._fd)
            self.path.unlink(missing_ok=True)
        else:
            os.close(self._fd)  # closing drops the flock
        self._fd = None


def _read_pid(fd: int) -> int | None:
    return _parse_pid(os.pread(fd, 32, 0))


def _parse_pid(raw: bytes) -> int | None:
    try:
        return int(raw.strip() or b"0") or None
    except ValueError:
        return None


def _alive(pid: int) -> bool:  # pragma: no cover - not POSIX
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
