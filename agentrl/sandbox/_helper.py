"""In-namespace helper of LocalSandbox: builds the sandbox's filesystem, then serves requests.

Runs as pid 1 of fresh pid/mount/ipc/uts(/net) namespaces (started by ``unshare``), as
root; every command it runs first drops to the sandbox's unprivileged uid. Standalone
(stdlib only): LocalSandbox runs it by path with ``python -I -S``; nothing imports it.

Warm Python: once the root is built, the helper re-executes itself in the sandbox's own
``python3`` (the one ``PATH`` finds, with the sandbox's environment, ``-s``), so that a
``python3 -c CODE`` exec with that environment is a fork of an interpreter that has
already started: the child drops privileges exactly as for any command and runs CODE in a
fresh ``__main__``, with the modules of a fresh interpreter only (about 1 ms instead of an
interpreter start). Differences a program can see: ``sys.flags.no_user_site`` is set (the
user site directory is added when it exists, as ``python3`` would) and str hashes (set
order) are the same in every exec of one sandbox.

Protocol on stdin/stdout: frames of a 4-byte big-endian length + a JSON object; the first
frame is the config, then one reply per request, in order.
"""

from __future__ import annotations

import atexit
import base64
import builtins
import contextlib
import ctypes
import errno
import io
import json
import os
import resource
import selectors
import shutil
import signal
import site
import stat
import struct
import sys
import time
import types
import warnings  # noqa: F401 - os.execvpe imports it, once the host's stdlib is out of reach

TYPE_CHECKING = False  # (no typing import: the warm interpreter loads what it must only)
if TYPE_CHECKING:
    from typing import Any

WORKDIR = "/workspace"
SCRATCH = ("/workspace", "/tmp", "/dev/shm")
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24
MACHINE = os.uname().machine
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(MACHINE)
ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf",
    "ssl", "ca-certificates", "mime.types", "python3", "python3.11", "python3.12", "bash.bashrc",
    "profile", "inputrc", "magic",
)  # fmt: skip
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")

libc = ctypes.CDLL(None, use_errno=True)

# seccomp: like Docker's default profile, refuse new user namespaces (in one, the code would
# be uid 0 with every capability over whatever that namespace owns). clone3 hides its flags
# in memory a filter cannot read, so it gets ENOSYS and libc falls back to clone.
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, CLONE_NEWUSER = 22, 2, 0x10000000
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
# machine: (AUDIT_ARCH, unshare, clone, clone3, first number of a foreign ABI on this arch)
SECCOMP_ARCH = {
    "x86_64": (0xC000003E, 272, 56, 435, 0x40000000),  # x32 numbers start at 2**30
    "aarch64": (0xC00000B7, 97, 220, 435, 0xFFFFFFFF),
}.get(MACHINE)


class SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    )


class SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter)))


def no_user_namespaces() -> None:
    """Installs a seccomp filter: unshare/clone with CLONE_NEWUSER fail with EPERM, clone3
    and foreign ABIs (i386 int 0x80, x32) with ENOSYS. Needs no_new_privs."""
    if SECCOMP_ARCH is None:
        raise OSError(f"no seccomp filter for {MACHINE}")
    audit, unshare, clone, clone3, foreign = SECCOMP_ARCH
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|..., BPF_RET
    prog = [
        (ld, 0, 0, 4),  # 0: A = seccomp_data.arch
        (jeq, 1, 0, audit),  # 1: native -> 3
        (ret, 0, 0, RET_ERRNO | errno.ENOSYS),  # 2: i386 via int 0x80 and the like
        (ld, 0, 0, 0),  # 3: A = seccomp_data.nr
        (jge, 0, 1, foreign),  # 4: x32 -> 5, else -> 6
        (ret, 0, 0, RET_ERRNO | errno.ENOSYS),  # 5
        (jeq, 0, 1, clone3),  # 6: clone3 -> 7, else -> 8
        (ret, 0, 0, RET_ERRNO | errno.ENOSYS),  # 7
        (jeq, 2, 0, unshare),  # 8: unshare -> 11
        (jeq, 1, 0, clone),  # 9: clone -> 11
        (ret, 0, 0, RET_ALLOW),  # 10
        (ld, 0, 0, 16),  # 11: A = low 32 bits of args[0] (the flags; little-endian)
        (jset, 0, 1, CLONE_NEWUSER),  # 12: CLONE_NEWUSER set -> 13, else -> 14
        (ret, 0, 0, RET_ERRNO | errno.EPERM),  # 13
        (ret, 0, 0, RET_ALLOW),  # 14
    ]
    insns = (SockFilter * len(prog))(*(SockFilter(*i) for i in prog))
    fprog = SockFprog(len(prog), insns)
    rc = libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0)
    _check(rc, "seccomp")


