//! Durations on the command line: `30s`, `500ms`, `10m`, `1h`, or plain seconds (`600`).

use std::time::Duration;

/// Parses a duration; the error says what is accepted.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration; use e.g. 30s, 500ms, 10m"))?;
    let secs = match unit.trim() {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{s}'; use ms, s, m or h"
            ));
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("'{s}' is out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_errors() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("600"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(
            parse_duration("soon")
                .unwrap_err()
                .contains("not a duration")
        );
        assert!(parse_duration("3d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("").is_err());
    }
}
