"""Run every generator (tools/gen_NAME.py, the convention of tools/_generated.py), in order.

Each one's `generated(root)` reads what the ones before it wrote (in memory, so --check writes
nothing and still sees the specs the variables table is made from). A generator that changed a
line outside its own marked blocks is refused.

Usage: python tools/generate.py [--check] [--root DIR]      (make generate, make check-generated)
  --check   write nothing; exit 1 naming each stale file and its generator
  --root    the collection's root (default: this checkout)

tools/gen_flag_data.py is not here: it reads the engines' parsers from their venvs (make flag-data).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools import _generated  # noqa: E402  pylint: disable=wrong-import-position

# One line a generator, each after every generator whose files it reads.
GENERATORS = (
    "tools/gen_node_reset_docs.py",   # node_reset's docs, spec and defaults from its steps and modules
    "tools/gen_engine_docs.py",       # inference_host's engine choices and the engine table from the registry
    "tools/gen_serve_settings.py",    # inference_service's defaults, spec options, stubs' options from its table
    "tools/gen_instance_tasks.py",    # reads inference_service's spec
    "tools/gen_variables_table.py",   # reads both roles' specs
    "tools/gen_contents.py",          # reads the roles' specs (their short descriptions)
)


def run(root: Path, generators=GENERATORS) -> dict:
    """{path: (its new text, the generator that last wrote it)}, each generator reading the texts before it."""
    made = {}
    for tool in generators:
        module = importlib.import_module("tools." + Path(tool).stem)
        with _generated.pending({path: text for path, (text, dummy) in made.items()}):
            texts = module.generated(root)
            for path, text in texts.items():
                old = _generated.read(root, path) if path in made or (root / path).is_file() else None
                if old is not None and _generated.blocks(old, tool, str(path)) and \
                        _generated.outside(old, tool, str(path)) != _generated.outside(text, tool, str(path)):
                    raise SystemExit("%s changed %s outside its marked blocks: a generator writes only between its "
                                     "markers (tools/_generated.py)" % (tool, path))
        made.update({Path(path): (text, tool) for path, text in texts.items()})
    return made


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    made = run(args.root)
    texts = {path: text for path, (text, dummy) in made.items()}
    if args.check:
        stale = _generated.stale(args.root, texts)
        for path in stale:
            print("%s is stale (written by %s): run make generate" % (path, made[path][1]))
        return 1 if stale else 0
    for path in _generated.write(args.root, texts):
        print("%s: written by %s" % (path, made[path][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
