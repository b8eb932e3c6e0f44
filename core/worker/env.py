"""The process a script runs in, as ``python script.py`` would give it, and the device it finds.

``script_environment`` sets cwd, ``sys.path[0]``, ``PYTHONPATH`` and takes the app's own
packages (``core``, ``app``, ``widgets``) out of ``sys.modules`` while the script runs, so a
project with its own ``core`` package imports its own. ``apply_device`` makes the picked
device the one a script finds; ``seed_run`` seeds torch, ``random`` and NumPy; ``input()``
fails at once saying scripts get no input; ``os._exit`` is reported before the process goes.
"""

from __future__ import annotations

import builtins
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation only: the worker hands its channel in
    from core.worker.channel import Channel

ROOT = Path(__file__).resolve().parents[2]
_WORKER_DIR = str(Path(__file__).resolve().parent)  # the worker's own frames (its capture included)
APP_PACKAGES = ("core", "app", "widgets")
NO_INPUT = ("scripts get no input in Backprop Studio (stdin is empty, as with `python script.py < /dev/null`); "
            "set the value in the script instead")


def _say_no_input() -> None:
    """``input()`` fails at once with a message saying why (stdin is ``/dev/null``)."""
    real_input = builtins.input

    def no_input(prompt: object = "") -> str:
        try:
            return real_input(prompt)
        except EOFError:
            raise EOFError(NO_INPUT) from None

    builtins.input = no_input


@contextmanager
def script_environment(script: str, cwd: str | None = None):
    """The process as ``python script.py`` would give it: cwd, sys.path, PYTHONPATH, no app modules.

    The app's modules stay alive (the worker's functions hold them) but leave ``sys.modules``
    while the script runs, so its own ``core`` or ``app`` package imports; they come back after.
    """
    folder = str(Path(script).resolve().parent)
    old_cwd = os.getcwd()
    old_path = list(sys.path)
    old_env = os.environ.get("PYTHONPATH")
    ours = {}
    for name, mod in list(sys.modules.items()):
        if name.split(".")[0] in APP_PACKAGES and _is_ours(mod):
            ours[name] = sys.modules.pop(name)
    sys.path[:] = [p for p in sys.path if not _is_root(p)]
    original = os.environ.get("BACKPROP_STUDIO_PYTHONPATH")
    if original is not None:
        if original:
            os.environ["PYTHONPATH"] = original
        else:
            os.environ.pop("PYTHONPATH", None)
    try:
        os.chdir(cwd or folder)  # ``cwd``: a remote run's --remote-cwd, where its data is
    except OSError:
        pass
    try:
        yield
    finally:
        try:
            os.chdir(old_cwd)
        except OSError:
            pass
        sys.path[:] = old_path
        if old_env is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_env
        for name in [n for n in sys.modules if n.split(".")[0] in APP_PACKAGES]:
            del sys.modules[name]  # the script's own packages of those names
        sys.modules.update(ours)


def _is_ours(mod) -> bool:
    file = getattr(mod, "__file__", None) or ""
    paths = list(getattr(mod, "__path__", []) or [])
    return any(str(p).startswith(str(ROOT)) for p in [file, *paths] if p)


def _is_root(entry: str) -> bool:
    if ROOT.name in ("site-packages", "dist-packages"):
        return False  # an installed worker: that folder also holds torch and what the script imports
    try:
        return Path(entry or ".").resolve() == ROOT
    except OSError:
        return False


def list_devices() -> list[dict]:
    import torch

    devices = [{"id": "cpu", "name": "CPU", "kind": "cpu"}]
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                devices.append({
                    "id": f"cuda:{i}", "name": p.name, "kind": "cuda",
                    "capability": f"{p.major}.{p.minor}", "total_memory": p.total_memory,
                })
    except Exception as exc:  # a broken driver must not stop the CPU from working
        devices.append({"id": "cuda", "name": f"CUDA unavailable: {exc}", "kind": "error"})
    try:
        if torch.backends.mps.is_available():
            devices.append({"id": "mps", "name": "Apple MPS", "kind": "mps"})
    except Exception:
        pass
    return devices


def check_device(device: str) -> str | None:
    """None when ``device`` can be used, else a sentence saying why not."""
    import torch

    try:
        dev = torch.device(device)
    except Exception as exc:
        return f"'{device}' is not a device name: {exc}"
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            return f"{device} was asked for, but CUDA is not available on this machine"
        if (dev.index or 0) >= torch.cuda.device_count():
            return f"{device} was asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)"
    if dev.type == "mps" and not torch.backends.mps.is_available():
        return "MPS was asked for, but it is not available on this machine"
    return None


def apply_device(device: str) -> None:
    """Make the picked device the one a script finds.

    Scripts choose with ``torch.device("cuda" if torch.cuda.is_available() else "cpu")``: on
    ``cpu`` the worker answers that CUDA and MPS are unavailable; on ``cuda:N`` device N becomes
    the current device, so a plain ``"cuda"`` means it. The choice is also in the environment
    variable BACKPROP_STUDIO_DEVICE. The default device is left alone: setting it would move
    tensors made from NumPy arrays and data loaders behind the script's back.
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cpu":
        torch.cuda.is_available = lambda: False
        try:
            torch.backends.mps.is_available = lambda: False
        except AttributeError:
            pass
    elif dev.type == "cuda":
        torch.cuda.set_device(dev.index or 0)
    elif dev.type == "mps":
        torch.cuda.is_available = lambda: False


def seed_run(seeds: dict | None) -> dict:
    """Seed torch, ``random`` and NumPy for a run (fresh seeds when none are given); returns them."""
    import random

    import torch

    seeds = dict(seeds or {})
    # Fresh seeds fit in 63 bits, so every JSON and Qt layer carries them as plain integers.
    fresh = [int.from_bytes(os.urandom(8), "little") >> 1 for _ in range(2)]
    seeds.setdefault("torch", fresh[0])
    seeds.setdefault("random", fresh[1])
    torch.manual_seed(int(seeds["torch"]))
    random.seed(int(seeds["random"]))
    try:
        import numpy
    except ImportError:
        seeds.pop("numpy", None)
    else:
        seeds.setdefault("numpy", fresh[1] & 0xFFFFFFFF)
        numpy.random.seed(int(seeds["numpy"]) & 0xFFFFFFFF)
    return seeds


def _flush_quietly() -> None:
    """Flush the script's streams; a script that closed fd 1 or 2 must not lose the result."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass



def _patch_exit(channel: Channel) -> None:
    """Tell the parent where ``os._exit`` was called before the process vanishes (not a forked child's)."""
    real_exit = os._exit

    def _exit(code: int = 0) -> None:
        if os.getpid() != channel.pid:
            real_exit(code)
        try:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(_WORKER_DIR):
                frame = frame.f_back
            line = frame.f_lineno if frame is not None else None
            file = frame.f_code.co_filename if frame is not None else None
            channel.send({"type": "exiting", "code": code, "line": line, "file": file})
            _flush_quietly()
        finally:
            real_exit(code)

    os._exit = _exit

