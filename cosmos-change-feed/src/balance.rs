//! Which leases an instance takes in one acquire cycle: the fair-share rule.
//!
//! With `L` leases and `N` live owners (instances owning at least one unexpired lease, plus the
//! deciding instance itself), the fair share is `ceil(L / N)`. An instance below it takes, in
//! this order and never beyond it:
//! 1. free or expired leases;
//! 2. only when no lease is free or expired: **one** lease of an over-loaded live owner per
//!    cycle (as .NET's equal-partitions strategy). An owner is over-loaded when it owns at
//!    least two more leases than the taker. Stealing therefore strictly narrows the spread, two
//!    instances never steal back and forth, and each hand-over (which may republish the page in
//!    flight) is paced by the acquire interval.
//!
//! An instance above its fair share does not give leases away; under-loaded instances steal.

use std::collections::{BTreeMap, BTreeSet};

/// One lease as the balancer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseView {
    /// Lease document id.
    pub(crate) id: String,
    /// The live (unexpired) owner, if any.
    pub(crate) live_owner: Option<String>,
}

/// A lease to take and from whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Take {
    /// A free or expired lease (or one recorded as ours that we do not run).
    Available(String),
    /// A lease of an over-loaded live owner.
    Steal {
        /// Lease document id.
        id: String,
        /// Its current owner.
        from: String,
    },
}

/// Plans the leases `me` takes. `running` are the ids of leases `me` currently polls.
pub(crate) fn plan(leases: &[LeaseView], me: &str, running: &BTreeSet<String>) -> Vec<Take> {
    if leases.is_empty() {
        return Vec::new();
    }
    // Live owners and their lease counts; a lease we run counts as ours.
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    counts.insert(me, 0);
    for lease in leases {
        if running.contains(&lease.id) {
            *counts.entry(me).or_default() += 1;
        } else if let Some(owner) = lease.live_owner.as_deref().filter(|o| *o != me) {
            *counts.entry(owner).or_default() += 1;
        }
    }
    let target = leases.len().div_ceil(counts.len());
    let mut mine = counts[me];
    let mut takes = Vec::new();

    // Free, expired, or recorded as ours without a poller (a restart under the same name).
    let mut available: Vec<&LeaseView> = leases
        .iter()
        .filter(|l| !running.contains(&l.id))
        .filter(|l| l.live_owner.as_deref().is_none_or(|o| o == me))
        .collect();
    available.sort_by_key(|l| spread_key(me, &l.id));
    if !available.is_empty() {
        for lease in available {
            if mine >= target {
                break;
            }
            takes.push(Take::Available(lease.id.clone()));
            mine += 1;
        }
        // Free or expired leases are someone's to take first; nobody steals meanwhile.
        return takes;
    }

    // Steal from over-loaded owners.
    let mut stealable: BTreeMap<&str, Vec<&LeaseView>> = BTreeMap::new();
    for lease in leases {
        if running.contains(&lease.id) {
            continue;
        }
        if let Some(owner) = lease.live_owner.as_deref().filter(|o| *o != me) {
            stealable.entry(owner).or_default().push(lease);
        }
    }
    for victims in stealable.values_mut() {
        victims.sort_by_key(|l| std::cmp::Reverse(spread_key(me, &l.id)));
    }
    if mine < target {
        let richest = counts
            .iter()
            .filter(|(owner, _)| **owner != me)
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(owner, count)| (*owner, *count));
        if let Some((owner, count)) = richest
            && count >= mine + 2
            && let Some(lease) = stealable.get_mut(owner).and_then(Vec::pop)
        {
            takes.push(Take::Steal {
                id: lease.id.clone(),
                from: owner.to_owned(),
            });
        }
    }
    takes
}

/// A per-instance order of leases (FNV-1a of instance and lease id), so instances racing for
/// the same free leases tend to try different ones first.
fn spread_key(me: &str, id: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in me.bytes().chain([0]).chain(id.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: &str, owner: Option<&str>) -> LeaseView {
        LeaseView {
            id: id.to_owned(),
            live_owner: owner.map(str::to_owned),
        }
    }

    fn running(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_lone_instance_takes_every_free_lease() {
        let leases = [view("a", None), view("b", None), view("c", None)];
        assert_eq!(plan(&leases, "me", &running(&[])).len(), 3);
    }

    #[test]
    fn an_instance_takes_free_leases_only_up_to_its_fair_share() {
        let leases = [
            view("a", Some("other")),
            view("b", None),
            view("c", None),
            view("d", None),
        ];
        // Two live owners, four leases: a share of two.
        let takes = plan(&leases, "me", &running(&[]));
        assert_eq!(takes.len(), 2);
        assert!(takes.iter().all(|t| matches!(t, Take::Available(_))));
    }

    #[test]
    fn an_instance_steals_one_lease_per_cycle_from_an_overloaded_owner() {
        let leases = [
            view("a", Some("other")),
            view("b", Some("other")),
            view("c", Some("other")),
            view("d", Some("other")),
        ];
        let takes = plan(&leases, "me", &running(&[]));
        assert_eq!(takes.len(), 1, "{takes:?}");
        assert!(matches!(&takes[0], Take::Steal { from, .. } if from == "other"));
        // The next cycle, running one, it steals the second and is balanced.
        let Take::Steal { id, .. } = &takes[0] else {
            unreachable!()
        };
        let leases: Vec<LeaseView> = leases
            .iter()
            .map(|l| {
                if &l.id == id {
                    view(id, Some("me"))
                } else {
                    l.clone()
                }
            })
            .collect();
        assert_eq!(plan(&leases, "me", &running(&[id.as_str()])).len(), 1);
    }

    #[test]
    fn nobody_steals_while_a_free_or_expired_lease_exists() {
        // `me` is at its share (2 of 5 over 3 owners) with a free lease left for the third
        // instance: no steal from the over-loaded `x`, though it holds 3.
        let leases = [
            view("a", Some("x")),
            view("b", Some("x")),
            view("c", Some("x")),
            view("d", Some("me")),
            view("e", None),
        ];
        let takes = plan(&leases, "me", &running(&["d"]));
        assert_eq!(takes, vec![Take::Available("e".into())]);
        let leases = [
            view("a", Some("x")),
            view("b", Some("x")),
            view("c", Some("x")),
            view("d", None),
        ];
        let takes = plan(&leases, "me", &running(&[]));
        assert!(
            takes.iter().all(|t| matches!(t, Take::Available(_))),
            "{takes:?}"
        );
    }

    #[test]
    fn no_stealing_when_the_spread_is_at_most_one() {
        // 2 / 1 / 1 over three instances: balanced enough, nobody steals.
        let leases = [
            view("a", Some("x")),
            view("b", Some("x")),
            view("c", Some("y")),
            view("d", Some("me")),
        ];
        assert!(plan(&leases, "me", &running(&["d"])).is_empty());
    }

    #[test]
    fn two_two_zero_becomes_two_one_one() {
        let leases = [
            view("a", Some("x")),
            view("b", Some("x")),
            view("c", Some("y")),
            view("d", Some("y")),
        ];
        let takes = plan(&leases, "me", &running(&[]));
        assert_eq!(takes.len(), 1, "{takes:?}");
    }

    #[test]
    fn a_lease_recorded_as_ours_but_not_running_is_taken_back() {
        let leases = [view("a", Some("me")), view("b", Some("other"))];
        assert_eq!(
            plan(&leases, "me", &running(&[])),
            vec![Take::Available("a".into())]
        );
    }
}
