"""Attacks on the Act tools: every attempt must be contained AND reported (a status and a reason).

Each attack runs in every sandbox this machine offers ("rlimits" always, "bwrap" when usable), first with
the audit guard (the default: the attempt is refused and named), then, where the OS layer alone must hold,
with `guard=False`. The snippets that attack the guard itself first (its tables through sys.modules, gc,
frames and tracebacks, the helpers it once trusted, re-imports, posix and _io directly) then go for the host:
each test asserts the host-side effect did not happen (no file, no connection, the outside process still
runs, no process left), not just a status. Everything is capped so no test can harm the machine: processes
under RLIMIT_NPROC, memory under RLIMIT_AS, time under a short wall clock; writes aim at a fresh folder
under /tmp that the test removes, and any process a failed test leaves is killed.
"""

from __future__ import annotations

import ast
import dis
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from pathlib import Path

import pytest

from surprisegate.arms import Query, _sandbox_runner, sandbox
from surprisegate.arms.sandbox import SandboxLimits, bwrap_status, isolation_status, run_python
from surprisegate.arms.tools import ToolArm
from surprisegate.errors import ArmError

MODES = ["rlimits"] + (["bwrap"] if bwrap_status()[0] else [])
LIMITS = SandboxLimits(timeout_s=3.0, max_processes=4)
EACH_ATTACK_S = 5.0  # no attack may take longer than this to be contained
AS_ROOT = os.geteuid() == 0
CHECKOUT = Path(__file__).resolve().parents[1]
NAMESPACES_HERE = isolation_status("rlimits")[0]
needs_namespaces = pytest.mark.skipif(not NAMESPACES_HERE, reason="this kernel or container refuses namespaces")


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


@pytest.fixture
def open_dir():
    """A world-writable directory outside the sandbox (under /tmp, not pytest's private tmp_path): only the
    sandbox, not file permissions, keeps the snippet from writing or reading here."""
    target = Path(tempfile.mkdtemp(prefix="surprisegate-attack-"))
    target.chmod(0o777)
    yield target
    shutil.rmtree(target, ignore_errors=True)


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)
    yield server
    server.close()


def _someone_connected(server: socket.socket) -> bool:
    try:
        connection, _ = server.accept()
    except OSError:  # includes the accept timeout
        return False
    connection.close()
    return True


def attack(code: str, mode: str, guard: bool = True, limits: SandboxLimits = LIMITS):
    started = time.monotonic()
    result = run_python(code, limits, mode=mode, guard=guard)
    assert time.monotonic() - started < EACH_ATTACK_S
    assert result.status != "ok" or guard is False, result
    assert result.reason  # reported
    return result


# --------------------------------------------------------------------------------------------------
# filesystem


def test_write_outside_the_work_dir_is_blocked(mode, open_dir):
    target = open_dir / "pwned"
    result = attack(f"open({str(target)!r}, 'w').write('x')", mode)
    assert result.status == "blocked"
    assert "writing" in result.reason
    assert not target.exists()


def test_write_outside_is_contained_by_bwrap_alone(open_dir):
    if "bwrap" not in MODES:
        pytest.skip("bwrap is not usable here")
    target = open_dir / "pwned"
    result = attack(f"open({str(target)!r}, 'w').write('x')", "bwrap", guard=False)
    assert result.status == "error"  # the path does not even exist in the sandbox
    assert not target.exists()
    # Nor can it write over the interpreter or the system: those are read-only binds.
    result = attack("open('/usr/lib/pwned', 'w')", "bwrap", guard=False)
    assert result.status == "error" and result.exception in ("OSError", "PermissionError", "FileNotFoundError")


def test_reading_a_secret_outside_is_blocked(mode, open_dir):
    secret = open_dir / "secret.txt"
    secret.write_text("TOPSECRET", encoding="utf-8")
    secret.chmod(0o644)
    result = attack(f"open({str(secret)!r}).read()", mode)
    assert result.status == "blocked"
    assert "reading" in result.reason
    assert "TOPSECRET" not in (result.value or "") + result.stdout + result.stderr + result.reason


def test_reading_a_secret_is_contained_by_bwrap_alone(open_dir):
    if "bwrap" not in MODES:
        pytest.skip("bwrap is not usable here")
    secret = open_dir / "secret.txt"
    secret.write_text("TOPSECRET", encoding="utf-8")
    result = attack(f"open({str(secret)!r}).read()", "bwrap", guard=False)
    assert result.exception == "FileNotFoundError"
    assert "TOPSECRET" not in (result.value or "") + result.stdout


# --------------------------------------------------------------------------------------------------
# processes, memory, time


def test_fork_bomb_is_blocked(mode):
    result = attack("import os\nwhile True:\n    os.fork()", mode)
    assert result.status == "blocked"
    assert "forking" in result.reason


