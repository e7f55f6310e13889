"""The node_reset variables that aim a reset at a simulated node instead of the real /dev,
/dev/shm and site-packages (used by `make demo`, the playbook tests and the fleet tests)."""
from __future__ import annotations


def node_reset_vars(manifest: dict, **overrides) -> dict:
    """Role variables for the node that `crash` described in `manifest`, plus overrides."""
    values = {
        "node_reset_environment": manifest["nvml"]["env"],
        "node_reset_gpu_reset_device_paths": manifest["device_paths"],
        "node_reset_gpu_reset_cmdline_patterns": [manifest["api_server_pattern"]],
        # The simulated SIGTERM-ignorer would hold every run for the default 30 s.
        "node_reset_gpu_reset_grace_period": 3,
        "node_reset_shm_clean_path": manifest["shm_dir"],
        # The engine's /tmp leftovers are looked for there too: never in the /tmp of the machine that runs the tests.
        "node_reset_shm_clean_tmp_path": manifest["shm_dir"],
        "node_reset_pycache_purge_paths": [manifest["site_packages"]["path"]],
        "node_reset_pycache_purge_python": manifest["python"],
        "node_reset_nvml_verify_expected_count": manifest["gpu_count"],
        # The evidence of a reset is kept under the node's root, never in the machine's /var/lib.
        "node_reset_evidence_path": manifest["root"] + "/evidence",
    }
    values.update(overrides)
    return values
