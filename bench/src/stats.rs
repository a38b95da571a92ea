//! Medians, spreads and percentiles: every figure in the report is the
//! median of several rounds with its min and max, because on a shared
//! two-core machine one round alone says little.

use serde::{Deserialize, Serialize};

/// The median of a set of rounds, with the smallest and largest round.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// `None` for no samples; NaN samples are dropped (a round that could
    /// not measure something).
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        // Even counts take the mean of the middle two, the usual median.
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// Nearest-rank percentile (`q` in 0..=100) of an ascending slice.
///
/// Nearest-rank rather than interpolation: a p99.9 is then a latency some
/// request really saw.
pub fn percentile_sorted(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    // The epsilon keeps 99.9% of 1000 at rank 999: 0.999 * 1000 is
    // 999.0000000000001 in floating point.
    let rank = ((q / 100.0) * sorted.len() as f64 - 1e-9).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The median of whole counts (the upper one of an even set); 0 for none.
pub fn median_u32(mut v: Vec<u32>) -> u32 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_takes_median_min_max_and_skips_nan() {
        let s = Spread::of(&[3.0, f64::NAN, 1.0, 2.0]).expect("samples");
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of(&[4.0, 1.0, 2.0, 3.0]).expect("samples");
        assert_eq!(s.median, 2.5);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile_sorted(&v, 50.0), Some(500));
        assert_eq!(percentile_sorted(&v, 99.0), Some(990));
        assert_eq!(percentile_sorted(&v, 99.9), Some(999));
        assert_eq!(percentile_sorted(&v, 100.0), Some(1000));
        assert_eq!(percentile_sorted(&[7], 0.0), Some(7));
        assert_eq!(percentile_sorted(&[], 50.0), None);
    }
}
