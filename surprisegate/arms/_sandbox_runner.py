"""The interpreter that runs a snippet, started fresh as `python -I -S -c STUB CODE SETTINGS`: the stub runs
this file's code, compiled by the parent (sandbox._code_arg); SETTINGS is a Python literal.

Both sandboxes end here: bwrap starts it directly, the "rlimits" sandbox execs it as the last step of its
namespace bootstrap (_sandbox_child.py). In order: read the snippet from stdin (then stdin is /dev/null), set
the resource limits, preload some modules (only where the stdlib becomes unreadable after the uid drop), drop
root for good, install the audit guard, run the snippet REPL-style, write one report line to the report fd
(a Python literal, which the parent reads with ast.literal_eval). Stdlib only, and few modules (each import
is time inside a 2 s round); importing this module does nothing.

The guard is defence in depth (the namespaces are the boundary), but a snippet cannot switch it off from
Python: it is one function, referenced by nothing but the interpreter's list of audit hooks (no module
global, no local of a frame on the stack while the snippet runs). Everything it reads is in its closure and
immutable: frozensets, tuples and strings, and C functions captured when it was made (posix.lstat,
posix.readlink, ...), so the guard's own frame, which the traceback of a refusal shows, holds nothing to
change. It calls no module global, builtin name or Python helper that a snippet could replace
(os.path.realpath, os.fsdecode, builtins.len), takes paths only as the raw text of a str or bytes (never a
path object whose __fspath__ could answer differently twice) and resolves them itself. It refuses the known
ways around it: gc.get_objects/get_referrers/get_referents, ctypes, native modules from outside the
interpreter's own install, CPython's test modules and subinterpreters, modules whose C code reaches files or
processes without audit events (_tkinter, readline, pwd, _posixshmem, ...), building code objects
(code.__new__, marshal.loads of anything but a compiled module of the install that matches its file byte for
byte), rewriting __code__, chdir and symlinks (which would let a checked path and the opened one differ).
Each refusal is written at once to the violations fd; a snippet that swaps that fd is stopped. What it cannot
stop is a bug in CPython itself that corrupts memory, or a call that raises no audit event at all (e.g.
os.pidfd_open with signal.pidfd_send_signal): that is what the namespaces and the per-run uid are for.
"""

import sys

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
    "webbrowser.open": "starting a web browser",
    "os.kill": "signalling a process",
    "os.killpg": "signalling a process group",
    "signal.pthread_kill": "signalling a thread",
    "os.chdir": "changing the working directory",
    "os.symlink": "creating a symbolic link",
    "gc.get_objects": "inspecting the interpreter's objects",
    "gc.get_referrers": "inspecting the interpreter's objects",
    "gc.get_referents": "inspecting the interpreter's objects",
    "sys._current_frames": "inspecting other threads' frames",
    "code.__new__": "building a code object",
    "marshal.load": "building code from marshal data",
    "resource.setrlimit": "changing resource limits",
    "resource.prlimit": "changing resource limits",
    "sqlite3.enable_load_extension": "loading native code (sqlite3 extensions)",
    "sqlite3.load_extension": "loading native code (sqlite3 extensions)",
    "urllib.Request": "connecting to the network",
}
# Socket events: all refused ("socket." prefix); these have their own words.
SOCKET_WORDS = {
    "socket.__new__": "opening a network socket",
    "socket.connect": "connecting to the network",
    "socket.bind": "binding a network port",
    "socket.getaddrinfo": "resolving a host name (network access)",
    "socket.gethostbyname": "resolving a host name (network access)",
    "socket.gethostbyaddr": "resolving an address (network access)",
    "socket.sendto": "sending network packets",
}
# Modules whose import alone gives process creation, native code or an interpreter without this guard.
BLOCKED_IMPORTS = {
    "_posixsubprocess": "starting a subprocess",
    "subprocess": "starting a subprocess",
    "multiprocessing": "starting a subprocess",
    "_ctypes": "loading native code",
    "ctypes": "loading native code",
    "_ctypes_test": "loading native code",
    "_testcapi": "loading CPython's test hooks",
    "_testinternalcapi": "loading CPython's test hooks",
    "_testbuffer": "loading CPython's test hooks",
    "_testmultiphase": "loading CPython's test hooks",
    "_testsinglephase": "loading CPython's test hooks",
    "_testimportmultiple": "loading CPython's test hooks",
    "_testclinic": "loading CPython's test hooks",
    "_xxtestfuzz": "loading CPython's test hooks",
    "_xxsubinterpreters": "starting a subinterpreter (no audit hooks there)",
    "_xxinterpchannels": "starting a subinterpreter (no audit hooks there)",
    "_interpreters": "starting a subinterpreter (no audit hooks there)",
    "_tkinter": "starting a Tcl interpreter (files and processes without audit events)",
    "readline": "reading and writing history files without audit events",
    "_curses": "writing terminal files without audit events",
    "_dbm": "opening database files without audit events",
    "_gdbm": "opening database files without audit events",
    "_posixshmem": "creating shared-memory files without audit events",
    "_multiprocessing": "creating named semaphores without audit events",
    "pwd": "reading the user database without audit events",
    "grp": "reading the group database without audit events",
    "spwd": "reading the shadow password database",
    "nis": "querying NIS",
    "_imp": "re-creating the import machinery's native module",
}
# Events that touch paths: (argument positions written, argument positions read).
PATH_EVENTS = {
    "os.remove": ((0,), ()),
    "os.rmdir": ((0,), ()),
    "os.mkdir": ((0,), ()),
    "os.mkfifo": ((0,), ()),
    "os.mknod": ((0,), ()),
    "os.rename": ((0, 1), ()),
    "os.link": ((1,), (0,)),
    "os.chmod": ((0,), ()),
    "os.chown": ((0,), ()),
    "os.truncate": ((0,), ()),
    "os.utime": ((0,), ()),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
    "os.getxattr": ((), (0,)),
    "os.listxattr": ((), (0,)),
    "os.listdir": ((), (0,)),
    "os.scandir": ((), (0,)),
    "shutil.rmtree": ((0,), ()),
    "shutil.copyfile": ((1,), (0,)),
    "shutil.copytree": ((1,), (0,)),
    "shutil.move": ((0, 1), ()),
    "sqlite3.connect": ((0,), ()),
}
# Readable besides the interpreter's own install and the work directory.
EXTRA_READ_ROOTS = ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random", "/usr/share/zoneinfo")