def test_fork_bomb_is_capped_by_rlimit_nproc_alone(mode):
    result = attack("import os\nwhile True:\n    os.fork()", mode, guard=False)
    assert result.status in ("process_limit", "error", "killed", "timeout")


def test_process_count_stays_under_the_cap(mode):
    # Forks sleeping children until the kernel refuses; the count shows the cap held. The children are
    # killed with the pid namespace when the run ends.
    code = (
        "import os, time\ncount = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    count += 1\ncount"
    )
    result = attack(code, mode, guard=False)
    assert result.status == "ok"
    if AS_ROOT:  # a per-run uid: RLIMIT_NPROC counts only this run's processes, so the cap is exact
        assert int(result.value) == LIMITS.max_processes
    else:  # the user's own processes (or, in a user namespace, the bootstrap's) share the count
        assert int(result.value) <= LIMITS.max_processes


def test_subprocess_and_shell_are_blocked(mode, open_dir):
    marker = open_dir / "touched"
    for code in (
        f"import os\nos.system('touch {marker}')",
        f"import subprocess\nsubprocess.run(['touch', {str(marker)!r}])",
        f"import os\nos.execv('/usr/bin/touch', ['touch', {str(marker)!r}])",
        f"import os\nos.posix_spawn('/usr/bin/touch', ['touch', {str(marker)!r}], {{}})",
    ):
        result = attack(code, mode)
        assert result.status == "blocked", code
    assert not marker.exists()


def test_a_shell_inside_bwrap_cannot_reach_the_host(open_dir):
    if "bwrap" not in MODES:
        pytest.skip("bwrap is not usable here")
    marker = open_dir / "touched"
    attack(f"import os\nos.system('touch {marker}')", "bwrap", guard=False)
    assert not marker.exists()


def test_ctypes_and_signals_are_blocked(mode):
    assert attack("import ctypes\nctypes.CDLL(None).getpid()", mode).status == "blocked"
    assert attack("import os\nos.kill(1, 9)", mode).status == "blocked"


def test_memory_bomb_hits_the_memory_limit(mode):
    for guard in (True, False):
        result = attack("x = bytearray(8 * 2**30)", mode, guard=guard)
        assert result.status == "memory_limit"
        assert "memory limit" in result.reason
        result = attack("chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))", mode, guard=guard)
        assert result.status == "memory_limit"


def test_infinite_loop_is_killed_at_the_wall_clock_limit(mode):
    started = time.monotonic()
    result = attack("while True:\n    pass", mode, limits=SandboxLimits(timeout_s=0.5))
    assert result.status == "timeout"
    assert "wall-clock" in result.reason
    assert time.monotonic() - started < 2.0


def test_sleeping_forever_is_killed_too(mode):
    result = attack("import time\ntime.sleep(3600)", mode, limits=SandboxLimits(timeout_s=0.5))
    assert result.status == "timeout"


def test_huge_output_is_capped(mode):
    result = attack("while True:\n    print('x' * 10000)", mode, limits=SandboxLimits(timeout_s=2.0))
    assert result.status in ("file_size_limit", "timeout")
    assert len(result.stdout) <= LIMITS.max_output_chars


# --------------------------------------------------------------------------------------------------
# network


def test_network_connect_is_blocked(mode, listener):
    port = listener.getsockname()[1]
    result = attack(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)", mode)
    assert result.status == "blocked"
    assert "network" in result.reason
    assert not _someone_connected(listener)


def test_network_is_contained_by_the_namespace_alone(mode, listener):
    port = listener.getsockname()[1]
    code = f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n'connected'"
    result = attack(code, mode, guard=False)
    if result.isolation.get("network") != "netns":
        pytest.skip("no network namespace here (rlimits without unshare): the audit guard is the only barrier")
    assert result.status == "error"
    assert result.value != "'connected'"
    assert not _someone_connected(listener)


# --------------------------------------------------------------------------------------------------
# attacks on the guard itself, then on the host (the red team's findings)

