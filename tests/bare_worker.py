"""Start the worker with numpy, psutil and Qt made unimportable: what a bare remote host has."""

import importlib.util
import runpy
import sys
from pathlib import Path

BLOCKED = ("numpy", "psutil", "PySide6", "networkx", "pyqtgraph", "PIL")


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)


sys.meta_path.insert(0, Block())
# Neither the source tree nor this folder, whose core/ holds the tests of the package's core.
HERE = Path(__file__).resolve()
sys.path = [p for p in sys.path if p not in (str(HERE.parents[1]), str(HERE.parent))]
spec = importlib.util.find_spec("core.worker.main")
print("worker module:", spec.origin, file=sys.stderr, flush=True)
runpy.run_module("core.worker.main", run_name="__main__", alter_sys=True)
