"""Shared-memory leftovers of a crashed server, named the way NCCL, multiprocessing, torch
and vLLM name them, in the node's own shm directory."""
from __future__ import annotations

import secrets
from pathlib import Path

MAPPED_SIZE = 1 << 20


def _write(path: Path, size: int) -> str:
    # Real bytes, not a sparse file: shm_clean reports bytes freed.
    path.write_bytes(b"\x5a" * size)
    return str(path)


def leftovers(shm_dir: Path) -> list:
    """Segments nobody holds any more (the torch one comes later: it needs a dead pid)."""
    return [
        _write(shm_dir / ("nccl-" + secrets.token_hex(3)), 256 << 10),
        _write(shm_dir / ("psm_" + secrets.token_hex(4)), 128 << 10),
        _write(shm_dir / ("sem.mp-" + secrets.token_hex(4)), 32),
        _write(shm_dir / ("vllm_offload_kv_" + secrets.token_hex(4) + ".mmap"), 512 << 10),
    ]


def torch_leftover(shm_dir: Path, dead_pid: int) -> str:
    return _write(shm_dir / ("torch_%d_%d_0" % (dead_pid, secrets.randbits(31))), 64 << 10)


def mapped_segment(shm_dir: Path) -> str:
    """The segment a live process maps with its fd closed (a vLLM shm broadcast ring)."""
    return _write(shm_dir / ("psm_" + secrets.token_hex(4)), MAPPED_SIZE)
