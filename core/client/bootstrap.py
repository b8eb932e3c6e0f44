"""The worker travels: a host with only Python and torch runs a worker the app sends it.

A worker command that ends in a bare interpreter (``VENV/bin/python``, ``ssh gpu-box python3``,
``docker exec -i box python``, ``/opt/python3.11``) and a saved ssh host's ``python`` get
``-c BOOTSTRAP`` appended: a one-line program that reads, from the raw stdin with
``os.read``, a length line and then exactly that many bytes, the worker's own sources packed
as a zip (``worker_code``: ``core/worker``, ``core/protocol``, ``core/model``,
``core/programs``, ``core/__init__.py`` and ``backprop_studio.py``; nothing of
``core/client``, ``core/layout``, ``app`` or ``widgets``). It unpacks them into a private
temporary folder (``mkdtemp``, mode 0700, removed at exit), puts that folder first on
``sys.path`` and runs ``core.worker`` as ``python -m core.worker`` would, so the folder is the
worker's ``ROOT`` (hidden from the script, on ``PYTHONPATH`` for torchrun ranks). Nothing past
the code is read ahead: the rest of stdin is the protocol, as for an installed worker. The
worker says ``sent_code`` in its hello.

A command that names a module or a script after its interpreter (``python -m core.worker``)
is left as it is: the host has the package installed. Through ``ssh`` the words are joined
by the remote shell, so the program travels shell-quoted (it holds no ``!``, newline or ``'``).
"""

from __future__ import annotations

import io
import os
import re
import shlex
import zipfile
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds core/
PACKAGES = ("core/worker", "core/protocol", "core/model", "core/programs")
FILES = ("core/__init__.py", "backprop_studio.py")
SENT_FLAG = "--sent-code"  # core.worker.main's option: the hello says the code came from the app
_PYTHON = re.compile(r"python[0-9.]*")
_REMOTE_SHELLS = ("ssh",)  # launchers whose remote side joins the words and hands them to a shell

BOOTSTRAP = (
    "import os,sys,io,zipfile,tempfile,shutil,atexit,runpy;"
    "r=lambda n:os.read(0,n);"
    "n=int(b\"\".join(iter(lambda:r(1) or b\"\\n\",b\"\\n\")) or b\"-1\");"
    "n<0 and sys.exit(\"backprop-studio: no worker code came on stdin\");"
    "b=bytearray();"
    "[b.extend(r(n-len(b)) or sys.exit(\"backprop-studio: the worker code was cut short\"))"
    " for _ in iter(lambda:len(b)<n,False)];"
    "d=os.path.realpath(tempfile.mkdtemp(prefix=\"backprop-studio-worker-\"));"
    "atexit.register(shutil.rmtree,d,True);"
    "zipfile.ZipFile(io.BytesIO(b)).extractall(d);"
    "sys.path[0]=d;"
    f"sys.argv=[\"-m\",\"{SENT_FLAG}\"];"
    "runpy.run_module(\"core.worker\",run_name=\"__main__\",alter_sys=True)"
)


def is_bare_python(argv: tuple[str, ...] | list[str]) -> bool:
    """Whether the command's last word is an interpreter with nothing after it (no ``-m``, no
    script, and not inside a ``sh -c`` line): ``python``, ``python3``, ``python3.11``, ``/venv/bin/python``."""
    last = argv[-1] if argv else ""
    return not any(c.isspace() for c in last) and _PYTHON.fullmatch(os.path.basename(last)) is not None


def bootstrap_words(shell: bool) -> tuple[str, str]:
    """``-c BOOTSTRAP``, quoted for a remote shell where ``shell``."""
    return ("-c", shlex.quote(BOOTSTRAP)) if shell else ("-c", BOOTSTRAP)


def with_bootstrap(argv: tuple[str, ...]) -> tuple[tuple[str, ...], bool]:
    """``argv`` with ``-c BOOTSTRAP`` appended where it ends in a bare interpreter, and whether
    the code is to be sent; other commands unchanged."""
    if not is_bare_python(argv):
        return tuple(argv), False
    shell = os.path.basename(argv[0]) in _REMOTE_SHELLS and len(argv) > 1
    return (*argv, *bootstrap_words(shell)), True


def remote_command(python: str) -> tuple[str, bool]:
    """The remote shell command that starts a worker with a host's ``python``: the bootstrap
    where it is a bare interpreter (``python3``, ``/opt/venv/bin/python``, ``conda run -n t
    python``), else ``PYTHON -m core.worker`` (a field that ends in an option, ``python3 -X dev``)."""
    try:
        words = shlex.split(python)
    except ValueError:
        words = [python]
    if is_bare_python(words):
        return f"{python} {' '.join(bootstrap_words(True))}", True
    return f"{python} -m core.worker", False


def _sources(root: Path) -> list[Path]:
    found = [root / f for f in FILES if (root / f).is_file()]
    for package in PACKAGES:
        found += sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    return found


@lru_cache(maxsize=1)
def worker_code(root: Path = ROOT) -> bytes:
    """The worker's sources as a deflated zip (names relative to ``root``, fixed timestamps, so
    the same tree packs to the same bytes)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for path in _sources(root):
            info = zipfile.ZipInfo(path.relative_to(root).as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, path.read_bytes())
    return out.getvalue()


def code_message(root: Path = ROOT) -> bytes:
    """What the bootstrap reads first: the length line, then the packed code."""
    code = worker_code(root)
    return b"%d\n" % len(code) + code
