"""Compiling native operator libraries on the user's machine, once.

An operator library must be compiled against the headers and C++ ABI of the framework
that loads it, so it cannot ship prebuilt beside a framework-agnostic package: roicore
compiles it the first time it is needed, into a per-user cache, and reuses it from then
on.  A build lives in a directory named after a digest of everything the binary depends
on (the caller's key, typically the framework's version and ABI flags, plus the
compiler, the flags and the contents of every source and dependency), so upgrading any
of them builds afresh instead of loading a stale binary.

This module is the framework-free half: where the cache is, a lock so that concurrent
processes compile once, finding the compiler, and running it.

Environment:
  ROICORE_CACHE_DIR  the cache root (default: $XDG_CACHE_HOME/roicore, else ~/.cache/roicore)
  CXX                the C++ compiler, with any leading arguments (default: the first of
                     c++, g++ and clang++ on PATH)
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pathlib
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Iterable, Mapping, Sequence

__all__ = ["NativeBuildError", "cache_root", "build_directory", "locked", "find_compiler",
           "compiler_version", "file_digest", "build_shared_library", "share_runtime"]

log = logging.getLogger("roicore.native")

COMPILERS = ("c++", "g++", "clang++")
LIBRARY_SUFFIX = ".dll" if sys.platform == "win32" else ".so"
_LOG_TAIL = 4000  # characters of compiler output quoted in an error
_ERROR_LINES = 20


class NativeBuildError(RuntimeError):
    """A native library could not be built: no compiler, or the compiler failed."""


def cache_root() -> pathlib.Path:
    """The directory that holds every build: ``ROICORE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/roicore``, else ``~/.cache/roicore``."""
    root = os.environ.get("ROICORE_CACHE_DIR")
    if root:
        return pathlib.Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "roicore"


def _digest(key: Mapping[str, object]) -> str:
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_directory(name: str, key: Mapping[str, object]) -> pathlib.Path:
    """The cache directory of build ``name`` for ``key`` (JSON-serialisable), created if
    needed; ``key.json`` inside records the key for whoever looks at the cache."""
    directory = cache_root() / f"{name}-{_digest(key)}"
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / "key.json"
    if not record.exists():
        _write_atomically(record, json.dumps(key, sort_keys=True, indent=1, default=str))
    return directory


def _write_atomically(path: pathlib.Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(directory: pathlib.Path):
    """Hold an exclusive lock on ``directory`` (a ``.lock`` file in it) for the block.

    Processes building the same key wait for each other, so the first one compiles and
    the others find its result.  The operating system drops the lock of a process that
    dies, so a crashed build never leaves the cache locked.
    """
    with open(pathlib.Path(directory) / ".lock", "a+b") as f:
        _lock_file(f)
        try:
            yield
        finally:
            _unlock_file(f)


if os.name == "nt":  # pragma: no cover - Windows
    import msvcrt

    def _lock_file(f):
        while True:
            try:  # LK_LOCK itself gives up after 10 one-second tries
                msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
                return
            except OSError:
                continue

    def _unlock_file(f):
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock_file(f):
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)

    def _unlock_file(f):
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def find_compiler(purpose: str = "a native library") -> list[str]:
    """The C++ compiler command: ``CXX`` (split as a shell would), else the first of
    c++, g++ and clang++ on PATH.  Raises :class:`NativeBuildError` naming what was
    looked for when there is none."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        cmd = shlex.split(cxx)
        if shutil.which(cmd[0]) is None:
            raise NativeBuildError(
                f"roicore needs a C++ compiler to build {purpose}, but CXX={cxx!r} names no "
                "program that can be run; set CXX to a C++ compiler (g++ or clang++) or unset it")
        return cmd
    for name in COMPILERS:
        path = shutil.which(name)
        if path:
            return [path]
    raise NativeBuildError(
        f"roicore needs a C++ compiler to build {purpose}, and found none: CXX is not set "
        f"and none of {', '.join(COMPILERS)} is on PATH. Install one (Debian/Ubuntu: "
        "apt-get install g++; Fedora: dnf install gcc-c++; conda: conda install gxx) or set "
        "CXX to one")


def compiler_version(cmd: Sequence[str]) -> str:
    """The first line of ``cmd --version`` (part of every build key: another compiler,
    or another version of it, builds afresh)."""
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(
            f"the C++ compiler {shlex.join(cmd)} could not be run: {exc}") from exc
    lines = (out.stdout or out.stderr).strip().splitlines()
    if out.returncode != 0 or not lines:
        raise NativeBuildError(
            f"the C++ compiler {shlex.join(cmd)} does not run: '--version' exited with "
            f"{out.returncode}: {out.stderr[-_LOG_TAIL:]}")
    return lines[0]


