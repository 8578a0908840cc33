"""Bench results are written whole or not at all (bench.common.write_result), and a partial bench run
leaves the committed results (bench/last_run.json, BENCHMARKS.md) alone."""

from __future__ import annotations

import json
import os
import stat
import sys
from types import SimpleNamespace

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO))
from bench import common  # noqa: E402
from bench import run as bench_run  # noqa: E402


def test_a_writer_that_raises_leaves_the_old_file_untouched(tmp_path):
    path = tmp_path / "last_run.json"
    path.write_text('{"old": true}\n')
    os.chmod(path, 0o664)

    def half(f):
        f.write('{"new": ')  # a run that crashed half-way through its output
        raise RuntimeError("crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        common.write_result(path, half)
    assert path.read_text() == '{"old": true}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["last_run.json"], "temp file left behind"
    common.write_result(path, lambda f: json.dump({"new": 1}, f))
    assert json.loads(path.read_text()) == {"new": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o664, "the file's mode changed"
    common.write_result(tmp_path / "fresh.md", "# report\n")
    assert (tmp_path / "fresh.md").read_text() == "# report\n"


def test_a_partial_run_writes_only_the_files_it_was_given(tmp_path, monkeypatch, capsys):
    written = []
    monkeypatch.setattr(bench_run, "write_result", lambda path, text: written.append(path))
    monkeypatch.setattr(bench_run, "write_report", lambda run, cmd: "# report\n")
    run = {"cmd": "bench/run.py --quick --only tracing"}
    args = SimpleNamespace(json=None, output=str(tmp_path / "x.md"), save=False)
    bench_run.save(run, complete=False, args=args)
    assert written == [tmp_path / "x.md"], written  # not bench/last_run.json
    assert "last_run.json left as it is" in capsys.readouterr().out
    written.clear()
    bench_run.save(run, complete=False, args=SimpleNamespace(json=None, output=None, save=False))
    assert written == []  # neither committed file
    bench_run.save(run, complete=False, args=SimpleNamespace(json=None, output=None, save=True))
    assert set(written) == set(common.TRACKED_RESULTS)
    written.clear()
    bench_run.save(run, complete=True, args=SimpleNamespace(json=None, output=None, save=False))
    assert set(written) == set(common.TRACKED_RESULTS)


def test_a_tracing_only_report_renders():
    """The header of a run without an exporter section (it crashed on `--only tracing`)."""
    run = {"quick": True, "elapsed": 1.0, "machine": {
        "date": "today", "cpu": "cpu", "cores": 2, "python": "3", "os": "linux", "prometheus": "p",
        "victoria-metrics": "v", "versions": {k: "1" for k in ("gpuobs", "nvitop-exporter", "nvitop",
                                                                "opentelemetry-sdk", "prometheus-client")}}}
    header = "\n".join(bench_run.header_section(run, "bench/run.py --quick --only tracing"))
    assert "--only tracing" in header and "Quick mode" in header
