"""Named worker hosts, kept in the app's settings, and the command-line options that pick one.

Every headless command takes ``--host NAME|DEST`` (a saved host, or any ssh destination:
``user@host``, ``ssh://user@host:port`` or a ``~/.ssh/config`` alias) or ``--worker-command
"CMD"`` (any command whose stdin/stdout are the worker's: ``srun``, ``docker exec -i``,
``kubectl exec -i``), plus
``--remote-cwd``, ``--send-folder``, ``--compress`` and, for DDP scripts, ``--nproc N`` and
``--rank R``. ``python main.py hosts`` lists, adds and removes saved hosts, and ``hosts check``
starts a worker on each to show what it reports (its machine, Python, torch, devices) or why
it does not start.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from typing import TYPE_CHECKING

from core.client.handle import CHECK_TIMEOUT, CheckFailed, check_worker
from core.client.launchers import CODECS, Launcher, LauncherError, from_command, from_host, resolve

if TYPE_CHECKING:
    from PySide6.QtCore import QSettings

KEY = "hosts"


def _settings() -> QSettings:
    # Imported here: the command line's trace and export read hosts only when one is named, and
    # loading Qt would add a third of a second to every command.
    from PySide6.QtCore import QSettings

    # The same store as the window's settings (BACKPROP_STUDIO_SETTINGS names an ini file).
    path = os.environ.get("BACKPROP_STUDIO_SETTINGS")
    if path:
        return QSettings(path, QSettings.Format.IniFormat)
    return QSettings("Backprop Studio", "Backprop Studio")


def load_hosts() -> list[dict]:
    raw = _settings().value(KEY, "[]")
    try:
        hosts = json.loads(raw) if isinstance(raw, str) else []
    except json.JSONDecodeError:
        return []
    return [h for h in hosts if isinstance(h, dict) and h.get("name")]


def save_hosts(hosts: list[dict]) -> None:
    s = _settings()
    s.setValue(KEY, json.dumps(hosts))
    s.sync()


def add_host(host: dict) -> Launcher:
    """Check ``host`` (LauncherError names a bad field) and save it, replacing one of that name."""
    launcher = from_host(host)
    hosts = [h for h in load_hosts() if h.get("name") != host["name"]]
    save_hosts(hosts + [host])
    return launcher


def remove_host(name: str) -> bool:
    hosts = load_hosts()
    kept = [h for h in hosts if h.get("name") != name]
    save_hosts(kept)
    return len(kept) != len(hosts)


# -- what a host's worker says of itself ---------------------------------------------------------
def device_label(host: str, d: dict) -> str:
    """The picker's text for device ``d`` of ``host``: "gpu-box: cuda:0 (H100, 80 GB)"."""
    detail = d.get("name", "")
    if d.get("total_memory"):
        detail = f"{detail}, {d['total_memory'] / 2**30:.0f} GB"  # GiB, as nvidia-smi rounds them
    return f"{host}: {d['id']} ({detail})" if d["id"] != "cpu" else f"{host}: cpu ({detail or 'CPU'})"


def check_report(name: str, hello, seconds: float) -> list[str]:
    """What a checked host's worker said of itself (a ``protocol.Hello``), as lines: the first
    one its machine and versions, then each device as the picker lists it (and any device
    that could not be used, with why)."""
    on = f"on {hello.host}, " if hello.host and hello.host != name else ""
    codecs = " or ".join(hello.codecs) if hello.codecs else "zlib"
    lines = [f"{name}: ready in {seconds:.1f} s: {on}Python {hello.python or '?'}, torch {hello.torch or '?'}, "
             f"protocol {hello.protocol}, compresses traces with {codecs}"
             + (", runs the worker code the app sent" if hello.sent_code else "")]
    for d in hello.devices:
        if d.get("kind") == "error":
            lines.append(f"  {name}: {d.get('name') or d.get('id')}")
        else:
            lines.append(f"  {device_label(name, d)}")
    return lines


# -- command-line options --------------------------------------------------------------------------
def check_host(launcher: Launcher, timeout: float | None = None) -> tuple[bool, list[str]]:
    """Start a worker behind ``launcher`` and end it (``core.client.handle.check_worker``): whether it
    came up, and the lines saying what it reported (``check_report``) or why it did not."""
    started = time.monotonic()
    try:
        hello = check_worker(launcher, CHECK_TIMEOUT if timeout is None else timeout)
    except CheckFailed as exc:
        return False, [f"{launcher.name}: failed after {time.monotonic() - started:.1f} s: {exc}"]
    return True, check_report(launcher.name, hello, time.monotonic() - started)


