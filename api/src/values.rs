//! Values a user writes in the operator's flags and in a pod's sidecar
//! annotations, with their grammar and bounds: a resource quantity and a
//! sidecar log filter. One grammar for both, so a value the chart passes
//! is one a pod annotation may hold.

/// Longest quantity accepted ("1.5Gi" is 5; Kubernetes' own values stay
/// far below this).
pub const MAX_QUANTITY_LEN: usize = 24;
/// Largest quantity accepted, in base units (cores, bytes): about 2^63,
/// the int64 a Kubernetes quantity is kept in (1Ei of memory still fits).
pub const MAX_QUANTITY: f64 = 9.2e18;
/// Longest log filter accepted (`info,kubegrace_sidecar::drain=debug` is 36).
pub const MAX_LOG_LEVEL_LEN: usize = 256;

/// A Kubernetes resource quantity (`250m`, `0.5`, `.5`, `128Mi`, `1G`,
/// `1e3`) as a number of base units, for comparing a request with its
/// limit. The grammar is the chart schema's `quantityOrEmpty` (a value the
/// chart admits must not stop the operator), without a sign: a sidecar's
/// resources are above zero.
pub fn parse_quantity(raw: &str) -> Result<f64, String> {
    const HINT: &str = "write a quantity such as 100m or 64Mi";
    let s = raw.trim();
    if s.is_empty() {
        return Err(format!("empty; {HINT}"));
    }
    if s.len() > MAX_QUANTITY_LEN {
        return Err(format!("longer than {MAX_QUANTITY_LEN} characters; {HINT}"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let well_formed = number.chars().any(|c| c.is_ascii_digit())
        && number.matches('.').count() <= 1
        && !number.ends_with('.');
    let value: f64 = number
        .parse()
        .ok()
        .filter(|_| well_formed)
        .ok_or_else(|| format!("{number:?} is not a number; {HINT}"))?;
    let multiplier = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 2f64.powi(10),
        "Mi" => 2f64.powi(20),
        "Gi" => 2f64.powi(30),
        "Ti" => 2f64.powi(40),
        "Pi" => 2f64.powi(50),
        "Ei" => 2f64.powi(60),
        exponent => exponent
            .strip_prefix(['e', 'E'])
            .map(|e| e.strip_prefix(['+', '-']).map_or(e, |d| d))
            .filter(|digits| !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()))
            .and_then(|_| format!("1{exponent}").parse::<f64>().ok())
            .ok_or_else(|| {
                format!(
                    "unknown suffix {suffix:?}; {HINT} (suffixes m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei, or an exponent e3)"
                )
            })?,
    };
    let base = value * multiplier;
    if base.is_nan() || base <= 0.0 {
        return Err(format!("zero; {HINT} above zero"));
    }
    // Kubernetes keeps a quantity in an int64 of its smallest unit; past
    // that (`1e999`, `99999Ei`) the API server would refuse the pod.
    if base > MAX_QUANTITY {
        return Err(format!("larger than Kubernetes can hold; {HINT}"));
    }
    Ok(base)
}

/// A sidecar log filter: a level (`debug`) or comma-separated
/// `target=level` directives, in the characters those use.
pub fn check_log_level(raw: &str) -> Result<String, String> {
    let s = raw.trim();
    if s.is_empty() || s.len() > MAX_LOG_LEVEL_LEN {
        return Err(format!(
            "write a level (trace, debug, info, warn, error, off) or target=level directives, at most {MAX_LOG_LEVEL_LEN} characters"
        ));
    }
    const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];
    for directive in s.split(',') {
        let level = directive.rsplit('=').next().unwrap_or_default();
        let target_ok = directive.split('=').count() <= 2
            && directive
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '=' | '-'));
        if !target_ok || !LEVELS.contains(&level.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "{directive:?} is not a level; write trace, debug, info, warn, error or off, or target=level directives"
            ));
        }
    }
    Ok(s.to_string())
}
