"""Pod attribution from the kubelet PodResources API (v1 List() over its unix socket).

The NVIDIA device plugin hands the kubelet device ids that are GPU UUIDs (`GPU-...`) for
`nvidia.com/gpu` and MIG UUIDs (`MIG-...`) for `nvidia.com/mig-*`; with time-slicing a replica id
is `<uuid>::<n>`. List() is called in a background thread every `refresh_s` with a deadline of
`timeout_s`, never per scrape or per render.

- No socket (not a Kubernetes node, kubelet down): no attribution, one info log; checked again at
  every refresh.
- A failing or stalled kubelet: the call times out and the previous mapping is kept until it is
  older than `keep_refreshes` refreshes, then dropped, so labels are never stale for long.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from typing import Any

from ._refresh import Refresher

log = logging.getLogger("gpuobs.attribution")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
MAX_MESSAGE = 16 * 1024 * 1024  # as the kubelet's own podresources client


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def device_uuid(device_id: str) -> str | None:
    """The GPU or MIG UUID of a device plugin device id, or None if it is not one."""
    uuid = device_id.split("::", 1)[0]  # time-slicing replicas: GPU-...::3
    return uuid if uuid.startswith(("GPU-", "MIG-")) else None


def build_mapping(response: Any) -> dict[str, dict[str, str]]:
    """{device UUID: {pod, namespace, container}} from a ListPodResourcesResponse. A device shared
    by several containers (time-slicing) gets their names joined with commas, sorted."""
    users: dict[str, set[tuple[str, str, str]]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if not dev.resource_name.startswith("nvidia.com/"):
                    continue
                for device_id in dev.device_ids:
                    uuid = device_uuid(device_id)
                    if uuid:
                        users.setdefault(uuid, set()).add((pod.name, pod.namespace, container.name))
    mapping = {}
    for uuid, who in users.items():
        ordered = sorted(who)
        mapping[uuid] = {key: ",".join(dict.fromkeys(w[i] for w in ordered))
                         for i, key in enumerate(("pod", "namespace", "container"))}
    return mapping


class PodResourcesWatcher(Refresher):
    """Keeps {device UUID: {pod, namespace, container}} from the kubelet, refreshed in a thread."""

    name = "podresources"

    def __init__(self, socket_path: str = DEFAULT_SOCKET, refresh_s: float = 10.0, timeout_s: float = 2.0,
                 keep_refreshes: int = 3):
        super().__init__(refresh_s)
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.keep_s = keep_refreshes * refresh_s
        self.calls = 0        # List() calls made
        self.errors = 0       # of which failed or timed out
        self._mapping: dict[str, dict[str, str]] = {}  # replaced whole, never mutated: read without a lock
        self._mapping_time = 0.0
        self._state: str | None = None    # last logged state: "missing", "error", "ok"

    def lookup(self, uuid: str, index: int | str | None = None,
               gpu_instance: str | None = None) -> dict[str, str] | None:
        """{pod, namespace, container} using the GPU or MIG device with this UUID, or None."""
        return self._mapping.get(uuid)

    @property
    def mapping(self) -> dict[str, dict[str, str]]:
        """The last mapping from the kubelet (empty when none or dropped): replaced whole, never mutated."""
        return self._mapping

    def _set_state(self, state: str, message: str, level: int = logging.INFO, **extra: Any) -> None:
        if state != self._state:
            log.log(level, message, extra={"socket": self.socket_path, **extra})
            self._state = state

    def list(self) -> Any:
        """One List() call with the deadline: the ListPodResourcesResponse (protobuf, untyped here), or
        grpc.RpcError (UNAVAILABLE, DEADLINE_EXCEEDED, ...)."""
        import grpc

        from . import podresources_v1_pb2 as pb
        from . import podresources_v1_pb2_grpc as pb_grpc

        options = [("grpc.max_receive_message_length", MAX_MESSAGE)]
        # A channel per refresh: a kubelet restart is picked up at once, with no reconnect backoff.
        with grpc.insecure_channel(f"unix://{os.path.abspath(self.socket_path)}", options=options) as channel:
            stub = pb_grpc.PodResourcesListerStub(channel)
            self.calls += 1
            return stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)

    def refresh(self) -> None:
        """One List(): the mapping from its answer; on no socket, none; on an error or timeout, the
        previous mapping until it is older than `keep_refreshes` refreshes. State changes are logged once."""
        if not _is_socket(self.socket_path):
            self._set_state("missing", "no kubelet pod-resources socket: no pod attribution")
            self._mapping, self._mapping_time, self.up = {}, 0.0, False
            return
        try:
            response = self.list()
        except Exception as e:  # grpc.RpcError (UNAVAILABLE, DEADLINE_EXCEEDED, ...) or a bad answer
            self.errors += 1
            self.up = False
            code = getattr(e, "code", lambda: None)()
            self._set_state("error", "kubelet pod-resources List() failed; keeping the last mapping a while",
                            logging.WARNING, error=str(code or e))
            if self._mapping and time.monotonic() - self._mapping_time > self.keep_s:
                age_s = round(time.monotonic() - self._mapping_time, 1)
                log.warning("pod attribution dropped: no answer from the kubelet",
                            extra={"socket": self.socket_path, "age_s": age_s})
                self._mapping = {}
            return
        self._mapping, self._mapping_time, self.up = build_mapping(response), time.monotonic(), True
        self._set_state("ok", "pod attribution from the kubelet", devices=len(self._mapping))

    def stop(self, timeout: float | None = None) -> None:
        """Stops the thread; waits by default one List() deadline plus a second, enough for a call in flight."""
        super().stop(self.timeout_s + 1 if timeout is None else timeout)
