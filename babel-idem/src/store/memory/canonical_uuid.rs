//! The canonical UUID form every BabelQueue SDK mints, read into two words.

/// A canonical UUID as two words: the first 16 and the last 16 hex digits.
pub(super) type Uuid = [u64; 2];

/// Parses the canonical form only (36 bytes, lowercase hex, hyphens at
/// 8-13-18-23), so two ids are one key exactly when their strings are equal.
///
/// Eight digits at a time in one `u64` (SWAR): this runs on every delivery.
#[inline(always)]
pub(super) fn parse(id: &str) -> Option<Uuid> {
    let id: &[u8; 36] = id.as_bytes().try_into().ok()?;
    if id[8] != b'-' || id[13] != b'-' || id[18] != b'-' || id[23] != b'-' {
        return None;
    }
    let group = |at: usize| {
        u64::from(u32::from_le_bytes([
            id[at],
            id[at + 1],
            id[at + 2],
            id[at + 3],
        ]))
    };
    let first = group(0) | group(4) << 32;
    let second = group(9) | group(14) << 32;
    let third = group(19) | group(24) << 32;
    let fourth = group(28) | group(32) << 32;
    Some([
        u64::from(eight_digits(first)?) << 32 | u64::from(eight_digits(second)?),
        u64::from(eight_digits(third)?) << 32 | u64::from(eight_digits(fourth)?),
    ])
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The value of eight lowercase hex digits, the first in the lowest byte;
/// `None` if any byte is not one.
#[inline(always)]
fn eight_digits(bytes: u64) -> Option<u32> {
    if bytes & HIGH_BITS != 0 {
        return None;
    }
    // With every byte below 0x80, adding `0x80 - n` to each byte sets its high
    // bit exactly when the byte is at least `n`, without carrying into the next.
    let at_least = |n: u64| bytes.wrapping_add(ONES * (0x80 - n)) & HIGH_BITS;
    let digit = at_least(b'0' as u64) & !at_least(b'9' as u64 + 1);
    let letter = at_least(b'a' as u64) & !at_least(b'f' as u64 + 1);
    if digit | letter != HIGH_BITS {
        return None;
    }
    // '0'..'9' keep their low nibble; 'a'..'f' (0x61..) add 9 to theirs.
    let values = (bytes & (ONES * 0x0f)) + ((bytes >> 6) & ONES) * 9;
    // Gather the eight nibbles, first digit most significant.
    let values = values.swap_bytes();
    let values = (values | values >> 4) & 0x00ff_00ff_00ff_00ff;
    let values = (values | values >> 8) & 0x0000_ffff_0000_ffff;
    Some((values | values >> 16) as u32)
}

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
    fn agrees_with_a_plain_reading_on_every_byte_in_every_position() {
        let canonical = "f1e2d3c4-b5a6-4789-90ab-cdef01234567";
        for position in 0..36 {
            for byte in 0..=255u8 {
                let mut bytes = canonical.as_bytes().to_vec();
                bytes[position] = byte;
                let Ok(id) = std::str::from_utf8(&bytes) else {
                    continue;
                };
                let expected = uuid::Uuid::try_parse(id)
                    .ok()
                    .filter(|uuid| uuid.hyphenated().to_string() == id)
                    .map(|uuid| {
                        let value = uuid.as_u128();
                        [(value >> 64) as u64, value as u64]
                    });
                assert_eq!(parse(id), expected, "{id:?}");
            }
        }
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
