"""The folder beside a script, as it travels in a ``run`` command (standard library only).

``--send-folder`` sends the files next to the script with it, so a script that reads its data by
a relative path finds it on the remote host. Both ends live here: the app packs the folder as a
base64 tar.gz (``core.client.launchers.run_payload``), the worker unpacks it into the run's
folder (``core.worker.remote.Materialized``), keeping only plain files and folders inside it.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
from pathlib import Path

FOLDER_LIMIT = 64 * 1024 * 1024  # bytes of a script's folder sent with it, before compression


def pack_folder(folder: str | Path, skip: str | None = None) -> str:
    """The files beside a script as base64 tar.gz (hidden folders and caches left out).

    Raises ValueError naming the folder when it holds more than FOLDER_LIMIT bytes.
    """
    folder = Path(folder)
    total = 0
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            for fname in files:
                p = Path(root) / fname
                if fname.startswith(".") or (skip and p.resolve() == Path(skip).resolve()):
                    continue
                total += p.stat().st_size
                if total > FOLDER_LIMIT:
                    raise ValueError(f"{folder}: the folder holds more than {FOLDER_LIMIT >> 20} MB; "
                                     f"put the data on the host and use --remote-cwd instead")
                tar.add(str(p), arcname=str(p.relative_to(folder)))
    return base64.b64encode(buf.getvalue()).decode("ascii")


def unpack_folder(packed: str, into: str | os.PathLike) -> None:
    """Write a ``pack_folder`` result into ``into``; links, devices and paths that leave it are skipped."""
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(packed)), mode="r:gz") as tar:
        tar.extractall(into, members=[m for m in tar.getmembers() if _safe_member(m)])


def _safe_member(m: tarfile.TarInfo) -> bool:
    name = m.name
    return (m.isfile() or m.isdir()) and not name.startswith(("/", "\\")) and ".." not in Path(name).parts
