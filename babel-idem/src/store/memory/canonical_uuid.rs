//! The canonical UUID form every BabelQueue SDK mints, read into two words.

/// A canonical UUID as two words holding its 32 hex digits, one nibble
/// each. The digits are not in reading order (see [`parse`]): the table only
/// needs one value per UUID, and the order that is cheapest to build.
pub(super) type Uuid = [u64; 2];

/// Parses the canonical form only (36 bytes, lowercase hex, hyphens at
/// 8-13-18-23), so two ids are one key exactly when their strings are equal.
///
/// Eight digits at a time in one `u64` (SWAR), with one branch for the
/// digits of all four words: this runs on every delivery. Digits `2i` and
/// `2i + 1` of each group of eight share a byte, and the bytes of two groups
/// interleave (see `tests::packed`, the same layout digit by digit).
#[inline(always)]
pub(super) fn parse(id: &str) -> Option<Uuid> {
    let id: &[u8; 36] = id.as_bytes().try_into().ok()?;
    if id[8] != b'-' || id[13] != b'-' || id[18] != b'-' || id[23] != b'-' {
        return None;
    }
    let four = |at: usize| {
        u64::from(u32::from_le_bytes([
            id[at],
            id[at + 1],
            id[at + 2],
            id[at + 3],
        ]))
    };
    let eight = |at: usize| four(at) | four(at + 4) << 32;
    let (a, b) = (eight(0), four(9) | four(14) << 32);
    let (c, d) = (four(19) | four(24) << 32, eight(28));
    // `&`, not `&&`: four checks without a branch between them.
    if !(lowercase_hex(a) & lowercase_hex(b) & lowercase_hex(c) & lowercase_hex(d)) {
        return None;
    }
    let packed = |word| pack(nibbles(word));
    Some([packed(a) | packed(b) << 8, packed(c) | packed(d) << 8])
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// Whether all eight bytes are `0-9` or `a-f`.
#[inline(always)]
fn lowercase_hex(bytes: u64) -> bool {
    // With every byte below 0x80, adding `0x80 - n` to each byte sets its high
    // bit exactly when the byte is at least `n`, without carrying into the next.
    let at_least = |n: u8| bytes.wrapping_add(ONES * u64::from(0x80 - n));
    let digit = at_least(b'0') & !at_least(b'9' + 1);
    let letter = at_least(b'a') & !at_least(b'f' + 1);
    (bytes & HIGH_BITS == 0) & ((digit | letter) & HIGH_BITS == HIGH_BITS)
}

/// The value of each of eight hex digits, in its own byte.
#[inline(always)]
fn nibbles(bytes: u64) -> u64 {
    // '0'..'9' keep their low nibble; 'a'..'f' (0x61..) add 9 to theirs.
    (bytes & (ONES * 0x0f)) + ((bytes >> 6) & ONES) * 9
}

/// Two neighbouring nibbles into the even byte of their pair; odd bytes zero.
#[inline(always)]
fn pack(values: u64) -> u64 {
    (values | values >> 4) & 0x00ff_00ff_00ff_00ff
}

/// The seeded hash of a UUID: one multiply of its two words, each mixed with
/// a per-store seed, folded (the construction foldhash uses), cheaper than
/// hashing the words as a byte slice.
#[inline(always)]
pub(super) fn hash(uuid: Uuid, seeds: [u64; 2]) -> u64 {
    let full = u128::from(uuid[0] ^ seeds[0]) * u128::from(uuid[1] ^ seeds[1]);
    (full as u64) ^ (full >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout `parse` builds, digit by digit from a UUID's value: digit
    /// `k` (0 = first) of each half goes to byte `k % 8 / 2 * 2 + k / 8`,
    /// low nibble for an even `k`.
    fn packed(value: u128) -> Uuid {
        let mut words = [0u64; 2];
        for k in 0..32 {
            let digit = (value >> (4 * (31 - k))) as u64 & 0xf;
            let (word, k) = (k / 16, k % 16);
            let byte = k % 8 / 2 * 2 + k / 8;
            words[word] |= digit << (8 * byte + 4 * (k % 2));
        }
        words
    }

    #[test]
    fn reads_every_digit_into_its_place() {
        assert_eq!(
            parse("f1e2d3c4-b5a6-4789-90ab-cdef01234567"),
            Some(packed(0xf1e2_d3c4_b5a6_4789_90ab_cdef_0123_4567))
        );
        assert_eq!(parse("00000000-0000-0000-0000-000000000000"), Some([0, 0]));
        assert_eq!(
            parse("ffffffff-ffff-ffff-ffff-ffffffffffff"),
            Some([u64::MAX, u64::MAX])
        );
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
                    .map(|uuid| packed(uuid.as_u128()));
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

    #[test]
    fn the_hash_depends_on_both_words_and_the_seeds() {
        let seeds = [0x1234_5678_9abc_def1, 0x0fed_cba9_8765_4321];
        let uuid = [0xf1e2_d3c4_b5a6_4789, 0x90ab_cdef_0123_4567];
        let base = hash(uuid, seeds);
        assert_ne!(base, hash([uuid[0] ^ 1, uuid[1]], seeds));
        assert_ne!(base, hash([uuid[0], uuid[1] ^ 1], seeds));
        assert_ne!(base, hash(uuid, [seeds[0], seeds[1] ^ 1]));
    }
}
