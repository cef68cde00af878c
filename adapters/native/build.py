"""Compiling native operator libraries on the user's machine, once.

An operator library must be compiled against the headers and C++ ABI of the framework
that loads it, so it cannot ship prebuilt beside a framework-agnostic package: roicore
compiles it the first time it is needed, into a per-user cache, and reuses it from then
on.  A build lives in a directory named after a digest of everything the binary depends
on (the caller's key, typically the framework's version and ABI flags, plus the full
compiler command and version, the flags, the compiler's environment and the contents of
every source and dependency), so changing any of them builds afresh instead of loading a
stale binary.

A cache is code that will run in the user's processes, so it is trusted as pip and
ccache trust theirs, and no further: its directories and files must belong to the user
and be writable by nobody else (otherwise they are refused, naming the path); a library
is loaded only when its size and SHA-256 match the record written after its build
completed, and a bad one is rebuilt; the compiler runs under a timeout, and so does the
wait for another process's build; temporary files of builds that died are removed.

This module is the framework-free half: where the cache is, a lock so that concurrent
processes compile once, finding and running the compiler, and verifying what is loaded.

Environment:
  ROICORE_CACHE_DIR      the cache root (default: $XDG_CACHE_HOME/roicore, else
                         ~/.cache/roicore)
  CXX                    the C++ compiler, with any leading arguments (default: the first
                         of c++, g++ and clang++ on PATH)
  ROICORE_BUILD_TIMEOUT  seconds a build may take before it is stopped (default 1200)
  ROICORE_LOCK_TIMEOUT   seconds to wait for another process's build of the same library
                         (default: the build timeout and one minute more)
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
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, Mapping, Sequence

__all__ = ["NativeBuildError", "cache_root", "build_directory", "locked", "find_compiler",
           "compiler_version", "compiler_key", "file_digest", "cached_library", "run_build",
           "build_shared_library", "share_runtime", "temporary_prefix", "BUILD_ENVIRONMENT"]

log = logging.getLogger("roicore.native")

COMPILERS = ("c++", "g++", "clang++")
LIBRARY_SUFFIX = ".dll" if sys.platform == "win32" else ".so"
# The environment variables that change what a compiler or setuptools builds: part of
# every key, so that a build under other include paths or flags is a build of its own.
BUILD_ENVIRONMENT = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH",
                     "COMPILER_PATH", "GCC_EXEC_PREFIX", "CFLAGS", "CXXFLAGS", "CPPFLAGS",
                     "LDFLAGS", "SDKROOT")
_RECORD = "library.json"  # the finished library's size and SHA-256
_TEMPORARY = ".tmp-"      # + the builder's pid: files and directories a build is writing
_LOG_TAIL = 4000          # characters of compiler output quoted in an error
_ERROR_LINES = 20
_DEFAULT_BUILD_TIMEOUT = 1200.0


class NativeBuildError(RuntimeError):
    """A native library could not be built or used: no compiler, a failed or timed-out
    build, a cache that is not the user's own."""


def cache_root() -> pathlib.Path:
    """The directory that holds every build: ``ROICORE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/roicore``, else ``~/.cache/roicore``."""
    root = os.environ.get("ROICORE_CACHE_DIR")
    if root:
        return pathlib.Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg).expanduser() if xdg else pathlib.Path.home() / ".cache"
    return base / "roicore"


