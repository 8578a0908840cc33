"""Grafana dashboards for gpuobs, built with grafanalib from the metric catalog and the recording
rules of gpuobs.records: Fleet overview, Node, Training job, Inference service, Exporter health
(one module each, common.py for the shared conventions).

`gpuobs generate` (build.py's outputs) writes them to dashboards/*.json with Grafana provisioning
files; `gpuobs generate --check` (tests/test_generate.py) fails when the committed files drift from this code.
"""
