"""roicore.adapters.native.build: the cache, the lock and the compiler of native libraries.

These tests build a tiny stand-alone C++ library (no framework) into a temporary cache;
the TensorFlow and Paddle op libraries are tested with their adapters.  A wrapper script
set as CXX counts the compiler's runs, so "compiled once" is observed from outside the
processes that build.
"""
import ctypes
import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from roicore.adapters.native import build

SOURCE = 'extern "C" int roicore_standin(void) { return %d; }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ROICORE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def counting_cxx(tmp_path, monkeypatch):
    """CXX set to a script that appends a line to a file on every compile (not on
    --version), then runs the real compiler; returns a function giving the count."""
    real = build.find_compiler()
    runs = tmp_path / "runs"
    script = tmp_path / "cxx"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        [ "$1" = "--version" ] || echo run >> {runs}
        exec {' '.join(real)} "$@"
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(script))
    return lambda: len(runs.read_text().splitlines()) if runs.exists() else 0


def standin(tmp_path, value=42, name="src.cc"):
    src = tmp_path / name
    src.write_text(SOURCE % value)
    return src


def build_standin(src, **kw):
    return build.build_shared_library("standin", [src], key={"framework": "none"},
                                      purpose="the stand-in library", **kw)


def call(path):
    return ctypes.CDLL(str(path)).roicore_standin()


def test_builds_once_and_reuses_the_cached_library(tmp_path, cache, counting_cxx):
    src = standin(tmp_path)
    path = build_standin(src)
    assert path.parent.parent == cache and path.name == "libstandin" + build.LIBRARY_SUFFIX
    assert call(path) == 42 and counting_cxx() == 1
    assert build_standin(src) == path and counting_cxx() == 1
    assert (path.parent / "key.json").exists() and "exit status 0" in (
        path.parent / "build.log").read_text()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp-")]


def test_a_changed_source_key_or_flag_builds_afresh(tmp_path, cache, counting_cxx):
    src = standin(tmp_path)
    first = build_standin(src)
    src.write_text(SOURCE % 7)
    second = build_standin(src)
    assert second != first and call(second) == 7
    third = build.build_shared_library("standin", [src], key={"framework": "other"})
    fourth = build_standin(src, compile_args=["-DUNUSED=1"])
    assert len({first, second, third, fourth}) == 4 and counting_cxx() == 4
    assert call(first) == 42  # the earlier build is still there, untouched


