//! The two ways every command writes an amount of time: a duration
//! (`30s`, `5m`, `2h`) and a point in time (RFC 3339 or Unix milliseconds,
//! UTC). One parser each, so a flag means the same in every command.

use std::time::Duration;

/// A duration as the CLI writes it: a whole number and a unit, `ms`, `s`,
/// `m`, `h` or `d` (`250ms`, `30s`, `5m`, `2h`, `7d`); a bare number is
/// seconds (`5` is `5s`).
///
/// ```
/// use std::time::Duration;
/// use babel_idem_cli::parse_duration;
///
/// assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
/// assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
/// assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
/// assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
/// assert!(parse_duration("5 minutes").unwrap_err().contains("30s, 5m, 2h"));
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let refused = || {
        format!(
            "{text:?} is not a duration: write a whole number and a unit \
             (ms, s, m, h, d), as in 30s, 5m, 2h; a bare number is seconds"
        )
    };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(refused());
    }
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| refused())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(refused()),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

/// [`parse_duration`], refusing zero: a wait that cannot last.
pub(crate) fn positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        Duration::ZERO => Err(format!("{text:?} is zero: give a duration above 0")),
        duration => Ok(duration),
    }
}

/// A point in time as the CLI writes it, in Unix milliseconds (UTC): either
/// Unix milliseconds themselves (`1796093299123`), or RFC 3339 with a
/// `Z` or a numeric offset (`2026-12-01T02:48:19Z`,
/// `2026-12-01T03:48:19.123+01:00`).
///
/// ```
/// use babel_idem_cli::parse_time;
///
/// assert_eq!(parse_time("1796093299123"), Ok(1_796_093_299_123));
/// assert_eq!(parse_time("2026-12-01T02:48:19.123Z"), Ok(1_796_093_299_123));
/// assert_eq!(parse_time("2026-12-01T03:48:19.123+01:00"), Ok(1_796_093_299_123));
/// assert!(parse_time("yesterday").unwrap_err().contains("RFC 3339"));
/// ```
pub fn parse_time(text: &str) -> Result<i64, String> {
    let refused = || {
        format!(
            "{text:?} is not a point in time: write RFC 3339 (2026-12-01T02:48:19Z, \
             with Z or an offset) or Unix milliseconds"
        )
    };
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map_err(|_| refused());
    }
    rfc3339_ms(text).ok_or_else(refused)
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`) as Unix ms.
fn rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = bytes.get(range)?;
        if part.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(part).ok()?.parse().ok()
        } else {
            None
        }
    };
    let separators = [(4, b'-'), (7, b'-'), (13, b':'), (16, b':')];
    if separators
        .iter()
        .any(|&(at, byte)| bytes.get(at) != Some(&byte))
        || !matches!(bytes.get(10), Some(b'T' | b't' | b' '))
    {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    let mut rest = &text[19..];
    let mut millis = 0;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let first_three = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = first_three.parse::<i64>().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let offset = rest.as_bytes();
            if offset.len() != 6 || offset[3] != b':' {
                return None;
            }
            let digits = |range: std::ops::Range<usize>| -> Option<i64> {
                let part = &rest[range];
                part.bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| part.parse().ok())?
            };
            let (hours, minutes) = (digits(1..3)?, digits(4..6)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            sign * (hours * 60 + minutes)
        }
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    // 60 seconds: a leap second, counted as the next second's start.
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1_000 + millis)
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::rfc3339_ms as format_ms;

    #[test]
    fn durations_take_a_unit_and_a_bare_number_is_seconds() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1"), Ok(Duration::from_secs(1)));
        for bad in [
            "",
            "s",
            "-5s",
            "1.5s",
            "5 s",
            "5sec",
            "5S",
            "99999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(positive_duration("0s").is_err());
        assert_eq!(positive_duration("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn times_round_trip_through_the_output_format() {
        for ms in [0, 951_782_400_001, 1_796_093_299_123, -1] {
            assert_eq!(parse_time(&format_ms(ms)), Ok(ms), "{ms}");
        }
        assert_eq!(parse_time("2000-02-29t00:00:00Z"), Ok(951_782_400_000));
        assert_eq!(parse_time("2000-02-29 00:00:00.5Z"), Ok(951_782_400_500));
        assert_eq!(parse_time("1970-01-01T00:00:00-00:30"), Ok(1_800_000));
        for bad in [
            "",
            "2026-12-01",
            "2026-12-01T02:48:19",
            "2026-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-01T24:00:00Z",
            "2026-12-01T02:48:19.Z",
            "2026-12-01T02:48:19+0100",
            "2026-12-01T02:48:19+25:00",
            "-5",
        ] {
            assert!(parse_time(bad).is_err(), "{bad:?}");
        }
    }
}
