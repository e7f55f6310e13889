"""The collection's filters are loaded once, in the controller's main process, before the fleet
playbooks fork their workers (issue 42, third pass): the first play's hosts lookup loads them, and
every later worker inherits them instead of importing nine filter files and the utilities they
import, compiled from source, for itself (about 90 ms of CPU a worker on 2 cores).

Seen from inside a worker: a lookup of the test's own, beside its playbook, lists the modules of
the collection's filters that the worker's process holds before anything in it names a filter."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
FILTERS = "ansible_collections.cleanslate.gpu.plugins.filter."
# The fleet playbooks' first play, then a task on each host (a worker each) that names no filter.
PLAYBOOK = """
- name: Check what the run targets
  ansible.builtin.import_playbook: cleanslate.gpu.fleet_preflight

- name: Look at what each worker holds
  hosts: gpu_nodes
  gather_facts: false
  tasks:
    - name: List the filter modules this worker's process holds
      ansible.builtin.debug:
        msg: "held: {{ lookup('modules_held', '%s') }}"
""" % FILTERS
MODULES_HELD = '''
import sys

from ansible.plugins.lookup import LookupBase


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [",".join(sorted(name for name in sys.modules if name.startswith(terms[0])))]
'''


def test_each_worker_inherits_the_filters_from_the_main_process(tmp_path):
    hosts = {f"gpu-{index}": LOCAL for index in range(3)}
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(json.dumps({"all": {"children": {"gpu_nodes": {"hosts": hosts}}}}))
    (tmp_path / "lookup_plugins").mkdir()
    (tmp_path / "lookup_plugins" / "modules_held.py").write_text(MODULES_HELD)
    playbook = tmp_path / "filters.yml"
    playbook.write_text(PLAYBOOK)
    proc = subprocess.run([ANSIBLE_PLAYBOOK, str(playbook), "-i", str(inventory), "--forks", "3"], cwd=REPO,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    held = [line.split("held: ", 1)[1].rstrip('"').split(",") for line in proc.stdout.splitlines() if "held: " in line]
    assert len(held) == 3, proc.stdout[-3000:]
    for modules in held:
        assert FILTERS + "node_reset" in modules and FILTERS + "inference_service" in modules, modules
