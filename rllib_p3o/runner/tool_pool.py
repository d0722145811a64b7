"""Tool calls in worker processes that can be killed: a warm pool per tool set, one call per worker at a time.

Why processes: a thread cannot be stopped, so a tool that hangs, loops or has side effects would keep running after
the model was told it timed out. Here each call runs in a worker process (`rllib_p3o.runner.tool_worker`):
- its timeout counts from the moment the call starts in a worker, never while it waits for one (a call queued
  behind slow ones is not reported as timed out);
- a call that runs past its timeout is killed with its worker's whole process group (nothing it started acts
  afterwards), and a new worker is started in its place;
- each call's address space (``memory_mb``) and CPU time (``cpu_s``) are bounded with ``setrlimit`` in the worker;
- a worker that dies (``os._exit``, a segfault, the CPU limit) is reported as such and replaced.
The text for the model says what happened; the runner goes on.

Workers are fresh interpreters started with ``subprocess`` (not ``fork``: the runner holds vLLM and torch threads,
and a fork copies their locks mid-flight; not multiprocessing's ``spawn``/``forkserver`` either, which re-import the
parent's ``__main__``, in an EnvRunner Ray's worker script). A worker starts from the runner's ``sys.path`` and
loads the tools once, before it takes calls; start-up is not counted in any call's timeout. The pool keeps
``workers`` of them alive, started when the pool is made, and one thread in the runner dispatches calls, watches the
deadlines and replaces workers.

Tools travel as cloudpickle pickles them, once per worker: a plain function by value (its code and the globals it
uses: a worker need not import the tool's module, which may be heavy), falling back to by reference when its globals
cannot be pickled; other callables (``functools.partial``, bound methods, objects with ``__call__``) by reference to
their class or module, which each worker then imports. Arguments and results are copied: a tool shares no state with
the runner, or with other calls in other workers.
"""

from __future__ import annotations

import atexit
import collections
import os
import pickle
import selectors
import signal
import subprocess
import sys
import threading
import time
import types
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable, Deque, Dict, List, Mapping, Optional, Tuple, Union

from rllib_p3o.runner import tool_worker
from rllib_p3o.runner.tool_worker import CALL, ERROR, HELLO, OK, OUT_OF_MEMORY, READY

DEFAULT_WORKERS = 4
DEFAULT_MEMORY_MB = 1024
# A worker that has not loaded the tools by then is stuck (an import that hangs, a deadlock in a tool's module).
WORKER_START_TIMEOUT_S = 120.0
# Tools get one thread of each numeric library: the runner's cores belong to its vLLM engine.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

Arguments = Union[Dict[str, Any], str]


class ToolError(RuntimeError):
    """A tool set that cannot run at all (it cannot be pickled, or its workers cannot load or start it): a
    configuration error, raised to the user rather than told to the model."""


@dataclass(frozen=True)
class ToolLimits:
    """What one call may use: wall-clock seconds from its start, MiB of address space, CPU seconds (None: no
    limit of its own, ``timeout_s`` bounds it)."""

    timeout_s: float = 5.0
    memory_mb: Optional[int] = DEFAULT_MEMORY_MB
    cpu_s: Optional[float] = None


@dataclass
class _Call:
    name: str
    arguments: Arguments
    limits: ToolLimits
    future: Future = field(default_factory=Future)


@dataclass
class _Worker:
    proc: subprocess.Popen
    conn_in: Connection  # the worker's replies
    conn_out: Connection  # its calls
    started: float
    ready: bool = False
    call: Optional[_Call] = None
    deadline: float = float("inf")


def pickle_tool(name: str, fn: Callable) -> bytes:
    """``fn`` as cloudpickle bytes (the module docstring says how); `ToolError` naming the tool if it cannot be."""
    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    by_value_already = module is None or module.__name__ in cloudpickle.list_registry_pickle_by_value()
    if isinstance(fn, types.FunctionType) and not by_value_already and module.__name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(fn)
        except Exception:  # noqa: BLE001 - a global it uses cannot be copied: by reference, below
            pass
        finally:
            cloudpickle.unregister_pickle_by_value(module)
    try:
        return cloudpickle.dumps(fn)
    except Exception as e:
        raise ToolError(
            f"tool {name!r} ({fn!r:.100}) cannot be pickled for its worker process: {type(e).__name__}: {e}. A tool "
            "runs in a process of its own: it must be a function (or callable) that cloudpickle can copy, with no "
            "locks, open files or connections among what it uses (open those inside the tool)."
        ) from e