# Each prelude tries to switch the audit guard off from inside the snippet, as the red team did against the
# old guard (whose tables were globals of `python -c`'s __main__). They swallow their own failures, so
# the host attacks after them always run.
GUARD_ATTACKS = {
    "main-globals": """
import sys
main = sys.modules["__main__"]
for name in ("BLOCKED_EVENTS", "BLOCKED_IMPORTS", "PATH_EVENTS", "SOCKET_WORDS", "EXTRA_READ_ROOTS"):
    try:
        getattr(main, name).clear()
    except Exception:
        pass
for value in list(vars(main).values()):
    try:
        if isinstance(value, (dict, set, list)) and value is not vars(main):
            value.clear()
    except Exception:
        pass
""",
    "gc": """
import gc
try:
    for obj in gc.get_objects():
        if isinstance(obj, (dict, set)) and "os.system" in obj:
            obj.clear()
except Exception:
    pass
try:
    for ref in gc.get_referrers(__import__("os").system):
        if isinstance(ref, dict):
            ref.clear()
except Exception:
    pass
""",
    "frames": """
import sys
def _empty(value):
    if isinstance(value, (dict, set, list)) and value is not globals():
        try:
            value.clear()
        except Exception:
            pass
def _cells(function):
    for cell in getattr(function, "__closure__", None) or ():
        try:
            contents = cell.cell_contents
            if isinstance(contents, (frozenset, tuple)):
                cell.cell_contents = type(contents)()
            elif callable(contents):
                cell.cell_contents = lambda *a, **k: "/tmp/work"
        except Exception:
            pass
frame = sys._getframe()
while frame is not None:
    for space in (frame.f_locals, frame.f_globals):
        if space is not globals():
            for value in list(space.values()):
                _empty(value)
                if callable(value):
                    _cells(value)
    frame = frame.f_back
""",
    "traceback-frames": """
def _poison(frame):
    while frame is not None:
        if frame.f_globals is not globals() or frame.f_code.co_name != "<module>":
            for value in list(frame.f_locals.values()):
                if isinstance(value, (dict, set, list)) and value is not globals():
                    try:
                        value.clear()
                    except Exception:
                        pass
                for cell in getattr(value, "__closure__", None) or ():
                    try:
                        cell.cell_contents = type(cell.cell_contents)()
                    except Exception:
                        pass
        frame = frame.f_back
try:
    open("/etc/shadow")  # refused by the guard: its traceback holds the guard's own frame
except BaseException as caught:
    tb = caught.__traceback__
    while tb is not None:
        try:
            _poison(tb.tb_frame)
        except Exception:
            pass
        tb = tb.tb_next
""",
    "patched-helpers": """
import builtins, os, os.path, posixpath, posix
inside = lambda *a, **k: "/tmp/work/x"
for module in (os.path, posixpath):
    for name in ("realpath", "abspath", "normpath", "join"):
        setattr(module, name, inside)
os.fsdecode = os.fspath = os.fsencode = lambda p: "/tmp/work/x"
os.getcwd = posix.getcwd = lambda: "/"
posix.lstat = os.lstat = lambda *a, **k: os.stat("/")
builtins.isinstance = lambda *a: True
builtins.any = lambda *a: True
builtins.len = lambda *a: 0
builtins.repr = lambda *a: "'/tmp/work/x'"
builtins.type = lambda *a: str
builtins.PermissionError = type("Harmless", (Exception,), {})
""",
    "reimport": """
import sys, importlib
saved = dict(sys.modules)
for name in ("os", "posixpath", "io", "socket", "_socket", "builtins", "__main__"):
    sys.modules.pop(name, None)
try:
    import os, socket
    importlib.reload(importlib.import_module("os"))
except Exception:
    sys.modules.update(saved)  # without namespaces the stdlib may be unreadable after the uid drop
""",
    "code-objects": """
import marshal
for build in (
    lambda: (lambda: 0).__code__.replace(co_consts=(None,)),
    lambda: marshal.loads(marshal.dumps((lambda: 0).__code__)),
    lambda: setattr(lambda: 0, "__code__", (lambda: 1).__code__),
):
    try:
        build()
    except Exception:
        pass
for name in ("_testcapi", "_testinternalcapi", "_xxsubinterpreters", "ctypes", "_ctypes"):
    try:
        __import__(name)
    except BaseException:
        pass
""",
}
# Host attempts that may "succeed" inside the sandbox without reaching the host (a shell that runs in it).
HARMLESS_INSIDE = {"shell", "write via chdir"}


def _host_attacks(open_dir: Path, port: int, pids: list[int]) -> str:
    """The host-reaching attempts, with the lowest-level calls (posix, _io, _socket); the final expression
    maps each attempt to ("ok", what it got) or (exception type, message)."""
    return f"""
import posix, _io
out = {{}}
def attempt(name, function):
    try:
        out[name] = ("ok", repr(function())[:400])
    except BaseException as err:
        out[name] = (type(err).__name__, str(err)[:120])
attempt("read passwd (_io)", lambda: _io.FileIO("/etc/passwd").read())
attempt("read passwd (posix)", lambda: posix.read(posix.open("/etc/passwd", posix.O_RDONLY), 4096))
attempt("read cmdline", lambda: _io.FileIO("/proc/{os.getpid()}/cmdline").read())
attempt("list checkout", lambda: posix.listdir({str(CHECKOUT)!r}))
attempt("scan checkout", lambda: [entry.name for entry in posix.scandir({str(CHECKOUT)!r})])
flags = posix.O_WRONLY | posix.O_CREAT
attempt("write (posix)", lambda: posix.write(posix.open({str(open_dir / "posix")!r}, flags, 0o666), b"x"))
attempt("write (_io)", lambda: _io.FileIO({str(open_dir / "io")!r}, "w").write(b"x"))
attempt("write via chdir", lambda: (posix.chdir({str(open_dir)!r}), _io.FileIO("chdir", "w").write(b"x")))
attempt("read via symlink", lambda: (posix.symlink("/etc/passwd", "link"), _io.FileIO("link").read()))
attempt("shell", lambda: posix.system("id > {open_dir}/id; touch {open_dir}/shell"))
def connect():
    import _socket
    s = _socket.socket()
    s.settimeout(1)
    s.connect(("127.0.0.1", {port}))
    return "connected"
attempt("connect", connect)
for pid in {pids!r}:
    attempt(f"kill {{pid}}", lambda pid=pid: posix.kill(pid, 9))
out
"""


