"""The Python tool: run a short snippet in a sandboxed subprocess and report what it returns or prints.

Two sandboxes, each a set of Linux namespaces around a fresh interpreter; `SandboxResult.isolation` says
what a run actually got ({"filesystem": "mount-ns", "pid": "pid-ns", "network": "netns", "full": True, ...}).
- "bwrap" (bubblewrap, when installed and working): new mount, pid, network, ipc and uts namespaces (a
  cgroup one where the kernel has it, a user one when not root); only /usr, /lib*, /bin, /sbin and the
  interpreter's own install are visible, read-only; third-party site-packages and CPython's ctypes, test,
  subinterpreter and Tcl modules are covered; a fresh /proc, bwrap's minimal /dev, and a small private
  tmpfs /tmp whose /tmp/work is the cwd.
- "rlimits" (the name is historical; what "auto" uses without bwrap): the same namespaces made directly with
  unshare(2) by a small bootstrap (_sandbox_child.py): a new root on tmpfs with the same read-only, nosuid
  binds and covers, a fresh /proc, a /dev of null, zero, full, random and urandom only, a private noexec
  tmpfs /tmp/work as cwd, pivot_root, no_new_privs. Where the kernel or container refuses the namespaces it
  runs weaker and says so (isolation "filesystem": "none", "pid": "none", "full": False; "network": "netns"
  when an empty network namespace could still be made, else "audit-hook"): the host's files and processes
  are then kept out only by file permissions, the per-run uid and the audit guard.
  `run_python(..., require_isolation=True)` (or `isolation_status(mode)` first) refuses that case instead.
- in both: the snippet is a descendant of the namespace's pid 1, so ending the run (or the timeout's kill of
  the whole tree) ends every process it started, a `setsid` grandchild too (in the weak fallback, as root,
  every process of the run's uid is killed instead); an empty environment; a fresh
  `python -I -S` (isolated, no site) that reads the snippet on stdin; no shell, argv lists only; limits on CPU,
  memory (RLIMIT_AS), file size, open files and processes (RLIMIT_NPROC); as root the snippet runs as a
  per-run uid that no other process has (so it can signal nothing outside its own tree and its process cap
  is its own), with no capabilities; an audit hook (_sandbox_runner.py) that refuses process creation,
  sockets, ctypes, native or compiled code from outside the interpreter's install and file access outside
  the work directory, reporting each attempt, built so that the snippet cannot switch it off from Python
  (`guard=False` drops it, to test that the namespaces hold on their own).
- not contained: CPU time and memory up to the limits; what the visible, read-only system files reveal (the
  OS's /usr and the interpreter's stdlib); the snippet's own output files (its stdout, stderr and report,
  which it may write as it likes); the kernel itself, which is shared (no seccomp filter): a kernel bug is
  an escape. The audit guard is defence in depth, not a boundary: a CPython memory-safety bug defeats it.

`run_python` never raises for what the snippet does: it returns a `SandboxResult` whose `status` and
`reason` say what happened ("ok", "error", "blocked", "timeout", "memory_limit", "unavailable", ...).
"""

from __future__ import annotations

import ast
import errno
import functools
import json
import os
import re
import secrets
import shutil
import signal
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from surprisegate.arms import Evidence
from surprisegate.arms.toolkit import tool_evidence
from surprisegate.errors import ConfigError

