"""cleanslate.gpu.textfile_metrics through its real entry point, against real files, read back
with prometheus_client's text parser (what Prometheus's own parser accepts, as node_exporter's
textfile collector does)."""
from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.directory_events import DirectoryEvents
from tests.run_module import run_module
from tests.syscall_gate import SyscallGate

HOSTILE = ['quote " here', "back\\slash", "not a newline \\n, a trailing \\", "new\nline", "at @ slash / pct % dollar $", "{brace}=,", "\udcff\udcfe raw"]


def family(name, samples, **extra):
    return dict({"name": name, "help": "Help of %s." % name, "samples": samples}, **extra)


def parsed(path: Path) -> dict:
    """{metric name: [(labels, value, timestamp)]} as prometheus_client reads the file."""
    return {fam.name: [(sample.labels, sample.value, sample.timestamp) for sample in fam.samples]
            for fam in text_string_to_metric_families(path.read_text(encoding="utf-8"))}


def write(tmp_path, families, check=False, diff=False, **params):
    params = dict({"path": str(tmp_path), "name": "cleanslate_gpu_t", "families": families}, **params)
    return run_module("textfile_metrics", params, check=check, diff=diff)


def test_the_file_parses_with_the_labels_and_values_given_and_no_timestamp(tmp_path):
    result = write(tmp_path, [family("cleanslate_gpu_run_ok", [{"labels": {"host": "node1", "role": "node_reset"}, "value": 1}]),
                              family("cleanslate_gpu_reset_shm_freed_bytes", [{"labels": {"host": "node1"}, "value": 3 * 2 ** 40}]),
                              family("cleanslate_gpu_run_seconds", [{"labels": {"host": "node1"}, "value": 12.25}]),
                              family("cleanslate_gpu_last_run_timestamp_seconds", [{"labels": {"host": "node1"}, "value": "now"}])])
    assert result["rc"] == 0 and result["changed"] and result["written"], result
    path = tmp_path / "cleanslate_gpu_t.prom"
    assert result["path"] == str(path)
    metrics = parsed(path)
    assert metrics["cleanslate_gpu_run_ok"] == [({"host": "node1", "role": "node_reset"}, 1.0, None)]
    assert metrics["cleanslate_gpu_reset_shm_freed_bytes"] == [({"host": "node1"}, 3 * 2.0 ** 40, None)]
    assert metrics["cleanslate_gpu_run_seconds"] == [({"host": "node1"}, 12.25, None)]
    (labels, stamp, timestamp), = metrics["cleanslate_gpu_last_run_timestamp_seconds"]
    assert timestamp is None and abs(stamp - path.stat().st_mtime) < 5  # the host's clock, as a value
    # Readable by the collector's user (prometheus), written by root.
    assert path.stat().st_mode & 0o777 == 0o644
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]  # no temporary file left


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_and_help_come_back_as_given(tmp_path, value):
    result = write(tmp_path, [family("cleanslate_gpu_service_info", [{"labels": {"host": "n", "unit": value}, "value": 1}],
                                     help="Help with \\ and\nnewline " + value)])
    assert result["rc"] == 0, result
    fam, = text_string_to_metric_families((tmp_path / "cleanslate_gpu_t.prom").read_text(encoding="utf-8"))
    # Bytes that are not UTF-8 (a unit name read from the host) are written as \xNN: the file is UTF-8.
    expected = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    assert fam.samples[0].labels == {"host": "n", "unit": expected}
    assert fam.documentation == "Help with \\ and\nnewline " + expected


def test_a_run_that_writes_the_same_text_changes_nothing(tmp_path):
    families = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 1}])]
    assert write(tmp_path, families)["changed"]
    path = tmp_path / "cleanslate_gpu_t.prom"
    before = os.stat(path)
    again = write(tmp_path, families)
    assert again["rc"] == 0 and not again["changed"] and not again["written"], again
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_check_mode_writes_nothing_and_diff_shows_the_text(tmp_path):
    families = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 0}])]
    result = write(tmp_path, families, check=True, diff=True)
    assert result["rc"] == 0 and result["changed"] and not result["written"], result
    assert list(tmp_path.iterdir()) == []
    assert result["diff"]["before"] == "" and 'cleanslate_gpu_run_ok{host="n"} 0\n' in result["diff"]["after"]
    write(tmp_path, families)
    same = write(tmp_path, families, check=True, diff=True)
    assert not same["changed"] and same["diff"]["before"] == same["diff"]["after"]