def add_worker_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("where the worker runs")
    g.add_argument("--host", metavar="NAME|DEST", help="run on a saved host, or on any ssh destination "
                   "(user@host, ssh://user@host:port, a ~/.ssh/config alias)")
    g.add_argument("--worker-command", metavar="CMD", help="run the worker behind this command, e.g. "
                   "\"docker exec -i box python\" (one that ends in a Python gets the worker's code sent; "
                   "\"... python -m core.worker\" where Backprop Studio is installed there)")
    g.add_argument("--remote-cwd", metavar="DIR", help="run the script in this folder on the host")
    g.add_argument("--send-folder", action="store_true", default=None,
                   help="also send the files beside the script")
    g.add_argument("--compress", choices=CODECS, help="how traces travel back (default zlib)")
    g.add_argument("--nproc", type=int, metavar="N", help="a DDP script: start N ranks with torchrun")
    g.add_argument("--rank", type=int, default=0, metavar="R", help="the DDP rank to capture (default 0)")


def worker_options(args) -> dict:
    """``launcher`` and ``ddp`` for run_capture from parsed options; LauncherError when they are wrong."""
    host = getattr(args, "host", None)
    command = getattr(args, "worker_command", None)
    if host and command:
        raise LauncherError("--host and --worker-command: give one of them")
    extra = dict(remote_cwd=getattr(args, "remote_cwd", None), send_folder=getattr(args, "send_folder", None),
                 compress=getattr(args, "compress", None))
    launcher = None
    if host:
        launcher = resolve(host, load_hosts(), **extra)
    elif command:
        launcher = from_command(command, **extra)
    elif any(v for v in extra.values()):
        raise LauncherError("--remote-cwd, --send-folder and --compress need --host or --worker-command")
    nproc = getattr(args, "nproc", None)
    ddp = None
    if nproc is not None:
        if nproc < 1:
            raise LauncherError(f"--nproc {nproc}: give at least 1 rank")
        if not 0 <= args.rank < nproc:
            raise LauncherError(f"--rank {args.rank}: ranks run from 0 to {nproc - 1}")
        ddp = {"nproc": nproc, "rank": args.rank}
    return {"launcher": launcher, "ddp": ddp}


def add_hosts_parser(sub) -> None:
    p = sub.add_parser("hosts", help="list, add, remove or check the hosts workers can run on")
    hs = p.add_subparsers(dest="action")
    hs.add_parser("list", help="list the saved hosts and their worker commands (also what 'hosts' alone does)")
    a = hs.add_parser("add", help="save a host: an ssh destination, or --worker-command for any other launcher")
    a.add_argument("name", help="the name the host is saved under (--host NAME picks it)")
    a.add_argument("dest", nargs="?", help="ssh destination (default: NAME)")
    a.add_argument("--python", default="python3", help="the host's Python with torch (the app sends the worker's code)")
    a.add_argument("--worker-command", help="a whole worker command instead of ssh (srun, docker exec -i, kubectl exec -i)")
    a.add_argument("--remote-cwd", help="run scripts in this folder on the host")
    a.add_argument("--send-folder", action="store_true", help="send the files beside each script")
    r = hs.add_parser("remove", help="forget a saved host")
    r.add_argument("name", help="the saved host's name")
    c = hs.add_parser("check", help="start a worker on each host and show what it reports (its Python, torch, "
                                    "devices) or why it does not start")
    c.add_argument("names", nargs="*", metavar="NAME|DEST", help="saved hosts or ssh destinations (default: every saved host)")
    c.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds each worker has to answer (default 30)")


def check_hosts(names: list[str], timeout: float | None = None) -> int:
    """``hosts check``: 0 when every host's worker came up, 1 when one did not, 2 for a bad name."""
    saved = load_hosts()
    try:
        launchers = [resolve(n, saved) for n in names] if names else [from_host(h) for h in saved]
    except LauncherError as exc:
        print(f"backprop-studio: hosts check: {exc}", file=sys.stderr)
        return 2
    if not launchers:
        print("no saved hosts to check (add one: python main.py hosts add NAME user@host --python /path/to/python)")
        return 2
    failed = 0
    for launcher in launchers:
        print(f"{launcher.name}: starting {shlex.join(launcher.argv)}", flush=True)
        ok, lines = check_host(launcher, timeout)
        failed += not ok
        print("\n".join(lines), flush=True)
    return 1 if failed else 0


def hosts_main(args) -> int:
    if args.action == "check":
        return check_hosts(args.names, args.timeout)
    if args.action == "add":
        host = {"name": args.name, "remote_cwd": args.remote_cwd or None, "send_folder": args.send_folder}
        if args.worker_command:
            host.update(kind="command", command=args.worker_command)
        else:
            host.update(kind="ssh", dest=args.dest or args.name, python=args.python)
        launcher = add_host(host)
        print(f"saved {launcher.describe()}")
        return 0
    if args.action == "remove":
        if remove_host(args.name):
            print(f"removed {args.name}")
            return 0
        print(f"backprop-studio: hosts remove: no saved host is named {args.name!r}")
        return 2
    hosts = load_hosts()
    if not hosts:
        print("no saved hosts (add one: python main.py hosts add NAME user@host --python /path/to/python)")
    for h in hosts:
        try:
            print(from_host(h).describe())
        except LauncherError as exc:
            print(f"{h.get('name')}: {exc}")
    return 0
