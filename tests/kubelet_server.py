"""A real kubelet PodResources server for tests: a gRPC server on a unix socket implementing the
kubelet's PodResourcesLister from the same generated code the exporter uses
(gpuobs.attribution.podresources_v1_pb2*). tests/test_attribution.py and the live slowdown test
(tests/test_slowdown_live.py) point an exporter's --kubelet-socket at it."""

from __future__ import annotations

import shutil
import tempfile
import threading
from concurrent import futures
from pathlib import Path
from typing import Callable

import grpc

from gpuobs.attribution import podresources_v1_pb2 as pb
from gpuobs.attribution import podresources_v1_pb2_grpc as pb_grpc


class Kubelet(pb_grpc.PodResourcesListerServicer):
    """A PodResourcesLister whose answer, and delay, the test changes; counts List() calls."""

    def __init__(self):
        self.pods: list[tuple[str, str, str, str, list[str]]] = []  # (pod, ns, container, resource, ids)
        self.delay = 0.0
        self.calls = 0
        self.released = threading.Event()  # set at teardown: stalled calls return at once

    def List(self, request, context):
        """The pods as set in self.pods (each container also holds a NIC device, which the exporter
        ignores), after self.delay seconds unless released."""
        self.calls += 1
        if self.delay:
            self.released.wait(self.delay)
        resp = pb.ListPodResourcesResponse()
        for pod, ns, container, resource, ids in self.pods:
            pr = resp.pod_resources.add(name=pod, namespace=ns)
            c = pr.containers.add(name=container)
            c.devices.add(resource_name=resource, device_ids=ids)
            c.devices.add(resource_name="example.com/nic", device_ids=["GPU-not-a-gpu"])  # ignored
        return resp


def serve_kubelet() -> tuple[Kubelet, str, Callable[[], None]]:
    """Start a Kubelet on a new short unix socket path (a unix socket path is limited to ~107 bytes,
    so it lives under /tmp, not the test's tmp_path). Returns (servicer, socket path, stop()): stop()
    ends the server and removes its directory; calling it again does nothing."""
    directory = tempfile.mkdtemp(prefix="kl", dir="/tmp")
    path = str(Path(directory) / "kubelet.sock")
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    stopped: list[int] = []

    def stop() -> None:
        if not stopped:
            servicer.released.set()
            server.stop(grace=None)
            shutil.rmtree(directory, ignore_errors=True)
            stopped.append(1)

    return servicer, path, stop
