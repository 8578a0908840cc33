"""The log-pattern catalog (gpuobs.logpatterns): every pattern matches real-looking lines of several
driver, NCCL and PyTorch versions and stays quiet on look-alikes; the XID code, PCI address and
rank are extracted; the gpuobs log handlers count matching records by pattern; the count reaches a
Prometheus scrape of the training metrics."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import free_port

from gpuobs import catalog as c
from gpuobs import logpatterns as lp
from gpuobs.logs import FluentdHandler, PatternFilter, json_handler, pattern_matches_total
from gpuobs.runenv import RunEnv

REPO = Path(__file__).resolve().parents[1]

# pattern -> (lines that must match, with the fields they must extract), lines that must not
EXAMPLES: dict[str, tuple[list[tuple[str, dict[str, str]]], list[str]]] = {
    "nvrm_xid": ([
        ("[ 1843.308145] NVRM: Xid (PCI:0000:18:00): 79, pid=4133, name=python, GPU has fallen off the bus.",
         {"xid": "79", "pci": "0000:18:00"}),
        ("kernel: NVRM: Xid (PCI:0000:ca:00): 119, pid=2197, name=pt_main_thread, Timeout after 6s of waiting "
         "for RPC response from GPU1 GSP!", {"xid": "119", "pci": "0000:ca:00"}),
        ("NVRM: Xid (0000:03:00): 13, 0001 00000000 0000a1c0 00000e00 00000000", {"xid": "13", "pci": "0000:03:00"}),
        ("Mar 05 23:33:35 node7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=1, An uncorrectable double bit "
         "error (DBE) has been detected on GPU in the framebuffer", {"xid": "48", "pci": "0000:3b:00"}),
    ], [
        # the multi-line "fallen off the bus" of newer drivers carries no Xid
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "NVRM: GPU at PCI:0000:18:00: GPU-5f3b1a2c-9d1e-4c1b-8e6a-0a1b2c3d4e5f",
        "DCGM: XID errors: 0 (last Xid 0)",
        "gpuobs_gpu_xid_errors_total{gpu=\"0\",xid=\"79\"} 1",
    ]),
    "collective_timeout": ([
        ("[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
         "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
         "ran for 600020 milliseconds before timing out.", {"op": "ALLREDUCE", "ms": "600020", "rank": "1"}),
        ("[E ProcessGroupNCCL.cpp:737] [Rank 6] Watchdog caught collective operation timeout: "
         "WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802210 milliseconds before "
         "timing out.", {"op": "ALLREDUCE", "ms": "1802210", "rank": "6"}),
        ("RuntimeError: NCCL watchdog thread terminated with exception: [PG ID 0 PG GUID 0(default_pg) Rank 7] "
         "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=64088, OpType=_REDUCE_SCATTER_BASE, "
         "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600089 milliseconds before timing out.",
         {"op": "_REDUCE_SCATTER_BASE", "ms": "600089", "rank": "7"}),
        # 1.8-1.9: no SeqNum, the timeout inside the abort message
        ("RuntimeError: NCCL communicator was aborted on rank 2. Original reason for failure was: [Rank 2] "
         "Watchdog caught collective operation timeout: WorkNCCL(OpType=BROADCAST, Timeout(ms)=1800000) ran for "
         "1800371 milliseconds before timing out.", {"op": "BROADCAST", "ms": "1800371", "rank": "2"}),
        # 2.2-2.3: "[PG 0 Rank 3]" before the watchdog's exception
        ("[rank3]:[E ProcessGroupNCCL.cpp:1182] [PG 0 Rank 3] NCCL watchdog thread terminated with exception: "
         "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4410, OpType=ALLGATHER, NumelIn=8, "
         "NumelOut=64, Timeout(ms)=600000) ran for 600512 milliseconds before timing out.",
         {"op": "ALLGATHER", "ms": "600512", "rank": "3"}),
        # 2.4+: the watchdog's summary line, and TORCH_NCCL_BLOCKING_WAIT's
        ("[rank4]:[E1109 03:12:54.118202341 ProcessGroupNCCL.cpp:1709] [PG 1 Rank 4] Timeout at NCCL work: 5531, "
         "last enqueued NCCL work: 5533, last completed NCCL work: 5530.", {"rank": "4"}),
        ("[rank6]:[E1014 11:05:09.552100214 ProcessGroupNCCL.cpp:756] [Rank 6] Work WorkNCCL(SeqNum=902, "
         "OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) timed out in blocking wait.",
         {"op": "ALLREDUCE", "rank": "6"}),
        # gloo, as torch 2.13 raises it (captured from a real 2-process job, tests/test_logpatterns_torch.py)
        # and as torch 1.12 and torchrun-prefixed 2.x logs printed it
        ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
         "Timed out waiting 3000ms for recv operation to complete", {"ms": "3000", "rank": "1"}),
        ("RuntimeError: [/opt/conda/conda-bld/pytorch_1656352430114/work/third_party/gloo/gloo/transport/tcp/"
         "unbound_buffer.cc:136] Timed out waiting 1800000ms for send operation to complete", {"ms": "1800000"}),
        ("[trainer7|3]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
         "waiting 1800000ms for recv operation to complete", {"ms": "1800000"}),
        ("[rank0]:[E1201 20:49:10.307454268 ProcessGroupGloo.cpp:67] [Rank 0]: Rank 1 failed to pass "
         "monitoredBarrier in 2000 ms", {"ms": "2000", "rank": "0"}),
        # what the timed-out rank's next gloo operation raises (torch 2.13, tests/test_logpatterns_torch.py)
        ("[rank1]: RuntimeError: Application timeout caused pair closure", {"rank": "1"}),
        ("RuntimeError: Application timeout caused pair closure", {}),
    ], [
        "[rank0]:[W ProcessGroupNCCL.cpp:1234] Watchdog heartbeat: last completed NCCL work 1579",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=1: the watchdog aborts the communicator on a collective timeout",
        "WorkNCCL(SeqNum=808, OpType=ALLREDUCE) completed in 12 milliseconds",
        "gloo: closing pairs after an application timeout of 30 s is not configured",
        # rendezvous, not a collective
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
        "[rank1]:[E1201 20:49:03.214027089 ProcessGroupGloo.cpp:67] Rank 1 successfully reached monitoredBarrier, "
        "but received errors while waiting for send/recv from rank 0.",
        "torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cuda//0",
        "monitoredBarrier(timeout=timedelta(seconds=30)) passed on all ranks",
    ]),
    "collective_peer_crash": ([
        # torch 2.13 (captured from a real 2-process job, tests/test_logpatterns_torch.py), whole
        ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
         "closed by peer [127.0.0.1]:10666. This is typically caused by a remote worker crashing. Check the logs of "
         "the remote worker before reporting an error. GLHF! \U0001f3d6\ufe0f", {"peer": "127.0.0.1", "rank": "1"}),
        # torch 1.x's gloo: no hint after the address; an IPv6 peer
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer "
         "[10.4.1.17]:52062", {"peer": "10.4.1.17"}),
        ("[rank3]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
         "closed by peer [fd00::1:7]:29500. This is typically caused by a remote worker crashing.",
         {"peer": "fd00::1:7", "rank": "3"}),
        # a reset: the peer exited with unread data, or closed its pairs hard after its own timeout
        ("[rank2]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
         "[10.4.1.18]:35112: Connection reset by peer. This is typically caused by a remote worker hanging or bugs "
         "in the application.", {"peer": "10.4.1.18", "rank": "2"}),
    ], [
        # NCCL's socket transport says "remote peer": nccl_error's; ssh and HTTP clients are no collective
        "gpu-node-3 sshd[2211]: Connection closed by peer 10.4.1.9 port 51724 [preauth]",
        "urllib3.exceptions.ProtocolError: ('Connection aborted.', ConnectionResetError(104, 'Connection reset by "
        "peer'))",
        "Read error on 10.4.1.18: Connection reset by peer (will retry)",
        "ConnectionResetError: [Errno 104] Connection reset by peer",
    ]),
    "cuda_oom": ([
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
         "79.15 GiB of which 1.19 GiB is free.", {"requested": "2.00 GiB", "gpu": "0"}),
        ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 7.79 GiB total capacity; "
         "6.12 GiB already allocated; 3.44 MiB free)", {"requested": "20.00 MiB", "gpu": "1"}),
        ("[rank2]: RuntimeError: CUDA error: out of memory", {"rank": "2"}),
        # 2.0 (torch.cuda.OutOfMemoryError with 1.x's text), 2.1 (its "capacty" typo)
        ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB (GPU 3; 23.69 GiB total "
         "capacity; 20.11 GiB already allocated; 1.02 GiB free; 21.30 GiB reserved in total by PyTorch)",
         {"requested": "1.50 GiB", "gpu": "3"}),
        ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacty "
         "of 4.00 GiB of which 41.56 MiB is free.", {"requested": "32.00 MiB", "gpu": "0"}),
        ("node1:23:45 [0] NCCL WARN Cuda failure 'out of memory'", {}),  # an OOM first, not an NCCL error
    ], [
        "Out of memory: Killed process 4242 (python) total-vm:82347512kB",  # the host's OOM killer
        "DataLoader worker (pid 1234) is killed by signal: Killed. Perhaps out of shared memory?",
        "Setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation",
        "torch.cuda.max_memory_allocated(): 71.2 GiB (no CUDA out-of-memory so far)",
    ]),
    "cuda_illegal_address": ([
        ("RuntimeError: CUDA error: an illegal memory access was encountered", {}),
        ("[rank5]: terminate called after throwing an instance of 'c10::Error' what(): CUDA error: an illegal "
         "memory access was encountered", {"rank": "5"}),
        ("CUDA runtime error: cudaErrorIllegalAddress (700) in kernel launch", {}),
        ("cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS", {}),
    ], [
        "RuntimeError: CUDA error: an illegal instruction was encountered",
        "CUDA error: misaligned address",
        "Fatal Python error: Segmentation fault (invalid memory reference)",
    ]),
    "ecc_error": ([
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", {}),
        ("cudaErrorECCUncorrectable: uncorrectable ECC error encountered", {}),
        ("gpu 3: Row remapping failure: the GPU must be replaced", {}),
        ("NVRM: GPU 0000:3b:00.0: row remap pending, reset the GPU to activate", {}),
    ], [
        "|   0  NVIDIA H100 80GB HBM3    On  | 00000000:18:00.0 Off |   0  Volatile Uncorr. ECC |",
        "ECC mode: Enabled; single-bit correctable ECC error corrected",
        "Row remapping: enabled; remapped rows: 0",
    ]),
    "nvlink_error": ([
        ("NVRM: NVLink: fatal error detected on link 3 (0x40000)", {}),
        ("nv-fabricmanager[2211]: detected NVSwitch fatal error 12028 on fid 0 on NVSwitch pci bus id "
         "00000000:05:00.0", {}),
        ("CUDA initialization: Unexpected error from cudaGetDeviceCount(). Error 802: system not yet initialized",
         {}),
        ("systemd[1]: nvidia-fabricmanager.service: Failed with result 'exit-code'.", {}),
    ], [
        "node1:534:1763 [3] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM (NVLink)",
        "NVLink CRC errors: 0",
        "systemd[1]: Started NVIDIA fabric manager service.",
    ]),
    "nccl_error": ([
        ("node1:1234:5678 [3] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<54321> with error 12", {}),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
         "(run with NCCL_DEBUG=INFO for details), NCCL version 2.20.5 ncclSystemError: System call failed", {}),
        ("[rank3]:[E ProcessGroupNCCL.cpp:1316] [PG 0 Rank 3] NCCL communicator was aborted on rank 3.",
         {"rank": "3"}),
        ("ncclInternalError: Internal check failed.", {}),
        # NCCL 2.19+ writes the source file and line before WARN
        ("gpu-node-3:2211:2650 [5] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
         "10.1.4.7<41822> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.1.4.6", {}),
        ("gpu-node-3:2211:2650 [5] include/socket.h:455 NCCL WARN Net : Connection closed by remote peer "
         "gpu-node-4<48212>", {}),
    ], [
        "node1:534:1763 [3] NCCL INFO NVLS comm 0x7f19 headRank 3 nHeads 4 buffSize 4194304",
        "NCCL version 2.18.1+cuda12.1",
        "ncclSuccess: all ranks joined",
    ]),
}


def test_every_pattern_has_examples_both_ways():
    assert set(EXAMPLES) == set(lp.BY_NAME) == {p.name for p in lp.PATTERNS}
    for name, (good, bad) in EXAMPLES.items():
        assert len(good) >= 2 and len(bad) >= 2, name


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_pattern_matches_its_lines_and_extracts_fields(name):
    for line, fields in EXAMPLES[name][0]:
        found = lp.match(line)
        assert found is not None and found.name == name, (line, found and found.name)
        assert found.fields == fields, line
        assert set(found.fields) <= set(found.pattern.extracts)
        # the prefilter holds: every matched line carries one of its pattern's keywords
        assert any(k in line for k in found.pattern.keywords), line


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_look_alike_lines_do_not_match(name):
    for line in EXAMPLES[name][1]:
        assert lp.match(line) is None, (line, lp.match(line))


def test_xid_fields_and_unrelated_lines():
    found = lp.match("NVRM: Xid (PCI:0000:b3:00): 74, pid=9, NVLink: fatal error detected on link 2")
    assert (found.name, found.fields) == ("nvrm_xid", {"pci": "0000:b3:00", "xid": "74"})  # the Xid line wins
    for line in ("", "step 1200 loss 2.31 lr 3e-4", "x" * 100_000):
        assert lp.match(line) is None


def test_catalog_entries_are_well_formed():
    """Each pattern: a severity, an alert name, the catalog metric, at most a bounded label set."""
    assert c.LOG_PATTERN_MATCHES.name == lp.METRIC
    assert c.LOG_PATTERN_MATCHES.exposed_name == "gpuobs_log_pattern_matches_total"
    assert c.LOG_PATTERN_MATCHES.labels == ("rank", "job_id", "pattern")
    for p in lp.PATTERNS:
        assert p.severity in ("critical", "warning") and p.alert and p.summary and p.metric == lp.METRIC
    assert lp.BY_NAME["nvrm_xid"].extracts == ("pci", "xid")
    assert lp.BY_NAME["collective_timeout"].extracts == ("op", "ms", "rank")
    assert len({p.alert for p in lp.PATTERNS}) == len(lp.PATTERNS)


# ------------------------------------------------------------------------------------ handlers

def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in pattern_matches_total().items() if v != before.get(k, 0)}


def test_json_handler_counts_and_marks_matching_records():
    stream = io.StringIO()
    handler = json_handler(stream, RunEnv(rank=2, job_id="j"))
    log = logging.getLogger("test.logpatterns.json")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    before = pattern_matches_total()
    try:
        log.error("[Rank 2] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                  "Timeout(ms)=600000) ran for %d milliseconds before timing out.", 600013)
        log.info("step %d done", 7)
        log.error("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.")
        try:
            raise RuntimeError("CUDA error: out of memory")
        except RuntimeError:
            log.exception("step failed")  # matched through the exception's text
        log.info("bad args %d", "x")  # logging's own error path: still no exception into the caller
    finally:
        log.removeHandler(handler)
    assert _delta(before) == {"collective_timeout": 1, "nvrm_xid": 1, "cuda_oom": 1}
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r.get("log_pattern") for r in records] == ["collective_timeout", None, "nvrm_xid", "cuda_oom"]


def test_a_record_through_two_gpuobs_handlers_counts_once_and_fluentd_counts_too():
    fluent = FluentdHandler("127.0.0.1", free_port(), close_timeout=0.1, env=RunEnv())
    stream_handler = json_handler(io.StringIO(), RunEnv())
    assert any(isinstance(f, PatternFilter) for f in fluent.filters)
    log = logging.getLogger("test.logpatterns.two")
    log.propagate = False
    log.addHandler(fluent)
    log.addHandler(stream_handler)
    before = pattern_matches_total()
    try:
        log.warning("node1:1:2 [0] NCCL WARN Call to ibv_reg_mr failed")
        log.warning("node1:1:2 [0] NCCL INFO Bootstrap : Using eth0")
    finally:
        log.removeHandler(fluent)
        log.removeHandler(stream_handler)
        fluent.close()
    assert _delta(before) == {"nccl_error": 1}


def test_the_filter_never_raises_and_lets_every_record_through():
    f = PatternFilter()
    broken = logging.LogRecord("x", logging.ERROR, __file__, 1, "CUDA out of memory %s %s", ("one",), None)
    assert f.filter(broken) is True  # getMessage() raises TypeError inside: swallowed
    ok = logging.LogRecord("x", logging.ERROR, __file__, 1, "fine", (), None)
    assert f.filter(ok) is True and "log_pattern" not in ok.__dict__


# ------------------------------------------------------------------------------------ Prometheus

SCRIPT = textwrap.dedent('''
    import logging, sys, urllib.request
    from gpuobs import instrument, logs

    port = int(sys.argv[1])
    tel = instrument.configure(prometheus_port=port, prometheus_addr="127.0.0.1")
    logs.configure("info", stream=open("/dev/null", "w"))
    log = logging.getLogger("train")
    for _ in range(2):
        log.error("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
                  "Timeout(ms)=600000) ran for 600013 milliseconds before timing out.")
    log.error("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    log.info("step 1 done")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        print(r.read().decode())
    tel.shutdown(timeout_s=2)
''')


def test_pattern_counts_reach_the_training_metrics_scrape():
    from prometheus_client.parser import text_string_to_metric_families

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "SLURM", "TORCHELASTIC"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GPUOBS_JOB_ID", "JOB_ID", "GPUOBS_FLUENTD",
                         "FLUENTD_HOST", "GPUOBS_PROMETHEUS_PORT", "KUBERNETES_SERVICE_HOST", "POD_NAME")}
    env.update(RANK="1", WORLD_SIZE="2", GPUOBS_JOB_ID="job-logs", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(free_port())], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = [s for fam in text_string_to_metric_families(proc.stdout) for s in fam.samples
               if s.name == "gpuobs_log_pattern_matches_total"]
    by_pattern = {s.labels["pattern"]: s.value for s in samples}
    assert by_pattern == {name: {"collective_timeout": 2.0, "cuda_oom": 1.0}.get(name, 0.0) for name in lp.BY_NAME}
    assert all(s.labels["rank"] == "1" and s.labels["job_id"] == "job-logs" for s in samples)


def test_docs_table_lists_every_pattern():
    text = (REPO / "docs" / "instrument.md").read_text()
    for p in lp.PATTERNS:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{p.name}` |")), None)
        assert row is not None, p.name
        assert p.severity in row and p.alert in row and f'pattern="{p.name}"' in row and p.summary in row
