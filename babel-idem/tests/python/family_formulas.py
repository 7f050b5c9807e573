"""The Python SDK's own functions behind two contract points, for the Rust
tests to compare against (one JSON document on stdout):

  retry-delay     stdin [{"n", "base", "multiplier", "maximum"}, ...]: the
                  seconds `babelqueue.app.retry_delay` answers for each
  trace-parent    stdin ["<trace_id>", ...]: `babelqueue.otel.trace_id_of` and
                  `_span_id_of` of each, as 32 and 16 hex digits

`babelqueue.otel` imports OpenTelemetry at module level, which the peer does
not install; the two functions asked for use only `hashlib`, so the
OpenTelemetry modules are stand-ins that name anything and do nothing.
"""

import json
import sys
import types


def stand_in_opentelemetry():
    """Registers inert `opentelemetry` modules, so `babelqueue.otel` imports."""

    class Anything:
        def __init__(self, *args, **kwargs):
            pass

    def module(name):
        made = types.ModuleType(name)
        made.__getattr__ = lambda attribute: Anything
        sys.modules.setdefault(name, made)

    for name in (
        "opentelemetry",
        "opentelemetry.context",
        "opentelemetry.trace",
        "opentelemetry.trace.propagation",
        "opentelemetry.trace.propagation.tracecontext",
    ):
        module(name)


def main():
    mode = sys.argv[1]
    requests = json.load(sys.stdin)
    if mode == "retry-delay":
        from babelqueue.app import retry_delay

        answer = [
            retry_delay(r["n"], r["base"], r["multiplier"], r["maximum"]) for r in requests
        ]
    elif mode == "trace-parent":
        stand_in_opentelemetry()
        from babelqueue.otel import _span_id_of, trace_id_of

        answer = [
            {
                "trace_id": format(trace_id_of(t), "032x"),
                "span_id": format(_span_id_of(t), "016x"),
            }
            for t in requests
        ]
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