def _seconds(variable: str, default: float) -> float:
    value = os.environ.get(variable, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise NativeBuildError(f"{variable} must be a number of seconds > 0, got {value!r}")
    return seconds


def build_timeout() -> float:
    """``ROICORE_BUILD_TIMEOUT`` seconds (default 1200)."""
    return _seconds("ROICORE_BUILD_TIMEOUT", _DEFAULT_BUILD_TIMEOUT)


def lock_timeout() -> float:
    """``ROICORE_LOCK_TIMEOUT`` seconds (default: the build timeout plus a minute)."""
    return _seconds("ROICORE_LOCK_TIMEOUT", build_timeout() + 60.0)


# ---------------------------------------------------------------------------------------
# trust: the cache is the user's own

def _check_owned(path: pathlib.Path, what: str) -> None:
    """Refuse ``path`` unless it belongs to this user and no one else may write it."""
    if not hasattr(os, "getuid"):  # pragma: no cover - Windows: per-user profile directories
        return
    st = path.stat()
    problems = []
    if st.st_uid != os.getuid():
        problems.append(f"it belongs to user id {st.st_uid}, not to this user ({os.getuid()})")
    if st.st_mode & 0o022:
        problems.append(f"others may write it (mode {st.st_mode & 0o777:o})")
    if problems:
        raise NativeBuildError(
            f"roicore will not use {what} {path}: {' and '.join(problems)}, so code placed "
            "there by someone else could run in this process. Use a directory of your own "
            "(ROICORE_CACHE_DIR), or fix its owner and mode (chmod go-w)")


def _private_directory(path: pathlib.Path, what: str) -> pathlib.Path:
    """``path`` created (this user's, mode 700) if needed, and checked to be the user's."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_owned(path, what)
    return path


def _digest(key: Mapping[str, object]) -> str:
    text = json.dumps(key, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_directory(name: str, key: Mapping[str, object]) -> pathlib.Path:
    """The cache directory of build ``name`` for ``key`` (JSON-serialisable), created if
    needed and checked to be the user's own, as is the cache root; ``key.json`` inside
    records the key for whoever looks at the cache."""
    root = _private_directory(cache_root(), "the cache directory")
    directory = _private_directory(root / f"{name}-{_digest(key)}", "the build directory")
    record = directory / "key.json"
    if not record.exists():
        _write_atomically(record, json.dumps(key, sort_keys=True, indent=1, default=str))
    return directory


def temporary_prefix() -> str:
    """The prefix of this process's temporary files: stale once the process is gone."""
    return f"{_TEMPORARY}{os.getpid()}-"


def _write_atomically(path: pathlib.Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=temporary_prefix())
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _remove_stale_temporaries(directory: pathlib.Path) -> None:
    """Files and directories that builds of processes no longer running left behind (a
    build killed mid-way); the caller holds the lock."""
    for entry in directory.iterdir():
        if not entry.name.startswith(_TEMPORARY):
            continue
        pid = entry.name[len(_TEMPORARY):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            log.info("removing %s, left by a build that did not finish", entry)
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------
# the lock

@contextlib.contextmanager
def locked(directory: pathlib.Path, timeout: float | None = None):
    """Hold an exclusive lock on ``directory`` (a ``.lock`` file in it) for the block.

    Processes building the same key wait for each other, so the first one compiles and
    the others find its result; the wait gives up after ``timeout`` seconds (default
    :func:`lock_timeout`) with a NativeBuildError naming the directory.  The operating
    system drops the lock of a process that dies, so a crashed build never leaves the
    cache locked.
    """
    timeout = lock_timeout() if timeout is None else timeout
    with open(pathlib.Path(directory) / ".lock", "a+b") as f:
        deadline = time.monotonic() + timeout
        while not _try_lock(f):
            if time.monotonic() >= deadline:
                raise NativeBuildError(
                    f"roicore waited {timeout:g} s for another process's build in {directory} "
                    "and gave up (ROICORE_LOCK_TIMEOUT sets the wait); if no build is running, "
                    "a stuck process holds the lock: end it, or delete the directory")
            time.sleep(0.05)
        try:
            yield
        finally:
            _unlock_file(f)


if os.name == "nt":  # pragma: no cover - Windows
    import msvcrt

    def _try_lock(f):
        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock_file(f):
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _try_lock(f):
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock_file(f):
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------
# the compiler

def find_compiler(purpose: str = "a native library") -> list[str]:
    """The C++ compiler command: ``CXX`` (split as a shell would), else the first of
    c++, g++ and clang++ on PATH.  Raises :class:`NativeBuildError` naming what was
    looked for when there is none."""
    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        cmd = shlex.split(cxx)
        path = shutil.which(cmd[0])
        if path is None:
            raise NativeBuildError(
                f"roicore needs a C++ compiler to build {purpose}, but CXX={cxx!r} names no "
                "program that can be run; set CXX to a C++ compiler (g++ or clang++) or unset it")
        return [path, *cmd[1:]]
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
    """The first line of ``cmd --version``."""
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


def compiler_key(cmd: Sequence[str]) -> dict:
    """What of the compiler a build depends on, for its key: the whole command (its path
    and any arguments in CXX, such as -fsanitize=address), its version and the
    environment variables that change what it builds (BUILD_ENVIRONMENT)."""
    return {"compiler_command": list(cmd), "compiler": compiler_version(cmd),
            "environment": {v: os.environ[v] for v in BUILD_ENVIRONMENT if v in os.environ}}


def file_digest(paths: Iterable[os.PathLike | str]) -> str:
    """SHA-256 over the names and contents of ``paths``, in the order given."""
    h = hashlib.sha256()
    for p in paths:
        p = pathlib.Path(p)
        h.update(p.name.encode() + b"\0")
        h.update(p.read_bytes())
    return h.hexdigest()


def run_build(cmd: Sequence[str], log_path: pathlib.Path, purpose: str, *,
              cwd: os.PathLike | str | None = None, env: Mapping[str, str] | None = None,
              ok: Callable[[], bool] = lambda: True) -> None:
    """Run build command ``cmd`` (a compiler, or Python running a setup script) within
    :func:`build_timeout`, its output written to ``log_path``; a NativeBuildError quoting
    the command and the compiler's errors when it fails, times out (its whole process
    group is killed) or ``ok()`` is false afterwards."""
    timeout = build_timeout()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=None if env is None else dict(env),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=os.name != "nt")
    except OSError as exc:
        raise NativeBuildError(f"roicore could not run the build of {purpose}: {exc} "
                               f"(command: {shlex.join(cmd)})") from exc
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        output, _ = proc.communicate()
        _write_atomically(log_path, f"$ {shlex.join(cmd)}\n{output}timed out after "
                                    f"{timeout:g} s\n")
        raise NativeBuildError(
            f"roicore stopped the build of {purpose} after {timeout:g} s "
            f"(ROICORE_BUILD_TIMEOUT sets the limit).\ncommand: {shlex.join(cmd)}\n"
            f"(full log: {log_path})") from None
    _write_atomically(log_path, f"$ {shlex.join(cmd)}\n{output}exit status {proc.returncode}\n")
    if proc.returncode != 0 or not ok():
        raise NativeBuildError(
            f"roicore could not compile {purpose}: the build exited with status "
            f"{proc.returncode}.\ncommand: {shlex.join(cmd)}\n"
            f"{_diagnostics(output)}\n(full log: {log_path})")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        if os.name != "nt":
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # pragma: no cover
            proc.kill()
    except ProcessLookupError:
        pass


def _diagnostics(output: str) -> str:
    """The compiler's error lines (warnings about the framework's own headers can run to
    thousands of lines before them), else the end of its output."""
    errors = [line for line in output.splitlines() if "error" in line.lower()
              and ("error:" in line or "Error" in line or "undefined reference" in line)]
    text = "\n".join(errors[:_ERROR_LINES]) if errors else output.strip()
    return text[-_LOG_TAIL:]


# ---------------------------------------------------------------------------------------
# the cached library

def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _verified(target: pathlib.Path) -> bool:
    """Whether ``target`` is the library its build finished: the user's own, and of the
    size and SHA-256 recorded after the build (a truncated or replaced file is not)."""
    record_path = target.parent / _RECORD
    if not target.exists() or not record_path.exists():
        return False
    _check_owned(target, "the library")
    _check_owned(record_path, "the library's record")
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return False
    return (record.get("file") == target.name and record.get("bytes") == target.stat().st_size
            and record.get("sha256") == _sha256(target))


def cached_library(name: str, key: Mapping[str, object], filename: str,
                   produce: Callable[[pathlib.Path, pathlib.Path], None],
                   purpose: str) -> pathlib.Path:
    """The verified library ``filename`` of build ``name`` for ``key``, produced first
    when the cache has none, or a bad one.

    ``produce(path, log_path)`` writes the library to ``path`` (a temporary name in the
    build directory) and its build log to ``log_path``, raising NativeBuildError when it
    cannot.  The first process to take the directory's lock builds; the library is
    renamed into place and its size and SHA-256 recorded only once it is complete, so no
    process loads a half-written file, and one that does not match its record (a crash
    between the two, a truncated or replaced file) is built again.
    """
    directory = build_directory(name, key)
    target = directory / filename
    if _verified(target):
        return target
    with locked(directory):
        if _verified(target):  # built by the process that held the lock before us
            return target
        _remove_stale_temporaries(directory)
        if target.exists():
            log.warning("rebuilding %s: %s does not match the record of its build", purpose,
                        target)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=temporary_prefix(),
                                   suffix=LIBRARY_SUFFIX)
        os.close(fd)
        log.info("compiling %s into %s (once for this key)", purpose, directory)
        # one line, so that a first import or call that pauses to compile says why
        print(f"roicore: compiling {purpose} (once per machine and framework version)",
              file=sys.stderr, flush=True)
        try:
            produce(pathlib.Path(tmp), directory / "build.log")
            record = {"file": target.name, "bytes": os.path.getsize(tmp),
                      "sha256": _sha256(pathlib.Path(tmp))}
            os.replace(tmp, target)
            _write_atomically(directory / _RECORD, json.dumps(record, indent=1))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return target


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
        roicore's version); the compiler (:func:`compiler_key`), the flags and the
        contents of ``sources`` and ``depends`` are added to it.
      compile_args: flags before the sources (include dirs, -std, -D).
      link_args: flags after the sources (-L, -l, libraries).
      depends: headers and libraries the build reads (hashed into the key, not compiled).
      purpose: what is being built, for messages ("roicore's TensorFlow op library").

    Returns the library's path (see :func:`cached_library`).  Raises
    :class:`NativeBuildError` when there is no compiler, it fails or times out (the
    message quotes the command and the end of the compiler's output), or the cache is
    not the user's own.
    """
    purpose = purpose or f"native library {name}"
    cxx = find_compiler(purpose)
    sources = [pathlib.Path(s).resolve() for s in sources]
    full_key = {
        **key,
        **compiler_key(cxx),
        "compile_args": list(compile_args),
        "link_args": list(link_args),
        "inputs": file_digest([*sources, *depends]),
        "platform": f"{sys.platform}-{platform.machine()}",
    }

    def produce(path, log_path):
        run_build([*cxx, "-shared", "-fPIC", "-O2", *compile_args, *map(str, sources),
                   "-o", str(path), *link_args], log_path, purpose)

    return cached_library(name, full_key, f"lib{name}{LIBRARY_SUFFIX}", produce, purpose)


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
