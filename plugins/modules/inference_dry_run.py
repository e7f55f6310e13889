#!/usr/bin/python
# -*- coding: utf-8 -*-

# Copyright (c) 2026, cleanslate.gpu maintainers
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: inference_dry_run
short_description: Run the inference engine's own configuration checks on a command line, as the service user, starting nothing
version_added: 0.2.0
description:
  - The engine's own word on a command line before any server is stopped, for the C(cleanslate.gpu.inference_service)
    role's validation; in check mode too, since it changes nothing.
  - vLLM - the command line parsed by the parser C(vllm serve) builds, the serve command's own validation, then
    the engine arguments' C(create_engine_config) (C(AsyncEngineArgs.from_cli_args) of the parsed arguments), which builds the whole configuration (the model's
    from its C(config.json), the cache, scheduler, speculative and compilation configurations). No weights are
    loaded, no engine process starts and no port is opened.
  - SGLang - C(ServerArgs) from the command line (C(prepare_server_args), whose checks run as it is built) and
    its C(check_server_args) where the version has it. The role's C(--config) file, which holds only the API keys, is
    left out.
  - The check is a small program of this collection, sent on the standard input of the Python the engine's
    executable names on its C(#!) line (read from the file, nothing started as root). That Python runs only as
    O(user), never as root - with the user's groups, a new session (its whole process group is killed at
    O(timeout)), the current directory the user's home (or C(/)), and an environment of its own - C(PATH),
    C(HOME), C(USER), C(LOGNAME), C(LANG=C.UTF-8), O(environment), then C(HF_HUB_OFFLINE=1) and
    C(TRANSFORMERS_OFFLINE=1) (nothing is downloaded). No secret is needed and none is given - a command line or
    environment holding a value of O(secrets) is refused.
  - Everything the engine's Python prints is untrusted (it runs the user's code). Its output is read up to 256 KiB
    a stream; only one line, the program's marker followed by a JSON object, is read as the answer, and its texts
    are returned printable (a byte that is not UTF-8 as C(\\xNN)), cut to 1000 characters, with every form of every
    value of O(secrets) hidden.
  - The module fails only on a bad input or a refused user; an engine that refuses the configuration is
    RV(ran) V(true) and RV(ok) V(false), with RV(refusal); a check that could not run is RV(ran) V(false), with
    RV(why_not_run).
  - C(changed) is always false.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - cleanslate.gpu.attributes
attributes:
  check_mode:
    details:
      - The same check, since it changes nothing.
  diff_mode:
    support: none
options:
  engine:
    description: The engine.
    type: str
    required: true
    choices: [vllm, sglang]
  argv:
    description:
      - The engine's command line, its executable (an absolute path) first, as C(cleanslate.gpu.inference_args)
        returns it.
    type: list
    elements: str
    required: true
  user:
    description:
      - The user the engine's Python runs as, the server's. Root (uid 0) and a user the host does not have are
        refused.
    type: str
    required: true
  environment:
    description:
      - The server's environment (not secret), added to the check's own.
    type: dict
    default: {}
  secrets:
    description:
      - Values that must reach neither the command line, nor the environment, nor anything returned (the role's
        secrets); each is hidden in every form engines print it, replaced by C(********).
    type: list
    elements: str
    default: []
  timeout:
    description:
      - Seconds the check may take; at the deadline its whole process group is killed and RV(why_not_run) says so.
      - The range is a whole number of seconds from 1 to 3600.
    type: int
    default: 180
notes:
  - Requires Python 3.9 or later on the host (a child started as another user with its groups).
  - The module must run as root (C(become)) unless it runs as O(user) already.
seealso:
  - module: cleanslate.gpu.inference_args
  - module: cleanslate.gpu.inference_host
"""

EXAMPLES = r"""
- name: Let vLLM check its own configuration on the host, as the service user
  cleanslate.gpu.inference_dry_run:
    engine: vllm
    argv: [/opt/vllm/venv/bin/vllm, serve, /srv/models/llama, --max-num-seqs, "64"]
    user: vllm
    environment:
      HF_HOME: /srv/hf
    timeout: 180
  register: dry_run

- name: Refuse the configuration in the engine's own words
  ansible.builtin.assert:
    that: not dry_run.ran or dry_run.ok
    fail_msg: "vLLM refuses the configuration: {{ dry_run.refusal }}"
"""

RETURN = r"""
ran:
  description: Whether the engine's checks ran to their verdict.
  returned: always
  type: bool
  sample: true
ok:
  description: Whether the engine accepted the configuration (false when it did not run).
  returned: always
  type: bool
  sample: false