SANDBOX_MODES = ("auto", "bwrap", "rlimits")
MAX_SNIPPET_CHARS = 4000
MAX_REPR_CHARS = 4000
SANDBOX_UID = 65534  # "nobody": no longer used for snippets (each run as root gets its own uid, below)
SANDBOX_GID = 65534
# As root, every run gets a fresh uid from this range that no process on the host has (see _claim_uid).
SANDBOX_UID_RANGE = (0x5F000000, 0x6F000000)
_CHILD_SOURCE = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
_RUNNER_SOURCE = (Path(__file__).with_name("_sandbox_runner.py")).read_text(encoding="utf-8")
# `python -I -S -c _STUB CODE ...` runs CODE, a code object compiled here once (hex of its marshal), so that no
# sandbox start spends milliseconds compiling the bootstrap or the runner again; sys.argv[1] is then SETTINGS.
_STUB = "import sys,marshal;exec(marshal.loads(bytes.fromhex(sys.argv.pop(1))))"
# False makes the "rlimits" bootstrap behave as on a kernel that refuses namespaces (tests of the weak path).
_NAMESPACES = True
# Modules imported before root is dropped where the filesystem is the host's: the stdlib may be unreadable
# after the drop (an interpreter under /root). With namespaces the install is bound readable, so none are.
_PRELOAD = (
    "math",
    "cmath",
    "itertools",
    "functools",
    "collections",
    "operator",
    "re",
    "json",
    "string",
    "fractions",
    "decimal",
    "statistics",
    "datetime",
    "random",
    "heapq",
    "bisect",
    "textwrap",
    "unicodedata",
    "copy",
    "dataclasses",
    "enum",
    "typing",
    "calendar",
    "hashlib",
    "base64",
    "socket",
    "encodings.idna",
)  # socket: a network attempt must meet the guard and the namespace
# Native modules covered in both sandboxes: ctypes (raw memory), CPython's test hooks, subinterpreters, Tcl.
HIDDEN_NATIVE_MODULES = (
    "_ctypes",
    "_ctypes_test",
    "_testcapi",
    "_testinternalcapi",
    "_testbuffer",
    "_testmultiphase",
    "_testsinglephase",
    "_testimportmultiple",
    "_testclinic",
    "_xxtestfuzz",
    "_xxsubinterpreters",
    "_xxinterpchannels",
    "_interpreters",
    "xxlimited",
    "xxlimited_35",
    "_tkinter",
)
NAMESPACE_END_WAIT_S = 1.0  # after a kill, how long to wait for the namespace's pid 1 to be gone


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 2.0  # wall clock, then the whole process tree is killed
    memory_bytes: int = 256 * 2**20  # RLIMIT_AS
    max_processes: int = 8  # processes the snippet may add (RLIMIT_NPROC over its uid's count)
    file_size_bytes: int = 2**20  # RLIMIT_FSIZE: also bounds stdout and stderr
    open_files: int = 64  # RLIMIT_NOFILE
    max_output_chars: int = 8192  # what is kept of stdout and stderr
    tmpfs_bytes: int = 16 * 2**20  # size of the private /tmp (both sandboxes)

    def __post_init__(self):
        if not (0 < self.timeout_s <= 60):
            raise ConfigError(f"timeout_s={self.timeout_s!r}: use seconds between 0 and 60, e.g. 2.0")
        if not (32 * 2**20 <= self.memory_bytes <= 8 * 2**30):
            raise ConfigError(f"memory_bytes={self.memory_bytes!r}: use 32 MiB to 8 GiB, e.g. {256 * 2**20}")
        if not (1 <= self.max_processes <= 256):
            raise ConfigError(f"max_processes={self.max_processes!r}: use 1 to 256, e.g. 8")


@dataclass(frozen=True)
class SandboxResult:
    status: str  # ok | error | blocked | timeout | memory_limit | cpu_limit | file_size_limit | process_limit
    # | killed | refused (not run: bad input, no time left) | unavailable (the sandbox could not start, or could
    # not isolate as fully as the caller required)
    reason: str  # one line: "ZeroDivisionError: division by zero", "tried opening a network socket", ...
    sandbox: str  # "bwrap" | "rlimits" | "none" (refused before running)
    value: str | None = None  # repr of a final expression, as a REPL shows it
    stdout: str = ""
    stderr: str = ""
    exception: str | None = None  # the snippet's exception type, when it raised one
    exit_code: int | None = None
    duration_ms: float = 0.0
    truncated: bool = False  # stdout or stderr was cut to max_output_chars
    violations: tuple[str, ...] = ()  # what the audit guard refused, even when the snippet caught it
    # What contained the run: {"filesystem": "mount-ns" | "none", "pid": "pid-ns" | "none", "network": "netns" |
    # "audit-hook", "ipc", "uts", "user": "host" | "userns", "proc", "uid", "guard", "full": bool, "why": ...}
    isolation: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------------
# choosing the sandbox


def _bwrap_path() -> str | None:
    return shutil.which("bwrap", path=os.environ.get("PATH", "") + os.pathsep + "/usr/bin:/bin")


@functools.lru_cache(maxsize=1)
def _bwrap_help() -> str:
    import subprocess

    path = _bwrap_path()
    if path is None:
        return ""
    try:
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5, env={}, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout + done.stderr


_probe_lock = threading.Lock()
_probe_result: tuple[bool, str] | None = None
_isolation_lock = threading.Lock()
_isolation_probes: dict[bool, tuple[bool, str]] = {}  # keyed by _NAMESPACES


