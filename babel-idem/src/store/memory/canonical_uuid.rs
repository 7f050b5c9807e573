//! The canonical UUID form every BabelQueue SDK mints, read into two words.
//!
//! `InMemoryStore` keeps such an id as these two words in its lock-free
//! table. Two readers give one [layout](parse): 16 bytes at a time with
//! SSE2 on x86-64 (through `safe_arch`, whose wrappers are safe where the
//! CPU feature is enabled at compile time, as SSE2 always is there; this
//! crate forbids `unsafe`), eight at a time in a `u64` (SWAR) elsewhere.
//! The tests hold the two to the same answer.

/// A canonical UUID as two words holding its 32 hex digits, one nibble
/// each. The digits are not in reading order (see [`parse`]): the table only
/// needs one value per UUID, and the order that is cheapest to build.
pub(crate) type Uuid = [u64; 2];

/// Parses the canonical form only (36 bytes, lowercase hex, hyphens at
/// 8-13-18-23), so two ids are one key exactly when their strings are equal.
///
/// The layout: byte `k` of the two words (`k` < 8 in the first) holds the
/// digits of text bytes `2k` (low nibble) and `2k + 1` (high nibble), and
/// the four nibbles that fall on a hyphen hold the last four digits, of
/// bytes 32 to 35 (see `tests::place`, the same layout digit by digit).
#[inline(always)]
pub(crate) fn parse(id: &str) -> Option<Uuid> {
    read(id.as_bytes().try_into().ok()?)
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
use sse2::parse as read;
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
use swar::parse as read;

/// Puts the last four digits (one per byte of `tail`, as [`nibbles`] gives
/// them) in the nibbles where the hyphens were, which both readers leave 0.
#[inline(always)]
fn with_last_four(words: Uuid, tail: u64) -> Uuid {
    // One multiply per word copies two digits to where they go (hyphens at
    // bytes 8 and 13: the low nibble of byte 4, the high of byte 6; at 18
    // and 23: the low nibble of byte 1, the high of byte 3), and two copies
    // elsewhere that the mask drops; no copy overlaps another, so nothing
    // carries.
    let first = (tail & 0x0f0f).wrapping_mul(1 << 32 | 1 << 44) & (0xf << 32 | 0xf << 52);
    let second = (tail >> 16 & 0x0f0f).wrapping_mul(1 << 8 | 1 << 20) & (0xf << 8 | 0xf << 28);
    [words[0] | first, words[1] | second]
}

/// Bytes 32 to 35 as the low half of a word whose high half reads as `0`
/// digits, so that [`lowercase_hex`] checks them.
#[inline(always)]
fn last_four(id: &[u8; 36]) -> u64 {
    u64::from(u32::from_le_bytes([id[32], id[33], id[34], id[35]])) | 0x3030_3030 << 32
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
mod sse2 {
    use safe_arch::{
        bitand_m128i, bitandnot_m128i, bitor_m128i, cmp_eq_mask_i8_m128i, get_i64_from_m128i_s,
        load_unaligned_m128i, m128i, move_mask_i8_m128i, pack_i16_to_u8_m128i, set_i32_m128i_s,
        set_splat_i8_m128i, set_splat_i16_m128i, shr_imm_u16_m128i, sub_i8_m128i,
        sub_saturating_u8_m128i, unpack_high_i64_m128i, zeroed_m128i,
    };

    use super::{Uuid, with_last_four};

    /// What each lane of a 16-byte piece must hold: lowercase hex, or the
    /// hyphen where `hyphens` has `0xff` (bytes 8 and 13 of the first
    /// piece; 18 and 23, lanes 2 and 7, of the second), or a zero byte
    /// where `lowest` and `span` are 0 (past byte 36, in the last piece).
    struct Lanes {
        /// `0xff` on a hyphen's lane.
        hyphens: [u8; 16],
        /// The lowest byte a lane takes as a digit: `'0'`, or `'-'` on a hyphen's lane.
        lowest: [u8; 16],
        /// How far above `lowest` a digit may be: 9, or 0 on a hyphen's lane.
        span: [u8; 16],
    }

    impl Lanes {
        const fn new(hyphens: &[usize]) -> Self {
            let mut lanes = Lanes {
                hyphens: [0; 16],
                lowest: [b'0'; 16],
                span: [9; 16],
            };
            let mut next = 0;
            while next < hyphens.len() {
                let lane = hyphens[next];
                (lanes.hyphens[lane], lanes.lowest[lane], lanes.span[lane]) = (0xff, b'-', 0);
                next += 1;
            }
            lanes
        }
    }

    const FIRST: Lanes = Lanes::new(&[8, 13]);
    const SECOND: Lanes = Lanes::new(&[2, 7]);
    /// Bytes 32 to 36, then zeros.
    const LAST: Lanes = {
        let mut lanes = Lanes::new(&[]);
        let mut lane = 4;
        while lane < 16 {
            (lanes.lowest[lane], lanes.span[lane]) = (0, 0);
            lane += 1;
        }
        lanes
    };

    /// Each load lies within one piece of the id as a key copies it (16
    /// bytes at 0, 16 bytes at 16, 4 bytes at 32), so none waits for two
    /// earlier stores to reach the cache.
    #[inline(always)]
    pub(super) fn parse(id: &[u8; 36]) -> Option<Uuid> {
        let (head, rest) = id.split_first_chunk::<16>()?;
        let (middle, _) = rest.split_first_chunk::<16>()?;
        let (_, tail) = id.split_last_chunk::<4>()?;
        read(
            load_unaligned_m128i(head),
            load_unaligned_m128i(middle),
            set_i32_m128i_s(i32::from_le_bytes(*tail)),
        )
    }

    /// The id's three 16-byte pieces (the last holding bytes 32 to 36 and
    /// zeros), in registers. The last four digits are checked and valued in
    /// the same vector pass as the rest.
    #[inline(always)]
    fn read(head: m128i, middle: m128i, last: m128i) -> Option<Uuid> {
        let (head_ok, head) = digits(head, &FIRST);
        let (middle_ok, middle) = digits(middle, &SECOND);
        let (last_ok, last) = digits(last, &LAST);
        let ok = bitand_m128i(bitand_m128i(head_ok, middle_ok), last_ok);
        if move_mask_i8_m128i(ok) != 0xffff {
            return None;
        }
        let packed = pack_i16_to_u8_m128i(pairs(head), pairs(middle));
        let high = get_i64_from_m128i_s(packed) as u64;
        let low = get_i64_from_m128i_s(unpack_high_i64_m128i(packed, packed)) as u64;
        Some(with_last_four(
            [high, low],
            get_i64_from_m128i_s(last) as u64,
        ))
    }

    /// For sixteen bytes: which are what `lanes` says they must be, all
    /// ones per byte; and each byte's digit value, a hyphen's 0.
    ///
    /// A hyphen's lane is read as a digit whose only value is the hyphen,
    /// as 0, so one range check covers both kinds of lane.
    #[inline(always)]
    fn digits(bytes: m128i, lanes: &Lanes) -> (m128i, m128i) {
        // `x - lowest <= span`, unsigned: a byte below `lowest` wraps high.
        let within = |from_lowest: m128i, span: m128i| {
            cmp_eq_mask_i8_m128i(sub_saturating_u8_m128i(from_lowest, span), zeroed_m128i())
        };
        let from_zero = sub_i8_m128i(bytes, m128i::from(lanes.lowest));
        let digit = within(from_zero, m128i::from(lanes.span));
        let from_a = sub_i8_m128i(bytes, set_splat_i8_m128i(b'a' as i8));
        let letter = bitandnot_m128i(
            m128i::from(lanes.hyphens),
            within(from_a, set_splat_i8_m128i(5)),
        );
        // A letter's value is its distance from '0' less the 39 bytes
        // between '9' + 1 and 'a'.
        let values = sub_i8_m128i(
            from_zero,
            bitand_m128i(letter, set_splat_i8_m128i((b'a' - b'0' - 10) as i8)),
        );
        (bitor_m128i(digit, letter), values)
    }

    /// Each pair of bytes' two digits in its 16-bit lane's low byte.
    #[inline(always)]
    fn pairs(values: m128i) -> m128i {
        let pairs = bitor_m128i(values, shr_imm_u16_m128i::<4>(values));
        bitand_m128i(pairs, set_splat_i16_m128i(0x00ff))
    }
}

#[cfg_attr(
    all(target_arch = "x86_64", target_feature = "sse2", not(test)),
    allow(dead_code, reason = "the SSE2 reader runs here; tests compare the two")
)]
mod swar {
    use super::{Uuid, last_four, lowercase_hex, nibbles, with_last_four};

