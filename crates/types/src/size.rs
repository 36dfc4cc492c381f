//! Sizes as people write them: `8GiB`, `512M`, `4096`, `1.5TiB`.
//!
//! Binary units (`KiB`, `MiB`, `GiB`, `TiB`, `PiB`) and the short forms `K`, `M`, `G`, `T`, `P`
//! are powers of 1024; SI units (`kB`, `MB`, `GB`, `TB`, `PB`) are powers of 1000. A bare number
//! is bytes. Matching is case-insensitive for the unit letter, so `8gib` works.

use thiserror::Error;

/// Why a size string was rejected.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    #[error("empty size; write a number with an optional unit, e.g. 8GiB")]
    Empty,
    #[error("'{0}' is not a size; write a number with an optional unit, e.g. 8GiB or 512MiB")]
    Malformed(String),
    #[error(
        "unknown unit '{unit}' in '{input}'; use B, KiB, MiB, GiB, TiB, PiB (or kB, MB, GB, TB, PB)"
    )]
    UnknownUnit { input: String, unit: String },
    #[error("'{0}' is too large (more than 2^64 bytes)")]
    Overflow(String),
    #[error("'{0}' is not a whole number of bytes")]
    Fractional(String),
}

/// Parses a size such as `8GiB` into bytes.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim();
    if num.is_empty() || num.matches('.').count() > 1 {
        return Err(SizeError::Malformed(input.to_string()));
    }
    let mult = unit_multiplier(unit).ok_or_else(|| SizeError::UnknownUnit {
        input: input.to_string(),
        unit: unit.to_string(),
    })?;
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part
            .parse()
            .map_err(|_| SizeError::Overflow(input.to_string()))?
    };
    let mut total = int
        .checked_mul(mult as u128)
        .ok_or_else(|| SizeError::Overflow(input.to_string()))?;
    if !frac_part.is_empty() {
        let frac: u128 = frac_part
            .get(..frac_part.len().min(18))
            .unwrap_or("0")
            .parse()
            .map_err(|_| SizeError::Malformed(input.to_string()))?;
        let scale = 10u128.pow(frac_part.len().min(18) as u32);
        let scaled = frac * mult as u128;
        if !scaled.is_multiple_of(scale) {
            return Err(SizeError::Fractional(input.to_string()));
        }
        total += scaled / scale;
    }
    u64::try_from(total).map_err(|_| SizeError::Overflow(input.to_string()))
}

fn unit_multiplier(unit: &str) -> Option<u64> {
    const K: u64 = 1024;
    let lower = unit.to_ascii_lowercase();
    Some(match lower.as_str() {
        "" | "b" => 1,
        "k" | "kib" => K,
        "m" | "mib" => K.pow(2),
        "g" | "gib" => K.pow(3),
        "t" | "tib" => K.pow(4),
        "p" | "pib" => K.pow(5),
        "kb" => 1000,
        "mb" => 1000u64.pow(2),
        "gb" => 1000u64.pow(3),
        "tb" => 1000u64.pow(4),
        "pb" => 1000u64.pow(5),
        _ => return None,
    })
}

/// `part` as a percent of `whole`, rounded down (0 when `whole` is 0): how full a device is.
pub fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    u64::try_from(u128::from(part) * 100 / u128::from(whole)).unwrap_or(u64::MAX)
}

/// Formats bytes with the largest binary unit that divides it exactly (`8GiB`, `1536MiB`, `4097B`),
/// so that `parse_size(format_size(n)) == n` always holds.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes;
    let mut unit = 0;
    while unit + 1 < UNITS.len() && value != 0 && value.is_multiple_of(1024) {
        value /= 1024;
        unit += 1;
    }
    format!("{value}{}", UNITS[unit])
}

/// Formats bytes approximately for humans (`7.5 GiB`), for tables and progress output.
pub fn format_size_approx(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_common_forms() {
        assert_eq!(parse_size("8GiB"), Ok(8 << 30));
        assert_eq!(parse_size("8gib"), Ok(8 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("10GB"), Ok(10_000_000_000));
        assert_eq!(parse_size(" 1 TiB "), Ok(1 << 40));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert!(matches!(parse_size("GiB"), Err(SizeError::Malformed(_))));
        assert!(matches!(
            parse_size("8XB"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size("1.2.3G"), Err(SizeError::Malformed(_))));
        assert!(matches!(
            parse_size("99999999PiB"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(parse_size("0.3B"), Err(SizeError::Fractional(_))));
        assert!(matches!(parse_size("-5G"), Err(SizeError::Malformed(_))));
    }

    #[test]
    fn formats_exactly() {
        assert_eq!(format_size(8 << 30), "8GiB");
        assert_eq!(format_size(1536 << 20), "1536MiB");
        assert_eq!(format_size(4097), "4097B");
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size_approx(3 << 29), "1.5 GiB");
    }

    proptest! {
        #[test]
        fn format_then_parse_round_trips(n in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(n)), Ok(n));
        }
    }
}