def bwrap_status() -> tuple[bool, str]:
    """(usable, why): bwrap is usable when it is installed and a trivial snippet runs in it here.

    Probed once per process (about 50 ms); kernels or containers that forbid namespaces make it unusable.
    """
    global _probe_result
    with _probe_lock:
        if _probe_result is None:
            if _bwrap_path() is None:
                _probe_result = (False, "bwrap is not installed (Debian/Ubuntu: apt-get install -y bubblewrap)")
            else:
                probe = _run(repr("sandbox-probe"), SandboxLimits(timeout_s=10), "bwrap", guard=True)
                if probe.status == "ok" and probe.value == repr("sandbox-probe"):
                    _probe_result = (True, "bwrap works here")
                else:
                    _probe_result = (False, f"bwrap failed here: {probe.reason}")
        return _probe_result


def sandbox_mode(mode: str = "auto") -> str:
    """The sandbox `run_python` will use: "bwrap" when usable (or demanded), else "rlimits"."""
    if mode not in SANDBOX_MODES:
        raise ConfigError(f"python sandbox {mode!r} is unknown; use one of {', '.join(SANDBOX_MODES)}")
    if mode == "auto":
        return "bwrap" if bwrap_status()[0] else "rlimits"
    return mode


def isolation_status(mode: str = "auto") -> tuple[bool, str]:
    """(isolated, why): whether `run_python(mode=mode)` gets full isolation here (its own mount, pid, network,
    ipc and uts namespaces, the host's files out of sight), so that code from a remote client may run.

    Probed once per process per sandbox (a trivial snippet, 30-60 ms). Callers that must never run a snippet
    with less pass `require_isolation=True` to `run_python` as well: that is checked on every run.
    """
    chosen = sandbox_mode(mode)
    if chosen == "bwrap":
        usable, why = bwrap_status()
        if not usable:
            return False, why
        return True, "bwrap isolates snippets here (mount, pid, network, ipc and uts namespaces)"
    with _isolation_lock:
        if _NAMESPACES not in _isolation_probes:
            probe = _run("1", SandboxLimits(timeout_s=10), "rlimits", guard=True, require_isolation=True)
            if probe.status == "ok":
                how = probe.isolation.get("root", "pivot_root")
                answer = (
                    True,
                    f"the rlimits sandbox isolates snippets here (mount, pid, network, ipc and uts namespaces; {how})",
                )
            else:
                answer = (False, f"the rlimits sandbox cannot isolate snippets here: {probe.reason}")
            _isolation_probes[_NAMESPACES] = answer
        return _isolation_probes[_NAMESPACES]


# --------------------------------------------------------------------------------------------------
# running


def run_python(
    code: str,
    limits: SandboxLimits | None = None,
    *,
    mode: str = "auto",
    guard: bool = True,
    require_isolation: bool = False,
) -> SandboxResult:
    """Run `code` in the sandbox and report. Statements run; a final expression's repr is `value`.

    `mode`: "auto" (bwrap when usable, else rlimits), "bwrap" (refuses when unusable) or "rlimits".
    `guard=False` drops the audit hook, to test that the OS-level containment holds on its own.
    `require_isolation=True`: where the namespaces cannot be made, return status "unavailable" (with the
    reason) instead of running in the weaker fallback. Remote callers must set it.
    """
    limits = limits or SandboxLimits()
    refusal = _check_snippet(code)
    if refusal:
        return SandboxResult("refused", refusal, "none")
    chosen = sandbox_mode(mode)
    if chosen == "bwrap" and mode == "bwrap":
        usable, why = bwrap_status()
        if not usable:
            return SandboxResult("unavailable", why, "bwrap")
    return _run(code, limits, chosen, guard, require_isolation)


def _check_snippet(code: object) -> str | None:
    if not isinstance(code, str):
        return f"snippet must be a string, not {type(code).__name__}"
    if not code.strip():
        return "snippet is empty"
    if len(code) > MAX_SNIPPET_CHARS:
        return f"snippet of {len(code)} characters is too long; keep it under {MAX_SNIPPET_CHARS}"
    if "\x00" in code:
        return "snippet contains a NUL character"
    return None


@functools.lru_cache(maxsize=2)
def _code_arg(source: str, name: str) -> str:
    import marshal

    return marshal.dumps(compile(source, name, "exec", dont_inherit=True)).hex()


