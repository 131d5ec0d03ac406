//! Kubernetes-style duration strings (`100ms`, `3s`, `15m`, `1h30m`).
//!
//! The CRDs carry durations as strings so that `kubectl` users write what they
//! write everywhere else in Kubernetes. The API server validates their syntax
//! with [`DURATION_PATTERN`] (a CEL rule with a readable message); the binaries
//! parse them with [`parse_duration`].

use std::time::Duration;

/// A regular expression (RE2 syntax, used inside CEL rules) that accepts the
/// duration strings havip understands: one or more `<number><unit>` groups with
/// units `ms`, `s`, `m` or `h`, e.g. `100ms`, `1.5s`, `1h30m`.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string was empty.
    #[error("failed to parse duration: empty string (expected e.g. 100ms, 3s, 15m)")]
    Empty,
    /// A group had no number before its unit.
    #[error("failed to parse duration {input:?}: expected a number before the unit")]
    MissingNumber {
        /// The whole input.
        input: String,
    },
    /// A number had no unit after it, or the unit was unknown.
    #[error("failed to parse duration {input:?}: unknown or missing unit (use ms, s, m or h)")]
    BadUnit {
        /// The whole input.
        input: String,
    },
    /// The number could not be parsed or the total overflowed.
    #[error("failed to parse duration {input:?}: number out of range")]
    OutOfRange {
        /// The whole input.
        input: String,
    },
}

/// Parses a duration string such as `100ms`, `3s`, `1.5s`, `15m` or `1h30m`.
///
/// The accepted syntax is exactly [`DURATION_PATTERN`]; the result is rounded
/// down to whole microseconds.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    if input.is_empty() {
        return Err(DurationError::Empty);
    }
    let mut total_us: u128 = 0;
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'.') {
            i += 1;
        }
        let number = &input[start..i];
        if number.is_empty() {
            return Err(DurationError::MissingNumber { input: input.to_owned() });
        }
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let unit_us: u128 = match &input[unit_start..i] {
            "ms" => 1_000,
            "s" => 1_000_000,
            "m" => 60_000_000,
            "h" => 3_600_000_000,
            _ => {
                return Err(DurationError::BadUnit { input: input.to_owned() });
            }
        };
        let (whole, frac) = match number.split_once('.') {
            Some((w, f)) => (w, f),
            None => (number, ""),
        };
        if whole.is_empty() || frac.contains('.') || (number.contains('.') && frac.is_empty()) {
            return Err(DurationError::MissingNumber { input: input.to_owned() });
        }
        let out_of_range = || DurationError::OutOfRange { input: input.to_owned() };
        let whole: u128 = whole.parse().map_err(|_| out_of_range())?;
        let mut value = whole.checked_mul(unit_us).ok_or_else(out_of_range)?;
        // Fractional part: at most 9 digits are meaningful.
        let mut scale = unit_us;
        for digit in frac.bytes().take(9) {
            scale /= 10;
            value += u128::from(digit - b'0') * scale;
        }
        total_us = total_us.checked_add(value).ok_or_else(out_of_range)?;
    }
    let secs =
        u64::try_from(total_us / 1_000_000).map_err(|_| DurationError::OutOfRange { input: input.to_owned() })?;
    // The remainder is below 1_000_000, so it always fits in a u32.
    let micros = u32::try_from(total_us % 1_000_000).unwrap_or(0);
    Ok(Duration::new(secs, micros * 1_000))
}

/// Formats a duration the way the CRDs write them (`100ms`, `3s`, `15m`, `1h`).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::{Duration, format_duration, parse_duration};

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_duration("100ms"), Ok(Duration::from_millis(100)));
        assert_eq!(parse_duration("3s"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_malformed() {
        for bad in ["", "3", "s", "3x", "1.s", ".5s", "1..2s", "-1s", "3 s", "1d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn format_roundtrips() {
        for s in ["100ms", "3s", "15m", "6h", "1100ms"] {
            let d = parse_duration(s).expect("valid");
            assert_eq!(format_duration(d), s);
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,24}") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn millis_roundtrip(ms in 0u64..10_000_000) {
            let d = Duration::from_millis(ms);
            proptest::prop_assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }
}
