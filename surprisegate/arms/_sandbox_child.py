"""Bootstrap of the "rlimits" sandbox: `sandbox.py` runs this file's code as `python -I -S -c STUB CODE SETTINGS
RUNNER_CODE` (compiled by the parent, see sandbox._code_arg; SETTINGS is a Python literal), as the user the
server runs as, in a fresh session. Stdlib only, few imports (each costs time in a 2 s round); importing
this module does nothing.

P0 (this process): unshare(2) new mount, pid, network, ipc and uts namespaces (and a user namespace when not
root; a cgroup namespace where the kernel has one), then fork P1 and wait for it; its exit status is P1's.
P1, pid 1 of the new pid namespace: makes every mount private; builds a new root on a small tmpfs holding
read-only, nosuid binds of /usr, /lib*, /bin, /sbin (symlinks stay symlinks) and of the interpreter's install,
with third-party site-packages and CPython's native test and ctypes modules covered, a fresh /proc of the new
pid namespace, a /dev with only null, zero, full, random and urandom, and a private noexec tmpfs /tmp whose
/tmp/work (owned by the sandbox's uid) is the cwd; pivot_root(2) into it and detaches the old root; names
the host "sandbox"; sets no_new_privs; forks P2 and reaps until P2 ends, then exits, which makes the kernel
kill every process left in the namespace (a `setsid` grandchild too).
P2 execs a fresh interpreter running _sandbox_runner.py (limits, uid drop, audit guard, the snippet).

What was achieved goes to the info fd as literal lines ({"init_pid": ...}, {"isolation": {...}}), written by P0
and P1, never by the snippet's process. Where unshare is refused (a container without CAP_SYS_ADMIN, user
namespaces switched off) P0 says so and, unless the parent requires full isolation, execs the runner itself:
the host filesystem, an empty network namespace where one can still be made, the uid drop and the guard.
"""

import os
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_MOVE, MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x2000, 0x4000, 0x40000, 0x200000, 0x1000000
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
# Mount options a remount must keep (in a user namespace they are locked) and their flags.
KEPT_OPTIONS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
    "strictatime": MS_STRICTATIME,
}
DEVICES = ("null", "zero", "full", "random", "urandom")
TOPS = ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin")


def main():
    settings = eval(sys.argv[1], {"__builtins__": {}})  # a literal the parent wrote
    runner_code = sys.argv[2]
    as_root = os.geteuid() == 0
    isolation = {
        "mode": "rlimits",
        "filesystem": "none",
        "pid": "none",
        "network": "audit-hook",
        "ipc": "none",
        "uts": "none",
        "cgroup": "host",
        "user": "host",
        "proc": "host",
        "uid": settings["uid"] if as_root else os.getuid(),
        "full": False,
    }
    libc, why = None, None
    try:
        import ctypes

        libc = _libc(ctypes)
    except (ImportError, OSError, AttributeError) as err:
        why = f"ctypes is unavailable, so unshare(2) cannot be called: {err}"
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    if not as_root:
        flags |= CLONE_NEWUSER
    unshared = False
    if libc is not None and not settings["namespaces"]:
        why = "namespaces are switched off (sandbox._NAMESPACES)"
    elif libc is not None:
        # A cgroup namespace too where the kernel has them (it hides the host's cgroup paths); not required.
        unshared = libc.unshare(flags | CLONE_NEWCGROUP) == 0
        isolation["cgroup"] = "cgroup-ns" if unshared else "host"
        unshared = unshared or libc.unshare(flags) == 0
        if not unshared:
            code = ctypes.get_errno()
            names = "mount, pid, network, ipc, uts" + ("" if as_root else ", user")
            why = f"unshare({names}) failed: {os.strerror(code)}"
    try:
        if unshared:
            _namespaced(settings, runner_code, libc, ctypes, isolation, as_root)
        else:
            _weak(settings, runner_code, libc, isolation, as_root, why)
    except Exception as err:  # noqa: BLE001 - the parent reports it as "unavailable", never runs weaker
        _emit(settings["info_fd"], {"error": f"{type(err).__name__}: {err}"})
        os._exit(120)


def _libc(ctypes):
    libc = ctypes.CDLL(None, use_errno=True)
    text, ulong, c_int = ctypes.c_char_p, ctypes.c_ulong, ctypes.c_int
    libc.unshare.argtypes = [c_int]
    libc.mount.argtypes = [text, text, text, ulong, text]
    libc.umount2.argtypes = [text, c_int]
    libc.prctl.argtypes = [c_int, ulong, ulong, ulong, ulong]
    libc.sethostname.argtypes = [text, ctypes.c_size_t]
    return libc


def _emit(fd, record):
    os.write(fd, (repr(record) + "\n").encode("utf-8", "backslashreplace"))