_uid_lock = threading.Lock()
_claimed_uids: set[int] = set()


def _claim_uid() -> int:
    """A uid for one run (as root): from SANDBOX_UID_RANGE, owned by no process now, claimed by no other run."""
    in_use = _process_uids()
    with _uid_lock:
        while True:
            uid = SANDBOX_UID_RANGE[0] + secrets.randbelow(SANDBOX_UID_RANGE[1] - SANDBOX_UID_RANGE[0])
            if uid not in in_use and uid not in _claimed_uids:
                _claimed_uids.add(uid)
                return uid


def _release_uid(uid: int | None) -> None:
    if uid is not None:
        with _uid_lock:
            _claimed_uids.discard(uid)


def _process_uids() -> set[int]:
    uids: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return uids
    for entry in entries:
        if entry.isdigit():
            try:
                uids.add(os.stat(f"/proc/{entry}").st_uid)
            except OSError:
                continue  # exited meanwhile
    return uids


def _run(code: str, limits: SandboxLimits, mode: str, guard: bool, require_isolation: bool = False) -> SandboxResult:
    import subprocess

    started = time.monotonic()
    as_root = os.geteuid() == 0
    interpreter = os.path.realpath(sys.executable)
    uid = _claim_uid() if as_root else None
    try:
        with tempfile.TemporaryDirectory(prefix="surprisegate-sandbox-", ignore_cleanup_errors=True) as run_dir:
            run_path = Path(run_dir)
            (run_path / "snippet.py").write_text(code, encoding="utf-8")
            work_dir = run_path / "work"  # the cwd only where no namespace could be made; else /tmp/work
            work_dir.mkdir(mode=0o700)
            (run_path / "root").mkdir(mode=0o700)  # where the rlimits bootstrap mounts the new root
            if uid is not None:
                os.chown(work_dir, uid, uid)
            names = ("snippet.py", "stdout", "stderr", "report", "violations", "info")
            with (
                open(run_path / names[0], "rb") as stdin,
                open(run_path / names[1], "wb") as stdout,
                open(run_path / names[2], "wb") as stderr,
                open(run_path / names[3], "wb") as report,
                open(run_path / names[4], "wb") as violations,
                open(run_path / names[5], "wb") as info,
            ):
                runner = _runner_settings(limits, mode, guard, uid, report.fileno(), violations.fileno())
                runner_code = _code_arg(_RUNNER_SOURCE, "<sandbox-runner>")
                if mode == "bwrap":
                    runner["nproc"] = (1 if as_root else 2) + limits.max_processes
                    argv = _bwrap_argv(interpreter, limits, as_root, info_fd=info.fileno())
                    argv += [interpreter, "-I", "-S", "-c", _STUB, runner_code, repr(runner)]
                else:
                    boot = _boot_settings(limits, runner, interpreter, run_path, uid, info.fileno(), require_isolation)
                    boot_code = _code_arg(_CHILD_SOURCE, "<sandbox-bootstrap>")
                    argv = [interpreter, "-I", "-S", "-c", _STUB, boot_code, repr(boot), runner_code]
                try:
                    process = subprocess.Popen(
                        argv,
                        stdin=stdin,
                        stdout=stdout,
                        stderr=stderr,
                        cwd=work_dir,
                        env={},
                        pass_fds=(report.fileno(), violations.fileno(), info.fileno()),
                        start_new_session=True,
                        close_fds=True,
                    )
                except OSError as err:
                    return SandboxResult("unavailable", f"could not start the sandbox: {err}", mode)
                timed_out = _wait_then_kill_tree(process, limits.timeout_s, lambda: _init_pid(run_path, mode))
                records = _info_records(run_path, mode)
                pid_namespace = any(r.get("isolation", {}).get("pid") == "pid-ns" for r in records)
                if mode == "rlimits" and uid is not None and not pid_namespace:
                    _kill_uid(uid)  # no pid namespace (the weak fallback): what the snippet left, by its own uid
            output = {name: _read_head(run_path / name, limits.max_output_chars) for name in ("stdout", "stderr")}
            report_lines = _read_head(run_path / "report", 256 * 1024)[0].strip().splitlines()
            violation_lines = _read_head(run_path / "violations", 64 * 1024)[0].splitlines()
    finally:
        _release_uid(uid)
    duration_ms = round((time.monotonic() - started) * 1000, 1)
    isolation = _isolation(records, mode, as_root, uid, guard)
    for record in records:
        if "refused" in record:
            why = f"full isolation is unavailable here ({record['refused']}); not run"
            return SandboxResult("unavailable", why, mode, isolation=isolation, duration_ms=duration_ms)
        if "error" in record:
            why = f"the sandbox could not start: {record['error']}"
            return SandboxResult("unavailable", why, mode, isolation=isolation, duration_ms=duration_ms)
    child = _parse_literal(report_lines[-1] if report_lines else "")
    violated = tuple(line.strip()[:300] for line in violation_lines if line.strip())[:5]
    return _result(process.returncode, timed_out, child, output, limits, mode, duration_ms, violated, isolation)


