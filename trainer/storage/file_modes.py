"""Everything the project keeps on a local disk is readable by every user: files 0644,
folders 0755, whichever library wrote them.

safetensors creates its files 0600 (`save_file`, so every `save_pretrained` and Trainer
checkpoint), where everything else a save writes is 0644 under the usual umask. A model saved
by root (the training image runs as root) is then unreadable to any other user: the serving
image's server (uid 10001) that mounts it, a colleague on a shared disk. transformers reports
that as "No such file or directory". So the folders the project writes are set to these
modes after each save, before they are uploaded, and where a local store keeps a copy.
Cloud Storage has no POSIX modes; a /gcs/ path is written through Cloud Storage
(trainer/storage/store.py), not through the mount.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path

FILE_MODE = 0o644
FOLDER_MODE = 0o755


def make_readable(root: Path) -> None:
    """`root` and every folder below it 0755, every file 0644 (a file `root`: 0644). Links
    are left alone (a mode set through one would change its target, which may be anyone's);
    an entry this process may not change (another user's) is left as it is."""
    set_mode(root)
    if not root.is_dir() or root.is_symlink():
        return
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            set_mode(Path(folder) / name)


def make_files_readable(root: Path, files: Iterable[str]) -> None:
    """Those `files` (relative to `root`) 0644, and every folder between them and `root`
    0755 (`root` itself is left as it is: it may be a folder the user made)."""
    folders: set[Path] = set()
    for name in files:
        path = root / name
        set_mode(path)
        folders.update(parent for parent in path.parents if root in parent.parents)
    for folder in folders:
        set_mode(folder)


def set_mode(path: Path) -> None:
    try:
        status = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISDIR(status.st_mode):
        wanted = FOLDER_MODE
    elif stat.S_ISREG(status.st_mode):
        wanted = FILE_MODE
    else:
        return  # a link, a socket: not written as model files are
    if stat.S_IMODE(status.st_mode) == wanted:
        return
    with contextlib.suppress(PermissionError):  # not this process's file: its owner decides
        os.chmod(path, wanted)
