//! The W3C trace context carrier: a message's `traceparent` (and
//! `tracestate`) transport headers, written from a producer span and read
//! into a consumer span (feature `opentelemetry`; without it no span has a
//! W3C context to carry).

use tracing::Span;

/// The W3C `traceparent` (and `tracestate`, when there is one) naming
/// `span`, as transport headers; none when the span has no OpenTelemetry
/// context (disabled, or a subscriber without the OpenTelemetry layer, or
/// the feature `opentelemetry` off).
#[cfg_attr(
    not(any(
        feature = "redis-transport",
        feature = "amqp-transport",
        feature = "sqlite",
        feature = "postgres"
    )),
    allow(dead_code, reason = "only a producer carries a trace context")
)]
pub(crate) fn trace_headers(span: &Span) -> Vec<(String, String)> {
    #[cfg(feature = "opentelemetry")]
    {
        use opentelemetry::propagation::{Injector, TextMapPropagator};
        use opentelemetry::trace::TraceContextExt;
        use opentelemetry_sdk::propagation::TraceContextPropagator;
        use tracing_opentelemetry::OpenTelemetrySpanExt;

        struct Headers(Vec<(String, String)>);

        impl Injector for Headers {
            fn set(&mut self, key: &str, value: String) {
                if !value.is_empty() {
                    self.0.push((key.to_owned(), value));
                }
            }
        }

        if span.is_disabled() {
            return Vec::new();
        }
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return Vec::new();
        }
        let mut headers = Headers(Vec::new());
        TraceContextPropagator::new().inject_context(&context, &mut headers);
        headers.0
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let _ = span;
        Vec::new()
    }
}

/// Makes `span` a child of the producer's span named by the W3C
/// `traceparent` header among `headers` (names compared ASCII
/// case-insensitively, the first value of a repeated header winning). A
/// missing or malformed header, or a subscriber without the OpenTelemetry
/// layer, leaves the span as it was.
#[cfg(feature = "opentelemetry")]
pub(super) fn continue_trace<'h, H>(span: &Span, headers: impl Fn() -> H)
where
    H: Iterator<Item = (&'h str, &'h str)>,
{
    use opentelemetry::propagation::{Extractor, TextMapPropagator};
    use opentelemetry::trace::TraceContextExt;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    /// The headers `F` lists, which live for `'h`.
    struct Headers<'h, F>(F, std::marker::PhantomData<&'h str>);

    impl<'h, F, H> Extractor for Headers<'h, F>
    where
        F: Fn() -> H,
        H: Iterator<Item = (&'h str, &'h str)>,
    {
        fn get(&self, key: &str) -> Option<&str> {
            (self.0)()
                .find(|(name, _)| name.eq_ignore_ascii_case(key))
                .map(|(_, value)| value)
        }
        fn keys(&self) -> Vec<&str> {
            (self.0)().map(|(name, _)| name).collect()
        }
    }

    let headers = Headers(headers, std::marker::PhantomData);
    if span.is_disabled() || headers.get("traceparent").is_none() {
        return;
    }
    let producer = TraceContextPropagator::new()
        .extract_with_context(&opentelemetry::Context::new(), &headers);
    if producer.span().span_context().is_valid() {
        // Err only when the subscriber has no OpenTelemetry layer: nothing to continue.
        let _ = span.set_parent(producer);
    }
}
