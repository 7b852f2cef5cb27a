"""Where a listening process's socket lives, and the checks made before using it.

The directory is ``$XDG_RUNTIME_DIR/aioprof`` when XDG_RUNTIME_DIR is an absolute path
to a directory of this user that no one else can write to, else ``/tmp/aioprof-UID``.
Before it is used, by the server or by a client, the directory must be a real directory
(not a symlink), owned by this user, with no group or other permission bits (mode
0700); one that is not is refused with one line, never repaired. The server creates it
(mode 0700) when it is missing. The socket in it is ``PID.sock``, mode 0600; a process
listening on TCP has ``PID.tcp`` there instead (its address and token, mode 0600).
"""
from __future__ import annotations

import os
import stat
from typing import List, Optional

from aioprof.live import ListenError

__all__ = ["candidate_dirs", "check_dir", "socket_dir", "socket_name", "token_name"]


def socket_name(pid: int) -> str:
    return f"{pid}.sock"


def token_name(pid: int) -> str:
    """The file of a process listening on TCP: its address and token (mode 0600)."""
    return f"{pid}.tcp"


def _xdg_base(environ: Optional[dict] = None) -> Optional[str]:
    """$XDG_RUNTIME_DIR if it is usable as the parent of our directory, else None."""
    base = (os.environ if environ is None else environ).get("XDG_RUNTIME_DIR", "")
    if not base or not os.path.isabs(base):
        return None
    try:
        st = os.stat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return base


def candidate_dirs(environ: Optional[dict] = None) -> List[str]:
    """The directories a socket of this user can be in, the server's choice first."""
    dirs = []
    base = _xdg_base(environ)
    if base is not None:
        dirs.append(os.path.join(base, "aioprof"))
    dirs.append(os.path.join("/tmp", f"aioprof-{os.geteuid()}"))
    return dirs


def check_dir(path: str) -> None:
    """Raise ListenError (one line) unless `path` is a directory (not a symlink) owned by
    this user with mode 0700 or stricter (no group or other bits). OSError (e.g.
    FileNotFoundError) propagates."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise ListenError(f"refusing {path}: it is {kind}; remove it (aioprof makes a "
                          f"directory of mode 0700 there)")
    if st.st_uid != os.geteuid():
        raise ListenError(f"refusing {path}: it is owned by uid {st.st_uid}, not by this "
                          f"user (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        raise ListenError(f"refusing {path}: its mode is {stat.S_IMODE(st.st_mode):04o}, "
                          f"group or others can enter it; it must be 0700 (chmod 700 {path})")


def socket_dir(create: bool = True, environ: Optional[dict] = None) -> str:
    """The server's directory, checked (and created mode 0700 if missing and `create`).
    Raises ListenError if it is refused or cannot be made."""
    path = candidate_dirs(environ)[0]
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise ListenError(f"cannot make {path}: {e.strerror or e}") from None
    try:
        check_dir(path)
    except OSError as e:
        raise ListenError(f"cannot use {path}: {e.strerror or e}") from None
    return path