refusal:
  description: The engine's own words on why it refuses the configuration, on one line; empty otherwise.
  returned: always
  type: str
  sample: "Error: --enable-auto-tool-choice requires --tool-call-parser"
error_type:
  description: The class of the exception the engine raised (for example V(ValidationError), V(ValueError)); empty otherwise.
  returned: always
  type: str
  sample: TypeError
why_not_run:
  description:
    - Why the checks did not run to a verdict (the interpreter, a timeout, the engine's import, the model's files
      not on the host, an answer that cannot be read); empty when they did.
  returned: always
  type: str
  sample: the check ran past its timeout of 180 seconds and its process group was killed
interpreter:
  description: The Python that ran the check, as the executable's C(#!) line names it; empty when none was found.
  returned: always
  type: str
  sample: /opt/vllm/venv/bin/python3
seconds:
  description: How long the check took.
  returned: always
  type: float
  sample: 7.1
"""

import json
import os
import pwd
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.cleanslate.gpu.plugins.module_utils import _engine_dry_run
from ansible_collections.cleanslate.gpu.plugins.module_utils._bounded_run import run_as_user
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import InputProblem
from ansible_collections.cleanslate.gpu.plugins.module_utils._engines import NAMES as ENGINE_NAMES
from ansible_collections.cleanslate.gpu.plugins.module_utils._installed_version import CannotTell, interpreter
from ansible_collections.cleanslate.gpu.plugins.module_utils._secrets import Masker
from ansible_collections.cleanslate.gpu.plugins.module_utils._settings import BY_NAME
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable

OUTPUT_MAX = 256 * 1024
TEXT_MAX = 1000
# The role's setting's range (inference_service_engine_dry_run_timeout), one source.
TIMEOUT = BY_NAME["engine_dry_run_timeout"].range
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The check's own, after O(environment): it never downloads.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def input_problems(params):
    """One sentence per bad input."""
    problems = []
    argv = params["argv"]
    if not argv or not os.path.isabs(argv[0]):
        problems.append("argv must start with the engine's executable, an absolute path, got %s"
                        % (json.dumps(argv[0]) if argv else "an empty list"))
    if any("\0" in item for item in argv):
        problems.append("argv holds a NUL character, which no command line can carry")
    problems += filter(None, [TIMEOUT.sentence("timeout", params["timeout"])])
    for name, value in params["environment"].items():
        if not ENV_NAME.match(name):
            problems.append("environment: %s is not a variable name (letters, digits and _, not first a digit)"
                            % json.dumps(name))
        elif "\0" in str(value):
            problems.append("environment: %s holds a NUL character" % name)
    secrets = [value for value in params["secrets"] if value]
    if any(secret in item for secret in secrets for item in argv):
        problems.append("argv holds a value of secrets: a secret never reaches the check")
    if any(secret in str(value) or secret in name for secret in secrets
           for name, value in params["environment"].items()):
        problems.append("environment holds a value of secrets: a secret never reaches the check")
    return problems


def service_user(name):
    """The user's pwd entry; InputProblem (one sentence) for root or a user the host lacks."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise InputProblem("user %s does not exist on the host: the check runs only as the server's user"
                           % json.dumps(name)) from None
    if entry.pw_uid == 0 or name == "root":
        raise InputProblem("user %s is root (uid 0): the engine's Python never runs as root, even for a check"
                           % json.dumps(name))
    if os.geteuid() not in (0, entry.pw_uid):
        raise InputProblem("the module runs as uid %d, neither root nor %s: it cannot start the check as that user "
                           "(become root)" % (os.geteuid(), name))
    return entry


def environment(entry, params, executable):
    env = {"PATH": os.path.dirname(executable) + ":" + SYSTEM_PATH, "HOME": entry.pw_dir,
           "USER": entry.pw_name, "LOGNAME": entry.pw_name, "LANG": "C.UTF-8"}
    env.update((name, str(value)) for name, value in params["environment"].items())
    env.update(OFFLINE)
    return env


def shown(text, mask):
    """Untrusted text as the result carries it: printable, secrets hidden, on one line, bounded."""
    text = mask(printable(text if isinstance(text, bytes) else str(text).encode("utf-8", "surrogatepass")))
    text = " ".join(text.split())
    return text if len(text) <= TEXT_MAX else text[:TEXT_MAX - 3] + "..."


def last_words(stderr, mask):
    lines = [line for line in stderr.splitlines() if line.strip()]
    return shown(lines[-1], mask) if lines else ""


