//! Feed-range arithmetic for keeping the leases tiling the whole key range after splits and
//! merges: intersections, the parts of a range no lease covers, and the gaps in a lease set.
//!
//! Effective partition keys are upper-case hex strings, `""` the minimum and `"FF"` the maximum
//! (exclusive); their string order is their byte order, so ranges are compared as strings.

use azure_data_cosmos::feed::FeedRange;
use azure_data_cosmos::models::EffectivePartitionKey;

/// The maximum (exclusive) effective partition key.
pub(crate) const MAX_EPK: &str = "FF";

/// A half-open effective-partition-key range `[min, max)`.
pub(crate) type Bounds = (String, String);

/// The bounds of `range`.
pub(crate) fn bounds(range: &FeedRange) -> Bounds {
    (
        range.min_inclusive().to_string(),
        range.max_exclusive().to_string(),
    )
}

/// The feed range `[min, max)`, if the bounds are valid keys.
pub(crate) fn feed_range((min, max): &Bounds) -> Option<FeedRange> {
    let min = EffectivePartitionKey::try_from(min.as_str()).ok()?;
    let max = EffectivePartitionKey::try_from(max.as_str()).ok()?;
    FeedRange::new(min, max).ok()
}

/// The overlap of two ranges, if it is not empty.
pub(crate) fn intersect(a: &Bounds, b: &Bounds) -> Option<Bounds> {
    let min = a.0.as_str().max(b.0.as_str());
    let max = a.1.as_str().min(b.1.as_str());
    (min < max).then(|| (min.to_owned(), max.to_owned()))
}

/// Whether `inner` lies within `outer` and is not `outer` itself (a split's child in its
/// parent).
pub(crate) fn strictly_within(inner: &Bounds, outer: &Bounds) -> bool {
    inner != outer && intersect(inner, outer).as_ref() == Some(inner)
}

/// The parts of `range` that none of `covered` covers, in order.
pub(crate) fn uncovered(range: &Bounds, covered: &[Bounds]) -> Vec<Bounds> {
    let mut pieces: Vec<Bounds> = covered.iter().filter_map(|c| intersect(range, c)).collect();
    pieces.sort();
    let mut gaps = Vec::new();
    let mut at = range.0.clone();
    for (min, max) in pieces {
        if min > at {
            gaps.push((at.clone(), min.clone()));
        }
        if max > at {
            at = max;
        }
    }
    if at < range.1 {
        gaps.push((at, range.1.clone()));
    }
    gaps
}

/// The parts of the whole key range `["", "FF")` that no lease covers.
pub(crate) fn gaps(leases: &[Bounds]) -> Vec<Bounds> {
    uncovered(&(String::new(), MAX_EPK.to_owned()), leases)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(min: &str, max: &str) -> Bounds {
        (min.to_owned(), max.to_owned())
    }

    #[test]
    fn intersections_are_the_overlap_or_nothing() {
        assert_eq!(intersect(&b("", "40"), &b("20", "80")), Some(b("20", "40")));
        assert_eq!(intersect(&b("", "40"), &b("40", "80")), None);
        assert_eq!(intersect(&b("10", "20"), &b("", "FF")), Some(b("10", "20")));
    }

    #[test]
    fn uncovered_parts_are_found_by_coverage_not_by_a_single_overlap() {
        // A lease covers half of the range: the other half is uncovered.
        assert_eq!(uncovered(&b("", "60"), &[b("", "40")]), vec![b("40", "60")]);
        assert_eq!(
            uncovered(&b("", "FF"), &[b("10", "20"), b("15", "30"), b("40", "FF")]),
            vec![b("", "10"), b("30", "40")]
        );
        assert!(uncovered(&b("20", "30"), &[b("", "FF")]).is_empty());
    }

    #[test]
    fn the_gaps_of_a_lease_set_are_what_the_tiling_misses() {
        assert!(gaps(&[b("", "80"), b("80", "FF")]).is_empty());
        assert_eq!(gaps(&[b("", "40"), b("60", "FF")]), vec![b("40", "60")]);
        assert_eq!(gaps(&[]), vec![b("", "FF")]);
    }

    #[test]
    fn feed_ranges_are_built_from_bounds() {
        let range = feed_range(&b("", "FF")).unwrap();
        assert_eq!(bounds(&range), b("", "FF"));
        assert!(feed_range(&b("zz", "FF")).is_none());
    }
}
