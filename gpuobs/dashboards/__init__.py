"""Grafana dashboards for gpuobs, built with grafanalib from the metric catalog and the recording
rules of gpuobs.records: Fleet overview, Node, Training job, Inference service, Exporter health
(one module each, common.py for the shared conventions). The Node dashboard's rows are built per
metric family, one module each in rows/ (a new panel goes in its family's module).

Panel ids are derived from each panel's identity, never its position: the SHA-256 of [dashboard uid,
row title, panel title] (or an explicit key passed to Layout.add/Layout.row where a title repeats, or
to keep a renamed panel's id) reduced to 1..2^31-1 (common.panel_id). Adding, removing or moving
other panels changes no id, so Grafana's `viewPanel=<id>` links keep working; two panels of one
identity in a dashboard, or a hash collision, fail the build with common.PanelIdError.

`gpuobs generate` (build.py's outputs) writes them to dashboards/*.json with Grafana provisioning
files; `gpuobs generate --check` (tests/test_generate.py) fails when the committed files drift from this code.
"""
