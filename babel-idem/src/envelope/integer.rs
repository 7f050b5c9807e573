//! The rule for the envelope's integer fields; stated on [`IntegerProblem`].

use std::fmt;

use serde_json::Number;

/// The largest value an integer field may hold: `u64::MAX`, the largest the
/// fields hold, so that every envelope this crate writes it also reads.
pub const MAX_INTEGER: u64 = u64::MAX;

/// Why a number in an integer field was refused.
///
/// The integer fields (`attempts`, `meta.schema_version`, `meta.created_at`,
/// `dead_letter.failed_at`, `dead_letter.attempts`) follow the BabelQueue
/// Python SDK (its typed check, `type(value) is int`) and the Go reference's
/// `int64` decode:
///
/// - an integer literal: no fraction part (`1.0` is refused) and no exponent
///   (`1e2` is refused, although it is a whole number);
/// - from 0 to [`MAX_INTEGER`]: `2^64` is out of range, and a negative value
///   breaks the contract (`attempts >= 0`). Python and Go stop at `i64::MAX`;
///   this crate reads up to `u64::MAX` because its fields are `u64` and it
///   reads back whatever it writes;
/// - `-0` is read as 0, as Python (`int("-0")`) and Go read it. Only the
///   byte decoders see that spelling: serde_json has already read `-0` as the
///   float `-0.0` in a [`Value`](serde_json::Value), so
///   [`Envelope::from_value`](crate::envelope::Envelope::from_value) refuses it as a
///   fraction.
///
/// ```
/// use babel_idem::EnvelopeError;
/// use babel_idem::envelope::IntegerProblem;
///
/// let bytes = br#"{"job": "urn:babel:orders:created", "trace_id": "t", "data": {},
///                  "meta": {"schema_version": 1}, "attempts": 1e2}"#;
/// let error = babel_idem::Envelope::from_slice(bytes).unwrap_err();
/// assert!(matches!(
///     error,
///     EnvelopeError::InvalidInteger { field: "attempts", problem: IntegerProblem::Exponent }
/// ));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IntegerProblem {
    /// Written with a fraction part, such as `2.5` or `1.0`.
    Fraction,
    /// Written in exponent form, such as `1e2`.
    Exponent,
    /// Below zero.
    Negative,
    /// Above [`MAX_INTEGER`], such as `2^64`.
    OutOfRange,
}

impl fmt::Display for IntegerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IntegerProblem::Fraction => "it has a fraction part",
            IntegerProblem::Exponent => "it is written in exponent form",
            IntegerProblem::Negative => "it is negative",
            IntegerProblem::OutOfRange => "it is out of range",
        })
    }
}

/// Reads `number` as an integer field's value. `literal` gives the number as
/// the source spelled it, when the source text is at hand: serde_json reads
/// `-0`, exponent forms and integers beyond 64 bits all as floats, and only
/// the spelling tells them apart. It is called for those floats only, so the
/// source is scanned only then.
pub(super) fn read<'a>(
    number: &Number,
    literal: impl FnOnce() -> Option<&'a str>,
) -> Result<u64, IntegerProblem> {
    // Every u64 is in range (`MAX_INTEGER`); anything larger is a float here.
    if let Some(value) = number.as_u64() {
        return Ok(value);
    }
    if number.is_i64() {
        return Err(IntegerProblem::Negative);
    }
    match literal() {
        Some(literal) => read_literal(literal),
        // Without the source, the float's own spelling (`-0.0`, `100.0`,
        // `1.8446744073709552e19`) is all there is: refused as what it shows.
        None => read_literal(&number.to_string()),
    }
}

fn read_literal(literal: &str) -> Result<u64, IntegerProblem> {
    // `1.5e3` is reported as what stands out most: its exponent.
    if literal.contains(['e', 'E']) {
        return Err(IntegerProblem::Exponent);
    }
    if literal.contains('.') {
        return Err(IntegerProblem::Fraction);
    }
    match literal.strip_prefix('-') {
        Some(digits) if digits.bytes().all(|digit| digit == b'0') => Ok(0),
        Some(_) => Err(IntegerProblem::Negative),
        None => Err(IntegerProblem::OutOfRange),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_text(text: &str) -> Result<u64, IntegerProblem> {
        let number: Number = serde_json::from_str(text).unwrap();
        read(&number, || Some(text))
    }

    #[test]
    fn integer_literals_in_range_are_read() {
        assert_eq!(read_text("0"), Ok(0));
        assert_eq!(read_text("-0"), Ok(0));
        assert_eq!(read_text("42"), Ok(42));
        assert_eq!(read_text("9223372036854775808"), Ok(1 << 63));
        assert_eq!(read_text("18446744073709551615"), Ok(MAX_INTEGER));
    }

    #[test]
    fn each_refusal_names_its_own_problem() {
        for (text, problem) in [
            ("1.0", IntegerProblem::Fraction),
            ("2.5", IntegerProblem::Fraction),
            ("-0.0", IntegerProblem::Fraction),
            ("1e2", IntegerProblem::Exponent),
            ("1E+2", IntegerProblem::Exponent),
            ("1.5e3", IntegerProblem::Exponent),
            ("-0e0", IntegerProblem::Exponent),
            ("-1", IntegerProblem::Negative),
            ("-18446744073709551617", IntegerProblem::Negative),
            ("18446744073709551616", IntegerProblem::OutOfRange),
            ("123456789012345678901234567890", IntegerProblem::OutOfRange),
        ] {
            assert_eq!(read_text(text), Err(problem), "{text}");
        }
    }

    #[test]
    fn without_the_source_a_float_is_refused_as_it_prints() {
        let negative_zero = Number::from_f64(-0.0).unwrap();
        assert_eq!(read(&negative_zero, || None), Err(IntegerProblem::Fraction));
        let big = Number::from_f64(1.8446744073709552e19).unwrap();
        assert_eq!(read(&big, || None), Err(IntegerProblem::Exponent));
    }
}