class SandboxViolation(PermissionError):
    """Raised into the snippet when it tries something the sandbox does not allow."""


def _main():
    import _ast
    import builtins
    import io
    import os
    import resource

    settings = eval(sys.argv[1], {"__builtins__": {}})  # a literal the parent wrote
    code = sys.stdin.read()
    sys.stdin = io.StringIO()  # input() sees end of file
    try:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        os.close(0)
    _set_limits(resource, settings["limits"], settings["nproc"])
    for name in settings["preload"]:  # after the drop below the stdlib may be unreadable (e.g. under /root)
        try:
            __import__(name)
        except ImportError:
            pass
    if settings["drop_to"]:
        _drop_privileges(os, *settings["drop_to"])
    # Bound now: the snippet may clear `settings` (a frame walk reaches it) or patch os.write and builtins.
    report_fd, write, show, streams = settings["report_fd"], os.write, repr, (sys.stdout, sys.stderr)
    if settings["guard"]:
        # The guard goes straight to the interpreter: no local, global or frame here keeps a reference to it.
        sys.addaudithook(_make_guard(os.getcwd(), settings["violations_fd"]))
    outcome = _run(code, settings["max_repr_chars"], _ast, builtins, (repr, str, type, isinstance, getattr, int))
    for stream in streams:
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - over the file-size limit, or closed by the snippet
            pass
    write(report_fd, (show(outcome) + "\n").encode("utf-8", "backslashreplace"))


def _set_limits(resource, limits, process_limit):
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


def _drop_privileges(os, uid, gid):
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    try:  # must be irreversible: a process that can become root again is not sandboxed
        os.setuid(0)
    except PermissionError:
        return
    os._exit(125)