def test_concurrent_processes_compile_once(tmp_path, cache, counting_cxx):
    src = standin(tmp_path)
    script = textwrap.dedent(f"""
        from roicore.adapters.native import build
        print(build.build_shared_library("standin", [{str(src)!r}], key={{"framework": "none"}}))
        """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and counting_cxx() == 1
    assert call(paths.pop()) == 42
    # the one process that compiled says so, in one line; the others are quiet
    notices = [err.count("roicore: compiling native library standin") for _, err in outs]
    assert sorted(notices) == [0, 0, 0, 1], [err for _, err in outs]


def test_no_compiler_is_a_clear_error(tmp_path, cache, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no compiler on it
    with pytest.raises(build.NativeBuildError, match=r"needs a C\+\+ compiler to build the "
                       r"stand-in library, and found none: CXX is not set and none of c\+\+, "
                       r"g\+\+, clang\+\+ is on PATH"):
        build_standin(standin(tmp_path))
    monkeypatch.setenv("CXX", "no-such-compiler --flag")
    with pytest.raises(build.NativeBuildError, match=r"CXX='no-such-compiler --flag' names no "
                                                      "program"):
        build_standin(standin(tmp_path))


def test_a_failing_compile_quotes_the_compiler_and_leaves_no_library(tmp_path, cache):
    src = tmp_path / "broken.cc"
    src.write_text("int roicore_standin( { return 1; }\n")
    with pytest.raises(build.NativeBuildError) as info:
        build_standin(src)
    message = str(info.value)
    assert "could not compile the stand-in library" in message
    assert "broken.cc" in message and "error" in message  # the compiler's own diagnostic
    assert "full log:" in message
    directory = next(cache.iterdir())
    assert not [p.name for p in directory.iterdir() if p.suffix == build.LIBRARY_SUFFIX]
    # fixing the source builds it
    src.write_text(SOURCE % 3)
    assert call(build_standin(src)) == 3


def test_cache_root_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ROICORE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_root() == tmp_path / "xdg" / "roicore"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build.cache_root() == tmp_path / "home" / ".cache" / "roicore"
    monkeypatch.setenv("ROICORE_CACHE_DIR", str(tmp_path / "mine"))
    assert build.cache_root() == tmp_path / "mine"


def test_the_lock_excludes_other_processes(tmp_path):
    """While one process holds a directory's lock, another waits for it: the child says when
    it is about to take the lock, the parent keeps it a second longer, and the child's wait
    covers that second (its start-up and imports are not counted)."""
    script = textwrap.dedent(f"""
        import time
        from roicore.adapters.native import build
        print("ready", flush=True)
        start = time.monotonic()
        with build.locked({str(tmp_path)!r}):
            print(time.monotonic() - start, flush=True)
        """)
    with build.locked(tmp_path):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and float(out) > 0.9, out


def test_importing_the_builder_imports_no_framework():
    code = ("import sys; import roicore.adapters.native.build; "
            "print(sorted(m for m in ('tensorflow', 'paddle', 'mxnet', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ}, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------
# a cache to trust

def test_a_directory_others_may_write_is_refused(tmp_path, cache):
    src = standin(tmp_path)
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    with pytest.raises(build.NativeBuildError, match=r"will not use the cache directory .*: "
                                                      r"others may write it \(mode 777\)"):
        build_standin(src)
    cache.chmod(0o755)
    path = build_standin(src)
    path.parent.chmod(0o775)
    with pytest.raises(build.NativeBuildError, match=r"the build directory .* others may write"):
        build_standin(src)
    path.parent.chmod(0o755)
    path.chmod(0o666)
    with pytest.raises(build.NativeBuildError, match=r"the library .* others may write"):
        build_standin(src)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="giving a file to another user needs root")
def test_a_library_of_another_user_is_refused(tmp_path, cache):
    src = standin(tmp_path)
    path = build_standin(src)
    os.chown(path, 12345, -1)
    with pytest.raises(build.NativeBuildError, match=r"the library .* belongs to user id 12345, "
                                                      r"not to this user"):
        build_standin(src)
    os.chown(path.parent.parent, 12345, -1)
    with pytest.raises(build.NativeBuildError, match=r"the cache directory .* belongs to user "
                                                      r"id 12345"):
        build_standin(src)


@pytest.mark.parametrize("damage", ["truncated", "replaced", "no record"])
def test_a_damaged_library_is_rebuilt_not_loaded(tmp_path, cache, counting_cxx, damage):
    """A library that does not match the size and SHA-256 recorded after its build (cut
    short, replaced, or its build killed before the record) is built again; loading the
    damaged one would kill the process (SIGBUS) or run someone else's code."""
    src = standin(tmp_path)
    path = build_standin(src)
    if damage == "truncated":
        with open(path, "r+b") as f:
            f.truncate(4096)
    elif damage == "replaced":
        other = build.build_shared_library("standin", [standin(tmp_path, 9, "other.cc")],
                                           key={"framework": "elsewhere"})
        path.write_bytes(other.read_bytes())
    else:
        (path.parent / "library.json").unlink()
    assert build_standin(src) == path and counting_cxx() == (3 if damage == "replaced" else 2)
    assert call(path) == 42


def test_temporaries_of_dead_builds_are_removed(tmp_path, cache, counting_cxx):
    """A build killed mid-way (SIGKILL) leaves its temporary files; the next build removes
    those of processes that no longer run, and keeps a running one's."""
    src = standin(tmp_path)
    path = build_standin(src)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    stale = path.parent / f".tmp-{dead}-abc.so"
    stale.write_bytes(b"")
    (path.parent / f".tmp-{dead}-build").mkdir()
    running = path.parent / f".tmp-{os.getppid()}-def.so"
    running.write_bytes(b"")
    path.unlink()
    build_standin(src)
    assert not stale.exists() and not (path.parent / f".tmp-{dead}-build").exists()
    assert running.exists()


def test_the_key_covers_the_compiler_command_and_its_environment(tmp_path, cache, monkeypatch):
    """g++, g++ -fsanitize=address and g++ -D_GLIBCXX_USE_CXX11_ABI=0 made one key, and so
    did different include and library paths: a sanitizer build was then loaded by a plain
    process, which died."""
    src = standin(tmp_path)
    real = build.find_compiler()
    paths = {build_standin(src)}
    monkeypatch.setenv("CXX", " ".join([*real, "-D_GLIBCXX_USE_CXX11_ABI=0", "-O0"]))
    paths.add(build_standin(src))
    monkeypatch.setenv("CXX", " ".join(real))
    for variable in ("CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "CXXFLAGS"):
        monkeypatch.setenv(variable, str(tmp_path))
        paths.add(build_standin(src))
    assert len(paths) == 5


def test_a_compiler_that_never_returns_is_stopped(tmp_path, cache, monkeypatch):
    real = build.find_compiler()
    script = tmp_path / "hanging-cxx"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        [ "$1" = "--version" ] && exec {' '.join(real)} --version
        echo $$ > {tmp_path / 'pid'}
        exec sleep 600
        """))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CXX", str(script))
    monkeypatch.setenv("ROICORE_BUILD_TIMEOUT", "2")
    start = time.monotonic()
    with pytest.raises(build.NativeBuildError, match=r"stopped the build of the stand-in "
                                                      r"library after 2 s \(ROICORE_BUILD_TIMEOUT"):
        build_standin(standin(tmp_path))
    assert time.monotonic() - start < 30
    pid = int((tmp_path / "pid").read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):  # the compiler was killed, not left running
        os.kill(pid, 0)
    monkeypatch.setenv("ROICORE_BUILD_TIMEOUT", "soon")
    with pytest.raises(build.NativeBuildError, match=r"ROICORE_BUILD_TIMEOUT must be a number "
                                                      r"of seconds > 0, got 'soon'"):
        build_standin(standin(tmp_path))


def test_waiting_for_the_lock_gives_up(tmp_path):
    script = textwrap.dedent(f"""
        import os
        os.environ["ROICORE_LOCK_TIMEOUT"] = "1"
        from roicore.adapters.native import build
        try:
            with build.locked({str(tmp_path)!r}):
                print("locked")
        except build.NativeBuildError as e:
            print(e)
        """)
    with build.locked(tmp_path):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=60).stdout
    assert out.startswith(f"roicore waited 1 s for another process's build in {tmp_path} "
                          "and gave up (ROICORE_LOCK_TIMEOUT sets the wait)"), out


@pytest.mark.parametrize("value, off", [("0", True), ("false", True), ("OFF", True),
                                        ("no", True), (" 0 ", True), ("1", False),
                                        ("", False), ("on", False)])
def test_every_switch_reads_the_same(value, off, monkeypatch):
    """ROICORE_TF_NATIVE took only "0", ROICORE_NATIVE_OPS also "false" and "off"."""
    from roicore.adapters import _common
    monkeypatch.setenv("ROICORE_TF_NATIVE", value)
    assert _common.switched_off("ROICORE_TF_NATIVE") is off