def file_digest(paths: Iterable[os.PathLike | str]) -> str:
    """SHA-256 over the names and contents of ``paths``, in the order given."""
    h = hashlib.sha256()
    for p in paths:
        p = pathlib.Path(p)
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def build_shared_library(name: str, sources: Sequence[os.PathLike | str], *,
                         key: Mapping[str, object], compile_args: Sequence[str] = (),
                         link_args: Sequence[str] = (),
                         depends: Sequence[os.PathLike | str] = (),
                         purpose: str | None = None) -> pathlib.Path:
    """Compile and link ``sources`` into shared library ``name`` in the cache, once.

    Args:
      name: the library's base name (the file is ``lib<name>.so``) and the cache
        directory's prefix.
      sources: C++ files to compile and link, in one compiler call.
      key: what the binary depends on besides its inputs (framework version, ABI flags,
        roicore's version); the compiler's version, the flags and the contents of
        ``sources`` and ``depends`` are added to it.
      compile_args: flags before the sources (include dirs, -std, -D).
      link_args: flags after the sources (-L, -l, libraries).
      depends: headers and libraries the build reads (hashed into the key, not compiled).
      purpose: what is being built, for messages ("roicore's TensorFlow op library").

    Returns the library's path.  A library already in the cache is returned at once;
    otherwise the first process to take the directory's lock compiles it into a
    temporary file and renames it into place, so no process ever loads a half-written
    file.  Raises :class:`NativeBuildError` when there is no compiler or it fails (the
    message quotes the command and the end of the compiler's output).
    """
    purpose = purpose or f"native library {name}"
    cxx = find_compiler(purpose)
    sources = [pathlib.Path(s).resolve() for s in sources]
    full_key = {
        **key,
        "compiler": compiler_version(cxx),
        "compile_args": list(compile_args),
        "link_args": list(link_args),
        "inputs": file_digest([*sources, *depends]),
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    directory = build_directory(name, full_key)
    target = directory / f"lib{name}{LIBRARY_SUFFIX}"
    if target.exists():
        return target
    with locked(directory):
        if target.exists():  # built by the process that held the lock before us
            return target
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=LIBRARY_SUFFIX)
        os.close(fd)
        cmd = [*cxx, "-shared", "-fPIC", "-O2", *compile_args, *map(str, sources), "-o", tmp,
               *link_args]
        log.info("compiling %s into %s (once for this key)", purpose, directory)
        try:
            _compile(cmd, directory / "build.log", purpose)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


def _compile(cmd: list[str], log_path: pathlib.Path, purpose: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise NativeBuildError(f"roicore could not run the C++ compiler to build {purpose}: "
                               f"{exc} (command: {shlex.join(cmd)})") from exc
    _write_atomically(log_path, f"$ {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}"
                                f"exit status {proc.returncode}\n")
    if proc.returncode != 0:
        raise NativeBuildError(
            f"roicore could not compile {purpose}: the compiler exited with status "
            f"{proc.returncode}.\ncommand: {shlex.join(cmd)}\n"
            f"{_diagnostics(proc.stdout + proc.stderr)}\n(full log: {log_path})")


def _diagnostics(output: str) -> str:
    """The compiler's error lines (warnings about the framework's own headers can run to
    thousands of lines before them), else the end of its output."""
    errors = [line for line in output.splitlines() if "error" in line.lower()
              and ("error:" in line or "Error" in line or "undefined reference" in line)]
    text = "\n".join(errors[:_ERROR_LINES]) if errors else output.strip()
    return text[-_LOG_TAIL:]


def share_runtime(path: os.PathLike | str) -> bool:
    """Point the copy of roicore's C library inside the loaded native library ``path`` at
    roicore.core's runtime (roicore.h: roicore_runtime_share), so that the memory limit,
    the scratch cache and its release, and Ctrl-C act on it too.  False when the library
    cannot share it (one built by an older roicore has no roicore_native_share_runtime);
    it then keeps settings of its own."""
    import ctypes

    from roicore import core
    try:
        # the library is loaded already: dlopen hands back the same handle
        share = ctypes.CDLL(str(path)).roicore_native_share_runtime
    except (OSError, AttributeError):
        return False
    share.argtypes, share.restype = [ctypes.c_void_p], ctypes.c_int
    return share(core.get_runtime()) == 0
