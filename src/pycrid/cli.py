"""The ``pycrid`` command: ``serve``, ``config default``, ``config migrate``, ``version``,
``status``, ``nri plugins``, ``install-service``, ``bench``."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys

from pycrid.errors import PycridError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pycrid", description="A Kubernetes CRI runtime.")
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    serve.add_argument("--config", "-c", help="config file (default /etc/pycrid/config.toml "
                       "if it exists, else the embedded defaults)")
    serve.add_argument("--root", help="persistent data directory (config: root)")
    serve.add_argument("--state", help="runtime state directory (config: state)")
    serve.add_argument("--address", "-a", help="CRI socket path (config: [grpc] address)")
    serve.add_argument("--log-level", "-l", choices=["debug", "info", "warning", "error"],
                       help="config: [debug] level")
    serve.add_argument("--log-format", choices=["text", "json", "journald"],
                       help="config: [debug] format (text becomes journald when stderr is "
                       "the journal)")

    install = sub.add_parser("install-service", help="write the systemd unit pycrid.service")
    install.add_argument("--unit-dir", default="/etc/systemd/system",
                         help="where to write pycrid.service (default %(default)s)")
    install.add_argument("--executable", help="the pycrid executable ExecStart runs (default: "
                         "this one)")
    install.add_argument("--force", action="store_true",
                         help="replace an existing, different pycrid.service")

    config = sub.add_parser("config", help="show or upgrade configuration")
    csub = config.add_subparsers(dest="config_command", required=True)
    csub.add_parser("default", help="print every key with its default")
    csub.add_parser("reference", help="print the configuration reference (Markdown)")
    migrate = csub.add_parser("migrate", help="print the config upgraded to the current version")
    migrate.add_argument("--config", "-c", required=True, help="the config file to upgrade")

    sub.add_parser("version", help="print the version")

    def client_args(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--address", "-a", help="CRI socket (default: the config's [grpc] "
                         "address)")
        cmd.add_argument("--config", "-c", help="config file read for the default address")
        cmd.add_argument("--json", action="store_true", help="print one JSON object")

    client_args(sub.add_parser(
        "status", help="ask the daemon: conditions, pods and containers by state, NRI"))
    nri = sub.add_parser("nri", help="NRI of the running daemon")
    nsub = nri.add_subparsers(dest="nri_command", required=True)
    client_args(nsub.add_parser("plugins", help="connected plugins and their call counts"))

    from pycrid.bench.command import add_arguments

    add_arguments(sub.add_parser(
        "bench", help="measure a CRI runtime on this node, each figure beside a floor"))
    return p


def _client(args: argparse.Namespace) -> int:
    from pycrid import status_command as status
    from pycrid.builtins import registry
    from pycrid.config.decode import ConfigError
    from pycrid.config.loader import default_config_path, load

    address = args.address
    if not address:
        try:
            address = load(default_config_path(args.config),
                           registry().registrations()).config.grpc.address
        except ConfigError as e:
            return status.unreachable(f"invalid configuration: {e}", args.json)
    if args.command == "status":
        return status.status(address, args.json)
    return status.nri_plugins(address, args.json)


def _serve(args: argparse.Namespace) -> int:
    from pycrid import log as logsetup
    from pycrid.builtins import registry
    from pycrid.config.decode import ConfigError
    from pycrid.config.loader import default_config_path, load
    from pycrid.daemon import serve, use_pidfd_child_watcher
    from pycrid.preflight import require_root

    try:
        require_root()
    except PycridError as e:
        print(f"pycrid: {e}", file=sys.stderr)
        return 1
    try:
        loaded = load(default_config_path(args.config), registry().registrations())
    except ConfigError as e:
        print(f"pycrid: invalid configuration: {e}", file=sys.stderr)
        return 2
    cfg = loaded.config
    if args.root:
        cfg.root = args.root
    if args.state:
        cfg.state = args.state
    if args.address:
        cfg.grpc = dataclasses.replace(cfg.grpc, address=args.address)
    logsetup.setup(args.log_level or cfg.debug.level, args.log_format or cfg.debug.format)
    use_pidfd_child_watcher()
    try:
        asyncio.run(serve(loaded))
    except ConfigError as e:  # found while starting (e.g. an unreadable TLS file)
        logging.getLogger("pycrid").error("invalid configuration: %s", e)
        return 2
    except PycridError as e:
        if isinstance(e.__cause__, ConfigError):  # a plugin's own config check
            logging.getLogger("pycrid").error("invalid configuration: %s", e)
            return 2
        logging.getLogger("pycrid").error("%s", e)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "version":
        from pycrid import release

        print(release.describe())
        return 0
    if args.command == "serve":
        return _serve(args)
    if args.command in ("status", "nri"):
        return _client(args)
    if args.command == "bench":
        from pycrid.bench import command

        problem = command.check(args)
        if problem:
            print(f"pycrid bench: error: {problem}", file=sys.stderr)
            return 2
        return command.main(args)
    if args.command == "install-service":
        from pycrid.install import install_service

        return install_service(args.unit_dir, args.executable, force=args.force)
    from pycrid.builtins import registry
    from pycrid.config.decode import ConfigError
    from pycrid.config.loader import migrate, read_toml, render_default, render_raw

    regs = registry().registrations()
    if args.config_command == "default":
        sys.stdout.write(render_default(regs))
        return 0
    if args.config_command == "reference":
        from pycrid.config.reference_doc import render_reference

        sys.stdout.write(render_reference(regs))
        return 0
    try:
        raw, _ = migrate(read_toml(args.config), regs)
    except ConfigError as e:
        print(f"pycrid: invalid configuration: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render_raw(raw))
    return 0
