"""The shared helpers every module uses for returned names and numeric checks."""
from __future__ import annotations

import json
import math
import sys

import pytest

from tests.run_module import ensure_collection_link

sys.path.insert(0, str(ensure_collection_link()))
from ansible_collections.cleanslate.gpu.plugins.module_utils._checks import number_problem  # noqa: E402
from ansible_collections.cleanslate.gpu.plugins.module_utils._text import printable  # noqa: E402


@pytest.mark.parametrize("raw, shown", [
    (b"psm_plain", "psm_plain"),
    (b"caf\xc3\xa9", "caf\u00e9"),
    (b"bad\xffname", "bad\\xffname"),
    (b"nl\nin\rname", "nl\nin\rname"),
])
def test_printable_keeps_utf8_and_escapes_other_bytes(raw, shown):
    assert printable(raw) == shown
    assert printable(raw.decode("utf-8", "surrogateescape")) == shown
    json.dumps(printable(raw)).encode("utf-8")  # serialisable as Ansible needs


@pytest.mark.parametrize("value, bounds, words", [
    (float("nan"), {"minimum": 0}, "finite"),
    (math.inf, {"minimum": 0}, "finite"),
    (-math.inf, {"minimum": 0}, "finite"),
    (-1, {"minimum": 0}, "0 or more"),
    (0, {"above": 0}, "more than 0"),
    (1e10, {"minimum": 0, "maximum": 86400}, "86400 or less"),
    (True, {}, "must be a number"),
    ("5", {}, "must be a number"),
])
def test_number_problem_refuses(value, bounds, words):
    problem = number_problem("grace_period", value, unit="seconds", **bounds)
    assert problem is not None and problem.startswith("grace_period must be") and words in problem


@pytest.mark.parametrize("value, bounds", [(0, {"minimum": 0}), (0.5, {"above": 0}), (86400, {"maximum": 86400})])
def test_number_problem_accepts(value, bounds):
    assert number_problem("x", value, **bounds) is None
