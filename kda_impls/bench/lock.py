"""One writer per sweep directory: a run holds an exclusive lock on ``DIR/.kda-sweep.lock`` (flock)
while it writes there, and removes the file when it ends. The kernel drops the lock when the process
ends, however it ends, so a crashed run leaves nothing stuck; another run into the directory is
refused with a line naming the first."""

from __future__ import annotations

import fcntl
import os
import platform
from pathlib import Path

from ..cli import UsageError

NAME = ".kda-sweep.lock"


class Lock:
    """``with Lock(directory):`` the directory's lock, or :class:`UsageError` naming its holder."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / NAME
        self.fd: int | None = None

    def __enter__(self) -> Lock:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process"
                os.close(fd)
                raise UsageError(f"{self.path.parent} is being written by another sweep ({holder}); wait for it "
                                 f"to end, or pass another --out") from None
            # the file locked is the one at the path (not one that its holder removed as it ended)
            if self.path.exists() and os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {platform.node()}".encode(), 0)
        self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        self.path.unlink(missing_ok=True)  # while still held: no other run holds this file
        os.close(self.fd)
