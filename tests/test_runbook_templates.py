"""The runbook templates (gpuobs/alerts/runbooks/<family>/<Alert>.md and _shared/ snippets): one per
alert of the pack, in its family's folder, and the include directive, on copies of the real tree."""

from __future__ import annotations

import shutil

import pytest

from gpuobs.alerts import runbooks
from gpuobs.alerts.rules import DEFAULT, FAMILIES, alerts


@pytest.fixture
def tree(tmp_path):
    """A copy of the templates that a test may break."""
    root = tmp_path / "runbooks"
    shutil.copytree(runbooks.ROOT, root, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return root


def test_each_alert_has_one_runbook_in_its_familys_folder():
    pack = [a.name for a in alerts(DEFAULT)]
    assert list(runbooks.RUNBOOKS) == pack  # the pack's order
    files = {p.stem: p.parent.name for p in runbooks.ROOT.glob("*/*.md") if p.parent.name != runbooks.SHARED}
    assert len(files) == len(pack)
    for family in FAMILIES:
        for a in family(DEFAULT):
            assert files[a.name] == family.__name__, a.name
    assert all(list(sections) == list(runbooks.SECTIONS) and all(sections.values())
               for sections in runbooks.RUNBOOKS.values())


def test_a_copy_loads_as_the_real_tree(tree):
    assert runbooks.load(tree) == runbooks.RUNBOOKS


def test_a_runbook_in_another_familys_folder_is_refused(tree):
    (tree / "thermal" / "GpuHwThermalSlowdown.md").rename(tree / "power" / "GpuHwThermalSlowdown.md")
    with pytest.raises(ValueError, match=r"power/GpuHwThermalSlowdown.md: .* family thermal"):
        runbooks.load(tree)


def test_an_alert_without_a_runbook_is_refused(tree):
    (tree / "meta" / "Watchdog.md").unlink()
    with pytest.raises(ValueError, match=r"without a runbook.*'Watchdog'"):
        runbooks.load(tree)


def test_a_runbook_without_an_alert_is_refused(tree):
    shutil.copy(tree / "meta" / "Watchdog.md", tree / "meta" / "Watchdogs.md")
    with pytest.raises(ValueError, match="meta/Watchdogs.md: the alert pack has no alert Watchdogs"):
        runbooks.load(tree)


def test_sections_must_be_the_four_in_order(tree):
    path = tree / "meta" / "Watchdog.md"
    text = path.read_text()
    path.write_text(text.replace("## Impact", "## Effect"))
    with pytest.raises(ValueError, match=r"meta/Watchdog.md: the sections must be .*'## Effect'"):
        runbooks.load(tree)
    path.write_text("Watchdog\n\n" + text)
    with pytest.raises(ValueError, match="nothing before the first"):
        runbooks.load(tree)


def _watchdog_action(tree, action: str) -> dict[str, str]:
    """Watchdog's runbook loaded from the tree with its action section replaced."""
    path = tree / "meta" / "Watchdog.md"
    text = path.read_text()
    path.write_text(text[:text.index("## Action")] + "## Action\n\n" + action + "\n")
    return runbooks.load(tree)["Watchdog"]


def test_includes_expand_with_their_parameter_and_nest(tree):
    (tree / "_shared" / "outer.md").write_text("Before {{who}}.\n{{include drain reason={{who}} left}}\n")
    action = _watchdog_action(tree, "First.\n\n{{include outer who=Watchdog test}}\n\nLast.")["action"]
    drain = (tree / "_shared" / "drain.md").read_text().strip().replace("{{reason}}", "Watchdog test left")
    assert action == f"First.\n\nBefore Watchdog test.\n{drain}\n\nLast."


@pytest.mark.parametrize("line, error", [
    ("{{include no_such_snippet}}", "there is no _shared/no_such_snippet.md"),
    ("{{include drain}}", r"drain.md takes \['reason'\], given none"),
    ("{{include undrain reason=x}}", r"undrain.md takes no parameter, given \['reason'\]"),
    ("{{include drain who=x}}", r"drain.md takes \['reason'\], given \['who'\]"),
    ("Drain: {{include drain reason=x}}", "is no directive"),
    ("{{reason}}", "is no directive"),
    ("{{include loop}}", "loop}}: includes itself"),
])
def test_a_bad_directive_is_refused(tree, line, error):
    (tree / "_shared" / "loop.md").write_text("{{include loop}}\n")
    with pytest.raises(ValueError, match=error):
        _watchdog_action(tree, line)
