"""Writing result files safely: check the destination before the work, write atomically after it.

:func:`check_output` runs before a command spends minutes simulating or measuring: it creates
the directory, proves it writable by creating and removing a file in it, and checks the free
space against the expected size; :func:`new_dirs_removed_on_failure` removes that directory again
when the command fails before writing anything there. :func:`atomic_output` then gives every writer a temporary path
beside the final one and renames it into place only when the writer finished, so a full disk,
a crash or Ctrl-C never leaves a cut or empty file under the final name (``os.replace`` is
atomic on POSIX within one file system); a write that fails is an :class:`OutputError` naming
the final file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from kvroute.traces.inputs import InputError

MARGIN_BYTES = 1 << 20
"""Free space required on top of a command's expected output size."""


class OutputError(InputError, OSError):
    """A result file could not be written (a full disk, a read-only or vanished directory): one
    line naming the file, e.g. ``cannot write t.jsonl: No space left on device``. Both a
    ValueError (an input error, as commands report them) and an OSError (as callers caught it
    before); ``strerror`` is the system's reason."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(f"cannot write {path}: {cause.strerror or cause}")
        self.message = f"cannot write {path}: {cause.strerror or cause}"
        self.strerror = cause.strerror or str(cause)
        self.errno = cause.errno

    def __str__(self) -> str:
        return self.message


def check_output(path: str | os.PathLike[str], expected_bytes: int = 0, flag: str = "--out",
                 is_dir: bool = False) -> None:
    """Fail now, not after the work, if ``path`` cannot be written.

    Args:
        path: the output file, or directory when ``is_dir``.
        expected_bytes: rough size of what will be written there.
        flag: the option that named ``path``, for the message.
        is_dir: ``path`` is a directory of outputs (created here if missing).

    Raises:
        InputError (a ValueError), one line naming ``flag`` and ``path``: the path exists with
            the wrong kind (a file where a directory is wanted or the reverse), its directory
            cannot be created or written, or has less free space than ``expected_bytes`` plus
            :data:`MARGIN_BYTES`.
    """
    path = Path(path)
    where = f"{flag} {path}"
    if is_dir and path.exists() and not path.is_dir():
        raise InputError("exists and is not a directory", where)
    if not is_dir and path.is_dir():
        raise InputError("is a directory; give a file name", where)
    directory = path if is_dir else path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".kvroute-probe-"):
            pass
    except OSError as exc:
        raise InputError(f"cannot write there: {exc.strerror or exc}", where) from None
    free = shutil.disk_usage(directory).free
    need = expected_bytes + MARGIN_BYTES
    if free < need:
        raise InputError(f"only {free / 2**20:.1f} MiB free, the output needs about {need / 2**20:.1f} MiB",
                         where)


@contextlib.contextmanager
def new_dirs_removed_on_failure(path: str | os.PathLike[str]) -> Iterator[None]:
    """Inside the block, remove on failure the directories of ``path`` that did not exist when it
    began (``path`` itself and missing parents, as :func:`check_output` makes them) and are empty.

    A command that fails before it writes anything (an unreachable server, a wrong model name, a
    bad option checked after :func:`check_output`) then leaves nothing it created behind, while a
    directory that existed before, or that holds any file (the rows of a run that failed midway),
    stays. Any exception counts as a failure, Ctrl-C and ``sys.exit`` too; it is raised again.
    """
    path = Path(path)
    new = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
    try:
        yield
    except BaseException:
        for directory in new:
            try:
                directory.rmdir()  # only an empty directory; a file in it keeps it and its parents
            except FileNotFoundError:
                continue
            except OSError:
                break
        raise


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` when the block succeeds.

    The temporary name keeps ``path``'s suffix, so writers that pick a format by suffix
    (pandas, matplotlib) behave the same. On an exception the temporary file is removed and
    ``path`` is left as it was (absent, or the previous complete file).

    Example::

        with atomic_output(out / "records.parquet") as tmp:
            frame.to_parquet(tmp)
    """
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}")
    except OSError as exc:
        raise OutputError(path, exc) from exc
    os.close(fd)
    tmp = Path(name)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600 would otherwise become the final file's mode
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError):  # the writer's (ENOSPC names no file) or the rename's
            raise OutputError(path, exc) from exc
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_output`."""
    with atomic_output(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
