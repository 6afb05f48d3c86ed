"""Attacks on the Act tools: every attempt must be contained AND reported (a status and a reason).

Each attack runs in every sandbox this machine offers ("rlimits" always, "bwrap" when usable), first with
the audit guard (the default: the attempt is refused and named), then, where the OS layer alone must hold,
with `guard=False`. Everything is capped so no test can harm the machine: processes under RLIMIT_NPROC,
memory under RLIMIT_AS, time under a short wall clock; all writes aim at this test's own tmp_path.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest

from surprisegate.arms import Query, sandbox
from surprisegate.arms.sandbox import SandboxLimits, bwrap_status, run_python
from surprisegate.arms.tools import ToolArm
from surprisegate.errors import ArmError

MODES = ["rlimits"] + (["bwrap"] if bwrap_status()[0] else [])
LIMITS = SandboxLimits(timeout_s=3.0, max_processes=4)
EACH_ATTACK_S = 5.0  # no attack may take longer than this to be contained


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
    # killed with the process group (or the pid namespace) when the run ends.
    code = (
        "import os, time\ncount = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    count += 1\ncount"
    )
    # RLIMIT_NPROC counts the uid's processes; ones that end during the run (zombies of earlier runs being
    # reaped) free slots, so the bound is our budget plus what the uid ran at the start.
    already_running = sandbox._count_processes(sandbox.SANDBOX_UID if os.geteuid() == 0 else os.getuid())
    result = attack(code, mode, guard=False)
    assert result.status == "ok"
    assert int(result.value) <= LIMITS.max_processes + already_running


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
# through the tool arm: injection via the span text, file escapes, status allow-list


@pytest.fixture
def roots(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "notes.txt").write_text("alpha\n", encoding="utf-8")
    return root


def _arm_failure(arm: ToolArm, question: str) -> str:
    with pytest.raises(ArmError) as caught:
        arm.ground(Query(span="", question=question, sentence=""), time.monotonic() + 5)
    return str(caught.value)


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