def _kill_uid(uid: int, rounds: int = 50) -> None:
    """SIGKILL every process whose real uid is `uid` (a per-run uid: only this run's processes have it)."""
    for _ in range(rounds):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/status", encoding="ascii", errors="replace") as handle:
                    owner = next((line.split()[1] for line in handle if line.startswith("Uid:")), None)
                if owner == str(uid):
                    os.kill(int(entry), signal.SIGKILL)
                    found = True
            except (OSError, StopIteration, IndexError):
                continue  # exited meanwhile
        if not found:
            return
        time.sleep(0.002)


def _runner_settings(
    limits: SandboxLimits, mode: str, guard: bool, uid: int | None, report_fd: int, violations_fd: int
) -> dict:
    """What the snippet's interpreter (_sandbox_runner.py) is told; the rlimits bootstrap sets "nproc"."""
    return {
        "report_fd": report_fd,
        "violations_fd": violations_fd,
        "limits": {
            "cpu_s": int(limits.timeout_s) + 1,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
        },
        "nproc": 1 + limits.max_processes,
        "drop_to": [uid, uid] if uid is not None else None,
        "preload": [],
        "guard": guard,
        "max_repr_chars": MAX_REPR_CHARS,
    }


def _boot_settings(
    limits: SandboxLimits,
    runner: dict,
    interpreter: str,
    run_path: Path,
    uid: int | None,
    info_fd: int,
    require_isolation: bool,
) -> dict:
    """What the rlimits bootstrap (_sandbox_child.py) is told."""
    bound = _system_tops()
    trees = [tree for tree in _install_trees(interpreter) if not _under(tree, bound)]
    weak_runner = dict(runner, preload=list(_PRELOAD) if uid is not None else [])
    # Without a pid namespace RLIMIT_NPROC counts every process of the uid: a per-run uid has none, else count.
    shared = 1 + limits.max_processes if uid is not None else _count_processes(os.getuid()) + 1 + limits.max_processes
    return {
        "info_fd": info_fd,
        "interpreter": interpreter,
        "stub": _STUB,
        "runner": runner,
        "weak_runner": weak_runner,
        "namespaces": _NAMESPACES,
        "require_isolation": require_isolation,
        "uid": uid,
        "max_processes": limits.max_processes,
        "nproc_shared": shared,
        "root_dir": str(run_path / "root"),
        "host_work_dir": str(run_path / "work"),
        "install_trees": trees,
        "hide_dirs": [d for d in _site_package_dirs() if _under(d, bound + trees)],
        "hide_files": list(_hidden_native_files()),
        "tmpfs_bytes": limits.tmpfs_bytes,
    }


def _count_processes(uid: int) -> int:
    """Processes owned by `uid` now (Linux /proc); a generous guess where /proc is absent."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 512
    count = 0
    for entry in entries:
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                continue  # exited meanwhile
    return count


def _under(path: str, trees: list[str]) -> bool:
    return any(path == tree or path.startswith(tree.rstrip("/") + "/") for tree in trees)


def _system_tops() -> list[str]:
    """The system trees both sandboxes bind (those that are directories, not symlinks, here)."""
    tops = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")
    return [top for top in tops if os.path.isdir(top) and not os.path.islink(top)]


def _install_trees(interpreter: str) -> list[str]:
    return sorted({os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(interpreter))})


@functools.lru_cache(maxsize=1)
def _hidden_native_files() -> tuple[str, ...]:
    """The files of HIDDEN_NATIVE_MODULES in the interpreter's own module directories."""
    found = []
    for directory in sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}):
        if "-packages" in directory:
            continue  # hidden as a whole
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        for name in names:
            if name.split(".")[0] in HIDDEN_NATIVE_MODULES and name.endswith(".so"):
                found.append(os.path.join(directory, name))
    return tuple(sorted(found))


