"""Running a tool's function with a time limit: a safe tool in a thread that is stopped at
its limit (:func:`run_in_thread`), an ``unsafe`` one in a child process with a memory limit
too, killed at its limit (:func:`run_in_subprocess`).

Both return ``(observation, is_error)``: the function's result as the text the model reads
(:func:`observation_text`), or an error observation saying what went wrong. Nothing a
tool does (raise, hang, allocate without bound, crash its process) reaches the caller as
an exception.

The unsafe tool's child process is a resource limit, not a security boundary: it shares the file
system, the network and the user of the training process. It is a fresh interpreter
(``sys.executable``; no copy of the trainer's memory or CUDA state) that receives the
function by reference (its module and qualified name, so it must be a module-level
function) and the arguments as JSON, and answers in JSON: nothing either side reads can
run code (no pickle), so a tool that writes crafted bytes to its result pipe gets at most
a wrong observation.
"""

from __future__ import annotations

import json
import importlib
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any, Callable

STARTUP_S = 60.0
"""How long a child process may take to start (interpreter, imports) before the tool's
own time limit begins; a child that has not started by then is killed."""


def observation_text(result: Any) -> str:
    """The text a tool's return value shows the model: a ``str`` as it is, anything JSON can
    write as JSON (``3`` -> ``3``, ``True`` -> ``true``, ``{"a": 1}`` -> ``{"a": 1}``),
    anything else as ``str(result)``."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


def _raised(name: str, exc: BaseException) -> str:
    message = str(exc)
    return f"error: tool {name!r} raised {type(exc).__name__}" + (f": {message}" if message else "")


def _outcome(name: str, fn: Callable[..., Any], arguments: dict[str, Any]) -> tuple[str, bool]:
    """``(observation, is_error)`` of calling ``fn(**arguments)`` here: its result as text, or
    what it raised (any exception, ``SystemExit`` and ``KeyboardInterrupt`` too)."""
    try:
        return observation_text(fn(**arguments)), False
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the model's observation
        return _raised(name, exc), True


class ToolTimeout(BaseException):
    """Raised inside a safe tool's thread when it runs past its time limit (a
    ``BaseException``, as ``SystemExit`` is, so the tool's ``except Exception`` does not
    swallow it)."""


STOP_GRACE_S = 1.0
"""How long a safe tool's thread has to end once :class:`ToolTimeout` is raised in it."""


def _raise_in(thread: threading.Thread) -> bool:
    """Raise :class:`ToolTimeout` in ``thread`` at its next Python instruction
    (``PyThreadState_SetAsyncExc``); ``False`` where that is not possible (no such thread,
    an interpreter without ``ctypes.pythonapi``)."""
    try:
        import ctypes

        set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    except (ImportError, AttributeError):
        return False
    return set_async(ctypes.c_ulong(thread.ident or 0), ctypes.py_object(ToolTimeout)) == 1


