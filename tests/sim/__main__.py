"""python -m tests.sim crash --root DIR [--gpus N] [--tp N] [--device-kind K] [--lib-dir D] [--python P] [--vars F]
   python -m tests.sim clean --root DIR

Prints the manifest (crash) or what was killed and removed (clean) as JSON. A bad input
gives one line on stderr and exit status 2, with nothing touched."""
from __future__ import annotations

import argparse
import json
import sys

from . import SimError, clean, crash
from .devices import KINDS
from .role_vars import node_reset_vars


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write("tests.sim: error: %s\n" % message)
        sys.exit(2)


def main(argv=None) -> int:
    parser = _Parser(prog="python -m tests.sim", description="Build or remove a simulated crashed GPU node.")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("crash", help="build a crashed node under ROOT and print its manifest")
    build.add_argument("--root", required=True)
    build.add_argument("--gpus", type=int, default=4)
    build.add_argument("--tp", type=int, default=4)
    build.add_argument("--device-kind", choices=KINDS, default="auto")
    build.add_argument("--lib-dir", default=None, help="directory of the fake libnvidia-ml.so.1")
    build.add_argument("--python", default=None, help="interpreter for the processes and the bytecode")
    build.add_argument("--vars", default=None,
                       help="also write the node's role variables here (JSON), for ansible-playbook -e @FILE")
    remove = sub.add_parser("clean", help="kill what crash started under ROOT and remove ROOT")
    remove.add_argument("--root", required=True)
    for child in (build, remove):
        child.error = parser.error  # one error format for every level
    args = parser.parse_args(argv)
    try:
        if args.command == "crash":
            result = crash(args.root, gpus=args.gpus, tp=args.tp, device_kind=args.device_kind,
                           lib_dir=args.lib_dir, python=args.python)
            if args.vars:
                with open(args.vars, "w", encoding="utf-8") as handle:
                    json.dump(node_reset_vars(result), handle, indent=2)
        else:
            result = clean(args.root)
    except (SimError, OSError) as exc:  # an OSError here: crash has already undone its work
        sys.stderr.write("tests.sim: error: %s\n" % exc)
        return 2
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