class PathError(Exception):
    """A file path outside the working directory."""


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = lambda s: s.encode() if s else None  # noqa: E731 - tiny local encoder
    _check(libc.mount(enc(src), dst.encode(), enc(fstype), flags, enc(data)), f"mount {dst}")


def bind(src: str, dst: str, *, ro: bool = True, flags: int = MS_NOSUID | MS_NODEV) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    mount(src, dst, None, MS_BIND | MS_REC)
    mount(None, dst, None, MS_BIND | MS_REMOUNT | flags | (MS_RDONLY if ro else 0))


def build_root(cfg: dict[str, Any]) -> None:
    """Builds a minimal read-only system view plus a size-limited scratch disk, and enters it."""
    root, uid, gid = cfg["root"], cfg["uid"], cfg["gid"]
    for cg in cfg["cgroups"]:  # join the sandbox's cgroups before anything else runs
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write("0")
    # a memory bomb should kill the code, not the helper (some hosts forbid lowering it)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    import socket  # (here: only the set-up needs it)

    socket.sethostname("sandbox")
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    bind("/usr", root + "/usr")
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        src = "/" + name
        if os.path.islink(src):
            os.symlink(os.readlink(src), root + src)
        elif os.path.isdir(src):
            bind(src, root + src)
    etc = root + "/etc"
    os.makedirs(etc)
    for name in ETC_FILES:
        if os.path.exists("/etc/" + name):
            bind("/etc/" + name, f"{etc}/{name}")
    files = {
        "passwd": f"root:x:0:0::/:/usr/sbin/nologin\nsandbox:x:{uid}:{gid}::{WORKDIR}:/bin/sh\n",
        "group": f"root:x:0:\nsandbox:x:{gid}:\n",
        "hostname": "sandbox\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
    }
    for name, text in files.items():
        with open(f"{etc}/{name}", "w") as f:
            f.write(text)
    dev = root + "/dev"
    os.makedirs(dev)
    for name in DEV_NODES:
        if os.path.exists("/dev/" + name):
            bind("/dev/" + name, f"{dev}/{name}", ro=False, flags=MS_NOSUID)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"{dev}/{name}")
    os.symlink("/proc/self/fd", dev + "/fd")
    disk = root + "/.disk"  # one tmpfs holds the workdir, /tmp and /dev/shm: one disk bound
    os.makedirs(disk)
    inodes = max(4096, cfg["disk_mb"] * 256)  # millions of empty files cost kernel memory too
    opts = f"size={cfg['disk_mb']}m,nr_inodes={inodes},mode=755"
    mount("tmpfs", disk, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    for path in SCRATCH:
        os.makedirs(disk + path)
        if path == WORKDIR:
            os.chown(disk + path, uid, gid)
        else:
            os.chmod(disk + path, 0o1777)
        bind(disk + path, root + path, ro=False)
    _check(libc.umount2(disk.encode(), MNT_DETACH), "umount scratch staging")
    os.rmdir(disk)
    for path in cfg["ro_binds"]:
        bind(path, root + path)
    os.makedirs(root + "/proc")
    proc_flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:  # hidepid: the code sees its own processes, not the helper
        mount("proc", root + "/proc", "proc", proc_flags, "hidepid=2")
    except OSError:
        mount("proc", root + "/proc", "proc", proc_flags)
    enter_root(root)
    mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def enter_root(root: str) -> None:
    """pivot_root into ``root`` and detaches the host's tree (chroot where pivot_root fails)."""
    os.chdir(root)
    os.makedirs(".old")
    if SYS_PIVOT_ROOT is not None and libc.syscall(SYS_PIVOT_ROOT, b".", b".old") == 0:
        os.chroot(".")
        _check(libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    else:
        os.chroot(".")
    os.rmdir("/.old")
    os.chdir("/")


def kill_all(main_pid: int, status: int | None) -> int | None:
    """SIGKILLs every other process of the pid namespace and reaps them; returns main's status."""
    while True:
        with contextlib.suppress(ProcessLookupError):  # as pid 1: all in this namespace but us
            os.kill(-1, signal.SIGKILL)
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if pid == main_pid:
            status = st


def child(req: dict[str, Any], cfg: dict[str, Any], fds: tuple[int, int, int]) -> None:
    """Runs in the forked child: limits, drop privileges, exec (or warm Python). Never returns."""
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        if not req.get("warm"):  # an exec'd program starts from the default dispositions
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        for name, value in cfg["rlimits"].items():
            soft, hard = value if isinstance(value, list) else (value, value)
            resource.setrlimit(getattr(resource, name), (soft, hard))
        os.chdir(req.get("cwd") or WORKDIR)
        for cap in range(64):  # empty the bounding set: nothing exec'd can regain a capability
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                break
        os.setgroups([])
        os.setgid(cfg["gid"])
        os.setuid(cfg["uid"])
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        no_user_namespaces()
        if req.get("warm"):
            os._exit(run_python(req["argv"][2], req["env"]))
        os.execvpe(req["argv"][0], req["argv"], req["env"])
    except BaseException as e:
        os.write(2, f"sandbox: cannot run {req['argv'][0]!r}: {e}\n".encode())
    os._exit(127)


# Warm Python ------------------------------------------------------------------
WARM: dict[str, Any] = {}  # {"python": realpath, "env": env} once serving in the sandbox's python
# How the sandbox's python3 runs this file: it notes the modules of a fresh interpreter
# (``FRESH``, a global of the source it then runs) before the helper imports its own.
BOOT = "import sys; FRESH = frozenset(sys.modules); exec(sys.argv.pop())"
# Variables that change what the interpreter loads at start: with any of them, no warm Python
# (the helper runs as root and must load only the system's own files).
_PY_LOADERS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONPLATLIBDIR")


def _loads_foreign_code(env: dict[str, str]) -> bool:
    return any(k in _PY_LOADERS or k.startswith("LD_") for k in env)


def warm_python(env: dict[str, str]) -> str | None:
    """The sandbox's ``python3`` to serve from (>= 3.9), or None (serve from this one)."""
    if _loads_foreign_code(env) or os.environ.get("AGENTRL_SANDBOX_WARM") == "0":
        return None
    found = shutil.which("python3", path=env.get("PATH", os.defpath))
    real = os.path.realpath(found) if found else ""
    name = os.path.basename(real)
    try:
        major, minor = (int(x) for x in name.removeprefix("python").split(".")[:2])
    except ValueError:
        return None
    return real if (major, minor) >= (3, 9) and os.access(real, os.X_OK) else None


def is_warm(req: dict[str, Any]) -> bool:
    """Whether an exec is ``python3 -c CODE`` for the interpreter serving, in its environment."""
    argv, env = req["argv"], req["env"]
    if not WARM or len(argv) != 3 or argv[1] != "-c" or env != WARM["env"]:
        return False
    found = shutil.which(argv[0], path=env.get("PATH", os.defpath))  # (a path: as it is)
    return bool(found) and os.path.realpath(found) == WARM["python"]


def fresh_stdio() -> None:
    """New sys.stdin/stdout/stderr on fds 0-2, configured as the interpreter made its own
    (the helper's stdin may hold buffered bytes of its requests)."""
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        buffered = not (fd and isinstance(old.buffer, io.FileIO))  # -u: unbuffered bytes
        buf = (io.BufferedReader if fd == 0 else io.BufferedWriter)(raw) if buffered else raw
        new = io.TextIOWrapper(
            buf, encoding=old.encoding, errors=old.errors,
            line_buffering=old.line_buffering, write_through=old.write_through,
        )  # fmt: skip
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def run_python(code: str, env: dict[str, str]) -> int:
    """Runs ``code`` as ``python3 -c`` would (after privileges are dropped); returns the exit
    status: tracebacks, SystemExit, non-daemon threads and atexit handlers as in CPython.
    Imports nothing: the modules it needs were loaded before any code ran."""
    fresh_stdio()
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c"]
    sys.orig_argv = [sys.orig_argv[0], "-c", code]
    sys.path.insert(0, "")  # -c: the working directory first
    user_site = site.getusersitepackages()
    if os.path.isdir(user_site):
        site.addsitedir(user_site)
    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __loader__=None, __spec__=None)
    fresh = globals().get("FRESH", ())
    for name in [m for m in sys.modules if m not in fresh]:  # the helper's own imports
        del sys.modules[name]
    sys.modules["__main__"] = main
    frame: types.FrameType | None = sys._getframe()
    depth = 1  # the helper's frames below the code's (and exec())
    while frame is not None:  # must not count against the code's recursion limit
        frame, depth = frame.f_back, depth + 1
    sys.setrecursionlimit(sys.getrecursionlimit() + depth)
    status, interrupted = 0, False
    try:
        exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        status = exit_status(e)
    except BaseException as e:  # what the interpreter prints for an uncaught exception
        e = e.with_traceback(e.__traceback__.tb_next if e.__traceback__ else None)  # not ours
        sys.excepthook(type(e), e, e.__traceback__)
        status, interrupted = 1, isinstance(e, KeyboardInterrupt)
    try:
        if "threading" in sys.modules:
            sys.modules["threading"]._shutdown()  # joins non-daemon threads, as at exit
        atexit._run_exitfuncs()
    except SystemExit as e:
        status = exit_status(e)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:  # CPython ends an uncaught KeyboardInterrupt by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


def exit_status(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    with contextlib.suppress(Exception):
        print(e.code, file=sys.stderr)
    return 1


def run(req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Runs one command to completion or timeout, then kills everything it left behind."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if req.get("stdin") is not None:
        in_fd = os.memfd_create("stdin")
        os.write(in_fd, base64.b64decode(req["stdin"]))
        os.lseek(in_fd, 0, os.SEEK_SET)
    else:
        in_fd = os.open("/dev/null", os.O_RDONLY)
    req["warm"] = is_warm(req)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(req, cfg, (in_fd, out_w, err_w))
    for fd in (in_fd, out_w, err_w):
        os.close(fd)
    limit = int(req["max_output"])
    bufs = {out_r: bytearray(), err_r: bytearray()}
    dropped = {out_r: 0, err_r: 0}
    pidfd = os.pidfd_open(pid)
    sel = selectors.DefaultSelector()
    for fd in (out_r, err_r, pidfd):
        sel.register(fd, selectors.EVENT_READ)
    deadline = start + float(req["timeout"])
    status: int | None = None
    timed_out = False

    def take(fd: int) -> bool:
        data = os.read(fd, 1 << 16)
        room = max(0, limit - len(bufs[fd]))
        bufs[fd] += data[:room]
        dropped[fd] += len(data) - min(room, len(data))
        return bool(data)

    while status is None:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(left):
            if key.fd == pidfd:
                status = os.waitpid(pid, 0)[1]
            elif not take(key.fd):
                sel.unregister(key.fd)
    sel.close()
    os.close(pidfd)
    status = kill_all(pid, status)
    for fd in (out_r, err_r):  # every writer is dead now: read to EOF
        while take(fd):
            pass
        os.close(fd)
    code = os.waitstatus_to_exitcode(status) if status is not None else -signal.SIGKILL
    return {
        "ok": True,
        "stdout": base64.b64encode(bytes(bufs[out_r])).decode(),
        "stderr": base64.b64encode(bytes(bufs[err_r])).decode(),
        "dropped": [dropped[out_r], dropped[err_r]],
        "exit_code": code,
        "timed_out": timed_out,
    }


def resolve(path: str) -> str:
    full = os.path.realpath(os.path.join(WORKDIR, path))
    if full != WORKDIR and not full.startswith(WORKDIR + "/"):
        raise PathError(f"path {path!r} resolves to {full!r}, outside the working directory")
    return full


def open_regular(full: str, shown: str, flags: int) -> int:
    """Opens ``full`` without blocking and only if it is a regular file (not a FIFO, device,
    socket, directory or link): a FIFO would otherwise block the helper forever."""
    try:
        fd = os.open(full, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, 0o644)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR, errno.ELOOP, errno.EOPNOTSUPP):
            raise PathError(f"path {shown!r} is not a regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise PathError(f"path {shown!r} is not a regular file")
    os.set_blocking(fd, True)
    return fd


def write_file(req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    full = resolve(req["path"])
    parent = os.path.dirname(full)
    made = []
    while not os.path.isdir(parent):
        made.append(parent)
        parent = os.path.dirname(parent)
    for d in reversed(made):
        os.mkdir(d)
        os.chown(d, cfg["uid"], cfg["gid"])
    full = resolve(req["path"])
    fd = open_regular(full, req["path"], os.O_WRONLY | os.O_CREAT)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, base64.b64decode(req["data"]))
        os.fchown(fd, cfg["uid"], cfg["gid"])
    finally:
        os.close(fd)
    return {"ok": True}


def read_regular(full: str, shown: str) -> str:
    """The bytes of the regular file ``full``, base64-encoded (see :func:`open_regular`)."""
    fd = open_regular(full, shown, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return base64.b64encode(b"".join(chunks)).decode()


def read_file(req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "data": read_regular(resolve(req["path"]), req["path"])}


def reset(req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    kill_all(-1, None)
    for path in SCRATCH:
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    return {"ok": True}


def snapshot(req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Every directory, regular file and symlink under the scratch directories, in order
    (parents first), for a fork. No process survives a call, so there is none to copy;
    FIFOs and sockets are left out, hard links become separate files."""
    entries: list[dict[str, Any]] = []
    stack = [top for top in reversed(SCRATCH)]
    while stack:  # (no recursion: a deep tree must not exhaust the helper's stack)
        with os.scandir(stack.pop()) as it:
            found = sorted(it, key=lambda e: e.name)
        subdirs = []
        for e in found:
            st = e.stat(follow_symlinks=False)
            mode, mtime = stat.S_IMODE(st.st_mode), st.st_mtime_ns
            if stat.S_ISLNK(st.st_mode):
                entries.append({"p": e.path, "t": "l", "to": os.readlink(e.path)})
            elif stat.S_ISDIR(st.st_mode):
                entries.append({"p": e.path, "t": "d", "m": mode, "mt": mtime})
                subdirs.append(e.path)
            elif stat.S_ISREG(st.st_mode):
                data = read_regular(e.path, e.path)
                entries.append({"p": e.path, "t": "f", "m": mode, "mt": mtime, "data": data})
        stack.extend(reversed(subdirs))
    return {"ok": True, "entries": entries}


def in_scratch(path: str) -> bool:
    norm = os.path.normpath(path)
    return norm == path and any(path.startswith(top + "/") for top in SCRATCH)


def restore(req: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """Recreates a :func:`snapshot` in this (fresh) sandbox, owned by its uid. Symlinks are
    made last, so no path written here passes through one."""
    uid, gid = cfg["uid"], cfg["gid"]
    entries = req["entries"]
    for e in entries:
        if not in_scratch(e["p"]):
            raise PathError(f"fork entry {e['p']!r} is outside the scratch directories")
    for e in entries:
        if e["t"] == "d":
            os.mkdir(e["p"], 0o700)
            os.chown(e["p"], uid, gid)
        elif e["t"] == "f":
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(e["p"], flags, 0o600)
            try:
                view = memoryview(base64.b64decode(e["data"]))
                while view:
                    view = view[os.write(fd, view) :]
                os.fchown(fd, uid, gid)
                os.fchmod(fd, e["m"] & 0o777)
                os.utime(fd, ns=(e["mt"], e["mt"]))
            finally:
                os.close(fd)
    for e in entries:
        if e["t"] == "l":
            os.symlink(e["to"], e["p"])
            os.lchown(e["p"], uid, gid)
    for e in reversed(entries):  # after their contents: a read-only dir, its mtime
        if e["t"] == "d":
            os.chmod(e["p"], e["m"] & 0o1777)
            os.utime(e["p"], ns=(e["mt"], e["mt"]))
    return {"ok": True}


def serve(inp: Any, out: Any, cfg: dict[str, Any]) -> None:
    ops = {"exec": run, "write": write_file, "read": read_file, "reset": reset}
    ops.update(snapshot=snapshot, restore=restore)
    ops["ping"] = lambda req, cfg: {"ok": True}
    while True:
        req = read_frame(inp)
        if req is None or req.get("op") == "exit":
            return
        try:
            reply = ops[req["op"]](req, cfg)
        except PathError as e:
            reply = {"ok": False, "kind": "path", "error": str(e)}
        except OSError as e:
            reply = {"ok": False, "kind": "os", "error": str(e)}
        write_frame(out, reply)


def read_frame(inp: Any) -> dict[str, Any] | None:
    head = inp.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    body: dict[str, Any] = json.loads(inp.read(n))
    return body


def write_frame(out: Any, obj: dict[str, Any]) -> None:
    body = json.dumps(obj).encode()
    view = memoryview(struct.pack(">I", len(body)) + body)
    while view:  # unbuffered (PYTHONUNBUFFERED in the sandbox's env): writes may be partial
        view = view[out.write(view) or 0 :]
    out.flush()


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    with open(__file__) as f:  # before the host's files are out of reach
        source = f.read()
    cfg = read_frame(inp)
    if cfg is None:
        return
    try:
        build_root(cfg)
    except Exception as e:
        import traceback

        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"{type(e).__name__}: {e} (at {where.name}:{where.lineno}: {where.line})"
        write_frame(out, {"ok": False, "kind": "setup", "error": msg})
        return
    python = warm_python(cfg["env"]) if "env" in cfg else None
    if python is not None:
        # Serve from the sandbox's python3 (it answers the setup); -s: no user site as root.
        with contextlib.suppress(OSError):
            argv = [python, "-s", "-c", BOOT, "--serve", json.dumps(cfg), source]
            os.execve(python, argv, cfg["env"])
    write_frame(out, {"ok": True})
    serve(inp, out, cfg)


def main_warm(cfg: dict[str, Any]) -> None:
    """Serving from the sandbox's python3 (see the module docstring); never imports after this."""
    os.chdir("/")
    sys.path[:] = [p for p in sys.path if p]  # nothing from the working directory, as root
    WARM.update(python=os.path.realpath(sys.executable), env=cfg["env"])
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    write_frame(out, {"ok": True})
    serve(inp, out, cfg)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        main_warm(json.loads(sys.argv[2]))
    else:
        main()