def _bwrap_argv(interpreter: str, limits: SandboxLimits, as_root: bool, info_fd: int | None = None) -> list[str]:
    """bwrap arguments: namespaces, read-only system and interpreter trees, a private tmpfs cwd."""
    argv = [
        _bwrap_path() or "bwrap",
        "--die-with-parent",
        "--new-session",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if as_root:
        # No user namespace: the uid must really change so RLIMIT_NPROC binds; the runner drops these caps.
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    bound: list[str] = []
    for top in ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
            bound.append(top)
    for tree in _install_trees(interpreter):
        if any(tree == b or tree.startswith(b + "/") for b in bound):
            continue
        # bwrap would create the missing parents with the host's modes (/root is 0700): make them traversable.
        for parent in reversed(Path(tree).parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", tree, tree]
        bound.append(tree)
    for packages in _site_package_dirs():  # third-party code stays out of reach even with sys.path edits
        if os.path.isdir(packages) and any(packages.startswith(b + "/") for b in bound):
            argv += ["--tmpfs", packages]
    for hidden in _hidden_native_files():
        if _under(hidden, bound):
            argv += ["--ro-bind", "/dev/null", hidden]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    if "--size" in _bwrap_help():
        argv += ["--size", str(limits.tmpfs_bytes)]
    argv += [
        "--tmpfs",
        "/tmp",
        "--perms",
        "0777" if as_root else "0700",
        "--dir",
        "/tmp/work",
        "--chdir",
        "/tmp/work",
        "--hostname",
        "sandbox",
        "--",
    ]
    return argv


def _site_package_dirs() -> list[str]:
    base = os.path.realpath(sys.base_prefix)
    dirs = {sysconfig.get_path(name, vars={"base": base, "platbase": base}) for name in ("purelib", "platlib")}
    minor = sys.version_info.minor
    dirs |= {"/usr/lib/python3/dist-packages", f"/usr/local/lib/python3.{minor}/dist-packages"}
    dirs |= {f"/usr/lib/python3.{minor}/site-packages", f"/usr/local/lib/python3.{minor}/site-packages"}
    return sorted(d for d in dirs if d)


def _wait_then_kill_tree(process, timeout_s: float, init_pid) -> bool:
    """Wait up to `timeout_s`, then SIGKILL the whole process group; True when the time ran out.

    The leader is waited for without being reaped (WNOWAIT), so its pid, which is the group id, cannot be
    reused by an unrelated process before the group is killed. Killing the group kills the namespace's pid 1
    (or bwrap's, which dies with its parent), and with it the kernel kills every process left in the
    namespace, those that left the group with setsid too; `init_pid()` names that pid 1, whose end is awaited.
    """
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    timed_out = True
    while time.monotonic() < deadline:
        try:  # None while the leader still runs (WNOHANG)
            exited = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:
            exited = True
        if exited:
            timed_out = False
            break
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, 0.01)
    namespace_init = init_pid()
    watch = _pidfd(namespace_init)
    try:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # stragglers the snippet forked, or the snippet itself
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        _wait_gone(watch, namespace_init, NAMESPACE_END_WAIT_S)
    finally:
        if watch is not None:
            os.close(watch)
    return timed_out


def _pidfd(pid: int | None) -> int | None:
    if pid is None or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None  # already gone


def _wait_gone(watch: int | None, pid: int | None, seconds: float) -> None:
    """Until `pid` (the namespace's pid 1) has ended: then the kernel has killed the whole namespace."""
    if pid is None:
        return
    if watch is not None:
        import select

        poller = select.poll()
        poller.register(watch, select.POLLIN)
        poller.poll(seconds * 1000)
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.005)


def _init_pid(run_path: Path, mode: str) -> int | None:
    for record in _info_records(run_path, mode):
        for key in ("init_pid", "child-pid"):
            if isinstance(record.get(key), int):
                return record[key]
    return None


def _info_records(run_path: Path, mode: str) -> list[dict]:
    """What the bootstrap (literal lines) or bwrap (one JSON object) wrote to the info fd."""
    text = _read_head(run_path / "info", 64 * 1024)[0]
    if mode == "bwrap":
        record = _parse_report(text)
        return [record] if record else []
    return [record for record in map(_parse_literal, text.splitlines()) if record]