def _make_guard(work_dir, violations_fd):
    """The audit hook. Everything it uses is bound here, once, before any snippet code exists."""
    import os
    import posix

    # C functions and immutable values only: nothing the snippet can reach changes what these do.
    getframe = sys._getframe
    lstat, readlink, getcwd = posix.lstat, posix.readlink, posix.getcwd
    open_fd, read_fd, close_fd, fstat = posix.open, posix.read, posix.close, posix.fstat
    write, exit_now = posix.write, posix._exit
    read_only = posix.O_RDONLY | posix.O_CLOEXEC
    write_flags = posix.O_WRONLY | posix.O_RDWR | posix.O_CREAT | posix.O_TRUNC | posix.O_APPEND
    str_t, bytes_t, int_t, bool_t, memoryview_t = str, bytes, int, bool, memoryview
    type_of, is_subclass, length, show = type, issubclass, len, repr
    str_copy, bytes_copy, decode, encode = str.__getitem__, bytes.__getitem__, bytes.decode, str.encode
    whole = slice(None)
    os_error, value_error, violation = OSError, ValueError, SandboxViolation
    fs_encoding, fs_errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    log_stat = fstat(violations_fd)
    log_dev, log_ino = log_stat.st_dev, log_stat.st_ino

    work = os.path.realpath(work_dir)
    install = [p for p in (*sys.path, sys.prefix, sys.base_prefix, sys.exec_prefix) if p]
    code_roots = _roots(install)  # the interpreter's own install: stdlib sources, compiled modules, lib-dynload
    read_roots = _roots([*install, work, *EXTRA_READ_ROOTS])
    write_roots = _roots([work, "/dev/null"])
    blocked = frozenset(BLOCKED_EVENTS)
    blocked_words = tuple(BLOCKED_EVENTS.items())
    socket_words = tuple(SOCKET_WORDS.items())
    blocked_imports = frozenset(BLOCKED_IMPORTS)
    import_words = tuple(BLOCKED_IMPORTS.items())
    path_events = frozenset(PATH_EVENTS)
    path_positions = tuple((name, written, read) for name, (written, read) in PATH_EVENTS.items())
    importer = sys.modules.get("_frozen_importlib_external")
    compile_bytecode = getattr(getattr(importer, "_compile_bytecode", None), "__code__", None)

    def guard(event, args):
        refusal = None
        items = []  # [(path, kind), ...]: kind 0 read, 1 write, 2 native module, 3 compiled module (.pyc)
        payload = None
        if event in blocked:
            for name, words in blocked_words:
                if name == event:
                    refusal = words
        elif event[:7] == "socket.":
            refusal = "using the network (" + event + ")"
            for name, words in socket_words:
                if name == event:
                    refusal = words
        elif event[:7] == "ctypes.":
            refusal = "using native code (ctypes)"
        elif event[:7] == "syslog.":
            refusal = "writing to the system log"
        elif event == "import":
            name = args[0] if length(args) else ""
            name_type = type_of(name)
            if name_type is not str_t:
                name = str_copy(name, whole) if is_subclass(name_type, str_t) else ""
            top = name.partition(".")[0]
            if top in blocked_imports:
                for module, words in import_words:
                    if module == top:
                        refusal = "importing " + top + " (" + words + ")"
            elif length(args) > 1 and args[1] is not None:
                items = [(args[1], 2)]  # an extension module is being loaded from this file
        elif event == "open":
            path, mode, flags = args[0], args[1], args[2]
            writing = type_of(flags) is not int_t or flags & write_flags != 0
            if type_of(mode) is str_t and ("w" in mode or "a" in mode or "x" in mode or "+" in mode):
                writing = True
            items = [(path, 1 if writing else 0)]
        elif event in path_events:
            for name, written, read in path_positions:
                if name == event:
                    for position in written:
                        if position < length(args):
                            items.append((args[position], 1))
                    for position in read:
                        if position < length(args):
                            items.append((args[position], 0))
        elif event == "object.__setattr__":
            name = args[1] if length(args) > 1 else ""
            name_type = type_of(name)
            if name_type is not str_t:
                name = str_copy(name, whole) if is_subclass(name_type, str_t) else ""
            if name == "__code__":
                refusal = "rewriting a function's code"
        elif event == "marshal.loads":
            # Only the import system loading a compiled module of the interpreter's own install, and only when
            # the bytes match that file: crafted bytecode can corrupt memory and with it this guard.
            refusal = "building code from marshal data"
            caller = getframe(1)
            if compile_bytecode is not None and caller.f_code is compile_bytecode:
                local = caller.f_locals
                payload, compiled = local.get("data"), local.get("bytecode_path")
                data_type = type_of(payload)
                if compiled is not None and (
                    data_type is bytes_t or data_type is memoryview_t and type_of(payload.obj) is bytes_t  # type: ignore[union-attr]
                ):
                    refusal = None
                    items = [(compiled, 3)]
        if refusal is None:
            for obj, kind in items:
                obj_type = type_of(obj)
                if obj is None or obj_type is int_t or obj_type is bool_t:
                    if kind < 2:
                        continue  # an open fd (or the cwd): nothing new is reached
                    refusal = "loading code from a file descriptor"
                    break
                if obj_type is str_t:
                    path = obj
                elif obj_type is bytes_t:
                    path = decode(obj, fs_encoding, fs_errors)
                elif is_subclass(obj_type, str_t):
                    path = str_copy(obj, whole)
                elif is_subclass(obj_type, bytes_t):
                    path = decode(bytes_copy(obj, whole), fs_encoding, fs_errors)
                else:  # os.* calls __fspath__ before the audit event and again for us: two answers
                    refusal = "using a path object the guard cannot check (pass the path as a str)"
                    break
                # Resolve like os.path.realpath, with captured C calls only.
                try:
                    full = path if path[:1] == "/" else getcwd() + "/" + path
                    pending = full.split("/")
                    pending.reverse()
                    current = ""  # the resolved prefix; "" is "/"
                    hops = 0
                    while pending:
                        part = pending.pop()
                        if part == "" or part == ".":
                            continue
                        if part == "..":
                            current = current[: current.rfind("/")] if current else ""
                            continue
                        candidate = current + "/" + part
                        try:
                            mode = lstat(candidate).st_mode
                        except os_error:
                            mode = 0
                        if mode & 0o170000 == 0o120000:
                            hops += 1
                            if hops > 40:
                                raise value_error("too many symbolic links")
                            target = readlink(candidate)
                            if target[:1] == "/":
                                current = ""
                            more = target.split("/")
                            more.reverse()
                            pending.extend(more)
                            continue
                        current = candidate
                    resolved = current or "/"
                except (os_error, value_error):
                    refusal = "reaching " + show(path) + " (it cannot be resolved)"
                    break
                allowed = write_roots if kind == 1 else read_roots if kind == 0 else code_roots
                inside = False
                for root, prefix in allowed:
                    if resolved == root or resolved.startswith(prefix):
                        inside = True
                        break
                if not inside:
                    if kind == 1:
                        refusal = "writing " + show(path) + " outside the sandbox's work directory"
                    elif kind == 0:
                        refusal = "reading " + show(path)
                    elif kind == 2:
                        refusal = "loading native code from " + show(path)
                    else:
                        refusal = "loading compiled code from " + show(path)
                    break
                if kind == 3:  # the bytes must be that file's, past its 16-byte header
                    try:
                        handle = open_fd(resolved, read_only)
                        try:
                            chunks = []
                            chunk = read_fd(handle, 1 << 20)
                            while chunk:
                                chunks.append(chunk)
                                chunk = read_fd(handle, 1 << 20)
                        finally:
                            close_fd(handle)
                        matches = b"".join(chunks)[16:] == payload
                    except os_error:
                        matches = False
                    if not matches:
                        refusal = "loading compiled code that does not match " + show(path)
                        break
        if refusal is None:
            return
        try:  # recorded before refusing, so catching the exception does not hide the attempt
            log = fstat(violations_fd)
            if log.st_dev != log_dev or log.st_ino != log_ino:
                exit_now(126)  # the snippet replaced the guard's log: stop here
            write(violations_fd, encode(refusal, "utf-8", "backslashreplace") + b"\n")
        except os_error:
            exit_now(126)
        raise violation("sandbox: " + refusal + " is not allowed")

    return guard


