"""python -m tests.sim.engine {vllm|sglang} serve ... : run the stand-in engine (see __init__.py)."""
from __future__ import annotations

import sys

from . import main

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.stderr.write("usage: python -m tests.sim.engine {vllm|sglang} serve [options]\n")
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
