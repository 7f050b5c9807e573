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
/// case-insensitively, the first value of a repeated header winning). With
/// no valid `traceparent`, makes it the child of the remote parent the
/// family derives from the envelope's `trace_id` ([`trace_parent`]), so
/// every hop of one `trace_id` shares one trace; an empty `trace_id` or a
/// subscriber without the OpenTelemetry layer leaves the span as it was.
#[cfg(feature = "opentelemetry")]
pub(super) fn continue_trace<'h, H>(span: &Span, headers: impl Fn() -> H, trace_id: &str)
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

    if span.is_disabled() {
        return;
    }
    let headers = Headers(headers, std::marker::PhantomData);
    let producer = headers.get("traceparent").and_then(|_| {
        let producer = TraceContextPropagator::new()
            .extract_with_context(&opentelemetry::Context::new(), &headers);
        producer
            .span()
            .span_context()
            .is_valid()
            .then_some(producer)
    });
    let parent = match producer {
        Some(producer) => producer,
        None if trace_id.is_empty() => return,
        None => opentelemetry::Context::new().with_remote_span_context(trace_parent(trace_id)),
    };
    // Err only when the subscriber has no OpenTelemetry layer: nothing to continue.
    let _ = span.set_parent(parent);
}

/// The remote parent the family derives from an envelope's `trace_id` when
/// no `traceparent` travelled (the Python SDK's `otel._parent_context`):
/// trace id [`trace_id_of`], span id [`span_id_of`], sampled.
#[cfg(feature = "opentelemetry")]
pub(crate) fn trace_parent(trace_id: &str) -> opentelemetry::trace::SpanContext {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

    SpanContext::new(
        TraceId::from(trace_id_of(trace_id)),
        SpanId::from(span_id_of(trace_id)),
        TraceFlags::SAMPLED,
        true,
        TraceState::NONE,
    )
}

/// The 128-bit trace id of an envelope's `trace_id`, as the Python SDK's
/// `otel.trace_id_of` maps it: a UUID (32 hex digits once its `-` are
/// removed) is its own value, any other text (and the nil UUID) the first
/// 16 bytes of its SHA-256, big-endian; never zero (an invalid trace id).
#[cfg(feature = "opentelemetry")]
pub(crate) fn trace_id_of(trace_id: &str) -> u128 {
    if let Some(value) = uuid_value(trace_id).filter(|value| *value != 0) {
        return value;
    }
    let digest = sha256(&[trace_id.as_bytes()]);
    let first: [u8; 16] = digest[..16].try_into().unwrap_or_default();
    match u128::from_be_bytes(first) {
        0 => 1,
        value => value,
    }
}

/// The 64-bit span id of the remote parent derived from `trace_id`, as the
/// Python SDK's `otel._span_id_of`: the first 8 bytes of the SHA-256 of
/// `babelqueue-span:` + `trace_id`, big-endian; never zero.
#[cfg(feature = "opentelemetry")]
pub(crate) fn span_id_of(trace_id: &str) -> u64 {
    let digest = sha256(&[b"babelqueue-span:", trace_id.as_bytes()]);
    let first: [u8; 8] = digest[..8].try_into().unwrap_or_default();
    match u64::from_be_bytes(first) {
        0 => 1,
        value => value,
    }
}

#[cfg(feature = "opentelemetry")]
fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

/// `trace_id` read as the Python SDK's `_uuid_bytes` reads it: without its
/// `-`, exactly 32 characters, which `bytes.fromhex` accepts (hex digit
/// pairs, ASCII whitespace allowed before each pair); the bytes as a
/// big-endian number. `None` when it is not one.
#[cfg(feature = "opentelemetry")]
fn uuid_value(trace_id: &str) -> Option<u128> {
    let digits: Vec<char> = trace_id.chars().filter(|c| *c != '-').collect();
    if digits.len() != 32 {
        return None;
    }
    // Python's `isspace` on ASCII: space, \t, \n, \x0b, \x0c, \r.
    let space = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r');
    let mut value: u128 = 0;
    let mut chars = digits.into_iter().peekable();
    loop {
        while chars.next_if(|c| space(*c)).is_some() {}
        let Some(high) = chars.next() else {
            return Some(value);
        };
        let high = high.to_digit(16)?;
        let low = chars.next()?.to_digit(16)?;
        // At most 16 pairs fit in 32 characters: no shift overflows.
        value = (value << 8) | u128::from(high * 16 + low);
    }
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_trace_id_is_its_own_value_and_other_text_is_hashed() {
        let uuid = "4bf92f35-77b3-4da6-a3ce-929d0e0e4736";
        assert_eq!(trace_id_of(uuid), 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(
            trace_id_of("4BF92F3577B34DA6A3CE929D0E0E4736"),
            0x4bf92f3577b34da6a3ce929d0e0e4736
        );
        // SHA-256("abc") begins ba7816bf 8f01cfea 414140de 5dae2223.
        assert_eq!(trace_id_of("abc"), 0xba7816bf8f01cfea414140de5dae2223);
        let nil = "00000000-0000-0000-0000-000000000000";
        assert_ne!(trace_id_of(nil), 0, "the nil UUID is hashed");
        assert_ne!(span_id_of(uuid), 0);
        assert_ne!(span_id_of(uuid), span_id_of("abc"));
    }

    #[test]
    fn hex_pairs_may_be_preceded_by_whitespace_as_python_reads_them() {
        // 30 digits + 2 spaces: 15 bytes.
        let spaced = " 0102030405060708090a0b0c0d0e0f ";
        assert_eq!(uuid_value(spaced), Some(0x0102030405060708090a0b0c0d0e0f));
        assert_eq!(uuid_value("0 102030405060708090a0b0c0d0e0f0"), None);
        assert_eq!(uuid_value("not-a-uuid"), None);
        assert_eq!(uuid_value("é1e2d3c4b5a6478990abcdef01234567"), None);
    }
}
