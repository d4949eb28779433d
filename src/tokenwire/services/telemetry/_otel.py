"""OpenTelemetry: the consumer's spans join the step's trace.

The gateway emits the model call's CLIENT span and the GenAI metrics (it is the provider's
client; ``tokenwire.services.gateway._observe.genai``). The consumer adds, per step, one
INTERNAL span parented on the trace context the gateway carried in the broker headers (so, on
the call's span): ``tokenwire.stream_started`` from the request to the first chunk, or
``tokenwire.call_failed`` (status ERROR, ``error.type``) when the first chunk is an error. The
attributes are those of the pinned conventions (``tokenwire.observability.conventions``) plus
tokenwire's ids; never any content.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from tokenwire.observability import conventions, parent_context
from tokenwire.schemas import ChunkEnvelope, StreamStarted

SEMCONV_SCHEMA_URL = conventions.SCHEMA_URL
STARTED_SPAN = "tokenwire.stream_started"
FAILED_SPAN = "tokenwire.call_failed"


class OtelSignals:
    """Records stream starts and failed calls as spans of the step's trace."""

    def __init__(self, tracer_provider: trace.TracerProvider) -> None:
        self._tracer = tracer_provider.get_tracer(
            "tokenwire.telemetry", schema_url=SEMCONV_SCHEMA_URL
        )

    def record(self, signal: StreamStarted) -> None:
        """One stream start: a span from the request to the first chunk."""
        attributes = _attributes(signal.provider, signal.model, signal.session)
        attributes |= {
            "tokenwire.turn": signal.turn,
            "tokenwire.step": signal.step,
            "tokenwire.first_block_type": signal.first_block_type or "none",
        }
        if signal.time_to_first_chunk_s is not None:
            attributes["gen_ai.response.time_to_first_chunk"] = signal.time_to_first_chunk_s
        parent = parent_context({"traceparent": signal.traceparent} if signal.traceparent else None)
        span = self._tracer.start_span(
            STARTED_SPAN,
            context=parent,
            kind=trace.SpanKind.INTERNAL,
            start_time=signal.request_time_ns or signal.first_chunk_time_ns,
            attributes=attributes,
        )
        span.add_event("gen_ai.first_chunk", timestamp=signal.first_chunk_time_ns)
        span.end(end_time=signal.first_chunk_time_ns)

    def record_failure(
        self, envelope: ChunkEnvelope, error_type: str, headers: dict[str, str]
    ) -> None:
        """One failed call (its first chunk is an error): an error span, no stream start."""
        attributes = _attributes(envelope.provider, envelope.model, envelope.session)
        attributes |= {
            "tokenwire.turn": envelope.turn,
            "tokenwire.step": envelope.step,
            "error.type": error_type,
        }
        span = self._tracer.start_span(
            FAILED_SPAN,
            context=parent_context(headers),
            kind=trace.SpanKind.INTERNAL,
            start_time=envelope.request_time_ns or envelope.time_ns,
            attributes=attributes,
        )
        span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end(end_time=envelope.time_ns)


def _attributes(provider: str, model: str, session: str) -> dict[str, AttributeValue]:
    return {
        "gen_ai.operation.name": conventions.OPERATION,
        "gen_ai.provider.name": conventions.genai_provider_name(provider),
        "gen_ai.request.model": model,
        "gen_ai.conversation.id": session,
        "tokenwire.session": session,
    }