def answer(stdout):
    """The verdict of the marker line, or a sentence part saying why there is none."""
    marker = _engine_dry_run.MARKER.encode("ascii")
    lines = [line for line in stdout.splitlines() if line.startswith(marker)]
    if len(lines) != 1:
        return None, ("its answer line is missing" if not lines else "it printed %d answer lines, not one" % len(lines))
    try:
        verdict = json.loads(lines[0][len(marker):].decode("utf-8"))
    except ValueError:
        return None, "its answer line is not JSON"
    if not isinstance(verdict, dict) or not isinstance(verdict.get("ok"), bool) \
            or not all(isinstance(verdict.get(key), str) for key in ("error_type", "error")):
        return None, "its answer line is not {ok: true or false, error_type: text, error: text}"
    return verdict, ""


def check_program():
    """The text of module_utils/_engine_dry_run.py, as shipped with the module (AnsiballZ's zip or a file)."""
    loader = getattr(_engine_dry_run, "__loader__", None)
    source = loader.get_source(_engine_dry_run.__name__) if hasattr(loader, "get_source") else None
    if source is None:
        with open(_engine_dry_run.__file__, encoding="utf-8") as handle:
            source = handle.read()
    return source.encode("utf-8")


def dry_run(module):
    params = module.params
    mask = Masker([value for value in params["secrets"] if value])
    result = {"changed": False, "ran": False, "ok": False, "refusal": "", "error_type": "", "why_not_run": "",
              "interpreter": "", "seconds": 0.0}
    try:
        entry = service_user(params["user"])
    except InputProblem as exc:
        module.fail_json(msg=str(exc), **result)
    argv = params["argv"]
    try:
        python = interpreter(argv[0], os.path.dirname(argv[0]) + ":" + SYSTEM_PATH)
    except CannotTell as exc:
        result["why_not_run"] = shown("the engine's Python cannot be found: %s" % exc, mask)
        return result
    result["interpreter"] = printable(python)
    source = check_program()
    request = {"engine": params["engine"], "argv": argv[1:]}
    program = source + ("\nmain(__import__('json').loads(%r))\n" % json.dumps(request)).encode("utf-8")
    started = time.monotonic()
    try:
        status, stdout, stderr, timed_out = run_as_user([python, "-I", "-"], program, entry,
                                                        environment(entry, params, argv[0]), params["timeout"],
                                                        OUTPUT_MAX)
    except OSError as exc:
        result["why_not_run"] = shown("%s could not be started as %s: %s"
                                      % (python, entry.pw_name, exc.strerror or exc), mask)
        return result
    finally:
        result["seconds"] = round(time.monotonic() - started, 3)
    if timed_out:
        result["why_not_run"] = "the check ran past its timeout of %d seconds and its process group was killed" \
            % params["timeout"]
        return result
    verdict, problem = answer(stdout)
    if verdict is None:
        how = ("exited with status %d" % status) if status >= 0 else ("was killed by signal %d" % abs(status))
        said = last_words(stderr, mask)
        result["why_not_run"] = shown("the engine's Python %s and %s%s" % (
            how, problem, ("; its last words: %s" % said) if said else ""), mask)
        return result
    if not verdict["ok"] and verdict.get("model_missing") is True:
        result["why_not_run"] = shown("the model's files are not on the host (not a directory, not in the Hugging "
                                      "Face cache) and the check downloads nothing: %s" % verdict["error"], mask)
        result["error_type"] = shown(verdict["error_type"], mask)
        return result
    if not verdict["ok"] and verdict["error_type"] in ("ImportError", "ModuleNotFoundError"):
        result["why_not_run"] = shown("the engine's import failed: %s" % verdict["error"], mask)
        result["error_type"] = shown(verdict["error_type"], mask)
        return result
    result.update(ran=True, ok=verdict["ok"], refusal=shown(verdict["error"], mask) if not verdict["ok"] else "",
                  error_type=shown(verdict["error_type"], mask))
    if not verdict["ok"] and not result["refusal"]:
        result["refusal"] = "the engine refused the configuration without a reason (%s)" % (result["error_type"] or "?")
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engine=dict(type="str", required=True, choices=ENGINE_NAMES),
            argv=dict(type="list", elements="str", required=True),
            user=dict(type="str", required=True),
            environment=dict(type="dict", default={}),
            secrets=dict(type="list", elements="str", default=[], no_log=True),
            timeout=dict(type="int", default=180),
        ),
        supports_check_mode=True,
    )
    problems = input_problems(module.params)
    if problems:
        module.fail_json(msg=" ".join(problems), problems=problems, changed=False)
    module.exit_json(**dry_run(module))


if __name__ == "__main__":
    main()