SHARED_UID = sandbox.SANDBOX_UID_RANGE[0] + 4242  # an outside process with the sandbox's own uid


@pytest.fixture
def outside(monkeypatch):
    """Processes outside the sandbox: a `sleep` of this test's user, and (as root) one that runs as the
    very uid the sandbox gets, so that only the pid namespace can keep the snippet from signalling it."""
    started = [subprocess.Popen(["sleep", "60"])]
    if AS_ROOT:
        monkeypatch.setattr(sandbox, "_claim_uid", lambda: SHARED_UID)
        started.append(subprocess.Popen(["sleep", "60"], user=SHARED_UID, group=SHARED_UID))
    yield started
    for process in started:
        process.kill()
        process.wait()


def _still_running(processes) -> bool:
    return all(process.poll() is None for process in processes)


def _host_secrets() -> dict[str, str]:
    """Text that must never appear in what the snippet got back."""
    with open("/etc/passwd", encoding="utf-8", errors="replace") as handle:
        passwd = handle.readline().strip()
    with open("/proc/self/cmdline", "rb") as handle:
        cmdline = handle.read().split(b"\0")
    return {
        "/etc/passwd": passwd,
        "this test's cmdline": max((part.decode(errors="replace") for part in cmdline), key=len),
        "the checkout's listing": "pyproject.toml",
    }


def _assert_host_untouched(result, open_dir: Path, listener, processes) -> None:
    text = (result.value or "") + result.stdout + result.stderr + result.reason
    for what, secret in _host_secrets().items():
        assert secret not in text, f"{what} leaked into the result"
    assert sorted(os.listdir(open_dir)) == [], "the snippet wrote into the host's /tmp"
    assert not _someone_connected(listener), "the snippet reached the loopback listener"
    assert _still_running(processes), "the snippet killed a process outside the sandbox"


def _attempts(result) -> dict | None:
    """The snippet's own account of each attempt; None where the prelude garbled it (a rebound repr)."""
    try:
        attempts = ast.literal_eval(result.value or "")
    except (ValueError, SyntaxError):
        return None
    return attempts if isinstance(attempts, dict) else None


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
@pytest.mark.parametrize("prelude", sorted(GUARD_ATTACKS))
def test_attacks_on_the_guard_then_the_host_are_contained(mode, guard, prelude, open_dir, listener, outside):
    port = listener.getsockname()[1]
    code = GUARD_ATTACKS[prelude] + _host_attacks(open_dir, port, [process.pid for process in outside])
    started = time.monotonic()
    result = run_python(code, LIMITS, mode=mode, guard=guard)
    assert time.monotonic() - started < EACH_ATTACK_S
    _assert_host_untouched(result, open_dir, listener, outside)
    assert result.isolation["full"] is True, result.isolation
    if guard:
        assert result.status == "blocked", result  # the guard stayed on, and said what it refused
        assert result.violations
    attempts = _attempts(result)
    if attempts is not None:  # every host attempt failed (or ran inside the sandbox only)
        succeeded = [name for name, (outcome, _) in attempts.items() if outcome == "ok" and name not in HARMLESS_INSIDE]
        assert succeeded == [], attempts
        if guard:  # each refused by the guard (a prelude that rebinds builtins.type garbles only the name)
            refused = [
                outcome == "SandboxViolation" or detail.startswith("sandbox: ") for outcome, detail in attempts.values()
            ]
            assert all(refused), attempts


@pytest.mark.parametrize("prelude", sorted(GUARD_ATTACKS))
def test_without_namespaces_the_guard_alone_holds_against_attacks_on_it(monkeypatch, prelude, open_dir, listener):
    # The weak fallback a kernel without namespaces gives: the host's filesystem, no pid or network
    # namespace; only the uid and the guard stand between the snippet and the host, so the guard must hold.
    monkeypatch.setattr(sandbox, "_NAMESPACES", False)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        code = GUARD_ATTACKS[prelude] + _host_attacks(open_dir, listener.getsockname()[1], [victim.pid])
        started = time.monotonic()
        result = run_python(code, LIMITS, mode="rlimits", guard=True)
        assert time.monotonic() - started < EACH_ATTACK_S
        assert result.isolation["filesystem"] == "none" and result.isolation["full"] is False
        _assert_host_untouched(result, open_dir, listener, [victim])
        assert result.status in ("blocked", "error"), result
        attempts = _attempts(result)
        if attempts is not None:
            assert all(outcome != "ok" for outcome, _ in attempts.values()), attempts
    finally:
        victim.kill()
        victim.wait()


