"""Worker processes: one framework per process, pickled messages over a private pipe.

The parent starts ``python -m roicore.cli._worker KIND FRAMEWORK``.  The worker moves its
own stdout onto stderr (frameworks print to stdout) and keeps a duplicate of the original
stdout as its message channel; the parent writes requests to the worker's stdin.  Each
message is a pickled object preceded by its length (8 bytes, big endian), so a worker can
serve several requests (the benchmark keeps its workers alive for interleaved rounds).

Worker stderr is read by a thread: lines starting with ``@progress`` are shown on the
parent's stderr, the rest is kept (last lines only) to explain a crash.
"""
from __future__ import annotations

import collections
import os
import pickle
import struct
import subprocess
import sys
import threading

PROGRESS = "@progress "

# Frameworks log a lot through these; keep workers quiet (their stderr is kept only for errors).
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "GLOG_minloglevel": "3", "GLOG_v": "0",
             "FLAGS_call_stack_level": "0", "MXNET_STORAGE_FALLBACK_LOG_VERBOSE": "0",
             "KMP_WARNINGS": "0", "PYTHONWARNINGS": "ignore"}

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
              "MXNET_CPU_WORKER_NTHREADS", "MXNET_OMP_MAX_THREADS", "TF_NUM_INTRAOP_THREADS")


def send(stream, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack(">Q", len(data)))
    stream.write(data)
    stream.flush()


def recv(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError("worker closed its channel")
    (n,) = struct.unpack(">Q", head)
    data = stream.read(n)
    if len(data) < n:
        raise EOFError("worker closed its channel mid-message")
    return pickle.loads(data)


class WorkerDied(RuntimeError):
    pass


class Worker:
    """A framework worker process.  ``request(obj)`` sends one message, returns the reply."""

    def __init__(self, kind, framework, threads=None, label=None, quiet_progress=False,
                 env_defaults=None):
        self.framework = framework
        self.label = label or framework
        env = dict(env_defaults or {})
        env.update(os.environ)
        env.update(QUIET_ENV)
        if threads:
            for k in THREAD_ENV:
                env[k] = str(threads)
            # Idle workers must not spin: with every contender alive in its own process, a
            # spinning OpenMP pool would steal the cores of the one being timed.
            env["OMP_WAIT_POLICY"] = "PASSIVE"
            env["KMP_BLOCKTIME"] = "0"
        self.quiet_progress = quiet_progress
        self.tail = collections.deque(maxlen=60)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "roicore.cli._worker", kind, framework],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self._err_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._err_thread.start()

    def _read_stderr(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(PROGRESS):
                if not self.quiet_progress:
                    print(f"[{self.label}] {line[len(PROGRESS):]}", file=sys.stderr, flush=True)
            else:
                self.tail.append(line)

    def request(self, obj):
        try:
            send(self.proc.stdin, obj)
            return recv(self.proc.stdout)
        except (EOFError, BrokenPipeError, OSError) as exc:
            code = self.proc.wait()
            self._err_thread.join(timeout=2)
            tail = "\n".join(list(self.tail)[-15:])
            raise WorkerDied(f"{self.framework} worker died (exit code {code}): {exc}\n{tail}") from None

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._err_thread.join(timeout=2)


# ----------------------------------------------------------------------------- worker side
def serve(handler):
    """Worker main loop: the process's stdout becomes a private channel, fd 1 goes to stderr."""
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    while True:
        try:
            msg = recv(inp)
        except EOFError:
            return
        send(channel, handler(msg))


def progress(text):
    print(PROGRESS + text, file=sys.stderr, flush=True)


def error_text(exc, limit=600):
    s = f"{type(exc).__name__}: {exc}".strip()
    return s if len(s) <= limit else s[:limit] + " ..."
