"""A serve setting added is one entry of the table (plugins/module_utils/_settings.py), and a test:
in a copy of the collection, one entry for vLLM's --max-num-seqs, then tools/generate.py, and the
role's validate entry point, run by ansible-playbook, puts the variable's value on the engine's
command line. The copy differs from this checkout in that entry and in the generated files only,
the documentation of the command builder's option (plugins/modules/inference_args.py) among them."""
from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tools.checkout_copy import copy_checkout

REPO = Path(__file__).resolve().parents[2]
TABLE = Path("plugins") / "module_utils" / "_settings.py"
ENTRY = '''    Setting('max_num_seqs', 'int', default=0,
            range=Range(minimum=0, maximum=65536, unit='sequences', whole=True),
            passes=(Pass(ARGS, description=("Most sequences in one batch; 0 means the engine's own.",)),),
            flags={'vllm': 'max_num_seqs'}, omit_empty=True,
            description=("Most sequences in one batch (vLLM C(--max-num-seqs)); 0 means the engine's own.",)),
)
BY_NAME = '''
STUB = Path("plugins") / "modules" / "inference_args.py"
GENERATED = {Path("roles/inference_service/defaults/main.yml"), Path("roles/inference_service/meta/argument_specs.yml"),
             Path("README.md"), Path("roles/inference_service/tasks/instances.yml"), STUB}
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.include_role:
        name: cleanslate.gpu.inference_service
        tasks_from: validate
    - ansible.builtin.copy:
        content: "{{ __inference_service_args.argv | to_json }}"
        dest: "{{ argv_file }}"
        mode: "0600"
"""


def differing(one: Path, two: Path) -> set:
    """The files (relative paths) whose content differs between two trees of the same files."""
    found = set()
    for path in two.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(two)
            if not (one / rel).is_file() or not filecmp.cmp(one / rel, path, shallow=False):
                found.add(rel)
    return found


def test_one_table_entry_reaches_the_engines_command_line_through_the_role(tmp_path):
    copy = copy_checkout(REPO, tmp_path / "ansible_collections" / "cleanslate" / "gpu")
    table = (copy / TABLE).read_text(encoding="utf-8")
    assert table.count(")\nBY_NAME = ") == 1
    (copy / TABLE).write_text(table.replace(")\nBY_NAME = ", ENTRY), encoding="utf-8")
    made = subprocess.run([sys.executable, str(copy / "tools" / "generate.py")], cwd=copy, capture_output=True, text=True,
                          check=False)
    assert made.returncode == 0, made.stdout + made.stderr
    assert subprocess.run([sys.executable, str(copy / "tools" / "generate.py"), "--check"], cwd=copy,
                          capture_output=True, check=False).returncode == 0
    assert differing(REPO, copy) == {TABLE} | GENERATED
    stub = (copy / STUB).read_text(encoding="utf-8")
    options = yaml.safe_load(stub.split('DOCUMENTATION = r"""', 1)[1].split('"""', 1)[0])["options"]
    assert options["max_num_seqs"] == {"description": ["Most sequences in one batch; 0 means the engine's own."],
                                       "type": "int", "default": 0}

    (tmp_path / "play.yml").write_text(PLAY, encoding="utf-8")
    argv_file = tmp_path / "argv.json"
    role_vars = {"argv_file": str(argv_file), "inference_service_model": "m", "inference_service_engine_version": "0.33.0",
                 "inference_service_executable": sys.executable, "inference_service_max_num_seqs": 128,
                 "inference_service_unit": "cleanslate-setting-added-test.service",
                 "inference_service_config_dir": str(tmp_path / "absent" / "etc"), "inference_service_metrics": False}
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(tmp_path), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_CONFIG=str(tmp_path / "none.cfg"))
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "play.yml",
                           "-e", json.dumps(role_vars)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          check=False, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    argv = json.loads(argv_file.read_text(encoding="utf-8"))
    assert argv[argv.index("--max-num-seqs") + 1] == "128", argv