# Ways around an audit hook that need no table at all: native code or crafted bytecode (which can corrupt
# memory, the guard's too), modules whose C code touches files without audit events, paths that answer
# differently on a second look.
GUARD_BYPASSES = r"""
import sys, os, marshal
external = sys.modules["_frozen_importlib_external"]
out = {}
def attempt(name, function):
    try:
        out[name] = ("ok", repr(function())[:200])
    except BaseException as err:
        out[name] = (type(err).__name__, str(err)[:150])
def native():
    open("evil" + external.EXTENSION_SUFFIXES[0], "wb").write(b"\x7fELF" + b"\0" * 60)
    sys.path.insert(0, os.getcwd())
    import evil
attempt("native module from the work dir", native)
def crafted_pyc():
    os.makedirs("pkgx/__pycache__", exist_ok=True)
    open("pkgx/__init__.py", "w").write("x = 1\n")
    pyc = external.cache_from_source(os.path.abspath("pkgx/__init__.py"))
    st = os.stat("pkgx/__init__.py")
    stamp = int(st.st_mtime).to_bytes(4, "little") + st.st_size.to_bytes(4, "little")
    header = external.MAGIC_NUMBER + b"\0\0\0\0" + stamp
    open(pyc, "wb").write(header + marshal.dumps((lambda: 1).__code__))
    sys.path.insert(0, os.getcwd())
    import pkgx
attempt("crafted pyc", crafted_pyc)
crafted = marshal.dumps((lambda: 1).__code__) if hasattr(marshal, "dumps") else b""
stdlib_pyc = external.cache_from_source(os.__file__)
attempt("_compile_bytecode", lambda: external._compile_bytecode(crafted))
compile_bytecode = external._compile_bytecode
attempt("_compile_bytecode, a stdlib path, other bytes", lambda: compile_bytecode(crafted, bytecode_path=stdlib_pyc))
mutable = memoryview(bytearray(open(stdlib_pyc, "rb").read())[16:])
attempt("_compile_bytecode, mutable bytes", lambda: compile_bytecode(mutable, bytecode_path=stdlib_pyc))
attempt("frozen object from data", lambda: __import__("_imp").get_frozen_object("zipimport", crafted))
for name in ("pwd", "readline", "_tkinter", "_xxsubinterpreters", "_testcapi", "ctypes", "_posixshmem"):
    attempt("import " + name, lambda name=name: __import__(name))
class Sneaky(str):
    def startswith(self, *a):
        return True
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
attempt("str subclass path", lambda: open(Sneaky("/etc/passwd")).read())
def twice():
    class Twice:
        calls = 0
        def __fspath__(self):
            Twice.calls += 1
            return "/etc/passwd" if Twice.calls == 1 else "harmless.txt"
    return Twice()
attempt("path that answers twice", lambda: open(twice()).read())
attempt("path object to os.open", lambda: os.open(twice(), os.O_RDONLY))
def patched_entry():
    entry = next(os.scandir("."))
    type(entry).__fspath__ = lambda self: "/etc/passwd"
    return os.read(os.open(entry, os.O_RDONLY), 100)
open("an-entry", "w").close()
attempt("DirEntry with a patched __fspath__", patched_entry)
attempt("reopen stdout by /proc", lambda: open("/proc/self/fd/1", "w"))
attempt("sqlite outside", lambda: __import__("sqlite3").connect("/tmp/surprisegate-attack.db"))
attempt("another audit hook", lambda: sys.addaudithook(lambda *a: None))
attempt("shell after that", lambda: os.system("true"))
attempt("a file in the work dir", lambda: open("fine.txt", "w").write("x"))
attempt("pathlib in the work dir", lambda: __import__("pathlib").Path("fine2.txt").write_text("x"))
out
"""
MAY_RUN = {"another audit hook", "a file in the work dir", "pathlib in the work dir"}


def test_the_guard_refuses_the_ways_around_an_audit_hook(mode):
    result = run_python(GUARD_BYPASSES, SandboxLimits(timeout_s=5.0), mode=mode)
    assert result.status == "blocked", result
    attempts = ast.literal_eval(result.value)
    for name, (outcome, detail) in attempts.items():
        if name in MAY_RUN:
            assert outcome == "ok", (name, detail)
        elif name != "frozen object from data":
            assert outcome == "SandboxViolation", (name, outcome, detail)
        else:  # _imp turns the guard's refusal of marshal.loads into an ImportError
            assert outcome != "ok", (name, detail)
    assert not os.path.exists("/tmp/surprisegate-attack.db")