    /// The hyphens among bytes 8..16 (at 8 and 13) and 16..24 (at 18 and 23).
    const HYPHENS_8: u64 = 0x0000_ff00_0000_00ff;
    const HYPHENS_16: u64 = 0xff00_0000_00ff_0000;

    /// One branch for all the checks.
    #[inline(always)]
    pub(super) fn parse(id: &[u8; 36]) -> Option<Uuid> {
        let word = |at: usize| {
            u64::from_le_bytes([
                id[at],
                id[at + 1],
                id[at + 2],
                id[at + 3],
                id[at + 4],
                id[at + 5],
                id[at + 6],
                id[at + 7],
            ])
        };
        let (first, second, third, fourth) = (word(0), word(8), word(16), word(24));
        let hyphens = (second & HYPHENS_8 == HYPHENS_8 / 0xff * u64::from(b'-'))
            & (third & HYPHENS_16 == HYPHENS_16 / 0xff * u64::from(b'-'));
        // Hyphens, once checked, read as `0` digits, so one check covers
        // every byte of all five words and the hyphens' nibbles stay 0.
        let zeros =
            |word: u64, hyphens: u64| (word & !hyphens) | (hyphens / 0xff * u64::from(b'0'));
        let (second, third) = (zeros(second, HYPHENS_8), zeros(third, HYPHENS_16));
        let tail = last_four(id);
        // `&`, not `&&`: the checks without a branch between them.
        if !(hyphens
            & lowercase_hex(first)
            & lowercase_hex(second)
            & lowercase_hex(third)
            & lowercase_hex(fourth)
            & lowercase_hex(tail))
        {
            return None;
        }
        let half = |lower: u64, upper: u64| pairs(nibbles(lower)) | pairs(nibbles(upper)) << 32;
        Some(with_last_four(
            [half(first, second), half(third, fourth)],
            nibbles(tail),
        ))
    }