def _isolation(records: list[dict], mode: str, as_root: bool, uid: int | None, guard: bool) -> dict:
    if mode == "bwrap":
        isolation = {
            "mode": "bwrap",
            "filesystem": "mount-ns",
            "pid": "pid-ns",
            "network": "netns",
            "ipc": "ipc-ns",
            "uts": "uts-ns",
            "cgroup": "cgroup-ns" if os.path.exists("/proc/self/ns/cgroup") else "host",  # --unshare-cgroup-try
            "user": "host" if as_root else "userns",
            "proc": "pid-ns",
            "uid": uid if uid is not None else os.getuid(),
            "root": "bwrap",
            "full": True,
        }
    else:
        isolation = {"mode": "rlimits", "full": False}
        for record in records:
            if isinstance(record.get("isolation"), dict):
                isolation = dict(record["isolation"])
    isolation["guard"] = "audit-hook" if guard else "off"
    return isolation


def _read_head(path: Path, max_chars: int) -> tuple[str, bool]:
    """The first `max_chars` characters of a file the sandbox wrote, and whether there was more."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(max_chars * 4 + 1)
    except OSError:
        return "", False
    text = head.decode("utf-8", "replace")
    return text[:max_chars], len(text) > max_chars or len(head) > max_chars * 4


def _parse_report(line: str) -> dict | None:
    try:
        report = json.loads(line)
    except (json.JSONDecodeError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def _parse_literal(line: str) -> dict | None:
    """A dict the runner or the bootstrap wrote as a Python literal (never evaluated as code)."""
    if not line.startswith("{") or len(line) > 64 * 1024:
        return None
    try:
        report = ast.literal_eval(line)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return report if isinstance(report, dict) else None


_SIGNAL_STATUS = {
    signal.SIGXCPU: ("cpu_limit", "the CPU-time limit was reached"),
    signal.SIGXFSZ: ("file_size_limit", "the file-size limit was reached"),
    signal.SIGKILL: ("killed", "killed (CPU hard limit or out of memory)"),
    signal.SIGSEGV: ("killed", "crashed with a segmentation fault (often the memory limit)"),
}


def _result(
    returncode: int,
    timed_out: bool,
    child: dict | None,
    output: dict,
    limits: SandboxLimits,
    mode: str,
    duration_ms: float,
    violations: tuple[str, ...] = (),
    isolation: dict | None = None,
) -> SandboxResult:
    (stdout, stdout_cut), (stderr, stderr_cut) = output["stdout"], output["stderr"]
    common = {
        "sandbox": mode,
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": returncode,
        "duration_ms": duration_ms,
        "truncated": stdout_cut or stderr_cut,
        "violations": violations,
        "isolation": isolation or {},
    }
    if timed_out:
        return SandboxResult("timeout", f"killed after the {limits.timeout_s:.3g} s wall-clock limit", **common)
    if violations:
        said = child or {}
        return SandboxResult(
            "blocked",
            f"the snippet tried {violations[0]}; the sandbox refused",
            value=None if said.get("value") is None else str(said["value"]),
            exception=None if said.get("exception") is None else str(said["exception"]),
            **common,
        )
    if child is None:
        return _result_without_report(returncode, stderr, common)
    # The report is the snippet process's word about itself: shapes are checked, not trusted.
    if child.get("outcome") == "ok":
        value = child.get("value")
        return SandboxResult("ok", "ran to completion", value=None if value is None else str(value), **common)
    name, message = str(child.get("exception") or "Exception"), str(child.get("message") or "")
    code = child.get("errno") if type(child.get("errno")) is int else None
    described = f"{name}: {message}" if message else name
    if name == "MemoryError":
        status = "memory_limit"
        described = f"MemoryError: the {limits.memory_bytes // 2**20} MiB memory limit was reached"
    elif code == errno.EFBIG:
        status = "file_size_limit"
    elif code == errno.EAGAIN and name in ("BlockingIOError", "OSError"):
        status = "process_limit"
    else:
        status = "error"
    return SandboxResult(status, described, exception=name, **common)


def _result_without_report(returncode: int, stderr: str, common: dict) -> SandboxResult:
    # bwrap and the rlimits bootstrap report a child killed by a signal as exit status 128 + signal.
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if signum is not None:
        try:
            status, reason = _SIGNAL_STATUS.get(signal.Signals(signum), ("killed", f"killed by signal {signum}"))
        except ValueError:
            status, reason = "killed", f"killed by signal {signum}"
        return SandboxResult(status, reason, **common)
    if returncode == 126:
        return SandboxResult("killed", "stopped by the sandbox's guard (its log was tampered with)", **common)
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {returncode}"
    if common["sandbox"] == "bwrap" and last_line.startswith("bwrap:"):
        return SandboxResult("unavailable", last_line, **common)
    return SandboxResult("killed", f"the sandbox ended without a report ({last_line[:200]})", **common)


# --------------------------------------------------------------------------------------------------
# finding snippets in text

_FENCED = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(?P<code>.{1,4000}?)```", re.DOTALL | re.IGNORECASE)
_INLINE = re.compile(r"(?<!`)`(?P<code>[^`\n]{1,2000})`(?!`)")
_WHAT_DOES = re.compile(
    r"\bwhat\s+(?:does|will|would)\s+(?P<code>\S.{0,400}?)\s+"
    r"(?:return|print|output|evaluate\s+to|give(?:\s+back)?|raise)\b",
    re.IGNORECASE | re.DOTALL,
)
_CODE_SHAPED = re.compile(r"[][()._=+*/<>'\"%]")


@dataclass(frozen=True)
class Snippet:
    code: str
    text: str  # the phrase it was found in: "`sorted([3,1,2])[0]`" or "what does len('abc') return"


def extract_snippet(text: str) -> Snippet | None:
    """Code to run, only when written in backticks or asked as "what does X return|print|evaluate to".

    The code must parse as Python and do something (a call, subscript, literal or operator on literals):
    a bare name such as `notes.txt` or a shell line such as `ls -la` is not run.
    """
    if not text or "`" not in text and not re.search(r"\bwhat\s+(?:does|will|would)\b", text, re.IGNORECASE):
        return None
    text = text[:8000]
    for pattern in (_FENCED, _INLINE):
        for match in pattern.finditer(text):
            code = match.group("code").strip("\n")
            if _is_runnable(code):
                return Snippet(code.strip(), match.group())
    for match in _WHAT_DOES.finditer(text):
        code = match.group("code").strip().strip("`").strip()
        code = re.sub(r"^(?:the\s+)?(?:python\s+)?(?:code|expression|snippet|call)\s+", "", code, flags=re.IGNORECASE)
        if _CODE_SHAPED.search(code) and _is_runnable(code):
            return Snippet(code, match.group())
    return None


def _is_runnable(code: str) -> bool:
    if not code.strip() or len(code) > MAX_SNIPPET_CHARS:
        return False
    try:
        tree = ast.parse(code if "\n" in code else code.strip())
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
        expression = tree.body[0].value
        while isinstance(expression, ast.Attribute):
            expression = expression.value
        if isinstance(expression, ast.Name):  # `notes.txt`, `config`: names, not computations
            return False
    doing = (
        ast.Call,
        ast.Subscript,
        ast.Constant,
        ast.List,
        ast.Tuple,
        ast.Dict,
        ast.Set,
        ast.comprehension,
        ast.JoinedStr,
        ast.Lambda,
    )
    return any(isinstance(node, doing) for node in ast.walk(tree))


# --------------------------------------------------------------------------------------------------
# evidence

SHOWN_CODE_CHARS = 200


def snippet_evidence(code: str, result: SandboxResult, field_name: str = "") -> Evidence:
    """Evidence for a snippet that ran (status "ok" or "error": raising is an observable result too)."""
    shown = code if len(code) <= SHOWN_CODE_CHARS else code[: SHOWN_CODE_CHARS - 3] + "..."
    shown = f"`{shown}`" if "\n" not in shown else f"```\n{shown}\n```"
    printed = result.stdout.strip()
    output: str | None
    if result.status == "error":
        sentence = f"{shown} raises {result.reason}."
        output = f"raises {result.reason}"
    elif result.value is not None and result.value != "None" or not printed:
        sentence = f"{shown} evaluates to {result.value}."
        output = result.value
        if printed:
            sentence = f"{shown} prints {printed!r} and evaluates to {result.value}."
    else:
        sentence = f"{shown} prints: {printed}"
        output = printed
    return tool_evidence(
        "python",
        claim=f"python: {code.strip()[:SHOWN_CODE_CHARS]} -> {output}",
        evidence=sentence,
        tool_input=code,
        output=output,
        sandbox=result.sandbox,
        status=result.status,
        stdout=result.stdout,
        duration_ms=result.duration_ms,
        isolation=result.isolation,
        field=field_name,
    )
