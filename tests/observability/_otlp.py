"""An OTLP/HTTP receiver on a loopback socket, decoding the real protobuf wire format.

It runs in a thread of its own (the SDK's exporters post synchronously from their own threads,
and a flush from the event loop's thread must not wait on the loop).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SPAN_KIND_INTERNAL = 1
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


@dataclass
class Received:
    """Everything posted, raw and decoded."""

    raw: list[bytes] = field(default_factory=list)
    traces: list[ExportTraceServiceRequest] = field(default_factory=list)
    metrics: list[ExportMetricsServiceRequest] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spans(self) -> list[tuple[str | None, Any]]:
        """(service.name, span) for every span received."""
        out: list[tuple[str | None, Any]] = []
        with self.lock:
            for request in self.traces:
                for rs in request.resource_spans:
                    service = attributes(rs.resource.attributes).get("service.name")
                    out.extend((service, s) for ss in rs.scope_spans for s in ss.spans)
        return out

    def metric_points(self, name: str) -> list[tuple[str | None, Any, dict[str, Any]]]:
        """(service.name, point, attributes) of every data point of metric ``name`` in each
        service's last export (the points are cumulative: each export repeats the totals)."""
        out: list[tuple[str | None, Any, dict[str, Any]]] = []
        with self.lock:
            last: dict[str | None, Any] = {}
            for request in self.metrics:
                for rm in request.resource_metrics:
                    last[attributes(rm.resource.attributes).get("service.name")] = rm
            for service, rm in last.items():
                for sm in rm.scope_metrics:
                    for metric in (m for m in sm.metrics if m.name == name):
                        out.extend((service, p, attributes(p.attributes)) for p in _points(metric))
        return out


def _points(metric: Any) -> Iterator[Any]:
    kind = metric.WhichOneof("data")
    yield from getattr(metric, kind).data_points


def value(v: AnyValue) -> Any:
    """A protobuf AnyValue as Python."""
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: value(kv.value) for kv in kvs}


class OtlpReceiver:
    """``with OtlpReceiver() as r: ... r.url ... r.received``."""

    def __init__(self) -> None:
        self.received = Received()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                with received.lock:
                    received.raw.append(body)
                    if self.path == "/v1/traces":
                        received.traces.append(ExportTraceServiceRequest.FromString(body))
                        answer = ExportTraceServiceResponse().SerializeToString()
                    elif self.path == "/v1/metrics":
                        received.metrics.append(ExportMetricsServiceRequest.FromString(body))
                        answer = ExportMetricsServiceResponse().SerializeToString()
                    else:
                        self.send_response(404)
                        self.end_headers()
                        return
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