def _roots(paths):
    """((root, root + "/"), ...) for the resolved paths, never "/" itself."""
    import os

    resolved = sorted({os.path.realpath(p) for p in paths if p} - {"/"})
    return tuple((root, root.rstrip("/") + "/") for root in resolved)


def _run(code, max_repr_chars, _ast, builtins, captured):
    """Run like a REPL: statements execute, and the value of a final expression is reported as its repr.

    `captured`: builtins bound before the snippet ran, which may rebind them in the builtins module."""
    show, text, type_of, is_instance, attribute, int_t = captured
    try:
        tree = compile(code, "<snippet>", "exec", _ast.PyCF_ONLY_AST)
        last = tree.body.pop() if tree.body and is_instance(tree.body[-1], _ast.Expr) else None
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(tree, "<snippet>", "exec"), namespace)
        if last is None:
            return {"outcome": "ok", "value": None}
        value = eval(compile(_ast.Expression(last.value), "<snippet>", "eval"), namespace)
        return {"outcome": "ok", "value": text(show(value))[:max_repr_chars]}
    except BaseException as err:  # noqa: BLE001 - the snippet's own failure is the result
        try:
            import traceback  # only now: most snippets do not raise

            traceback.print_exc(limit=-5)
        except BaseException:  # noqa: BLE001 - stderr may be over its size limit, or the snippet broke imports
            pass
        code = attribute(err, "errno", None)
        return {
            "outcome": "exception",
            "exception": text(type_of(err).__name__),
            "message": text(err)[:500],
            "errno": code if type_of(code) is int_t else None,
        }


if __name__ == "__main__":
    globals().pop("_main")()  # not left in __main__'s globals while the snippet runs
