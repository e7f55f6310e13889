"""node_exporter's textfile rendering (module_utils/_textfile.py) at its edges: a label with an empty
value is no label (Prometheus reads `a=""` as no `a`), so it is left out, and two samples that differ
only by one are the same series, refused as such."""
from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.cleanslate.gpu.plugins.module_utils._textfile import TextfileError, parse, render


def family(*samples):
    return {"name": "cleanslate_gpu_run_status", "help": "The last run's status.", "samples": list(samples)}


def test_a_label_with_an_empty_value_is_left_out():
    text = render([family({"labels": {"host": "gpu1", "status": "ok", "step": ""}, "value": 1})])
    assert text.splitlines()[-1] == 'cleanslate_gpu_run_status{host="gpu1",status="ok"} 1'
    assert parse(text)["cleanslate_gpu_run_status"] == [{"labels": {"host": "gpu1", "status": "ok"}, "value": 1}]
    (read,) = text_string_to_metric_families(text)
    assert read.samples[0].labels == {"host": "gpu1", "status": "ok"}


def test_only_empty_labels_leave_a_sample_without_braces():
    text = render([family({"labels": {"step": "", "unit": ""}, "value": 0})])
    assert text.splitlines()[-1] == "cleanslate_gpu_run_status 0"


def test_two_samples_that_differ_by_an_empty_label_alone_are_one_series_refused():
    with pytest.raises(TextfileError, match=r'two samples with the labels \{host="gpu1"\}'):
        render([family({"labels": {"host": "gpu1"}, "value": 1}, {"labels": {"host": "gpu1", "step": ""}, "value": 2})])


def test_a_label_whose_value_is_zero_or_a_space_is_kept():
    text = render([family({"labels": {"gpu": 0, "note": " "}, "value": 1})])
    assert text.splitlines()[-1] == 'cleanslate_gpu_run_status{gpu="0",note=" "} 1'
