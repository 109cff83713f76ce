"""Names inside a layer's own directory, resolved so nothing outside it is ever touched.

Every entry name is cleaned lexically (``..`` clamps at the root, absolute names are
rooted there), then its parent directories are resolved one component at a time,
symlinks included, as if the layer's directory were ``/``. The last component is never
followed. The layers below, once committed, are looked up the way overlayfs reads them
(whiteouts and opaque directories hide what lies under them).
"""

from __future__ import annotations

import os
import posixpath
import shutil
import stat
from collections.abc import Sequence

from pycrid.errors import DataLoss, NotFound

_MAX_LINK_HOPS = 255
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
OVERLAY_XATTRS = "trusted.overlay."
OPAQUE_XATTR = "trusted.overlay.opaque"


def is_whiteout(st: os.stat_result) -> bool:
    """An overlayfs whiteout: a character device with device number 0/0."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def make_whiteout(path: str) -> None:
    os.mknod(path, stat.S_IFCHR, 0)


def make_dir(path: str, *, opaque: bool) -> None:
    os.mkdir(path, 0o755)
    if opaque:
        os.setxattr(path, OPAQUE_XATTR, b"y", follow_symlinks=False)


def is_opaque(path: str) -> bool:
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def lower_entry(root: str, lowers: Sequence[str], rel: str) -> tuple[str, os.stat_result] | None:
    """What the layers ``lowers`` (top first) show at ``rel`` under the layer at ``root``,
    looked up as overlayfs does: the topmost lower entry, unless a whiteout, an opaque
    directory or a non-directory on the way (in this layer or below) hides it."""
    parts = rel.split("/")
    current = root
    for comp in parts[:-1]:
        current = os.path.join(current, comp)
        if is_opaque(current):
            return None
    for lower in lowers:
        current, last = lower, False
        for comp in parts[:-1]:
            current = os.path.join(current, comp)
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                break
            if not stat.S_ISDIR(st.st_mode):
                return None
            last = last or is_opaque(current)
        else:
            path = os.path.join(lower, rel)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                pass
            else:
                return None if is_whiteout(st) else (path, st)
        if last:
            return None
    return None


class Resolver:
    """Resolves names inside ``root``; remembers the directories it made for entries whose
    parents the layer does not list (they take their metadata from the layers below).

    A directory once resolved is remembered (most entries share their parent with the one
    before), until the caller says the tree changed under it: :meth:`forget` after anything
    is removed or replaced, or a symlink is made. Creating a name that did not exist cannot
    change where an existing directory resolves, except through the layers below (a new
    name hides theirs), so with ``lowers`` nothing is remembered."""

    def __init__(self, root: str, *, has_lower: bool = False,
                 lowers: Sequence[str] = ()) -> None:
        self.root = os.path.realpath(root)
        self.has_lower = has_lower or bool(lowers)
        #: The committed layers below, top first, when known: missing components are then
        #: looked up in them (a symlink there is followed, a file refused).
        self.lowers = lowers
        self.implicit: set[str] = set()
        self._dirs: dict[str, str] = {}

    def forget(self) -> None:
        """The tree changed (an entry removed or replaced, a symlink made): resolve anew."""
        self._dirs.clear()

    def parent(self, rel_dir: str, *, create: bool) -> str:
        """The real path of directory ``rel_dir`` (cleaned, relative to root), inside root."""
        known = self._dirs.get(rel_dir)
        if known is not None:
            return known
        current = self._resolve(rel_dir, create=create)
        if not self.lowers:
            self._dirs[rel_dir] = current
        return current

    def _resolve(self, rel_dir: str, *, create: bool) -> str:
        todo = [c for c in rel_dir.split("/") if c]
        current = self.root
        hops = 0
        while todo:
            comp = todo.pop(0)
            if comp == ".":
                continue
            if comp == "..":
                current = self.root if current == self.root else os.path.dirname(current)
                continue
            candidate = os.path.join(current, comp)
            link = candidate
            try:
                st = os.lstat(candidate)
            except FileNotFoundError:
                below = (lower_entry(self.root, self.lowers, os.path.relpath(candidate, self.root))
                         if self.lowers else None)
                if below is None or stat.S_ISDIR(below[1].st_mode):
                    if not create:
                        raise NotFound(
                            f"{candidate[len(self.root):] or '/'} does not exist") from None
                    make_dir(candidate, opaque=False)
                    self.implicit.add(candidate)
                    current = candidate
                    continue
                link, st = below
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    raise DataLoss(f"too many levels of symbolic links under {rel_dir!r}")
                target = os.readlink(link)
                if target.startswith("/"):
                    current = self.root
                todo = [c for c in target.split("/") if c] + todo
                continue
            if create and self.has_lower and is_whiteout(st):
                # This layer whited the name out, then puts entries under it: a directory
                # that hides what lower layers had there (what overlayfs itself makes).
                self.forget()
                os.unlink(candidate)
                make_dir(candidate, opaque=True)
                self.implicit.add(candidate)
                current = candidate
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise DataLoss(f"{candidate[len(self.root):]} is not a directory")
            current = candidate
        return current


def clean_name(name: str) -> str:
    """The entry name as a path relative to root, ``..`` clamped ('' is the root itself)."""
    if name and name[0] not in "./" and "//" not in name and "/." not in name:
        return name[:-1] if name[-1] == "/" else name  # already clean: the usual case
    return posixpath.normpath("/" + name).lstrip("/")


def escapes(linkname: str) -> bool:
    """True when a relative name climbs above where it starts (``a/../../x``)."""
    depth = 0
    for comp in linkname.split("/"):
        if comp == "..":
            depth -= 1
            if depth < 0:
                return True
        elif comp not in ("", "."):
            depth += 1
    return False


def remove_entry(path: str) -> bool:
    """Remove what is at ``path`` (a directory with its contents), never following it;
    True if there was something."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    return True


def is_real_dir_inside(root: str, path: str) -> bool:
    """True when every component from ``root`` down to ``path`` is a directory, not a link.

    Directory times are set after the whole layer, when a later entry may have
    turned one of the path's parents into a symlink; a path that no longer
    passes this check is skipped rather than followed out of the root.
    """
    current = root
    for comp in os.path.relpath(path, root).split("/"):
        if comp in ("", ".", ".."):
            return False
        current = os.path.join(current, comp)
        try:
            if not stat.S_ISDIR(os.lstat(current).st_mode):
                return False
        except FileNotFoundError:
            return False
    return True

