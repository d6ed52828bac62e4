import sys
from pathlib import Path

HERE = Path(__file__).parent
for path in (HERE, HERE.parent):  # preload_helpers, and tests/checkpoints.py
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