def test_the_guard_keeps_nothing_a_snippet_could_change(tmp_path):
    # The guard's closure: immutable values and C functions only; its code reads no global (a global is a
    # name in __main__ or builtins, which the snippet can rebind).
    with open(tmp_path / "violations", "wb") as log:
        guard = _sandbox_runner._make_guard(str(tmp_path), log.fileno())
    immutable = (frozenset, tuple, str, bytes, int, bool, type(None), slice, types.CodeType)
    c_functions = (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)
    immutable_type = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE: str, bytes, posix.DirEntry, ... (attributes cannot be set)

    def frozen(value) -> bool:
        if isinstance(value, (tuple, frozenset)):
            return all(frozen(item) for item in value)
        if isinstance(value, type):
            return bool(value.__flags__ & immutable_type)
        return type(value) in immutable or isinstance(value, c_functions)

    for name, cell in zip(guard.__code__.co_freevars, guard.__closure__, strict=True):
        value = cell.cell_contents
        if value is _sandbox_runner.SandboxViolation:
            continue  # a Python class, but raising it always raises, whatever the snippet does to it
        assert frozen(value), (name, type(value))
        assert not isinstance(value, types.FunctionType), name  # a Python helper's cells would be writable
    opcodes = {instruction.opname for instruction in dis.get_instructions(guard)}
    assert not opcodes & {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "LOAD_CLASSDEREF"}, opcodes
    assert guard.__globals__ is vars(_sandbox_runner)  # unused: nothing in the code reads it


def test_the_guard_resolves_paths_as_the_kernel_does(tmp_path):
    # The guard's own realpath (captured C calls only) against os.path.realpath, on links in and out of work.
    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("x", encoding="utf-8")
    (work / "inner").write_text("x", encoding="utf-8")
    (work / "to-outside").symlink_to(outside / "secret")
    (work / "relative-out").symlink_to("../outside/secret")
    (work / "to-inner").symlink_to("inner")
    (work / "sub" / "up-in").symlink_to("../inner")
    (work / "dir-out").symlink_to(outside, target_is_directory=True)
    (work / "loop-a").symlink_to("loop-b")
    (work / "loop-b").symlink_to("loop-a")
    with open(tmp_path / "violations", "wb") as log:
        guard = _sandbox_runner._make_guard(str(work), log.fileno())

        def writable(path: str) -> bool:
            try:
                guard("open", (path, "w", os.O_WRONLY | os.O_CREAT))
            except _sandbox_runner.SandboxViolation:
                return False
            return True

        inside = {"inner", "to-inner", "sub/up-in", "sub/../inner", "./sub/./../inner", "new-file", "sub/new"}
        escapes = {"to-outside", "relative-out", "dir-out/secret", "../outside/secret", "sub/../../outside/x"}
        for name in sorted(inside | escapes):
            path = str(work / name)
            expected = os.path.realpath(path).startswith(str(work.resolve()) + "/")
            assert expected == (name in inside), name  # the table above agrees with the kernel's view
            assert writable(path) is expected, name
        assert not writable(str(work / "loop-a"))  # a symlink loop is refused, not followed forever
        assert not writable(str(outside) + "/../work/../outside/secret")
        assert writable(str(outside) + "/../work/inner")


def _host_processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _setsid_grandchild(marker: str, then: str) -> str:
    sleep = shutil.which("sleep", path="/usr/bin:/bin")
    return (
        "import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv({sleep!r}, ['sleep', {marker!r}])\n    os._exit(0)\n"
        f"os.waitpid(pid, 0)\ntime.sleep(0.3)\n{then}"
    )


