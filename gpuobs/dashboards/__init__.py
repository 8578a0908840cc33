"""Grafana dashboards for gpuobs, built with grafanalib from the metric catalog and the recording
rules of gpuobs.alerts: Fleet overview, Node, Training job, Inference service, Exporter health
(one module each, common.py for the shared conventions).

`gpuobs dashboards build` (build.py) writes them to dashboards/*.json with Grafana provisioning
files; `--check` and tests/test_dashboards.py fail when the committed files drift from this code.
"""