def test_keep_previous_keeps_the_old_samples_and_takes_the_given_ones_only_without(tmp_path):
    labels = {"host": "n", "role": "node_reset"}
    first = write(tmp_path, [family("cleanslate_gpu_last_success_timestamp_seconds", [{"labels": labels, "value": 1700000000.5}])])
    assert first["written"]
    # A failed run: its own value is not taken, the previous file's is.
    kept = write(tmp_path, [family("cleanslate_gpu_last_success_timestamp_seconds", [], keep_previous=True),
                            family("cleanslate_gpu_failing_since_timestamp_seconds", [{"labels": labels, "value": 1800000000}],
                                   keep_previous=True)])
    assert kept["kept_previous"] == ["cleanslate_gpu_last_success_timestamp_seconds"], kept
    metrics = parsed(tmp_path / "cleanslate_gpu_t.prom")
    assert metrics["cleanslate_gpu_last_success_timestamp_seconds"] == [(labels, 1700000000.5, None)]
    assert metrics["cleanslate_gpu_failing_since_timestamp_seconds"] == [(labels, 1800000000.0, None)]
    # The next failure keeps the first failure's time.
    write(tmp_path, [family("cleanslate_gpu_failing_since_timestamp_seconds", [{"labels": labels, "value": 1900000000}],
                            keep_previous=True)])
    assert parsed(tmp_path / "cleanslate_gpu_t.prom")["cleanslate_gpu_failing_since_timestamp_seconds"] == [
        (labels, 1800000000.0, None)]


@pytest.mark.parametrize("value", HOSTILE)
def test_keep_previous_keeps_hostile_label_values_as_they_were(tmp_path, value):
    """The kept samples are read back from the file: a unit name with quotes, backslashes or a
    newline must come back as written, or the kept series is another series."""
    labels = {"host": "n", "unit": value}
    write(tmp_path, [family("cleanslate_gpu_last_success_timestamp_seconds", [{"labels": labels, "value": 17}])])
    write(tmp_path, [family("cleanslate_gpu_last_success_timestamp_seconds", [], keep_previous=True)])
    (got, seventeen, dummy), = parsed(tmp_path / "cleanslate_gpu_t.prom")["cleanslate_gpu_last_success_timestamp_seconds"]
    assert seventeen == 17 and got == {"host": "n", "unit": value.replace("\udcff\udcfe", "\\xff\\xfe")}


