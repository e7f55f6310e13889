"""Shared-memory leftovers of a crashed server, named the way NCCL, multiprocessing, torch,
vLLM and SGLang name them, in the node's own shm directory."""
from __future__ import annotations

import secrets
import uuid
from pathlib import Path

MAPPED_SIZE = 1 << 20

# One name of each family the engines leave in /dev/shm, as their sources of the supported
# versions spell it (vLLM 0.31 to 0.33, SGLang 0.5.21 to 0.5.23), with a pid where the name has one.
FAMILIES = {
    "nccl": lambda pid: "nccl-" + secrets.token_hex(3),
    "multiprocessing": lambda pid: "psm_" + secrets.token_hex(4),
    "semaphore": lambda pid: "sem.mp-" + secrets.token_hex(4),
    "vllm_offload": lambda pid: "vllm_offload_%s.mmap" % uuid.uuid4(),            # KV offload region
    "vllm_ec": lambda pid: "vllm_ec_%s.mmap" % uuid.uuid4(),                       # encoder cache region
    "sgl_shm": lambda pid: "sgl_shm_mq_%d_%s" % (pid, secrets.token_hex(4)),        # make_shm_name("mq")
    "multi_tokenizer": lambda pid: "multi_tokenizer_args_%d" % pid,
    "sglang_loads": lambda pid: "sglang_loads_%s_%s.shm" % (secrets.token_hex(3), secrets.token_hex(8)),
    "sglang_host_pool": lambda pid: "sglang_host_pool_%s.mmap" % uuid.uuid4().hex,
    "cuda_ipc": lambda pid: "cuda.shm.%d.%s" % (pid, secrets.token_hex(2)),
}

SIZES = {"nccl": 256 << 10, "multiprocessing": 128 << 10, "semaphore": 32, "vllm_offload": 512 << 10}


def _write(path: Path, size: int) -> str:
    # Real bytes, not a sparse file: shm_clean reports bytes freed.
    path.write_bytes(b"\x5a" * size)
    return str(path)


def leftovers(shm_dir: Path, dead_pid: int = 999999) -> list:
    """Segments nobody holds any more, one of each family (the torch one comes later: it needs a
    dead pid)."""
    return [_write(shm_dir / make(dead_pid), SIZES.get(family, 64 << 10)) for family, make in FAMILIES.items()]


def torch_leftover(shm_dir: Path, dead_pid: int) -> str:
    return _write(shm_dir / ("torch_%d_%d_0" % (dead_pid, secrets.randbits(31))), 64 << 10)


def mapped_segment(shm_dir: Path) -> str:
    """The segment a live process maps with its fd closed (a vLLM shm broadcast ring)."""
    return _write(shm_dir / ("psm_" + secrets.token_hex(4)), MAPPED_SIZE)
