"""The Python tool: run a short snippet in a sandboxed subprocess and report what it returns or prints.

Containment, outermost first:
- bubblewrap (`bwrap`) when it is installed and works here: new mount, pid, network, ipc and uts namespaces;
  only /usr and the interpreter's own install are visible, read-only (third-party site-packages hidden);
  /tmp and the working directory are a small private tmpfs. `sandbox == "bwrap"` in the result.
- otherwise "rlimits": the same interpreter with a fresh temp dir as cwd and, when possible, an empty network
  namespace (`unshare`); no filesystem isolation beyond the uid drop and the audit guard.
- in both: an empty environment, `python -I -S` (isolated, no site), no shell, argv lists only; resource
  limits on CPU, memory (RLIMIT_AS), file size, open files and processes (RLIMIT_NPROC); when run as root the
  snippet drops to an unprivileged uid (RLIMIT_NPROC does not bind root); a hard wall-clock timeout that kills
  the whole process group; and an audit hook that refuses process creation, sockets, ctypes and file access
  outside the work directory, reporting each attempt.

`run_python` never raises for what the snippet does: it returns a `SandboxResult` whose `status` and
`reason` say what happened ("ok", "error", "blocked", "timeout", "memory_limit", ...).
"""

from __future__ import annotations

import ast
import errno
import functools
import json
import os
import re
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
SANDBOX_UID = 65534  # "nobody": when we run as root, the snippet runs as this uid instead
SANDBOX_GID = 65534
_CHILD_SOURCE = (Path(__file__).with_name("_sandbox_child.py")).read_text(encoding="utf-8")
# Modules imported before root is dropped: after the drop a stdlib under /root may be unreadable.
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


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 2.0  # wall clock, then the process group is killed
    memory_bytes: int = 256 * 2**20  # RLIMIT_AS
    max_processes: int = 8  # processes the snippet may add (RLIMIT_NPROC over its uid's count)
    file_size_bytes: int = 2**20  # RLIMIT_FSIZE: also bounds stdout and stderr
    open_files: int = 64  # RLIMIT_NOFILE
    max_output_chars: int = 8192  # what is kept of stdout and stderr
    tmpfs_bytes: int = 16 * 2**20  # bwrap: size of the private /tmp

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
    # | killed | refused (not run: bad input, no time left) | unavailable (the sandbox itself could not start)
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
    isolation: dict = field(default_factory=dict)  # {"network": "netns" | "audit-hook", "uid": ...}

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


# --------------------------------------------------------------------------------------------------
# running


