"""``python -m core.worker``: the worker process (``core.worker.main``)."""

import sys

from core.worker.main import main

if __name__ == "__main__":
    sys.exit(main())
