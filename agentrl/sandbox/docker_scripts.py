"""The shell scripts DockerSandbox runs inside its container, all as the sandbox user.

Every exec, and every file operation, is a ``docker exec`` of ``sh -c SCRIPT`` as uid 1000:
paths are resolved by the kernel with the sandbox user's rights, never by the engine's
privileged archive API (which followed a symlink in the middle of a path, e.g.
``link/etc/shadow``, as root). The scripts need only POSIX ``sh`` and coreutils
(``timeout``, ``cat``, ``tar`` for downloads).

Background-process sweep: after a command ends, its process group is killed; then every
other uid-1000 process is killed too, unless another exec is still running its command.
Another exec is recognised by something the code cannot forge: a ``docker exec`` process
has its parent outside the container's pid namespace, so its ``PPid`` reads 0, and while
it runs its command it has a child (its ``timeout``). (The sweep used to be gated by a
shared ``flock`` on ``/``, which any daemon could hold forever to switch it off.) The
sweep uses shell builtins only, STOPs what it will kill until nothing new appears (so a
forking daemon cannot outrun it), spares every exec process (so two execs ending together
do not kill each other's shells), and backs off, resuming what it stopped, if another
exec turns out to be running a command.
"""

from __future__ import annotations

__all__ = [
    "EXIT_MISSING",
    "EXIT_NOT_REGULAR",
    "EXIT_OUTSIDE",
    "READ",
    "TAR",
    "TAR_WORKDIR",
    "WRAPPER",
    "WRITE",
]

UID = 1000

#: Exit codes of the file scripts (each also prints why on stderr).
EXIT_MISSING, EXIT_OUTSIDE, EXIT_NOT_REGULAR = 3, 4, 5

_SWEEP = r"""sweep() {
  victims=" "; round=0
  while [ "$round" -lt 30 ]; do
    round=$((round + 1)); execs=" "; others=""
    for d in /proc/[0-9]*; do
      pid=${d#/proc/}; [ "$pid" = "$$" ] && continue
      pp=""; uid=""
      while read -r k v _; do
        case $k in PPid:) pp=$v ;; Uid:) uid=$v; break ;; esac
      done 2>/dev/null < "$d/status"
      [ "$uid" = __UID__ ] || continue
      if [ "$pp" = 0 ]; then execs="$execs$pid "; else others="$others $pid:$pp"; fi
    done
    new=""
    for x in $others; do
      case $execs in *" ${x#*:} "*)
        [ "$victims" = " " ] || kill -s CONT $victims 2>/dev/null
        return 0 ;;
      esac
      case $victims in *" ${x%:*} "*) ;; *) new="$new ${x%:*}" ;; esac
    done
    [ -n "$new" ] || break
    kill -s STOP $new 2>/dev/null
    victims="$victims${new# } "
  done
  [ "$victims" = " " ] || kill -s KILL $victims 2>/dev/null
  return 0
}
""".replace("__UID__", str(UID))

#: argv: $1 timeout seconds, $2 kill_background (1/0), then the command. fd 8 keeps the
#: exec's stdin for the command, which runs in its own process group under ``timeout``.
#: ``wait``'s stderr goes to /dev/null: dash reports a job killed by a signal there
#: ("Terminated"), and only when ``wait`` itself reaps it (a race), which put a line the
#: command never wrote into its stderr, on some runs and not others. The command's own
#: stderr was bound at fork and is not affected.
WRAPPER = (
    _SWEEP
    + r"""t=$1; kb=$2; shift 2
exec 8<&0
timeout -s KILL "$t" "$@" <&8 8<&- &
p=$!
wait "$p" 2>/dev/null; rc=$?
exec 8<&-
if [ "$kb" = 1 ]; then
  kill -s KILL -- "-$p" 2>/dev/null
  sweep
fi
exit "$rc"
"""
)

# $1: an absolute, normalised path under /workspace (checked on the host too). The parent
# directory is entered with `cd -P`, which resolves every link in it as the sandbox user;
# the result must still be under /workspace, and the last component must be a regular file
# (not a link, FIFO, device, socket or directory).
_RESOLVE = rf"""p=$1; d=${{p%/*}}; b=${{p##*/}}
cd -P -- "${{d:-/}}" 2>/dev/null || {{ echo "no such directory: $d" >&2; exit {EXIT_MISSING}; }}
case $PWD in
  /workspace|/workspace/*) ;;
  *) echo "path $p resolves outside the working directory" >&2; exit {EXIT_OUTSIDE} ;;
esac
"""

#: Prints the file's bytes on stdout.
READ = (
    _RESOLVE
    + rf"""if [ -L "$b" ] || {{ [ -e "$b" ] && [ ! -f "$b" ]; }}; then
  echo "path $p is not a regular file (a link, FIFO, device, socket or directory)" >&2
  exit {EXIT_NOT_REGULAR}
fi
[ -e "$b" ] || {{ echo "no such file: $p" >&2; exit {EXIT_MISSING}; }}
exec cat -- "$b"
"""
)

#: Writes stdin to the file (parents created, as the sandbox user).
WRITE = (
    r"""d=${1%/*}; mkdir -p -- "${d:-/}" 2>/dev/null
"""
    + _RESOLVE
    + rf"""if [ -L "$b" ] || {{ [ -e "$b" ] && [ ! -f "$b" ]; }}; then
  echo "path $p is not a regular file (a link, FIFO, device, socket or directory)" >&2
  exit {EXIT_NOT_REGULAR}
fi
exec cat > "$b"
"""
)

#: Prints a tar of the file or directory on stdout, named by its last component.
TAR = (
    _RESOLVE
    + rf"""[ -e "$b" ] || [ -L "$b" ] || {{ echo "no such path: $p" >&2; exit {EXIT_MISSING}; }}
exec tar -cf - -- "$b"
"""
)

#: A tar of the whole working directory, named ``workspace``.
TAR_WORKDIR = "cd / && exec tar -cf - -- workspace\n"
