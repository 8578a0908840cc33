"""The renderer writes each series' labels once and then only its values, and keeps the text of
families whose samples did not change: what it serves must be byte-identical to prometheus_client's
own rendering of the same snapshot (generate_latest, or its OpenMetrics twin), whatever changed in
between (values, GPUs, attribution) and whatever the label values hold. And the series dcgm naming
derives: the last XID per GPU, aliased DCGM field names."""

from __future__ import annotations

import gzip

import pytest

from gpuobs import catalog as c
from gpuobs.attribution import SlurmJobMap
from gpuobs.collect import Sampler, Session, build_families, default_families
from gpuobs.collect.base import Sample, Snapshot
from gpuobs.exporter import render
from gpuobs.exporter.render import Renderer, dcgm_families
from gpuobs.sim.state import set_val


def full_render(snap, naming, source=None, fmt="text") -> bytes:
    """prometheus_client's rendering of a snapshot, as the exporter serves it: the GPU families
    (dcgm: renamed counter headers), then self-health, then gpuobs_exporter_snapshot_stale 0."""
    extra = Renderer(naming, attribution=[source] if source else [])._attributor(
        [s for s in snap.samples if s.metric is c.MIG_INFO])
    own = [s for s in snap.samples if s.metric.family in render.SELF_FAMILIES]
    gpu = [s for s in snap.samples if s.metric.family not in render.SELF_FAMILIES]
    tail = render.native_families(own) + [render._stale_flag(False)]
    if naming == "dcgm":
        watched = any(s.metric is c.XID_WATCHER_UP for s in own)
        return render.dcgm_text(dcgm_families(gpu, "node-a", extra, xid_watched=watched)) + render._to_text(tail)
    return render._to_text(render.native_families(gpu, extra) + tail, fmt)


