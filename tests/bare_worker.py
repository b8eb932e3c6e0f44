"""Start the worker with numpy, psutil and Qt made unimportable: what a bare remote host has."""

import runpy
import sys

BLOCKED = ("numpy", "psutil", "PySide6", "networkx", "pyqtgraph", "PIL")


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)


sys.meta_path.insert(0, Block())
runpy.run_module("core.worker", run_name="__main__", alter_sys=True)
