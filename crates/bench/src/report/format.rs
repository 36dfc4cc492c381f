//! Number formatting shared by the terminal, HTML and progress lines. Full precision stays in
//! results.json / results.csv; these strings are for reading.

/// `812`, `45.2k`, `1.23M`.
pub fn fmt_iops(v: f64) -> String {
    if !v.is_finite() {
        "-".into()
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// `0.9`, `176.6`, `1806`.
pub fn fmt_mib(v: f64) -> String {
    if v >= 1000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// `350 µs`, `1.25 ms`, `-` for unknown.
pub fn fmt_us(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(v) if v >= 10_000.0 => format!("{:.1} ms", v / 1000.0),
        Some(v) if v >= 1000.0 => format!("{:.2} ms", v / 1000.0),
        Some(v) if v >= 100.0 => format!("{v:.0} µs"),
        Some(v) => format!("{v:.1} µs"),
    }
}

/// `1,234,567` (whole number with thousands separators, as in the simplyblock tables).
pub fn fmt_thousands(v: f64) -> String {
    let n = v.round() as i64;
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// `62%` or `0.4%`.
pub fn fmt_pct(fraction: f64) -> String {
    let p = fraction * 100.0;
    if p < 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// A ratio such as `0.43x`.
pub fn fmt_ratio(r: f64) -> String {
    if !r.is_finite() {
        "-".into()
    } else if r >= 10.0 {
        format!("{r:.0}x")
    } else {
        format!("{r:.2}x")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_iops(812.4), "812");
        assert_eq!(fmt_iops(45_234.0), "45.2k");
        assert_eq!(fmt_iops(1_234_567.0), "1.23M");
        assert_eq!(fmt_us(Some(48.9)), "48.9 µs");
        assert_eq!(fmt_us(Some(1250.0)), "1.25 ms");
        assert_eq!(fmt_us(Some(28_400.0)), "28.4 ms");
        assert_eq!(fmt_us(None), "-");
        assert_eq!(fmt_thousands(343_895.4), "343,895");
        assert_eq!(fmt_thousands(999.0), "999");
        assert_eq!(fmt_pct(0.623), "62%");
        assert_eq!(fmt_ratio(0.4321), "0.43x");
    }
}