class ToolPool:
    """Runs calls of one tool set in ``workers`` worker processes (module docstring). Thread-safe."""

    def __init__(self, tools: Mapping[str, Callable], workers: int = DEFAULT_WORKERS):
        if workers < 1:
            raise ValueError(f"tool_workers must be >= 1, got {workers}")
        self.tools = dict(tools)
        self.size = int(workers)
        self._hello = pickle.dumps(
            (HELLO, {"sys_path": list(sys.path), "tools": {n: pickle_tool(n, f) for n, f in self.tools.items()}})
        )
        self._load_errors: Dict[str, str] = {}
        self._queue: Deque[_Call] = collections.deque()
        self._workers: List[_Worker] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        self._closed = False
        self._broken: Optional[BaseException] = None
        self.workers_started = 0
        self._thread = threading.Thread(target=self._run, name="p3o-tool-pool", daemon=True)
        self._thread.start()

    # -- the caller's side -----------------------------------------------------------------------------------------

    def submit(self, name: str, arguments: Arguments, limits: ToolLimits) -> "Future[Tuple[str, bool]]":
        """Start a call when a worker is free; the future gives ``(text for the model, succeeded)``, or raises
        `ToolError` when the tool cannot be loaded or workers cannot start."""
        call = _Call(name, arguments, limits)
        with self._lock:
            if self._broken is not None or self._closed:
                raise ToolError(f"the tool pool is {'closed' if self._closed else 'broken'}") from self._broken
            if name in self._load_errors:
                raise self._load_error(name)
            self._queue.append(call)
        self._wake()
        return call.future

    def close(self) -> None:
        """Kill every worker (calls in flight get an error) and stop the dispatching thread."""
        with self._lock:
            self._closed = True
        self._wake()
        self._thread.join(timeout=10)

    def worker_pids(self) -> List[int]:
        """Process ids of the live workers (for tests and diagnostics)."""
        with self._lock:
            return [w.proc.pid for w in self._workers]

    # -- the dispatching thread ------------------------------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # closed at shutdown
            pass

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while True:
                with self._lock:
                    if self._closed:
                        break
                while len(self._workers) < self.size:
                    worker = self._start_worker()
                    selector.register(worker.conn_in.fileno(), selectors.EVENT_READ, worker)
                self._dispatch()
                now = time.monotonic()
                deadlines = [w.deadline for w in self._workers if w.call is not None]
                deadlines += [w.started + WORKER_START_TIMEOUT_S for w in self._workers if not w.ready]
                timeout = max(0.0, min(deadlines) - now) if deadlines else None
                for key, _ in selector.select(timeout):
                    if key.data is None:
                        os.read(self._wake_r, 4096)
                    else:
                        self._on_readable(key.data, selector)
                self._kill_overdue(selector)
        except BaseException as e:  # noqa: BLE001 - every waiting caller must hear of it
            with self._lock:
                self._broken = e
        finally:
            error = self._broken or ToolError("the tool pool was closed")
            for worker in list(self._workers):
                call = self._retire(worker, selector)
                if call is not None and not call.future.done():
                    call.future.set_exception(error)
            with self._lock:
                pending, self._queue = list(self._queue), collections.deque()
            for call in pending:
                call.future.set_exception(error)
            selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _start_worker(self) -> _Worker:
        # Pipes, not the worker's stdin/stdout: the tool's prints go to the runner's log, as they would in-process.
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        proc = subprocess.Popen(
            [sys.executable, tool_worker.__file__, str(to_worker_r), str(from_worker_w), str(os.getpid())],
            pass_fds=(to_worker_r, from_worker_w),
            stdin=subprocess.DEVNULL,
            env={**os.environ, **WORKER_ENV},
            start_new_session=True,  # its own process group: a timeout kills what the tool started too
            close_fds=True,
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        worker = _Worker(
            proc,
            Connection(from_worker_r, writable=False),
            Connection(to_worker_w, readable=False),
            started=time.monotonic(),
        )
        worker.conn_out.send_bytes(self._hello)
        self.workers_started += 1
        with self._lock:
            self._workers.append(worker)
        return worker

    def _dispatch(self) -> None:
        """Hand queued calls to idle, ready workers; each call's clock starts here."""
        for worker in self._workers:
            if not worker.ready or worker.call is not None:
                continue
            with self._lock:
                if not self._queue:
                    return
                call = self._queue.popleft()
            if call.name in self._load_errors:
                call.future.set_exception(self._load_error(call.name))
                continue
            limits = call.limits
            memory = int(limits.memory_mb * 2**20) if limits.memory_mb else None
            worker.conn_out.send_bytes(pickle.dumps((CALL, (call.name, call.arguments, memory, limits.cpu_s))))
            worker.call, worker.deadline = call, time.monotonic() + limits.timeout_s

    def _on_readable(self, worker: _Worker, selector: selectors.BaseSelector) -> None:
        try:
            kind, value = pickle.loads(worker.conn_in.recv_bytes())
        except (EOFError, OSError):  # the worker died
            self._on_death(worker, selector)
            return
        if kind == READY:
            worker.ready = True
            with self._lock:
                self._load_errors.update(value)
            return
        call, worker.call, worker.deadline = worker.call, None, float("inf")
        if call is None:
            return
        if kind == OK:
            call.future.set_result((value, True))
        elif kind == ERROR:
            call.future.set_result((f"error: {value}", False))
        elif kind == OUT_OF_MEMORY:
            call.future.set_result(
                (f"error: tool {call.name} ran out of memory (its limit is {call.limits.memory_mb} MiB)", False)
            )
            self._retire(worker, selector)  # it exits by itself; a new one is started
        else:  # pragma: no cover - protocol error
            raise RuntimeError(f"tool worker sent {kind!r}")

    def _on_death(self, worker: _Worker, selector: selectors.BaseSelector) -> None:
        call = self._retire(worker, selector)
        code = worker.proc.returncode
        if call is None and not worker.ready:
            self._fail_start(f"a tool worker exited while loading the tools ({_exit_reason(code)})")
        elif call is not None:
            if code == -signal.SIGXCPU:
                text = f"error: tool {call.name} used up its CPU time limit ({call.limits.cpu_s:g} s) and was stopped"
            else:
                text = f"error: tool {call.name} crashed its process ({_exit_reason(code)})"
            call.future.set_result((text, False))

    def _kill_overdue(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.call is not None and now >= worker.deadline:
                call = self._retire(worker, selector)
                call.future.set_result((f"error: tool {call.name} timed out after {call.limits.timeout_s:g} s", False))
            elif not worker.ready and now >= worker.started + WORKER_START_TIMEOUT_S:
                self._retire(worker, selector)
                self._fail_start(f"a tool worker did not load the tools within {WORKER_START_TIMEOUT_S:g} s")

    def _retire(self, worker: _Worker, selector: selectors.BaseSelector) -> Optional[_Call]:
        """Kill a worker with its process group, reap it and forget it (the loop starts another); returns the call it
        was running, if any, for the caller to answer."""
        try:
            os.killpg(worker.proc.pid, signal.SIGKILL)  # before the reaping wait: the group id is still its own
        except (ProcessLookupError, PermissionError):
            pass
        try:
            worker.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignored
            pass
        try:
            selector.unregister(worker.conn_in.fileno())
        except (KeyError, ValueError):
            pass
        worker.conn_in.close()
        worker.conn_out.close()
        with self._lock:
            self._workers.remove(worker)
        call, worker.call = worker.call, None
        return call

    def _fail_start(self, message: str) -> None:
        """Workers cannot start: every queued call fails with `ToolError`, and so does the pool from now on."""
        error = ToolError(
            f"{message}. Tool workers start from the runner's sys.path and load every tool of "
            f"{sorted(self.tools)} before they take calls."
        )
        with self._lock:
            self._broken = error
            pending, self._queue = list(self._queue), collections.deque()
        for call in pending:
            call.future.set_exception(error)
        raise error

    def _load_error(self, name: str) -> ToolError:
        return ToolError(
            f"tool {name!r} cannot be loaded in its worker process: {self._load_errors[name]}. Tool workers start "
            "from the runner's sys.path: the tool's module (and what it imports) must be importable there, as "
            "for the reward function (install it on every node, or ship it with Ray's runtime_env py_modules)."
        )


def _exit_reason(code: Optional[int]) -> str:
    if code is None:
        return "it did not exit"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


# -- one pool per tool set and process ----------------------------------------------------------------------------

_POOLS: Dict[tuple, ToolPool] = {}
_POOLS_LOCK = threading.Lock()


def tool_pool(tools: Mapping[str, Callable], workers: int = DEFAULT_WORKERS) -> ToolPool:
    """This process's pool for ``tools`` (the same callables) with ``workers`` workers, made on first use."""
    key = (tuple(sorted((name, id(fn)) for name, fn in tools.items())), int(workers))
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool._broken is not None:  # (the pool holds the callables: their ids stay theirs)
            pool = _POOLS[key] = ToolPool(tools, workers)
        return pool


@atexit.register
def close_pools() -> None:
    """Close every pool of this process (its workers are killed)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.close()
