"""``pycrid bench``: compare CRI runtimes on a node, each figure beside a floor measured in
the same run. Only the argument parser is imported with the CLI; the rest when it runs."""

from __future__ import annotations

import argparse
from typing import Any

SECTIONS = ("lifecycle", "nri", "rss", "list", "partial")

DESCRIPTION = """\
Measure the CRI runtime at --endpoint (default: the running pycrid's socket from its
config), each figure beside a floor measured in the same run. It pulls what is missing of
--image and the sandbox image through the CRI ImageService, runs its own pods in the
namespace pycrid-bench, and removes exactly the pods, containers and images it created
(the images that were there before stay). Exit 1 only on an error or a leftover of its
own; numbers never fail it. Needs root and runc.

sections and their floors:
  lifecycle  RunPodSandbox (pod network), Create/Start/Stop/RemoveContainer (`sleep
             3600`), Stop/RemovePodSandbox, and RunPodSandbox hostNetwork (with
             --runtime-handler, that handler's pod start too, beside the default's), beside
             `runc create` + `runc start` of an equivalent bundle timed in the same loop:
             pycrid's base spec, a private runc --root, cgroup /<run dir>/<id>, running the
             host's `sleep 3600` on a root that is an empty read-only directory of this
             run's into which runc bind-mounts the host's /usr (and /bin, /sbin, /lib*
             where they are directories) read-only, inside the container's own mount
             namespace. Not the host's / as root: runc would bind every mount of the node
             (other containers' rootfs, shm, netns) first, a cost a container does not pay,
             and make missing mount points in the host's /. Not the image's rootfs: CRI
             hands no client an unpacked image, and unpacking it here would mean pulling
             around the runtime and its registry config.
  nri        CreateContainer with 0/1/5 plugins (pycrid.nri SDK processes subscribed to
             CreateContainer, each adding one variable to the containers of the
             benchmark's own pod only) on --nri-socket; 0 plugins is the floor. Skipped
             without --nri-socket: plugins on a node's NRI socket see every container
             created meanwhile, so that is the operator's call.
  rss        the daemon's RSS and PSS before the run's pods (the floor) and with
             --rss-pods running pods; per pod; the PSS of the monitor processes (conmon,
             containerd-shim*) of those pods. The daemon is the socket's owner
             (/proc/net/unix and /proc/*/fd) or --daemon-pid.
  list       ListContainers and ListPodSandbox with --list-sizes containers present (the
             runtime's total: the run adds containers that ran `true` and exited), beside
             the Version round trip (a call that does no work).
  partial    with --partial-images OLD,NEW (two versions of one image, neither on the
             node): PullImage of NEW right after OLD, beside PullImage of NEW on a node
             without OLD (the floor), and the disk both take (ImageFsInfo); a runtime with
             partial pulls (pycrid, zstd:chunked images) fetches only what changed. Each
             of --partial-rounds pulls and removes both. Only with that option.
"""


def int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not vals or min(vals) < 0:
        raise argparse.ArgumentTypeError(f"need non-negative integers: {text!r}")
    return vals


def image_pair(text: str) -> tuple[str, str]:
    old, sep, new = text.partition(",")
    if not sep or not old.strip() or not new.strip() or old.strip() == new.strip():
        raise argparse.ArgumentTypeError(f"want OLD,NEW (two image references): {text!r}")
    return old.strip(), new.strip()


def section_list(known: tuple[str, ...]) -> Any:
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"sections are {','.join(known)}, not {bad}")
        return names
    return parse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.description = DESCRIPTION
    ap.add_argument("--image", required=True, metavar="REF",
                    help="the containers' image; it must have `sleep` and `true` "
                         "(e.g. docker.io/library/busybox:1.36)")
    ap.add_argument("--sandbox-image", metavar="REF",
                    help="the runtime's pause image, pulled first if missing (default: what "
                         "the runtime reports in its Status info)")
    ap.add_argument("--endpoint", metavar="unix:///PATH",
                    help="the CRI socket (default: the config's [grpc] address)")
    ap.add_argument("--config", "-c", help="pycrid config file read for the default endpoint")
    ap.add_argument("--sections", type=section_list(SECTIONS), default=None,
                    help=f"comma-separated subset of {','.join(SECTIONS)} (default all; "
                         "partial only with --partial-images)")
    ap.add_argument("--runtime-handler", metavar="NAME", default="",
                    help="also time the pod start of this runtime handler (e.g. runsc) in the "
                         "lifecycle section, beside the default handler's")
    ap.add_argument("--iterations", type=int, default=20,
                    help="lifecycle rounds and NRI rounds (default 20)")
    ap.add_argument("--nri-socket", metavar="PATH",
                    help="the runtime's NRI socket (without it the nri section is skipped)")
    ap.add_argument("--nri-plugins", type=int_list, default=[0, 1, 5],
                    help="plugin counts to compare; 0 is always added (default 0,1,5)")
    ap.add_argument("--seed", type=int, default=0, help="NRI phase-order seed (default 0)")
    ap.add_argument("--rss-pods", type=int, default=20,
                    help="running pods for the rss and list sections (default 20)")
    ap.add_argument("--list-sizes", type=int_list, default=[100, 300],
                    help="container counts the list calls are timed at (default 100,300)")
    ap.add_argument("--list-calls", type=int, default=20,
                    help="calls timed per list size and kind (default 20)")
    ap.add_argument("--partial-images", type=image_pair, metavar="OLD,NEW",
                    help="the partial section's two versions of one image (neither may be "
                         "on the node)")
    ap.add_argument("--partial-rounds", type=int, default=3,
                    help="rounds of the partial section (default 3)")
    ap.add_argument("--daemon-pid", type=int,
                    help="the runtime's pid for rss (default: the socket's owner)")
    ap.add_argument("--json", nargs="?", const="-", metavar="PATH",
                    help="the whole result as JSON (schema pycrid-bench/1): on stdout instead "
                         "of the table, or with PATH written there beside the table")
    ap.add_argument("--keep", action="store_true",
                    help="keep the run's directory (runc and NRI plugin logs)")


def check(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, if anything."""
    if min(args.iterations, args.list_calls, args.rss_pods, args.partial_rounds) < 1:
        return "--iterations, --list-calls, --rss-pods and --partial-rounds must be at least 1"
    if args.endpoint and not args.endpoint.startswith(("unix://", "/")):
        return "--endpoint must be unix:///path/to/socket"
    if args.sections is None:
        args.sections = [s for s in SECTIONS if s != "partial" or args.partial_images]
    elif "partial" in args.sections and not args.partial_images:
        return "the partial section needs --partial-images OLD,NEW"
    return None


def main(args: argparse.Namespace) -> int:
    from pycrid.bench.run import run

    return run(args)
