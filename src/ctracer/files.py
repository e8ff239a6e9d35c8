"""Creating the files ctracer writes (trace files, reports, exports) safely.

What ctracer writes holds kernel and heap addresses, command lines, host names and
char[] contents of traced objects, so everything it creates is private to its owner
(files 0600, directories 0700) and created without following a symlink someone planted
in a shared directory.  An existing file at an output path is never destroyed: it is
kept as ``FILE.old``, as ``perf record`` does.  Names that come from a trace (struct,
host, object or field names) pass through `safe_name` before they become path
components, so nothing is written outside the chosen output directory.

Every writer (the recorder through `ctracer.tracefile`, the report, the exports) uses
these helpers; a problem is an `OutputError`, shown as one line.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import stat
from typing import Any, Callable, Iterable, Iterator, Optional

from ctracer.errors import OutputError

FILE_MODE = 0o600
DIR_MODE = 0o700

_SAFE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,119}\Z")


def safe_name(name: str, prefix: str = "x", reserved: Iterable[str] = ()) -> str:
    """``name`` itself when it is a harmless single path component (letters, digits,
    ``_.-``, no leading dot, no ``..``, not one of ``reserved``), else a stable stand-in,
    ``PREFIX-<hash>``, so distinct names never collide and none climbs out."""
    if _SAFE.match(name) and ".." not in name and name.lower() not in set(reserved):
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{prefix}-{digest}"


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Everything created inside (by ctracer or by a library it calls, such as
    matplotlib or graphviz) is at most 0600 for files and 0700 for directories."""
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def private_files(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``fn`` runs under `private_umask` (everything it and the libraries it
    calls create is 0600/0700)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with private_umask():
            return fn(*args, **kwargs)
    return wrapper


def _explain(path: str, e: OSError) -> OutputError:
    reason = e.strerror or str(e)
    return OutputError(f"cannot write {path}: {reason}")


def keep_old(path: str) -> Optional[str]:
    """Move an existing ``path`` (file or symlink, never followed) to ``path.old``,
    replacing an older ``.old``; the name it was kept under, or None when there was
    nothing.  SQLite's side files of the old file move with it, so they can never be
    mistaken for the new file's."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise _explain(path, e) from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{path} is a directory: give a file name for the output")
    old = path + ".old"
    try:
        os.replace(path, old)
        for suffix in ("-wal", "-shm", "-journal"):
            if os.path.lexists(path + suffix):
                os.replace(path + suffix, old + suffix)
    except OSError as e:
        raise _explain(path, e) from None
    return old


def create_private_file(path: str) -> int:
    """Create ``path`` (which must not exist) as an empty 0600 file without following
    symlinks; the open descriptor (read-write)."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write {path}: no directory {parent}")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileExistsError:
        raise OutputError(f"cannot write {path}: it appeared while ctracer was creating "
                          "it (another writer?)") from None
    except OSError as e:
        raise _explain(path, e) from None
    os.fchmod(fd, FILE_MODE)  # whatever the umask was
    return fd


def same_file(fd: int, path: str) -> bool:
    """``path`` names the regular file open at ``fd`` (not a symlink or a file swapped
    in since)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    mine = os.fstat(fd)
    return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def make_private_dir(path: str) -> str:
    """Create the directory ``path`` (and missing parents) 0700; an existing one is
    used as it is, unless it is a symlink or not a directory.  Returns ``path``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        try:
            with private_umask():
                os.makedirs(path, DIR_MODE)
        except FileExistsError:
            return make_private_dir(path)
        except OSError as e:
            raise _explain(path, e) from None
        return path
    except OSError as e:
        raise _explain(path, e) from None
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"cannot write into {path}: it is a symlink (give the real directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"cannot write into {path}: it exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write into {path}: permission denied")
    return path


#: where `private_temp_dir` lists what it makes, for a supervising process to remove
#: after a SIGKILL (which runs no cleanup); a file descriptor, or None
_leftovers_fd: Optional[int] = None


