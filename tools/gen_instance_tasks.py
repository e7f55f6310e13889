"""Write the instance loop's variables in roles/inference_service/tasks/instances.yml from the role's spec.

Ansible takes no mapping as a task's `vars:`, so one step of one instance of inference_service_instances
runs through an include whose `vars:` name each of the role's variables and take its value from the
resolved instance (the filter cleanslate.gpu.inference_service_instances). Include parameters rank above
inventory variables, role defaults and set_fact, and end with the include: nothing of one instance
outlives its step, unlike a set_fact of the whole instance. The list of names is the spec's (one fact,
one place): this tool writes it between its markers in instances.yml, and `--check` fails until it is
run after the spec changes.

Usage: python tools/gen_instance_tasks.py [--check] [--root DIR]
  --check   write nothing; exit 1 naming the file when it differs from the spec
  --root    the collection's root (default: this checkout)
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tools import _generated  # noqa: E402  pylint: disable=wrong-import-position

TOOL = _generated.tool_of(__file__)

SPEC = Path("roles") / "inference_service" / "meta" / "argument_specs.yml"
TASKS = Path("roles") / "inference_service" / "tasks" / "instances.yml"
PREFIX = "inference_service_"
# The loop task's `vars:` entries, under `  vars:` of a top-level task.
INDENT = "    "


def instance_keys(root: Path) -> list:
    """The keys an instance may set: the filter's rule (which of the spec's variables are the host's)."""
    sys.path.insert(0, str(root.parents[2]) if root.parent.name == "cleanslate" else str(root / ".ansible" / "collections"))
    from ansible_collections.cleanslate.gpu.plugins.filter import inference_service_instances  # pylint: disable=import-outside-toplevel
    spec = yaml.safe_load(_generated.read(root, SPEC))["argument_specs"]["main"]["options"]
    return sorted(name[len(PREFIX):] for name in spec
                  if name[len(PREFIX):] not in inference_service_instances.NOT_PER_INSTANCE)


def block(root: Path) -> list:
    """The lines between the markers: each per-instance variable from the loop's instance."""
    return ['%s%s%s: "{{ __inference_service_instance.%s }}"' % (INDENT, PREFIX, key, key) for key in instance_keys(root)]


def generated(root: Path) -> dict:
    """{instances.yml: its text with the block between the markers regenerated}."""
    return {TASKS: _generated.replace_labelled(_generated.read(root, TASKS), TOOL, str(TASKS), {None: block(root)})}


def main(argv=None) -> int:
    return _generated.main(argv, generated, __doc__, TOOL)


if __name__ == "__main__":
    sys.exit(main())
