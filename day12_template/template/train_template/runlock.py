"""One writer per run folder: rank 0 holds an exclusive `flock` on <run_dir>/run.lock for the whole run.

The kernel releases the lock when its holder exits or is killed (`kill -9` included), so a dead run leaves no stale
lock, and the next launch takes it over. The file names its holder (pid, host, start time), so a refused launch can
say whose run is live. On a filesystem without flock (some NFS and Lustre mounts) flock fails or is local to one
node: there the run says that a second writer cannot be refused, and trains on.
"""
import errno
import os
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock
    fcntl = None

NAME = "run.lock"
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class Busy(Exception):
    """Another live process holds the run folder."""


def _lock(f) -> bool:
    """Try the exclusive lock without waiting: True taken, False held by another process; OSError if unsupported."""
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _busy(run_dir: Path, f) -> Busy:
    f.seek(0)
    holder = f.read().strip() or "another process"
    return Busy(f"run.out_dir {run_dir} is in use by a live run ({holder}): wait for it to end or stop it "
                f"(SIGTERM), or choose another run.out_dir")


def check(run_dir) -> None:
    """Raise Busy if a live run holds `run_dir`; writes nothing (a cheap early test, before any work)."""
    path = Path(run_dir) / NAME
    if fcntl is None or not path.is_file():
        return
    with open(path) as f:
        try:
            free = _lock(f)  # released again when the file closes
        except OSError:
            return
        if not free:
            raise _busy(Path(run_dir), f)


class Lock:
    """The held lock (`file` None where flock is unavailable, and `note` says so). Keep it until the run ends."""

    def __init__(self, file=None, note: str | None = None):
        self.file, self.note = file, note

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing the file releases the lock


def hold(run_dir) -> Lock:
    """Take the run folder's lock for this process, or raise Busy if another live run holds it."""
    run_dir = Path(run_dir)
    if fcntl is None:
        return Lock(note="no flock on this system: a second writer into this run folder cannot be refused")
    f = open(run_dir / NAME, "a+")  # creates it if absent; leaves a live holder's text alone
    try:
        taken = _lock(f)
    except OSError as exc:
        f.close()
        if exc.errno not in UNSUPPORTED:
            raise
        return Lock(note=f"flock unsupported on this filesystem ({exc.strerror}): a second writer into this run "
                         f"folder cannot be refused")
    if not taken:
        error = _busy(run_dir, f)
        f.close()
        raise error
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    f.flush()
    return Lock(f)