    /// Eight digits, one per byte, as four bytes: byte `k` holds digits `2k`
    /// (low nibble) and `2k + 1`.
    #[inline(always)]
    fn pairs(digits: u64) -> u64 {
        let even = (digits | digits >> 4) & 0x00ff_00ff_00ff_00ff;
        let quads = (even | even >> 8) & 0x0000_ffff_0000_ffff;
        (quads | quads >> 16) & 0xffff_ffff
    }
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

/// The seeded hash of a UUID: one multiply of its two words, each mixed with
/// a per-store seed, folded (the construction foldhash uses), cheaper than
/// hashing the words as a byte slice.
#[inline(always)]
pub(crate) fn hash(uuid: Uuid, seeds: [u64; 2]) -> u64 {
    let full = u128::from(uuid[0] ^ seeds[0]) * u128::from(uuid[1] ^ seeds[1]);
    (full as u64) ^ (full >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout `parse` builds, digit by digit from a UUID's value: the
    /// digit at text position `p` goes to the nibble this gives (word, byte,
    /// high nibble or low).
    fn place(p: usize) -> (usize, usize, bool) {
        match p {
            8 | 13 | 18 | 23 => unreachable!("position {p} holds a hyphen"),
            0..32 => (p / 16, p % 16 / 2, p % 2 == 1),
            // The four nibbles of the hyphens, in the order of the hyphens.
            32 => (0, 4, false),
            33 => (0, 6, true),
            34 => (1, 1, false),
            35 => (1, 3, true),
            _ => unreachable!("position {p} is past the end"),
        }
    }

    /// What each reader makes of `id`: [`parse`], and each reader it can
    /// take (the SWAR one everywhere, the SSE2 one where it runs).
    fn readings(id: &str) -> Vec<(&'static str, Option<Uuid>)> {
        let mut readings = vec![("parse", parse(id))];
        if let Ok(bytes) = <&[u8; 36]>::try_from(id.as_bytes()) {
            readings.push(("swar", swar::parse(bytes)));
            #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
            readings.push(("sse2", sse2::parse(bytes)));
        }
        readings
    }

    fn packed(value: u128) -> Uuid {
        let mut words = [0u64; 2];
        for k in 0..32 {
            let digit = (value >> (4 * (31 - k))) as u64 & 0xf;
            // The digit's position in the text: one more for each hyphen before it.
            let p = k + [8, 12, 16, 20].iter().filter(|&&at| k >= at).count();
            let (word, byte, high) = place(p);
            words[word] |= digit << (8 * byte + if high { 4 } else { 0 });
        }
        words
    }

    #[test]
    fn every_digit_has_a_nibble_of_its_own() {
        let mut taken = std::collections::HashSet::new();
        for p in (0..36).filter(|p| ![8, 13, 18, 23].contains(p)) {
            assert!(taken.insert(place(p)), "position {p}");
        }
        assert_eq!(taken.len(), 32);
    }

    #[test]
    fn reads_every_digit_into_its_place() {
        for (id, expected) in [
            (
                "f1e2d3c4-b5a6-4789-90ab-cdef01234567",
                packed(0xf1e2_d3c4_b5a6_4789_90ab_cdef_0123_4567),
            ),
            ("00000000-0000-0000-0000-000000000000", [0, 0]),
            ("ffffffff-ffff-ffff-ffff-ffffffffffff", [u64::MAX, u64::MAX]),
        ] {
            for (reader, reading) in readings(id) {
                assert_eq!(reading, Some(expected), "{reader}: {id}");
            }
        }
    }

    #[test]
    fn agrees_with_a_plain_reading_on_every_byte_in_every_position() {
        let canonical = "f1e2d3c4-b5a6-4789-90ab-cdef01234567";
        let mut read = 0;
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
                read += usize::from(expected.is_some());
                for (reader, reading) in readings(id) {
                    assert_eq!(reading, expected, "{reader}: {id:?}");
                }
            }
        }
        // 16 digits in each of 32 positions, one hyphen in each of 4.
        assert_eq!(read, 32 * 16 + 4);
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
            "f1e2d3c4-b5a6-4789-90ab-cdef01234/67",
            "f1e2d3c4-b5a6-4789-90ab-cdef01234:67",
            "",
        ] {
            for (reader, reading) in readings(other) {
                assert_eq!(reading, None, "{reader}: {other}");
            }
        }
    }

    #[test]
    fn the_readers_agree_on_random_uuids() {
        for _ in 0..10_000 {
            let id = uuid::Uuid::new_v4().hyphenated().to_string();
            let readings = readings(&id);
            assert!(
                readings
                    .iter()
                    .all(|(_, reading)| reading == &readings[0].1),
                "{id}: {readings:?}"
            );
            assert!(readings[0].1.is_some(), "{id}");
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
