"""Command-line plumbing shared by the example plugins (not part of the SDK)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--name", help="plugin name to register (default: from NN-name or env)")
    p.add_argument("--idx", help="plugin index, two digits (default: from NN-name or env)")
    p.add_argument("--socket-path", help="NRI socket of an external plugin "
                   "(default /var/run/nri/nri.sock; ignored when launched by the runtime)")
    p.add_argument("--verbose", action="store_true", help="log at debug level")
    return p


def stub_options(args: argparse.Namespace) -> dict[str, Any]:
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return {"name": args.name, "idx": args.idx, "socket_path": args.socket_path}


def argv(default: Sequence[str] | None = None) -> list[str]:
    """A launched plugin gets no arguments at all; the defaults then apply."""
    return list(sys.argv[1:] if default is None else default)