def _run_watching(marker: str, code: str, **kwargs):
    """Run `code`, watching the host's /proc for a process with `marker` in its argv meanwhile: (the result,
    whether one was seen during the run, those left right after it). Kills any left, even when asserts fail."""
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.extend(_host_processes_with(marker))
            stop.wait(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_python(code, SandboxLimits(timeout_s=1.5, max_processes=4), **kwargs)
        left = _host_processes_with(marker)
    finally:
        stop.set()
        watcher.join()
        for pid in _host_processes_with(marker):  # never leave one behind, even when the test fails
            os.kill(pid, 9)
    return result, bool(seen), left


@needs_namespaces
@pytest.mark.parametrize("ending", ["timeout", "snippet-exits"])
def test_a_setsid_grandchild_does_not_outlive_the_run(mode, ending):
    # The red team's grandchild left the process group with setsid and outlived the old group kill. Now it
    # is in the sandbox's pid namespace, which ends with the run. Its argv carries a unique marker.
    marker = f"59.{uuid.uuid4().int % 10**9:09d}"
    then = "time.sleep(60)" if ending == "timeout" else "'left it running'"
    result, seen, left = _run_watching(marker, _setsid_grandchild(marker, then), mode=mode, guard=False)
    assert seen, "the grandchild never started: the test proves nothing"
    assert left == [], f"a setsid grandchild outlived the run: {left}"
    assert result.status == ("timeout" if ending == "timeout" else "ok"), result


@pytest.mark.skipif(not AS_ROOT, reason="killing by the per-run uid needs root")
def test_without_a_pid_namespace_a_setsid_grandchild_is_killed_by_its_uid(monkeypatch):
    monkeypatch.setattr(sandbox, "_NAMESPACES", False)
    marker = f"59.{uuid.uuid4().int % 10**9:09d}"
    code = _setsid_grandchild(marker, "len([p for p in os.listdir('/proc') if p.isdigit()])")
    result, seen, left = _run_watching(marker, code, mode="rlimits", guard=False)
    assert result.status == "ok" and result.isolation["pid"] == "none"
    assert int(result.value or 0) > 20  # it saw the host's processes: there was no pid namespace
    assert seen, "the grandchild never started: the test proves nothing"
    assert left == [], f"a setsid grandchild outlived the run: {left}"


def test_the_guard_refuses_the_grandchild_before_it_exists(mode):
    result = attack("import os\nif os.fork() == 0:\n    os.setsid()", mode)
    assert result.status == "blocked"
    assert "forking" in result.reason


@needs_namespaces
def test_signals_reach_no_process_outside_not_even_of_the_same_uid(mode, outside):
    # As root the outside `sleep` runs as the very uid the sandbox is given: only the pid namespace keeps
    # it out of reach. kill(-1) signals everything the snippet may signal but itself.
    pids = [process.pid for process in outside]
    code = f"import os\nfor pid in {pids!r}:\n    try:\n        os.kill(pid, 9)\n    except OSError:\n        pass\n"
    code += "os.kill(-1, 9)"
    result = attack(code, mode, guard=False)
    # kill(-1) spares the caller: "no such process" means there was nothing else it could signal.
    assert (result.status, result.exception) == ("error", "ProcessLookupError"), result
    time.sleep(0.05)
    assert _still_running(outside)


@needs_namespaces
def test_the_snippet_sees_only_its_own_processes_and_has_no_privileges(mode):
    code = (
        "import os\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "(pids, open('/proc/1/cmdline', 'rb').read()[:40], status['NoNewPrivs'].strip(), status['CapEff'].strip(),"
        " status['CapPrm'].strip(), os.getuid(), os.uname().nodename, sorted(os.listdir('/')))"
    )
    result = run_python(code, LIMITS, mode=mode, guard=False)
    assert result.status == "ok", result
    pids, init_cmdline, no_new_privs, effective, permitted, uid, hostname, top = ast.literal_eval(result.value)
    assert max(pids) < 20 and os.getpid() not in pids  # a fresh pid namespace: a handful of small pids
    assert b"systemd" not in init_cmdline and b"init" not in init_cmdline.split(b"\0")[0]
    assert no_new_privs == "1"
    assert int(effective, 16) == 0 and int(permitted, 16) == 0
    assert uid != 0 and (not AS_ROOT or sandbox.SANDBOX_UID_RANGE[0] <= uid < sandbox.SANDBOX_UID_RANGE[1])
    assert hostname == "sandbox"
    # The root holds only what was bound: the system trees, the interpreter's install, /proc, /dev, /tmp.
    installs = {tree.split("/")[1] for tree in sandbox._install_trees(os.path.realpath(sys.executable))}
    assert set(top) <= {"usr", "lib", "lib64", "lib32", "libx32", "bin", "sbin", "proc", "dev", "tmp"} | installs
    assert "etc" not in top
    # A checkout under /tmp (CI's fresh clone) shares its top folder with the sandbox's own /tmp scratch.
    if CHECKOUT.parts[1] != "tmp":
        assert CHECKOUT.parts[1] not in set(top) - installs


@pytest.mark.skipif(not AS_ROOT, reason="per-run uids are for a server running as root")
def test_each_run_gets_a_uid_no_other_process_has(monkeypatch):
    uids = {int(run_python("import os\nos.getuid()", mode="rlimits").value) for _ in range(3)}
    assert len(uids) == 3
    low, high = sandbox.SANDBOX_UID_RANGE
    assert all(low <= uid < high for uid in uids) and sandbox.SANDBOX_UID not in uids
    # A uid some process already has is skipped.
    taken = low + 7
    monkeypatch.setattr(sandbox, "_process_uids", lambda: {taken})
    draws = iter([7, 7, 8])
    monkeypatch.setattr(sandbox.secrets, "randbelow", lambda n: next(draws))
    assert sandbox._claim_uid() == low + 8
    sandbox._release_uid(low + 8)


# --------------------------------------------------------------------------------------------------
# where the kernel refuses namespaces: say so, and refuse when full isolation is required


@needs_namespaces
def test_the_rlimits_sandbox_reports_full_isolation_here():
    result = run_python("1 + 1", mode="rlimits", require_isolation=True)
    assert result.status == "ok"
    iso = result.isolation
    assert (iso["filesystem"], iso["pid"], iso["network"], iso["ipc"], iso["uts"]) == (
        "mount-ns",
        "pid-ns",
        "netns",
        "ipc-ns",
        "uts-ns",
    )
    assert iso["full"] is True and iso["guard"] == "audit-hook"
    assert isolation_status("rlimits")[0] is True


def test_without_namespaces_the_weaker_run_says_so_and_can_be_refused(monkeypatch):
    monkeypatch.setattr(sandbox, "_NAMESPACES", False)
    monkeypatch.setattr(sandbox, "_isolation_probes", {})
    weak = run_python("1 + 1", mode="rlimits")
    assert weak.status == "ok" and weak.value == "2"
    assert weak.isolation["filesystem"] == "none" and weak.isolation["pid"] == "none"
    assert weak.isolation["network"] == "audit-hook" and weak.isolation["full"] is False
    assert "namespaces" in weak.isolation["why"]
    refused = run_python("open('ran', 'w')", mode="rlimits", require_isolation=True)
    assert refused.status == "unavailable"
    assert "full isolation is unavailable" in refused.reason and "namespaces" in refused.reason
    assert refused.stdout == "" and refused.exit_code is None  # not run at all
    usable, why = isolation_status("rlimits")
    assert usable is False and "namespaces" in why


# --------------------------------------------------------------------------------------------------
# through the tool arm: injection via the span text, file escapes, status allow-list


@pytest.fixture
def roots(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\n", encoding="utf-8")
    return root


def _arm_failure(arm: ToolArm, question: str) -> str:
    try:
        evidence = arm.ground(Query(span="", question=question, sentence=""), time.monotonic() + 5)
    except ArmError as err:
        return str(err)
    # Once in a full fresh-clone run (never alone) this answered instead: say with what, for the next look.
    pytest.fail(f"the tool arm answered instead of refusing: {[(e.source, e.evidence) for e in evidence]!r}")


def test_code_injection_through_the_span_is_blocked(roots, open_dir):
    marker = open_dir / "pwned"
    arm = ToolArm(roots=[roots], warm_up=False)
    message = _arm_failure(arm, f"What does `__import__('os').system('touch {marker}')` return?")
    assert "python@question: blocked" in message
    assert "shell command" in message
    assert not marker.exists()


def test_shell_metacharacters_in_a_filename_are_just_a_missing_file(roots, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep", encoding="utf-8")
    arm = ToolArm(roots=[roots], warm_up=False)
    for question in (
        f"What's in `notes.txt; rm -rf {victim}`?",
        f"What's in `$(rm -rf {victim}).txt`?",
        f"What's in `notes.txt && rm -rf {victim}`?",
    ):
        message = _arm_failure(arm, question)
        assert "files@question: not_found" in message or "outside_roots" in message, message
    assert (victim / "keep.txt").read_text(encoding="utf-8") == "keep"


def test_calculator_refuses_code(roots, open_dir):
    marker = open_dir / "pwned"
    arm = ToolArm(roots=[roots], tools=("calculator",), warm_up=False)
    assert arm.ground(Query("", f"What is __import__('os').system('touch {marker}')?", ""), time.monotonic() + 5) == []
    assert not marker.exists()


def test_file_tool_refuses_parent_and_symlink_escapes(roots, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET", encoding="utf-8")
    (roots / "innocent.txt").symlink_to(secret)
    (roots / "linked").symlink_to(tmp_path, target_is_directory=True)
    arm = ToolArm(roots=[roots], warm_up=False)
    cases = {
        "What's in ../secret.txt?": "parent_escape",
        f"What's in `{roots}/../secret.txt`?": "parent_escape",
        "What's in innocent.txt?": "symlink_escape",
        "What's in `linked/secret.txt`?": "symlink_escape",
        f"What's in {secret}?": "outside_roots",
    }
    for question, reason in cases.items():
        message = _arm_failure(arm, question)
        assert f"files@question: {reason}" in message, message
        assert "TOPSECRET" not in message


def test_status_tool_never_contacts_targets_off_the_allow_list(listener):
    port = listener.getsockname()[1]
    arm = ToolArm(allowed_status_targets=["127.0.0.1:1"], warm_up=False)
    message = _arm_failure(arm, f"Is 127.0.0.1:{port} up?")
    assert "status@question: not_allowed" in message
    assert not _someone_connected(listener)
