"""``pycrid install-service``: the systemd unit shipped as package data, with ExecStart
pointing at the pycrid executable that is installed."""

from __future__ import annotations

import os
import shutil
import sys

UNIT_NAME = "pycrid.service"
#: Where the template's ExecStart names the executable.
PLACEHOLDER = "@PYCRID@"


def _own_executable() -> str | None:
    """The ``pycrid`` script this process runs from, else the one beside the interpreter
    (a venv's bin), else the one on PATH."""
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "pycrid" and os.access(argv0, os.X_OK):
        return os.path.realpath(argv0)
    beside = os.path.join(os.path.dirname(sys.executable), "pycrid")
    if os.access(beside, os.X_OK):
        return os.path.abspath(beside)
    found = shutil.which("pycrid")
    return os.path.realpath(found) if found else None


def render_unit(executable: str) -> str:
    from importlib.resources import files

    template = (files("pycrid") / "data" / UNIT_NAME).read_text()
    # Only ExecStart names the executable; the placeholder anywhere else is a template bug.
    assert template.count(PLACEHOLDER) == 1 and f"ExecStart={PLACEHOLDER} " in template
    return template.replace(PLACEHOLDER, executable)


def install_service(unit_dir: str, executable: str | None, *, force: bool) -> int:
    """Write the unit with ExecStart naming ``executable`` (default: this pycrid); the exit
    code: 0 written or already so, 1 an existing different file or an I/O error, 2 no
    executable."""
    exe = executable or _own_executable()
    if not exe or not os.path.isabs(exe) or not os.access(exe, os.X_OK):
        print(f"pycrid: cannot find the pycrid executable ({exe or 'none found'}); pass "
              "--executable /absolute/path/to/pycrid", file=sys.stderr)
        return 2
    text = render_unit(exe)
    target = os.path.join(unit_dir, UNIT_NAME)
    try:
        with open(target) as f:
            current: str | None = f.read()
    except FileNotFoundError:
        current = None
    except OSError as e:
        print(f"pycrid: cannot read {target}: {e.strerror}", file=sys.stderr)
        return 1
    if current == text:
        print(f"{target} is already up to date")
    elif current is not None and not force:
        print(f"pycrid: {target} exists and differs; pass --force to replace it", file=sys.stderr)
        return 1
    else:
        try:
            os.makedirs(unit_dir, exist_ok=True)
            tmp = target + ".tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except OSError as e:
            print(f"pycrid: cannot write {target}: {e.strerror}", file=sys.stderr)
            return 1
        print(f"wrote {target} (ExecStart={exe} serve)")
    print("next: systemctl daemon-reload && systemctl enable --now pycrid")
    return 0