def run_python(
    code: str, limits: SandboxLimits | None = None, *, mode: str = "auto", guard: bool = True
) -> SandboxResult:
    """Run `code` in the sandbox and report. Statements run; a final expression's repr is `value`.

    `mode`: "auto" (bwrap when usable, else rlimits), "bwrap" (refuses when unusable) or "rlimits".
    `guard=False` drops the audit hook, to test that the OS-level containment holds on its own.
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
    return _run(code, limits, chosen, guard)


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


def _run(code: str, limits: SandboxLimits, mode: str, guard: bool) -> SandboxResult:
    import subprocess

    started = time.monotonic()
    as_root = os.geteuid() == 0
    interpreter = os.path.realpath(sys.executable)
    with tempfile.TemporaryDirectory(prefix="surprisegate-sandbox-", ignore_cleanup_errors=True) as run_dir:
        run_path = Path(run_dir)
        (run_path / "snippet.py").write_text(code, encoding="utf-8")
        work_dir = run_path / "work"  # the cwd in rlimits mode; bwrap uses a tmpfs instead
        work_dir.mkdir(mode=0o700)
        if as_root:
            os.chown(work_dir, SANDBOX_UID, SANDBOX_GID)
        with (
            open(run_path / "snippet.py", "rb") as stdin,
            open(run_path / "stdout", "wb") as stdout,
            open(run_path / "stderr", "wb") as stderr,
            open(run_path / "report", "wb") as report,
        ):
            settings = _child_settings(limits, mode, guard, as_root, report.fileno())
            argv = [interpreter, "-I", "-S", "-c", _CHILD_SOURCE, json.dumps(settings)]
            if mode == "bwrap":
                argv = _bwrap_argv(interpreter, limits, as_root) + argv
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=stdin,
                    stdout=stdout,
                    stderr=stderr,
                    cwd=work_dir,
                    env={},
                    pass_fds=(report.fileno(),),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as err:
                return SandboxResult("unavailable", f"could not start the sandbox: {err}", mode)
            timed_out = _wait_then_kill_group(process, limits.timeout_s)
        output = {name: _read_head(run_path / name, limits.max_output_chars) for name in ("stdout", "stderr")}
        report_line = _read_head(run_path / "report", 256 * 1024)[0].strip().splitlines()
    duration_ms = round((time.monotonic() - started) * 1000, 1)
    child = _parse_report(report_line[-1] if report_line else "")
    return _result(process.returncode, timed_out, child, output, limits, mode, duration_ms)


def _child_settings(limits: SandboxLimits, mode: str, guard: bool, as_root: bool, report_fd: int) -> dict:
    # RLIMIT_NPROC counts every process of the uid, so the cap is what that uid already runs plus our budget.
    # Inside a new user namespace only the sandbox's own processes count.
    sandbox_uid = SANDBOX_UID if as_root else os.getuid()
    if as_root or mode == "rlimits":
        process_limit = _count_processes(sandbox_uid) + 1 + limits.max_processes
    else:
        process_limit = 2 + limits.max_processes  # bwrap's own pid-1 reaper and the interpreter
    return {
        "mode": mode,
        "report_fd": report_fd,
        "limits": {
            "cpu_s": int(limits.timeout_s) + 1,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
        },
        "nproc": process_limit,
        "nproc_in_new_userns": 1 + limits.max_processes,
        "unshare_network": mode == "rlimits",
        "drop_to": [SANDBOX_UID, SANDBOX_GID] if as_root else None,
        "preload": list(_PRELOAD) if as_root and mode == "rlimits" else [],
        "guard": guard,
        "max_repr_chars": MAX_REPR_CHARS,
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


def _bwrap_argv(interpreter: str, limits: SandboxLimits, as_root: bool) -> list[str]:
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
    if as_root:
        # No user namespace: the uid must really change so RLIMIT_NPROC binds; the child drops these caps.
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
    install_trees = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.dirname(interpreter))}
    for tree in sorted(install_trees):
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
    dirs |= {"/usr/lib/python3/dist-packages", f"/usr/local/lib/python3.{sys.version_info.minor}/dist-packages"}
    return sorted(d for d in dirs if d)


def _wait_then_kill_group(process, timeout_s: float) -> bool:
    """Wait up to `timeout_s`, then SIGKILL the whole process group; True when the time ran out.

    The leader is waited for without being reaped (WNOWAIT), so its pid, which is the group id, cannot be
    reused by an unrelated process before the group is killed.
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
    try:
        os.killpg(process.pid, signal.SIGKILL)  # stragglers the snippet forked, or the snippet itself
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    return timed_out


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
) -> SandboxResult:
    (stdout, stdout_cut), (stderr, stderr_cut) = output["stdout"], output["stderr"]
    common = {
        "sandbox": mode,
        "stdout": stdout,
        "stderr": stderr,
        "exit_code": returncode,
        "duration_ms": duration_ms,
        "truncated": stdout_cut or stderr_cut,
    }
    if child is not None:
        common["violations"] = tuple(str(v) for v in child.get("violations") or ())
        common["isolation"] = child.get("isolation") or {}
    if timed_out:
        return SandboxResult("timeout", f"killed after the {limits.timeout_s:.3g} s wall-clock limit", **common)
    if child is None:
        return _result_without_report(returncode, stderr, common)
    if common.get("violations"):
        return SandboxResult(
            "blocked",
            f"the snippet tried {common['violations'][0]}; the sandbox refused",
            exception=child.get("exception"),
            **common,
        )
    if child.get("outcome") == "ok":
        return SandboxResult("ok", "ran to completion", value=child.get("value"), **common)
    name, message, code = child.get("exception") or "Exception", child.get("message") or "", child.get("errno")
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
    # bwrap reports a child killed by a signal as exit status 128 + signal.
    signum = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else None
    if signum is not None:
        try:
            status, reason = _SIGNAL_STATUS.get(signal.Signals(signum), ("killed", f"killed by signal {signum}"))
        except ValueError:
            status, reason = "killed", f"killed by signal {signum}"
        return SandboxResult(status, reason, **common)
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