def test_a_failed_write_reports_one_sentence_and_leaves_no_temporary(tmp_path):
    """A write that fails half-way (here the file size limit, as a full disk would): the module
    fails with one sentence naming the file, the old file is whole and no temporary stays."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    good = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 1}])]
    assert write(metrics, good)["written"]
    before = (metrics / "cleanslate_gpu_t.prom").read_bytes()
    # An ignored SIGXFSZ survives exec: the write gets EFBIG instead of the process dying.
    limited = tmp_path / "python-fsize-limited"
    limited.write_text("#!/bin/bash\ntrap '' XFSZ\nulimit -f 4\nexec %s \"$@\"\n" % sys.executable)
    limited.chmod(0o755)
    steps = [{"labels": {"host": "n", "step": "s%05d" % i}, "value": i} for i in range(2000)]
    result = run_module("textfile_metrics", {"path": str(metrics), "name": "cleanslate_gpu_t",
                                             "families": [family("cleanslate_gpu_reset_step_seconds", steps)]},
                        python=str(limited))
    assert result["rc"] == 1 and result["msg"].startswith("cannot write %s: " % (metrics / "cleanslate_gpu_t.prom")), result
    assert (metrics / "cleanslate_gpu_t.prom").read_bytes() == before
    assert sorted(entry.name for entry in metrics.iterdir()) == ["cleanslate_gpu_t.prom"]


def test_a_missing_directory_gets_no_file(tmp_path):
    result = write(tmp_path / "absent", [family("cleanslate_gpu_run_ok", [{"labels": {}, "value": 1}])])
    assert result["rc"] == 0 and not result["changed"] and not result["written"], result
    assert "does not exist" in result["msg"] and not (tmp_path / "absent").exists()
    # Said in the run's output too (a task that is ok prints no msg): one warning (ansible-core 2.19
    # returns them structured), naming the directory and the roles' variables, and no host.
    (warning,) = result.get("warnings", [])
    assert "no metrics file was written: %s does not exist" % (tmp_path / "absent") in str(warning), result
    assert "node_reset_metrics_dir" in str(warning) and "inference_service_metrics_dir" in str(warning), warning


BAD = [
    ({"name": ""}, "name must be"),
    ({"name": "../etc/x"}, "name must be"),
    ({"name": ".hidden"}, "name must be"),
    ({"name": "a\nb"}, "name must be"),
    ({"name": "x" * 201}, "name must be"),
    ({"path": "relative/dir"}, "path must be an absolute"),
    ({"mode": "999"}, "mode must be"),
    ({"mode": "0o644'; rm"}, "mode must be"),
    ({"families": [family("1bad", [{"value": 1}])]}, "not a Prometheus metric name"),
    ({"families": [family("ok_name", [{"labels": {"__name__": "x"}, "value": 1}])]}, "not a Prometheus label name"),
    ({"families": [family("ok_name", [{"labels": {"bad-label": "x"}, "value": 1}])]}, "not a Prometheus label name"),
    ({"families": [family("ok_name", [{"value": "abc"}])]}, "must be a number or 'now'"),
    ({"families": [family("ok_name", [{"value": True}])]}, "must be a number or 'now'"),
    ({"families": [family("ok_name", [{"value": None}])]}, "must be a number or 'now'"),
    ({"families": [family("ok_name", [{"labels": "host=n", "value": 1}])]}, "must be a dictionary"),
    ({"families": [family("ok_name", [{"labels": {}}])]}, "with a value"),
    ({"families": [family("ok_name", [{"value": 1}]), family("ok_name", [{"value": 2}])]}, "given twice"),
    ({"families": [family("ok_name", [{"labels": {"a": "1"}, "value": 1}, {"labels": {"a": "1"}, "value": 2}])]},
     "two samples with the labels"),
]


@pytest.mark.parametrize("override, words", BAD, ids=[str(i) for i in range(len(BAD))])
def test_a_bad_input_is_refused_in_one_sentence_and_the_old_file_stays(tmp_path, override, words):
    good = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 1}])]
    assert write(tmp_path, good)["written"]
    before = (tmp_path / "cleanslate_gpu_t.prom").read_bytes()
    params = {"path": str(tmp_path), "name": "cleanslate_gpu_t", "families": good}
    params.update(override)
    result = run_module("textfile_metrics", params)
    assert result.get("failed") and words in result["msg"], result
    assert "\n" not in result["msg"].strip() or "\n" in str(override)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["cleanslate_gpu_t.prom"]
    assert (tmp_path / "cleanslate_gpu_t.prom").read_bytes() == before


def test_non_finite_values_are_written_as_the_format_spells_them(tmp_path):
    assert write(tmp_path, [family("a", [{"labels": {"k": "1"}, "value": float("nan")}, {"labels": {"k": "2"}, "value": "inf"},
                                         {"labels": {"k": "3"}, "value": "-inf"}])])["written"]
    values = {labels["k"]: value for labels, value, dummy in parsed(tmp_path / "cleanslate_gpu_t.prom")["a"]}
    assert values["1"] != values["1"] and values["2"] == float("inf") and values["3"] == float("-inf")


def test_a_reader_never_sees_a_half_written_file(tmp_path):
    """The collector's view: node_exporter reads every name of the directory that ends in .prom,
    hidden ones too. The kernel's record of every name the module made (inotify, read after each
    write: complete whatever the machine's load, no race with a reader) shows that no name ending
    in .prom but the file's own ever existed, and that the file's name only ever arrived by a
    rename of a file already written and closed under another name, never written in place."""
    steps = [{"labels": {"host": "n", "step": "s%06d" % i, "pad": "x" * 40}, "value": i} for i in range(2000)]
    big = [family("cleanslate_gpu_reset_step_seconds", steps),
           family("cleanslate_gpu_zz_end", [{"labels": {"run": "0"}, "value": 1}])]
    final = "cleanslate_gpu_t.prom"
    with DirectoryEvents(tmp_path) as events:
        for run in ("first", "again"):  # the file absent, then replaced
            big[-1]["samples"][0]["labels"]["run"] = run
            assert write(tmp_path, big)["written"]
            history = events.read()
            assert [event for event in history if event.name.endswith(".prom") and event.name != final] == [], history
            arrivals = [event for event in history if event.name == final]
            assert [event.kind for event in arrivals] == ["moved_to"], history
            (departure,) = [event for event in history if event.kind == "moved_from" and event.cookie == arrivals[0].cookie]
            temporary = [event.kind for event in history if event.name == departure.name]
            assert temporary[0] == "create" and temporary[-2:] == ["close_write", "moved_from"], history
            written = list(text_string_to_metric_families((tmp_path / final).read_text(encoding="utf-8")))
            assert [(fam.name, len(fam.samples)) for fam in written] == [
                ("cleanslate_gpu_reset_step_seconds", 2000), ("cleanslate_gpu_zz_end", 1)]
            assert written[-1].samples[0].labels == {"run": run}
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [final]


def test_a_crash_before_the_rename_leaves_no_prom_file_and_the_old_one_whole(tmp_path):
    """The module killed (SIGKILL) while it is inside rename(2), after writing the new text: the
    old file is still the one the collector reads, and the new text never appears under a .prom name."""
    gate_dir, tmp_path = tmp_path, tmp_path / "metrics"
    tmp_path.mkdir()
    good = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 1}])]
    assert write(tmp_path, good)["written"]
    before = (tmp_path / "cleanslate_gpu_t.prom").read_bytes()
    held = []

    def crash(call):
        held.append(sorted(entry.name for entry in tmp_path.iterdir()))
        os.kill(call.pid, signal.SIGKILL)
        # Answer the held call only once the process is dead, so the rename never continues.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if Path("/proc/%d/stat" % call.pid).read_text().rsplit(")", 1)[1].split()[0] in "ZX":
                    return
            except (FileNotFoundError, ProcessLookupError):
                return
            time.sleep(0.01)

    syscall = "rename" if platform.machine() == "x86_64" else "renameat2"
    with SyscallGate(gate_dir, hold=[syscall], handler=crash) as gate, \
            pytest.raises(AssertionError, match=r"printed no JSON \(rc=-9\)"):
        run_module("textfile_metrics", {"path": str(tmp_path), "name": "cleanslate_gpu_t",
                                        "families": [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 0}])]},
                   python=gate.python)
    assert len(held) == 1
    names = sorted(entry.name for entry in tmp_path.iterdir())
    # The new text was whole under its temporary name when the rename began: not a .prom name.
    temporary = [name for name in names if name != "cleanslate_gpu_t.prom"]
    assert len(temporary) == 1 and not temporary[0].endswith(".prom") and temporary[0].startswith("."), names
    assert 'cleanslate_gpu_run_ok{host="n"} 0' in (tmp_path / temporary[0]).read_text()
    assert (tmp_path / "cleanslate_gpu_t.prom").read_bytes() == before
    # The killed writer's temporary does not stay forever: the next write (a new value) removes it.
    result = write(tmp_path, [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 2}])])
    assert result["removed_temporaries"] == temporary, result
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["cleanslate_gpu_t.prom"]


def test_the_next_write_removes_a_crashed_writers_temporary_and_nothing_else(tmp_path):
    """A write killed between write and rename left its temporary behind: the next write removes
    it, and keeps a live writer's recent temporary, other files' temporaries and look-alikes."""
    good = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 1}])]
    assert write(tmp_path, good)["written"]
    # A writer that ran and died: a real process, reaped, so its pid and start time name nobody now.
    dead = subprocess.Popen(["sleep", "0"])
    dead_starttime = int(Path("/proc/%d/stat" % dead.pid).read_text().rsplit(")", 1)[1].split()[19])
    dead.wait()
    live_starttime = int(Path("/proc/%d/stat" % os.getpid()).read_text().rsplit(")", 1)[1].split()[19])
    crashed = ".cleanslate_gpu_t.prom.%d-%d.a1b2c3d4.tmp" % (dead.pid, dead_starttime)
    live = ".cleanslate_gpu_t.prom.%d-%d.e5f6g7h8.tmp" % (os.getpid(), live_starttime)
    old_live = ".cleanslate_gpu_t.prom.%d-%d.oldoldol.tmp" % (os.getpid(), live_starttime)
    # A live pid with another start time: the writer died and its pid was reused.
    reused = ".cleanslate_gpu_t.prom.%d-%d.reusedxx.tmp" % (os.getpid(), live_starttime + 1)
    others = [".cleanslate_gpu_t2.prom.%d-%d.a1b2c3d4.tmp" % (dead.pid, dead_starttime),  # another file's
              # the temporary of another file whose name begins with this one's whole name
              ".cleanslate_gpu_t.prom.old.prom.%d-%d.a1b2c3d4.tmp" % (dead.pid, dead_starttime),
              ".cleanslate_gpu_t.prom.%d-%d.a1b2c3d4.tmp.keep" % (dead.pid, dead_starttime),
              "cleanslate_gpu_t.prom.%d-%d.a1b2c3d4.tmp" % (dead.pid, dead_starttime),  # not hidden: not ours
              ".cleanslate_gpu_t.prom.x-y.a1b2c3d4.tmp", "other.prom"]
    for name in [crashed, live, old_live, reused] + others:
        (tmp_path / name).write_text("half\n")
    # Older than any write takes: its writer's pid may have been reused since.
    os.utime(tmp_path / old_live, (time.time() - 2 * 3600,) * 2)
    result = write(tmp_path, [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 0}])])
    assert result["written"] and sorted(result["removed_temporaries"]) == sorted([crashed, old_live, reused]), result
    assert sorted(entry.name for entry in tmp_path.iterdir()) == sorted(["cleanslate_gpu_t.prom", live] + others)
    assert 'cleanslate_gpu_run_ok{host="n"} 0' in (tmp_path / "cleanslate_gpu_t.prom").read_text()
    # Check mode removes nothing.
    (tmp_path / crashed).write_text("half\n")
    assert not write(tmp_path, good, check=True)["written"] and (tmp_path / crashed).exists()


def test_files_writes_each_file_on_its_own_and_fails_after_the_last_naming_the_bad_one(tmp_path):
    """reset_and_serve.yml writes every metrics file of its run in one contact (issue 42): a file refused
    (here a bad family) keeps its old text and fails the task by name, the files before and after it
    are written; one whose directory is missing is a warning, not a failure."""
    good = [family("cleanslate_gpu_run_ok", [{"labels": {"host": "n"}, "value": 1}])]
    assert write(tmp_path, good, name="cleanslate_gpu_middle")["written"]
    before = (tmp_path / "cleanslate_gpu_middle.prom").read_bytes()
    files = [{"path": str(tmp_path), "name": "cleanslate_gpu_first", "families": good},
             {"path": str(tmp_path), "name": "cleanslate_gpu_middle", "families": [family("1bad", [{"value": 1}])]},
             {"path": str(tmp_path / "absent"), "name": "cleanslate_gpu_nowhere", "families": good},
             {"path": str(tmp_path), "name": "cleanslate_gpu_last", "families": good, "mode": "0640"}]
    result = run_module("textfile_metrics", {"files": files})
    assert result.get("failed") and "not a Prometheus metric name" in result["msg"], result
    assert [(entry["written"], entry.get("failed", False)) for entry in result["files"]] == [
        (True, False), (False, True), (False, False), (True, False)], result["files"]
    assert parsed(tmp_path / "cleanslate_gpu_first.prom")["cleanslate_gpu_run_ok"] == [({"host": "n"}, 1.0, None)]
    assert (tmp_path / "cleanslate_gpu_last.prom").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "cleanslate_gpu_middle.prom").read_bytes() == before
    assert not (tmp_path / "absent").exists()
    assert any("%s does not exist" % (tmp_path / "absent") in str(warning) for warning in result.get("warnings", []))
    again = run_module("textfile_metrics", {"files": [files[0], files[3]]}, check=True, diff=True)
    assert again["rc"] == 0 and not again["changed"] and len(again["diff"]) == 2, again


@pytest.mark.parametrize("params", [{"name": "cleanslate_gpu_t"}, {"families": []},
                                    {"name": "cleanslate_gpu_t", "families": [], "files": []}, {}])
def test_name_with_families_or_files_alone(tmp_path, params):
    result = run_module("textfile_metrics", dict(params, path=str(tmp_path)))
    assert result.get("failed") and list(tmp_path.iterdir()) == [], result


@pytest.mark.parametrize("entry, words", [({"name": "cleanslate_gpu_t"}, "families"),
                                          ({"name": "cleanslate_gpu_t", "families": [{"help": "x"}]}, "name"),
                                          ({"name": "cleanslate_gpu_t", "families": [], "colour": "red"}, "colour")])
def test_a_bad_entry_of_files_is_refused_before_any_file_is_written(tmp_path, entry, words):
    good = {"path": str(tmp_path), "name": "cleanslate_gpu_good", "families": [family("ok_name", [{"value": 1}])]}
    result = run_module("textfile_metrics", {"files": [good, dict(entry, path=str(tmp_path))]})
    assert result.get("failed") and result["msg"].startswith("files[1]: ") and words in result["msg"], result
    assert list(tmp_path.iterdir()) == []