def _runner_argv(settings, runner_code, runner):
    interpreter = settings["interpreter"]
    return interpreter, [interpreter, "-I", "-S", "-c", settings["stub"], runner_code, repr(runner)]


# --------------------------------------------------------------------------------------------------
# the weak path: no namespaces


def _weak(settings, runner_code, libc, isolation, as_root, why):
    info_fd = settings["info_fd"]
    isolation["why"] = why
    if settings["require_isolation"]:
        _emit(info_fd, {"isolation": isolation, "refused": why})
        os._exit(0)
    runner = dict(settings["weak_runner"])
    runner["nproc"] = settings["nproc_shared"]
    if libc is not None and settings["namespaces"]:
        # At least an empty network namespace: root makes one directly, others inside a new user namespace.
        in_new_user_namespace = not as_root and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0
        if in_new_user_namespace or as_root and libc.unshare(CLONE_NEWNET) == 0:
            isolation["network"] = "netns"
        if in_new_user_namespace:
            isolation["user"] = "userns"
            runner["nproc"] = 1 + settings["max_processes"]
    _emit(info_fd, {"isolation": isolation})
    os.close(info_fd)
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    interpreter, argv = _runner_argv(settings, runner_code, runner)
    os.execve(interpreter, argv, {})


# --------------------------------------------------------------------------------------------------
# the namespaced path