def private_temp_dir(prefix: str, parent: Optional[str] = None) -> str:
    """A new private directory (``tempfile.mkdtemp``) for scratch or staged files, which
    its user removes when done; listed for `remove_leftovers` too."""
    import tempfile

    with private_umask():
        path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    if _leftovers_fd is not None:
        os.write(_leftovers_fd, os.fsencode(path) + b"\0")
    return path


def list_leftovers() -> int:
    """From now on (in this process and the children it forks), `private_temp_dir`
    lists the directories it makes; the list's file descriptor, for
    `remove_leftovers`."""
    import tempfile

    global _leftovers_fd
    with tempfile.TemporaryFile() as f:
        _leftovers_fd = os.dup(f.fileno())
    return _leftovers_fd


def remove_leftovers(fd: int) -> None:
    """Remove every listed directory that still exists (those of a child killed before
    its own cleanup ran), and stop listing."""
    import shutil

    global _leftovers_fd
    listed = b""
    while True:
        chunk = os.pread(fd, 1 << 16, len(listed))
        if not chunk:
            break
        listed += chunk
    for path in filter(None, listed.split(b"\0")):
        shutil.rmtree(path, ignore_errors=True)
    os.close(fd)
    if _leftovers_fd == fd:
        _leftovers_fd = None


@contextlib.contextmanager
def staged_output(path: str) -> Iterator[str]:
    """Write ``path`` through a name in a private directory beside it: the caller (or a
    library it drives, such as DuckDB or pyarrow) writes the yielded path, then it is
    renamed into place (a rename replaces a symlink, never follows it), an existing
    ``path`` kept as ``path.old``.  Nothing is left behind on failure."""
    import shutil

    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) and not os.path.islink(path):
        raise OutputError(f"{path} is a directory: give a file name for the output")
    if not os.path.isdir(parent):
        raise OutputError(f"cannot write {path}: no directory {parent}")
    try:
        stage = private_temp_dir(".ctracer-", parent)
    except OSError as e:
        raise _explain(path, e) from None
    try:
        staged = os.path.join(stage, "out")
        with private_umask():
            yield staged
        if os.path.exists(staged):
            keep_old(path)
            os.rename(staged, path)
    except OSError as e:
        raise _explain(path, e) from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def check_marked_dir(path: str, marker: str, what: str) -> None:
    """Refuse, in one line, an output folder ctracer may not fill: ``path`` is a file, or
    a directory holding something without ``marker`` (the file saying ctracer wrote it,
    as ``what``, e.g. "ctracer report").  New, empty or marked folders pass."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{path} exists and is not a directory")
    if os.path.isdir(path) and os.listdir(path) and \
            not os.path.exists(os.path.join(path, marker)):
        raise OutputError(f"{path} exists and is not a {what}; choose another directory "
                          "with -o")


def write_marker(path: str, marker: str, lines: Iterable[str]) -> None:
    """Create the folder ``path`` if needed and write its ``marker`` file."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, marker), "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def marker_lines(path: str, marker: str) -> list[str]:
    """The lines of the ``marker`` file in ``path`` ([] when it cannot be read)."""
    try:
        with open(os.path.join(path, marker), encoding="utf-8") as f:
            return f.read(4096).splitlines()
    except (OSError, UnicodeDecodeError):
        return []


def let_go(f: Any) -> None:
    """Flush an output file just written and ask the kernel to start writing it to disk
    and forget its pages once they are there (``POSIX_FADV_DONTNEED``).  Under a memory
    limit the page cache of what a process writes counts as its memory, and a dirty
    page cannot be dropped until written back: a report of thousands of pages would
    otherwise hold hundreds of megabytes of them (see `ctracer.analysis.mapped`)."""
    f.flush()
    try:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):  # not on this system: the kernel decides
        pass


def let_go_of(path: str) -> None:
    """`let_go` for a file another library wrote at ``path``."""
    try:
        with open(path, "rb") as f:
            let_go(f)
    except OSError:
        pass
