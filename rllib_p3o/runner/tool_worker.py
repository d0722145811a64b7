"""A tool worker process: loads the tools, then runs one call at a time, each under its memory and CPU-time limits.

Started by `rllib_p3o.runner.tool_pool` as ``python tool_worker.py <read fd> <write fd>`` (a fresh interpreter, not a
fork of the runner, whose vLLM and torch threads a fork would copy mid-flight). It imports only the standard library
and cloudpickle, so that it starts in a fraction of a second; the tools bring their own imports.

Messages are pickled (`multiprocessing.connection.Connection` framing) over two pipes:
    runner -> worker  HELLO {sys_path, tools: {name: cloudpickle bytes}} once, then CALL (name, arguments,
                      memory_bytes, cpu_s) one at a time
    worker -> runner  READY {name: load error}, then one (status, text) per call: OK (the result as text), ERROR
                      (the exception as text) or OUT_OF_MEMORY (after which the worker exits)
A CPU-time limit that is reached ends the worker with SIGXCPU; the runner kills a worker whose call runs past its
wall-clock timeout. Either way the runner starts another.
"""

import os
import pickle
import resource
import sys

# Message kinds (shared with tool_pool, which imports them from here).
HELLO, READY, CALL, OK, ERROR, OUT_OF_MEMORY = "hello", "ready", "call", "ok", "error", "out_of_memory"


def _die_with_parent(parent_pid: int) -> None:
    """Get SIGKILL when the runner thread that started this worker ends (Linux), so that no worker outlives it."""
    try:
        import ctypes
        import signal

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the runner's atexit hook and the CPU limit still bound it
        pass
    if os.getppid() != parent_pid:  # the runner ended before the line above
        os._exit(1)


def _set_limits(memory_bytes, cpu_s) -> None:
    """This call's limits: address space (soft limit; the hard one stays, so the next call may raise it again), and
    CPU seconds from now (RLIMIT_CPU counts the process's whole life, so the limit is the time used plus cpu_s)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes if memory_bytes else hard, hard))
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if cpu_s:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime + cpu_s + 0.999)
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    else:
        resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))


def main(read_fd: int, write_fd: int, parent_pid: int) -> None:
    from multiprocessing.connection import Connection

    _die_with_parent(parent_pid)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash or SIGXCPU writes no core file
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    kind, hello = pickle.loads(conn_in.recv_bytes())
    assert kind == HELLO, kind
    sys.path[:] = hello["sys_path"]  # the runner's, so tools import what the runner imports
    import cloudpickle

    tools, load_errors = {}, {}
    for name, payload in hello["tools"].items():
        try:
            tools[name] = cloudpickle.loads(payload)
        except BaseException as e:  # noqa: BLE001 - reported to the runner, which raises it
            load_errors[name] = f"{type(e).__name__}: {e}"
    conn_out.send_bytes(pickle.dumps((READY, load_errors)))
    while True:
        try:
            kind, (name, arguments, memory_bytes, cpu_s) = pickle.loads(conn_in.recv_bytes())
        except EOFError:  # the runner closed the pipe: the pool is shutting down
            return
        _set_limits(memory_bytes, cpu_s)
        try:
            fn = tools[name]
            result = fn(**arguments) if isinstance(arguments, dict) else fn(arguments)
            reply = (OK, str(result))
        except MemoryError:
            reply = (OUT_OF_MEMORY, "")
        except BaseException as e:  # noqa: BLE001 - the model is told; SystemExit and KeyboardInterrupt too
            reply = (ERROR, f"{type(e).__name__}: {e}")
        _set_limits(None, None)
        conn_out.send_bytes(pickle.dumps(reply))
        if reply[0] == OUT_OF_MEMORY:  # what is left of the heap is not worth keeping
            return


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
