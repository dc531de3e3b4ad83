"""OpenTelemetry traces of the gateway (off unless an OTLP endpoint is set).

`Tracing` (tracing.py) owns the process's provider and the control plane's
spans; `TurnOpener` (the hot routes) and `TracingMiddleware` (the others)
open each API request's span; the serving code's span sites are the
functions of `_turn` re-exported here. See
docs/operations.md ("Traces") for the spans and their attributes.
"""

from gateway.telemetry._middleware import TracingMiddleware, TurnOpener
from gateway.telemetry._turn import (
    NO_JOB,
    JobTrace,
    NoJobTrace,
    end_span,
    job_trace,
    start_span,
    turn_finished,
    turn_started,
)
from gateway.telemetry.tracing import SwitchTrace, Tracing

__all__ = [
    "NO_JOB",
    "JobTrace",
    "NoJobTrace",
    "SwitchTrace",
    "Tracing",
    "TracingMiddleware",
    "TurnOpener",
    "end_span",
    "job_trace",
    "start_span",
    "turn_finished",
    "turn_started",
]