def _namespaced(settings, runner_code, libc, ctypes, isolation, as_root):
    info_fd = settings["info_fd"]
    if not as_root:
        uid, gid = os.getuid(), os.getgid()
        _write_file("/proc/self/setgroups", "deny")
        _write_file("/proc/self/uid_map", f"{uid} {uid} 1")
        _write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    pid = os.fork()
    if pid == 0:
        try:
            _init(settings, runner_code, libc, ctypes, isolation, as_root)
        except BaseException as err:  # noqa: BLE001 - report, never fall through into P0's code
            try:
                _emit(info_fd, {"error": f"{type(err).__name__}: {err}"})
            finally:
                os._exit(120)
        os._exit(120)
    _emit(info_fd, {"init_pid": pid})
    os.close(info_fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(128 - code if code < 0 else code)


def _init(settings, runner_code, libc, ctypes, isolation, as_root):
    import _signal  # type: ignore[import-not-found]  # not `signal`: its enum import costs milliseconds

    info_fd = settings["info_fd"]
    _check(ctypes, libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")  # SIGKILL
    _signal.signal(2, _signal.SIG_IGN)  # SIGINT
    os.umask(0o022)
    isolation.update(pid="pid-ns", network="netns", ipc="ipc-ns", uts="uts-ns", proc="none")
    if not as_root:
        isolation["user"] = "userns"
    try:  # first: nothing mounted from here on may propagate back to the host
        _mount(ctypes, libc, None, "/", None, MS_REC | MS_PRIVATE)
        private = True
    except OSError as err:
        isolation["why"], isolation["proc"], private = f"mounts cannot be made private: {err}", "host", False
    if private:
        try:
            isolation.update(_new_root(settings, libc, ctypes, as_root))
            isolation["filesystem"] = "mount-ns"
        except OSError as err:
            isolation["why"] = f"the new root could not be built: {err}"
            isolation["proc"] = "host"
            try:  # still on the host's root: at least show this pid namespace's processes only
                _mount(ctypes, libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                isolation["proc"] = "pid-ns"
            except OSError:
                pass
    try:
        _check(ctypes, libc.sethostname(b"sandbox", 7), "sethostname")
    except OSError:
        pass
    isolation["full"] = isolation["filesystem"] == "mount-ns"
    if settings["require_isolation"] and not isolation["full"]:
        _emit(info_fd, {"isolation": isolation, "refused": isolation.get("why", "incomplete isolation")})
        os._exit(0)
    _emit(info_fd, {"isolation": isolation})
    os.close(info_fd)
    _check(ctypes, libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    runner = dict(settings["runner"])
    # RLIMIT_NPROC counts the uid's processes: a per-run uid has only the snippet's; a user namespace also
    # holds P0 and P1.
    runner["nproc"] = (1 if as_root else 3) + settings["max_processes"]
    interpreter, argv = _runner_argv(settings, runner_code, runner)
    if isolation["filesystem"] != "mount-ns":
        os.chdir(settings["host_work_dir"])
    snippet = os.fork()
    if snippet == 0:
        try:
            _signal.signal(2, _signal.SIG_DFL)
            os.execve(interpreter, argv, {})
        finally:
            os._exit(127)
    while True:  # pid 1: reap every orphan until the snippet's own process ends
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(120)
        if pid == snippet:
            code = os.waitstatus_to_exitcode(status)
            os._exit(128 - code if code < 0 else code)


def _new_root(settings, libc, ctypes, as_root):
    """The sandbox's filesystem, then pivot_root into it. Raises OSError where the kernel refuses a step."""
    root = settings["root_dir"]
    uid = settings["uid"] if as_root else os.getuid()
    gid = settings["uid"] if as_root else os.getgid()
    _mount(ctypes, libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=755")
    bound = []
    for top in TOPS:
        if os.path.islink(top):
            os.symlink(os.readlink(top), root + top)
        elif os.path.isdir(top):
            os.mkdir(root + top, 0o755)
            _bind_read_only(ctypes, libc, top, root + top)
            bound.append(top)
    for tree in settings["install_trees"]:
        if any(tree == b or tree.startswith(b + "/") for b in bound) or not os.path.isdir(tree):
            continue
        os.makedirs(root + tree, 0o755, exist_ok=True)
        _bind_read_only(ctypes, libc, tree, root + tree)
        bound.append(tree)
    _submounts_read_only(ctypes, libc, [root + b for b in bound])
    for hidden in settings["hide_dirs"]:  # third-party packages stay out of reach even with sys.path edits
        if os.path.isdir(root + hidden):
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            _mount(ctypes, libc, "tmpfs", root + hidden, "tmpfs", flags, "size=4k,nr_inodes=8,mode=755")
    for hidden in settings["hide_files"]:  # ctypes and CPython's test modules: /dev/null in their place
        if os.path.isfile(root + hidden):
            _mount(ctypes, libc, "/dev/null", root + hidden, None, MS_BIND)
    os.mkdir(root + "/proc", 0o555)
    proc = "none"
    try:
        _mount(ctypes, libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        proc = "pid-ns"
    except OSError:
        pass  # a container that masks /proc may refuse a new one: then there is none
    os.mkdir(root + "/dev", 0o755)
    _mount(ctypes, libc, "tmpfs", root + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
    for name in DEVICES:
        if os.path.exists("/dev/" + name):
            os.close(os.open(root + "/dev/" + name, os.O_CREAT | os.O_WRONLY, 0o666))
            _mount(ctypes, libc, "/dev/" + name, root + "/dev/" + name, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "0"), ("stdout", "1"), ("stderr", "2")):
        os.symlink(target if name == "fd" else "/proc/self/fd/" + target, root + "/dev/" + name)
    _mount(ctypes, libc, None, root + "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    os.mkdir(root + "/tmp", 0o755)
    tmp_options = f"size={settings['tmpfs_bytes']},nr_inodes=4096,mode=755"
    _mount(ctypes, libc, "tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, tmp_options)
    os.mkdir(root + "/tmp/work", 0o700)
    os.chown(root + "/tmp/work", uid, gid)
    _mount(ctypes, libc, None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    method = _pivot(ctypes, libc, root)
    os.chdir("/tmp/work")
    return {"proc": proc, "root": method}


def _pivot(ctypes, libc, root):
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None and libc.syscall(number, b".", b".") == 0:
        _check(ctypes, libc.umount2(b".", MNT_DETACH), "umount2(old root)")
        os.chdir("/")
        return "pivot_root"
    # pivot_root is refused on an initramfs root: move the new root over / and chroot into it instead.
    _mount(ctypes, libc, root, "/", None, MS_MOVE)
    os.chroot(".")
    os.chdir("/")
    return "chroot"


def _bind_read_only(ctypes, libc, source, target):
    _mount(ctypes, libc, source, target, None, MS_BIND | MS_REC)
    _mount(ctypes, libc, None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _kept_flags(source))


def _kept_flags(path):
    flags = MS_NOSUID | MS_NODEV
    statvfs = os.statvfs(path)
    for bit, flag in ((8, MS_NOEXEC), (1024, MS_NOATIME), (2048, MS_NODIRATIME), (4096, MS_RELATIME)):
        if statvfs.f_flag & bit:  # ST_NOEXEC, ST_NOATIME, ST_NODIRATIME, ST_RELATIME
            flags |= flag
    return flags


def _submounts_read_only(ctypes, libc, targets):
    """Mounts below the binds (MS_REC brought them along writable): read-only too."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as handle:
        lines = handle.read().splitlines()
    for line in lines:
        fields = line.split()
        point, options = _unescape(fields[4]), fields[5].split(",")
        if not any(point.startswith(target + "/") for target in targets):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        for option in options:
            flags |= KEPT_OPTIONS.get(option, 0)
        _mount(ctypes, libc, None, point, None, flags)


def _unescape(text):
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit():
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _mount(ctypes, libc, source, target, fstype, flags, data=None):
    encoded = [None if value is None else os.fsencode(value) for value in (source, target, fstype, data)]
    rc = libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3])
    _check(ctypes, rc, f"mount {source or ''} on {target}")


def _check(ctypes, rc, what):
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
