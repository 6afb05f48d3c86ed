"""The first code the sandboxed interpreter runs; `sandbox.py` passes this file's source with `python -I -S -c`.

Stdlib only, and importing it has no effect. Order matters: while still privileged it isolates the network
(rlimits mode) and sets resource limits, preloads modules the snippet may import, drops root, installs the
audit guard, then runs the snippet REPL-style and writes one JSON report line to the report fd. The guard is
defence in depth, not the boundary: bwrap (or the uid drop and limits) is.
"""

import ast
import builtins
import io
import json
import os
import resource
import sys
import traceback

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

# Audit events refused outright, with the words the report uses for them.
BLOCKED_EVENTS = {
    "os.system": "running a shell command",
    "os.exec": "executing a program",
    "os.posix_spawn": "spawning a process",
    "os.spawn": "spawning a process",
    "os.fork": "forking a process",
    "os.forkpty": "forking a process",
    "subprocess.Popen": "starting a subprocess",
    "pty.spawn": "spawning a process",
    "os.kill": "signalling a process",
    "os.killpg": "signalling a process group",
    "signal.pthread_kill": "signalling a thread",
    "socket.__new__": "opening a network socket",
    "socket.connect": "connecting to the network",
    "socket.bind": "binding a network port",
    "socket.getaddrinfo": "resolving a host name (network access)",
    "socket.gethostbyname": "resolving a host name (network access)",
    "socket.gethostbyaddr": "resolving an address (network access)",
    "socket.sendto": "sending network packets",
    "gc.get_objects": "inspecting the interpreter's objects",
    "gc.get_referrers": "inspecting the interpreter's objects",
    "gc.get_referents": "inspecting the interpreter's objects",
    "resource.setrlimit": "changing resource limits",
    "resource.prlimit": "changing resource limits",
}
# Modules whose import alone gives process creation or native code without an audit event of their own.
BLOCKED_IMPORTS = {
    "_posixsubprocess": "starting a subprocess",
    "subprocess": "starting a subprocess",
    "multiprocessing": "starting a subprocess",
    "_ctypes": "loading native code",
    "ctypes": "loading native code",
}
# Events that touch paths: (argument positions written, argument positions read).
PATH_EVENTS = {
    "os.remove": ((0,), ()),
    "os.rmdir": ((0,), ()),
    "os.mkdir": ((0,), ()),
    "os.rename": ((0, 1), ()),
    "os.link": ((1,), (0,)),
    "os.symlink": ((1,), ()),
    "os.chmod": ((0,), ()),
    "os.chown": ((0,), ()),
    "os.truncate": ((0,), ()),
    "os.utime": ((0,), ()),
    "shutil.rmtree": ((0,), ()),
    "shutil.copyfile": ((1,), (0,)),
    "os.listdir": ((), (0,)),
    "os.scandir": ((), (0,)),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class SandboxViolation(PermissionError):
    """Raised into the snippet when it tries something the sandbox does not allow."""


def main():
    settings = json.loads(sys.argv[1])
    code = sys.stdin.read()
    sys.stdin = io.StringIO()  # input() sees end of file
    isolation = {"mode": settings["mode"]}
    new_user_namespace = False
    if settings["unshare_network"]:
        isolation["network"], new_user_namespace = _unshare_network()
    else:
        isolation["network"] = "netns"  # bwrap --unshare-net already did it
    process_limit = settings["nproc_in_new_userns"] if new_user_namespace else settings["nproc"]
    _set_limits(settings["limits"], process_limit)
    for name in settings["preload"]:  # after the drop below the stdlib may be unreadable (e.g. under /root)
        try:
            __import__(name)
        except ImportError:
            pass
    if settings["drop_to"]:
        _drop_privileges(*settings["drop_to"])
    isolation["uid"] = os.getuid()
    violations: list[str] = []
    if settings["guard"]:
        _install_guard(violations, os.getcwd())
    outcome = _run(code, settings["max_repr_chars"])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # output over the file-size limit; the parent reads what was written
    report = {**outcome, "violations": violations[:5], "isolation": isolation}
    os.write(settings["report_fd"], (json.dumps(report) + "\n").encode("utf-8", "replace"))


def _unshare_network():
    """A fresh, empty network namespace: root can make one directly, others inside a new user namespace."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        as_root = os.geteuid() == 0
        flags = CLONE_NEWNET if as_root else CLONE_NEWUSER | CLONE_NEWNET
        unshared = libc.unshare(flags) == 0
    except (ImportError, OSError, AttributeError):
        unshared, as_root = False, False
    for name in ("ctypes", "_ctypes"):  # the snippet must import these afresh, which the guard refuses
        sys.modules.pop(name, None)
    if unshared:
        return "netns", not as_root
    return "audit-hook", False


def _set_limits(limits, process_limit):
    def cap(which, soft, hard=None):
        hard = soft if hard is None else hard
        current_hard = resource.getrlimit(which)[1]
        if current_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, current_hard), min(hard, current_hard)
        resource.setrlimit(which, (soft, hard))

    # CPU: SIGXCPU at the soft limit, SIGKILL one second later; the parent's wall clock usually wins.
    cap(resource.RLIMIT_CPU, limits["cpu_s"], limits["cpu_s"] + 1)
    cap(resource.RLIMIT_AS, limits["memory_bytes"])
    cap(resource.RLIMIT_FSIZE, limits["file_size_bytes"])
    cap(resource.RLIMIT_NOFILE, limits["open_files"])
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, process_limit)


def _drop_privileges(uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    try:  # must be irreversible: a process that can become root again is not sandboxed
        os.setuid(0)
    except PermissionError:
        return
    os._exit(125)


def _install_guard(violations, work_dir):
    work_dir = os.path.realpath(work_dir)
    read_roots = {os.path.realpath(p) for p in (*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix) if p}
    read_roots |= {work_dir, "/dev/null", "/dev/urandom", "/usr/share/zoneinfo"}

    def deny(what):
        violations.append(what)
        raise SandboxViolation(f"sandbox: {what} is not allowed")

    def inside(path, roots):
        if isinstance(path, int) or path is None:  # an open fd or "." (listdir()): nothing new is reached
            return True
        try:
            resolved = os.path.realpath(os.fsdecode(os.fspath(path)))
        except (TypeError, ValueError):
            return False
        return any(resolved == root or resolved.startswith(root.rstrip("/") + "/") for root in roots)

    def guard(event, args):
        if event in BLOCKED_EVENTS:
            deny(BLOCKED_EVENTS[event])
        elif event.startswith("ctypes."):
            deny("using native code (ctypes)")
        elif event == "import" and args and args[0] in BLOCKED_IMPORTS:
            deny(f"importing {args[0]} ({BLOCKED_IMPORTS[args[0]]})")
        elif event == "object.__setattr__" and len(args) > 1 and args[1] == "__code__":
            deny("rewriting a function's code")
        elif event == "open":
            path, mode, flags = (list(args) + [None, None, None])[:3]
            writing = bool(mode and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
            if writing and not inside(path, (work_dir,)):
                deny(f"writing {path!r} outside the sandbox's work directory")
            if not writing and not inside(path, read_roots):
                deny(f"reading {path!r}")
        elif event in PATH_EVENTS:
            written, read = PATH_EVENTS[event]
            for position in written:
                if position < len(args) and not inside(args[position], (work_dir,)):
                    deny(f"changing {args[position]!r} outside the sandbox's work directory ({event})")
            for position in read:
                if position < len(args) and not inside(args[position], read_roots):
                    deny(f"reading {args[position]!r} ({event})")

    sys.addaudithook(guard)


def _run(code, max_repr_chars):
    """Run like a REPL: statements execute, and the value of a final expression is reported as its repr."""
    try:
        tree = ast.parse(code, "<snippet>", "exec")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(tree, "<snippet>", "exec"), namespace)
        if last is None:
            return {"outcome": "ok", "value": None}
        value = eval(compile(ast.Expression(last.value), "<snippet>", "eval"), namespace)
        return {"outcome": "ok", "value": repr(value)[:max_repr_chars]}
    except BaseException as err:  # noqa: BLE001 - the snippet's own failure is the result
        try:
            traceback.print_exc(limit=-5)
        except BaseException:  # noqa: BLE001 - stderr may be over its size limit
            pass
        return {
            "outcome": "exception",
            "exception": type(err).__name__,
            "message": str(err)[:500],
            "errno": getattr(err, "errno", None),
        }


if __name__ == "__main__":
    main()