def run_in_thread(name: str, fn: Callable[..., Any], arguments: dict[str, Any],
                  timeout_s: float) -> tuple[str, bool]:
    """Call ``fn(**arguments)`` in a daemon thread and wait at most ``timeout_s`` seconds;
    a call that runs past the limit is stopped: :class:`ToolTimeout` is raised in its thread,
    which then has :data:`STOP_GRACE_S` seconds to end.

    A thread runs Python code between the instructions where the interpreter checks for
    such an exception, so a loop ends at once. A thread blocked outside Python (a C call:
    ``time.sleep``, a socket read, a regular expression backtracking) gets the exception
    only when that call returns; until then it runs on, and the observation says so. A
    tool that can block that way belongs in ``unsafe`` (a process that is killed).
    """
    outcome: list[tuple[str, bool]] = []
    guard = threading.Lock()  # no ToolTimeout is raised once the result is in (nor in threading's own code)

    def target() -> None:
        try:
            result = _outcome(name, fn, arguments)
            with guard:
                outcome.append(result)
        except ToolTimeout:  # raised between the tool's return and the result's append
            pass

    thread = threading.Thread(target=target, name=f"rlzoo-tool-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    with guard:
        if outcome:
            return outcome[0]
        raised = _raise_in(thread)
    thread.join(STOP_GRACE_S if raised else 0.0)
    if not thread.is_alive():
        return f"error: tool {name!r} timed out after {timeout_s:g} s and was stopped", True
    return (f"error: tool {name!r} timed out after {timeout_s:g} s and could not be stopped (blocked outside "
            "Python; its thread ends when that call returns)"), True


def _address_space_bytes() -> int | None:
    """This process's virtual address space (``/proc/self/statm``), ``None`` off Linux."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _limit_memory(memory_mb: int) -> None:
    try:
        import resource

        held = _address_space_bytes()
        if held is not None:
            limit = held + memory_mb * 2**20
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):  # no RLIMIT_AS here: the time limit still holds
        pass


def _resolve(module: str, qualname: str) -> Callable[..., Any]:
    """The function ``qualname`` of ``module``, imported."""
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _result_bytes(observation: str, is_error: bool) -> bytes:
    return json.dumps({"observation": observation, "is_error": is_error}).encode()


def child_main(result_fd: int) -> None:
    """The child process (``python -c "...; child_main(fd)"``): read the call from stdin as
    JSON (the parent's ``sys.path``, the function's module and qualified name, its
    arguments, ``memory_mb``), import the function, cap the address space ``memory_mb``
    above what the interpreter and the tool's module hold, write ``b"S"`` (started) then
    ``{"observation": ..., "is_error": ...}`` as JSON to ``result_fd``."""
    out = os.fdopen(result_fd, "wb", buffering=0)
    call = json.loads(sys.stdin.buffer.read())
    sys.path[:] = call["path"]
    name, memory_mb = call["name"], call["memory_mb"]
    try:
        fn = _resolve(call["module"], call["qualname"])
    except Exception as exc:  # noqa: BLE001 - the model sees why the tool could not run
        out.write(b"S" + _result_bytes(f"error: tool {name!r} could not be imported in its process "
                                       f"({type(exc).__name__}: {exc})", True))
        out.close()
        return
    _limit_memory(memory_mb)
    out.write(b"S")  # started: the tool's time limit runs from here
    try:
        result: tuple[str, bool] = (observation_text(fn(**call["arguments"])), False)
    except MemoryError:
        result = (f"error: tool {name!r} exceeded its memory limit of {memory_mb} MB", True)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the model's observation
        result = (_raised(name, exc), True)
    try:
        data = _result_bytes(*result)
    except MemoryError:
        data = _result_bytes(f"error: tool {name!r} exceeded its memory limit of {memory_mb} MB", True)
    out.write(data)
    out.close()


def _parse_result(data: bytes) -> tuple[str, bool] | None:
    """The child's ``(observation, is_error)``, or ``None`` when ``data`` is not one."""
    try:
        result = json.loads(data)
    except ValueError:
        return None
    if (isinstance(result, dict) and isinstance(result.get("observation"), str)
            and isinstance(result.get("is_error"), bool)):
        return result["observation"], result["is_error"]
    return None


def _read_until(fd: int, deadline: float, limit: int | None = None) -> bytes | None:
    """Bytes from ``fd`` until EOF (or ``limit`` bytes); ``None`` when ``deadline`` passes first."""
    chunks: list[bytes] = []
    size = 0
    while limit is None or size < limit:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, (limit - size) if limit is not None else 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _no_result(name: str, code: int, data: bytes, memory_mb: int) -> str:
    """The observation when the child's result pipe held no ``{observation, is_error}``:
    what happened, told apart by the exit code and what the pipe held."""
    if code != 0:
        return f"error: tool {name!r} crashed (its process ended with exit code {code}; memory limit {memory_mb} MB)"
    if not data:
        return (f"error: tool {name!r} ended its process (exit code 0) before returning a result: did it call "
                "os._exit() or close the result pipe?")
    return (f"error: tool {name!r} returned, but its result pipe held {len(data)} bytes that are not one result: "
            "something in the tool's process wrote to rlzoo's result pipe itself, so nothing it holds is used")


def run_in_subprocess(name: str, fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float,
                      memory_mb: int) -> tuple[str, bool]:
    """Call ``fn(**arguments)`` in a fresh Python process whose address space may grow by
    at most ``memory_mb`` MiB (``RLIMIT_AS``, Linux), killed after ``timeout_s`` seconds of
    wall time. The time counts from the call of ``fn``: the process's start-up (at most
    :data:`STARTUP_S`) is not part of it. The process inherits stdout and stderr (what the
    tool prints goes to the run's log), not the caller's ``__main__``."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return (f"error: tool {name!r} must be a module-level function of an importable module to run in its "
                f"own process (unsafe=True); got {fn!r}"), True
    try:
        payload = json.dumps({"path": list(sys.path), "module": module, "qualname": qualname, "name": name,
                              "arguments": arguments, "memory_mb": memory_mb}).encode()
    except (TypeError, ValueError) as exc:
        return f"error: tool {name!r} could not be sent to its process ({type(exc).__name__}: {exc})", True
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", f"from rlzoo.agents.sandbox import child_main; child_main({write_fd})"],
            stdin=subprocess.PIPE, pass_fds=(write_fd,),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})  # rlzoo itself too
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        return f"error: tool {name!r} could not start its process ({exc})", True
    os.close(write_fd)  # the child holds its copy: EOF here when the child ends
    try:
        try:
            process.stdin.write(payload)
            process.stdin.close()
        except BrokenPipeError:
            pass
        started = _read_until(read_fd, time.monotonic() + STARTUP_S, limit=1)
        if started is None:
            return f"error: tool {name!r} did not start within {STARTUP_S:g} s and was killed", True
        result = _read_until(read_fd, time.monotonic() + timeout_s) if started == b"S" else b""
        if result is None:
            return f"error: tool {name!r} timed out after {timeout_s:g} s and was killed", True
        parsed = _parse_result(result)
        if parsed is not None:
            return parsed
        try:  # no result, or bytes that are not one: how did the process end?
            code = process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        return _no_result(name, code, result, memory_mb), True
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        os.close(read_fd)