@pytest.mark.parametrize("naming", ["gpuobs", "dcgm"])
def test_cached_render_equals_full_render_as_values_gpus_and_jobs_change(make_sim, tmp_path, naming):
    sim = make_sim({"gpus": [{"profile": "h100-sxm-80gb", "count": 2},
                             {"profile": "h100-sxm-80gb", "count": 1, "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]}]})
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    source = SlurmJobMap(str(jobs))
    session = Session()
    sampler = Sampler(session, build_families(default_families() | {"processes"}, process_cap=8), interval=1)
    renderer = Renderer(naming, hostname="node-a", attribution=[source])
    g0 = sim.state.gpu(0)

    def step(change):
        change()
        source.refresh()
        snap = sampler.sample_once()
        renderer.render(snap)
        assert renderer.fresh == full_render(snap, naming, source)
        if naming == "gpuobs":
            assert renderer.body("openmetrics") == full_render(snap, naming, source, "openmetrics")
        return renderer.fresh

    first = step(lambda: None)
    same = step(lambda: None)
    temp = step(lambda: set_val(g0.temp_gpu, 83))
    assert b"83" in temp and temp != same
    job = step(lambda: (jobs / "1").write_text("4242\n"))
    assert b'"4242"' in job
    gone = step(lambda: sim.state.lose_gpu(1))
    assert gone.count(b'"4242"') < job.count(b'"4242"')  # the lost GPU's values are gone
    step(lambda: (sim.state.lose_gpu(1, False), (jobs / "1").unlink()))
    assert first  # rendered at all
    session.shutdown()


def _gpu_info(gpu: str, uuid: str) -> Sample:
    values = {"gpu": gpu, "uuid": uuid, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{gpu}8:00.0",
              "driver_version": "590.48.01"}
    return Sample(c.GPU_INFO, tuple(values.get(label, "") for label in c.GPU_INFO.labels), 1.0)


def _xid(uuid: str, code: int, seen: float, gi: str = "") -> Sample:
    return Sample(c.XID_LAST_SEEN, ("0", uuid, str(code), gi, "", ""), seen)


def test_dcgm_last_xid_is_the_latest_code_of_each_gpu_whatever_its_mig_instance():
    samples = [_gpu_info("0", "GPU-a"), _gpu_info("1", "GPU-b"),
               _xid("GPU-a", 13, 100.0), _xid("GPU-a", 31, 300.0, gi="1"), _xid("GPU-a", 43, 200.0),
               _xid("GPU-gone", 79, 50.0)]  # a GPU that fell off the bus: no gpuobs_gpu_info any more
    [fam] = [f for f in dcgm_families(samples, "node-a", xid_watched=True) if f.name == "DCGM_FI_DEV_XID_ERRORS"]
    got = {s.labels["UUID"]: s for s in fam.samples}
    assert {u: s.value for u, s in got.items()} == {"GPU-a": 31, "GPU-b": 0, "GPU-gone": 79}
    assert got["GPU-a"].labels["err_code"] == "31" and got["GPU-b"].labels["err_msg"] == "No Error"
    assert "GPU_I_ID" not in got["GPU-a"].labels  # DCGM reports XIDs per physical GPU
    assert got["GPU-gone"].labels["DCGM_FI_DRIVER_VERSION"] == "590.48.01"  # node-wide
    # without the XID watcher nothing says "no XID": only the XIDs seen are served
    [fam] = [f for f in dcgm_families(samples, "node-a") if f.name == "DCGM_FI_DEV_XID_ERRORS"]
    assert {s.labels["UUID"] for s in fam.samples} == {"GPU-a", "GPU-gone"}
    assert not [f for f in dcgm_families(samples[:2], "node-a") if f.name == "DCGM_FI_DEV_XID_ERRORS"]


def test_dcgm_aliases_serve_one_sample_under_each_name():
    mask = Sample(c.CLOCK_EVENT_REASONS_MASK, ("0", "GPU-a"), 68.0)
    fams = {f.name: f for f in dcgm_families([_gpu_info("0", "GPU-a"), mask], "node-a")}
    for name in ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", *c.DCGM_ALIASES["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]):
        [s] = fams[name].samples
        assert s.value == 68 and s.labels["UUID"] == "GPU-a" and fams[name].type == "gauge"


# Label values that need escaping in the text formats: quote, backslash, newline, and UTF-8.
AWKWARD = ['plain', 'say "hi"', 'C:\\path\\x', 'two\nlines', 'caf\u00e9 \u30b8\u30e7\u30d6', '', '{a="b"}', 'x,y=z']
VALUES = [0.0, -0.0, 1.0, 3, 0.1, 1e-7, 123456.0, 1234567.0, 1.5e21, 2.0 ** 64 - 1, 72.6, 1e300]


class ChurningSource:
    """Attribution whose answer changes with every refresh: a pod, then none, then another, with
    label values that need escaping."""
    name, up = "fake", True

    def __init__(self):
        self.round = 0

    def lookup(self, uuid, index=None, gpu_instance=None):
        pick = (self.round + int(index or 0)) % 3
        if pick == 0:
            return None
        return {"pod": AWKWARD[(self.round + pick) % len(AWKWARD)] or "p", "namespace": "ns-" + str(pick),
                "container": 'c"' + str(self.round), "hpc_job": ""}


def every_metric_snapshot(round_: int) -> Snapshot:
    """A sample of every catalog metric served in /metrics (OTel histograms are not), on two GPUs
    and a MIG instance, label values and values cycling through AWKWARD and VALUES by `round_`."""
    samples = []
    for i, metric in enumerate(m for m in c.ALL if m.kind != "histogram"):
        for gpu, uuid in (("0", "GPU-a"), ("1", "GPU-b")):
            labels = []
            for j, name in enumerate(metric.labels):
                if name == "gpu":
                    labels.append(gpu)
                elif name == "uuid":
                    labels.append(uuid)
                elif name in ("gpu_instance_id", "compute_instance_id"):
                    labels.append("1")
                elif name == "xid":  # a number: dcgm naming derives err_code from it
                    labels.append(("13", "79", "31")[(round_ + j) % 3])
                else:
                    labels.append(AWKWARD[(i + j + round_) % len(AWKWARD)])
            value = VALUES[(i + round_ + int(gpu)) % len(VALUES)]
            samples.append(Sample(metric, tuple(labels), value))
            if not metric.identity:
                break  # node-wide: one series
    return Snapshot(1.0, tuple(samples))


@pytest.mark.parametrize("naming", ["gpuobs", "dcgm"])
def test_every_metric_byte_identical_to_prometheus_client_with_escaping_and_churn(naming):
    source = ChurningSource()
    renderer = Renderer(naming, hostname="node-a", attribution=[source])
    formats = render.FORMATS if naming == "gpuobs" else ("text",)
    bodies = []
    for round_ in range(8):
        source.round = round_ // 2  # attribution changes every other render; labels and values every one
        snap = every_metric_snapshot(round_)
        renderer.render(snap)
        for fmt in formats:
            assert renderer.body(fmt) == full_render(snap, naming, source, fmt), (fmt, round_)
            assert gzip.decompress(renderer.body(fmt, gz=True)) == renderer.body(fmt)
        bodies.append(renderer.fresh)
    # escaped, not raw (in some round: which label gets which value turns with the catalog's order)
    assert any(b'\\"hi\\"' in body for body in bodies) and any(b"two\\nlines" in body for body in bodies)


def test_stale_body_in_each_format_is_self_health_only():
    renderer = Renderer("gpuobs", hostname="node-a")
    assert renderer.fresh == b"" and renderer.body("openmetrics", stale=True) == b""
    renderer.render(every_metric_snapshot(0))
    for fmt in render.FORMATS:
        stale = renderer.body(fmt, stale=True).decode()
        assert "gpuobs_exporter_snapshot_stale 1.0" in stale and "gpuobs_exporter_gpu_timeouts_total{" in stale
        assert not [line for line in stale.splitlines() if line.startswith("gpuobs_gpu_")]  # no GPU value
        assert stale.endswith("# EOF\n") == (fmt == "openmetrics")
    with pytest.raises(ValueError):
        renderer.body("protobuf")


@pytest.mark.parametrize(("accept", "encoding", "naming", "expected"), [
    # what Prometheus 2.42 sends: OpenMetrics first, gzip
    ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1", "gzip", "gpuobs", ("openmetrics", True)),
    ("application/openmetrics-text;version=1.0.0", "gzip", "dcgm", ("text", True)),  # dcgm-exporter: text only
    ("*/*", None, "gpuobs", ("text", False)),  # curl
    (None, "deflate, gzip;q=0.5", "gpuobs", ("text", True)),
    ("text/plain;version=0.0.4", "identity", "gpuobs", ("text", False)),
    # q-values, as client_golang weighs them: the highest q wins, q=0 refuses
    ("text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5", "gzip;q=0", "gpuobs",
     ("text", False)),
    ("text/plain;q=0.3,application/openmetrics-text;q=0.9", "identity;q=0.5, gzip", "gpuobs", ("openmetrics", True)),
    ("application/openmetrics-text;version=1.0.0;q=0,*/*;q=0.1", "gzip;q=0, identity", "gpuobs", ("text", False)),
    ("application/openmetrics-text;version=2.0.0,text/plain;q=0.2", "*", "gpuobs", ("text", False)),
    ("application/openmetrics-text;q=bogus", "gzip;q=0.001", "gpuobs", ("text", True)),
])
def test_negotiation_follows_the_go_client(accept, encoding, naming, expected):
    assert render.negotiate(accept, encoding, naming) == expected
