//! The canonical UUID form every BabelQueue SDK mints, read into two words.

/// A canonical UUID as two words: the first 16 and the last 16 hex digits.
pub(super) type Uuid = [u64; 2];

/// Parses the canonical form only (36 bytes, lowercase hex, hyphens at
/// 8-13-18-23), so two ids are one key exactly when their strings are equal.
#[inline]
pub(super) fn parse(id: &str) -> Option<Uuid> {
    let id: &[u8; 36] = id.as_bytes().try_into().ok()?;
    if id[8] != b'-' || id[13] != b'-' || id[18] != b'-' || id[23] != b'-' {
        return None;
    }
    // Branch-free over the 32 digits: a bad one only sets the high bit.
    let mut words = [0u64; 2];
    let mut bad = 0u8;
    let mut digit = 0;
    for group in [0..8, 9..13, 14..18, 19..23, 24..36] {
        for &byte in &id[group] {
            let value = HEX[byte as usize];
            bad |= value;
            let word = &mut words[digit / 16];
            *word = (*word << 4) | u64::from(value & 0x0f);
            digit += 1;
        }
    }
    (bad & INVALID == 0).then_some(words)
}

const INVALID: u8 = 0x80;

/// Lowercase hex digit values; every other byte maps to [`INVALID`].
static HEX: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut n = 0;
    while n < 10 {
        table[b'0' as usize + n] = n as u8;
        n += 1;
    }
    let mut n = 0;
    while n < 6 {
        table[b'a' as usize + n] = 10 + n as u8;
        n += 1;
    }
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_canonical_form_digit_for_digit() {
        assert_eq!(
            parse("f1e2d3c4-b5a6-4789-90ab-cdef01234567"),
            Some([0xf1e2_d3c4_b5a6_4789, 0x90ab_cdef_0123_4567])
        );
        assert_eq!(parse("00000000-0000-0000-0000-000000000000"), Some([0, 0]));
    }

    #[test]
    fn refuses_every_other_spelling() {
        for other in [
            "F1E2D3C4-B5A6-4789-90AB-CDEF01234567",
            "f1e2d3c4-b5a6-4789-90ab-cdef0123456A",
            "f1e2d3c4b5a6478990abcdef01234567",
            "{f1e2d3c4-b5a6-4789-90ab-cdef01234567}",
            "f1e2d3c4-b5a6-4789-90ab-cdef0123456g",
            "f1e2d3c4-b5a6-4789-90ab_cdef01234567",
            "f1e2d3c4-b5a6-4789-90ab-cdef012345é",
            "",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
