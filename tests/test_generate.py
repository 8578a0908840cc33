"""`gpuobs generate`: THE drift check of every generated, committed file (alerts/, dashboards/,
docs/runbooks/, docs/metrics.md, docs/cardinality.md), and how it writes, checks and reports.

The command runs in a child process: the cardinality measurement initialises NVML on simulators of
its own, which must not meet NVML state left by other tests in this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from gpuobs import generated

GENERATED_MD = ["docs/metrics.md", "docs/cardinality.md", "docs/rule-tiers.md", *(f"docs/runbooks/{p.name}" for p in
                                                           sorted((REPO / "docs" / "runbooks").glob("*.md")))]


def generate(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuobs.cli", "generate", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, **(env or {})})


def test_committed_generated_files_match_the_code():
    done = generate("--check")
    assert done.returncode == 0 and done.stdout == "", \
        f"run `gpuobs generate` and commit what it writes (or delete what it calls stale):\n{done.stdout}{done.stderr}"


def test_generate_writes_each_generator_into_its_own_folders(tmp_path):
    out = tmp_path / "out"
    done = generate("--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    written = sorted(line.removeprefix("wrote: ") for line in done.stdout.splitlines())
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert written == files
    folders = {Path(f).parent.as_posix() for f in files}
    assert folders == {"alerts", "alerts/dcgm", "dashboards", "dashboards/provisioning", "docs", "docs/runbooks", "deploy/fluent-bit"}
    assert {f for f in files if f.startswith("docs/") and "/runbooks/" not in f} == {
        "docs/metrics.md", "docs/cardinality.md", "docs/rule-tiers.md", "docs/dcgm.md",
        "docs/simulator.md"}
    # pure transformations are built where they are used, not generated into the tree
    assert not {"alerts/gpuobs-fast.rules.yml", "exporters/kubernetes/dashboards.yaml"} & set(files)
    for f in files:  # the same bytes as the committed files
        assert (out / f).read_text() == (REPO / f).read_text(), f
    assert generate("--check", "--out", str(out)).stdout == ""


def test_check_reports_drift_and_stale_files_without_touching_them(tmp_path):
    out = tmp_path / "out"
    assert generate("--out", str(out)).returncode == 0
    (out / "dashboards" / "node.json").write_text("{}")
    (out / "docs" / "runbooks" / "GpuLost.md").unlink()
    (out / "alerts" / "gpuobs-fast.rules.yml").write_text("groups: []\n")  # no longer generated
    (out / "docs" / "notes.md").write_text("hand-written\n")  # docs/ is not only generated files
    done = generate("--check", "--out", str(out))
    assert done.returncode == 1
    assert sorted(done.stdout.splitlines()) == [
        "differs: dashboards/node.json", "differs: docs/runbooks/GpuLost.md",
        "stale: alerts/gpuobs-fast.rules.yml (no generator makes it; delete it)"]
    assert (out / "dashboards" / "node.json").read_text() == "{}"
    done = generate("--out", str(out))  # writes, but a stale file still fails it
    assert done.returncode == 1 and "stale: alerts/gpuobs-fast.rules.yml" in done.stdout
    assert (out / "dashboards" / "node.json").read_text() == (REPO / "dashboards" / "node.json").read_text()
    assert (out / "alerts" / "gpuobs-fast.rules.yml").exists() and (out / "docs" / "notes.md").exists()


def test_runbook_base_from_the_command_line_and_the_environment(tmp_path):
    done = generate("--out", str(tmp_path / "a"), "--runbook-base-url", "https://wiki.example.com/gpu-runbooks/")
    assert done.returncode == 0, done.stdout + done.stderr
    rules = (tmp_path / "a" / "alerts" / "gpuobs.rules.yml").read_text()
    assert "runbook_url: https://wiki.example.com/gpu-runbooks/GpuLost.md" in rules
    assert "https://wiki.example.com/gpu-runbooks/GpuLost.md" in \
        (tmp_path / "a" / "alerts" / "grafana-alerting.json").read_text()
    assert (tmp_path / "a" / "docs" / "runbooks" / "GpuLost.md").exists()
    done = generate("--out", str(tmp_path / "b"), env={"GPUOBS_RUNBOOK_BASE_URL": "https://runbooks.example.org"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "https://runbooks.example.org/GpuLost.md" in (tmp_path / "b" / "alerts" / "prometheusrule.yaml").read_text()
    done = generate("--out", str(tmp_path / "c"), "--runbook-base-url", "docs/runbooks")
    assert done.returncode == 2 and "absolute http(s) URL" in done.stderr
    assert not (tmp_path / "c").exists()  # refused before anything is written


def test_a_generator_writing_outside_its_folders_is_refused(monkeypatch, tmp_path):
    rogue = generated.Generator("rogue", "gpuobs/rogue.py", ("alerts",), True,
                                lambda root, base: {root / "exporters" / "x.yaml": ""})
    monkeypatch.setattr(generated, "GENERATORS", (rogue,))
    with pytest.raises(RuntimeError, match="generator rogue makes .*x.yaml outside"):
        generated.generate(tmp_path)
    assert not (tmp_path / "exporters").exists()


@pytest.mark.parametrize("name", GENERATED_MD)
def test_generated_markdown_starts_by_naming_its_generator(name):
    first = (REPO / name).read_text().splitlines()[0]
    assert first.startswith("<!-- Generated by `gpuobs generate` from gpuobs/") and first.endswith("do not edit. -->")


def test_docs_that_repeat_native_names_take_them_from_the_catalog():
    """docs/dcgm.md and docs/simulator.md are written from docs/src/, whose native names are
    placeholders: a catalog rename is followed by `gpuobs generate` (and `--check` sees a stale page)."""
    import re

    from gpuobs import catalog as c
    from gpuobs import docs

    names = {n for m in c.ALL for n in (m.name, m.exposed_name)}
    for template in docs.TEMPLATES:
        typed = set(re.findall(r"(?<![\w:])gpuobs_[a-z0-9_]+", template.read_text())) & names
        assert not typed, f"{template}: use {{{{c.NAME}}}} placeholders for {sorted(typed)}"
    source = docs.DCGM_SOURCE.read_text()
    assert source.count("{{") > 20 and "{{" not in docs.from_template(source)
    assert docs.from_template("x\n`{{c.ENERGY}}` {{c.ENERGY.name}} {{dcgm:DCGM_FI_DEV_GPU_TEMP}}") == \
        f"x\n`{c.ENERGY.exposed_name}` {c.ENERGY.name} {c.TEMPERATURE.exposed_name}"
    for wrong in ("{{c.NO_SUCH_METRIC}}", "{{c.GPU_LABELS}}", "{{dcgm:DCGM_FI_NOT_A_FIELD}}"):
        with pytest.raises(ValueError):
            docs.from_template(wrong)
