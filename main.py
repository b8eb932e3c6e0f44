"""Backprop Studio: ``python main.py [SCRIPT]`` opens the app; ``python main.py trace SCRIPT`` runs headless."""

import sys

from app.main import main

if __name__ == "__main__":
    sys.exit(main())
