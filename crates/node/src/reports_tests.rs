//! The leader's failure-report rule, deterministic (explicit instants).

use super::*;

fn n(i: u32) -> NodeId {
    NodeId(i)
}

fn live(ids: &[u32]) -> BTreeSet<NodeId> {
    ids.iter().map(|i| n(*i)).collect()
}

fn reports(pairs: &[(u32, u32)]) -> Vec<(NodeId, NodeId)> {
    pairs.iter().map(|(r, a)| (n(*r), n(*a))).collect()
}

fn down(v: &Verdict) -> Vec<u32> {
    v.down.keys().map(|n| n.0).collect()
}

const SEC: Duration = Duration::from_secs(1);

fn rules() -> ReportRules {
    ReportRules {
        min_reporters: 2,
        min_down: 10 * SEC,
        mutual_after: 3 * SEC,
    }
}

#[test]
fn a_node_cut_off_from_the_others_is_marked_down_and_its_own_reports_do_not_count() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3]);
    let cut_off = reports(&[(2, 1), (3, 1), (1, 2), (1, 3)]);
    let v = r.decide(&cut_off, &all, &rules(), t);
    assert_eq!(down(&v), vec![1]);
    assert_eq!(v.down[&n(1)], 2, "reported by two peers");
}

#[test]
fn one_reporter_is_not_enough_with_min_reporters_two() {
    let mut r = Reports::default();
    let t = Instant::now();
    let v = r.decide(&reports(&[(2, 1)]), &live(&[1, 2, 3]), &rules(), t);
    assert!(v.down.is_empty());
    assert_eq!(v.next_due, None, "nothing will change without a new report");
    let mut one = rules();
    one.min_reporters = 1;
    let v = r.decide(&reports(&[(2, 1)]), &live(&[1, 2, 3]), &one, t);
    assert_eq!(down(&v), vec![1]);
}

#[test]
fn reports_of_a_dead_reporter_or_about_a_dead_node_do_not_count() {
    let mut r = Reports::default();
    let t = Instant::now();
    // Node 3 died (its lease expired): its report no longer counts.
    let v = r.decide(&reports(&[(2, 1), (3, 1)]), &live(&[1, 2]), &rules(), t);
    assert!(v.down.is_empty(), "{v:?}");
    // A report of a node that is not registered changes nothing (it is down by its lease).
    let v = r.decide(&reports(&[(2, 4), (3, 4)]), &live(&[1, 2, 3]), &rules(), t);
    assert!(v.down.is_empty(), "{v:?}");
}

#[test]
fn a_node_marked_down_stays_down_for_min_down_then_comes_back_when_reports_are_withdrawn() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3]);
    let cut = reports(&[(2, 1), (3, 1)]);
    assert_eq!(down(&r.decide(&cut, &all, &rules(), t)), vec![1]);
    // Healed after one second: the reports are gone, but the node stays down (damping).
    let v = r.decide(&[], &all, &rules(), t + SEC);
    assert_eq!(down(&v), vec![1]);
    assert_eq!(v.next_due, Some(t + 10 * SEC), "wake when the damping ends");
    // A report coming back meanwhile keeps it down, of course.
    assert_eq!(down(&r.decide(&cut, &all, &rules(), t + 5 * SEC)), vec![1]);
    let v = r.decide(&[], &all, &rules(), t + 10 * SEC);
    assert!(v.down.is_empty(), "up once damped and unreported: {v:?}");
    // Reported again later: down again, damped from the new marking.
    let later = t + 20 * SEC;
    assert_eq!(down(&r.decide(&cut, &all, &rules(), later)), vec![1]);
    let v = r.decide(&[], &all, &rules(), later + 9 * SEC);
    assert_eq!(down(&v), vec![1]);
}

#[test]
fn a_node_still_reported_after_min_down_stays_down() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3]);
    let cut = reports(&[(2, 1), (3, 1)]);
    r.decide(&cut, &all, &rules(), t);
    let v = r.decide(&cut, &all, &rules(), t + 60 * SEC);
    assert_eq!(down(&v), vec![1]);
}

#[test]
fn one_broken_link_marks_down_the_higher_id_after_the_delay() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3]);
    let link = reports(&[(1, 2), (2, 1)]);
    let v = r.decide(&link, &all, &rules(), t);
    assert!(v.down.is_empty(), "not before the delay: {v:?}");
    assert_eq!(v.next_due, Some(t + 3 * SEC));
    let v = r.decide(&link, &all, &rules(), t + 3 * SEC);
    assert_eq!(down(&v), vec![2]);
    assert_eq!(v.down[&n(2)], 1);
}

#[test]
fn one_broken_link_marks_down_the_side_with_more_reporters() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3, 4]);
    let mut three = rules();
    three.min_reporters = 3;
    // 1 and 2 report each other; 3 also cannot reach 1.
    let link = reports(&[(1, 2), (2, 1), (3, 1)]);
    r.decide(&link, &all, &three, t);
    let v = r.decide(&link, &all, &three, t + 3 * SEC);
    assert_eq!(down(&v), vec![1]);
}

#[test]
fn a_cut_off_node_reporting_first_is_not_mistaken_for_a_broken_link() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3]);
    // Node 1 is cut off; its reports and node 2's arrive before node 3's.
    let early = reports(&[(1, 2), (1, 3), (2, 1)]);
    let v = r.decide(&early, &all, &rules(), t);
    assert!(v.down.is_empty(), "{v:?}");
    let v = r.decide(
        &reports(&[(1, 2), (1, 3), (2, 1), (3, 1)]),
        &all,
        &rules(),
        t + SEC,
    );
    assert_eq!(down(&v), vec![1]);
    // Past the mutual delay the verdict stays: 1 is down, so its reports do not count.
    let v = r.decide(
        &reports(&[(1, 2), (1, 3), (2, 1), (3, 1)]),
        &all,
        &rules(),
        t + 5 * SEC,
    );
    assert_eq!(down(&v), vec![1]);
}

#[test]
fn in_a_two_node_cluster_a_broken_link_takes_down_one_node_after_the_delay() {
    let mut r = Reports::default();
    let t = Instant::now();
    let two = live(&[1, 2]);
    let link = reports(&[(1, 2), (2, 1)]);
    assert!(r.decide(&link, &two, &rules(), t).down.is_empty());
    assert_eq!(down(&r.decide(&link, &two, &rules(), t + 3 * SEC)), vec![2]);
    // One node alone reporting the other (the other is merely slow to answer) is not enough.
    let mut r = Reports::default();
    let v = r.decide(&reports(&[(1, 2)]), &two, &rules(), t + 60 * SEC);
    assert!(v.down.is_empty(), "{v:?}");
}

#[test]
fn a_split_in_two_halves_keeps_one_half_up() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3, 4]);
    let mut split = Vec::new();
    for (a, b) in [(1, 3), (1, 4), (2, 3), (2, 4)] {
        split.push((a, b));
        split.push((b, a));
    }
    let v = r.decide(&reports(&split), &all, &rules(), t);
    assert_eq!(down(&v), vec![3, 4]);
}

#[test]
fn two_isolated_nodes_of_five_do_not_take_down_a_healthy_one() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3, 4, 5]);
    let mut pairs = Vec::new();
    for isolated in [1, 2] {
        for other in 1..=5 {
            if other != isolated {
                pairs.push((isolated, other));
                pairs.push((other, isolated));
            }
        }
    }
    pairs.sort();
    pairs.dedup();
    let v = r.decide(&reports(&pairs), &all, &rules(), t);
    assert_eq!(down(&v), vec![1, 2]);
    let v = r.decide(&reports(&pairs), &all, &rules(), t + 60 * SEC);
    assert_eq!(down(&v), vec![1, 2]);
}

#[test]
fn min_reporters_zero_turns_the_rule_off() {
    let mut r = Reports::default();
    let t = Instant::now();
    let mut off = rules();
    off.min_reporters = 0;
    let cut = reports(&[(2, 1), (3, 1), (1, 2), (2, 1)]);
    let v = r.decide(&cut, &live(&[1, 2, 3]), &off, t + 60 * SEC);
    assert_eq!(v, Verdict::default());
}

#[test]
fn a_late_report_of_a_cut_off_node_takes_it_down_not_the_late_reporter() {
    let mut r = Reports::default();
    let t = Instant::now();
    let all = live(&[1, 2, 3]);
    // Node 1 is cut off from 2 and 3; 3's report of it stands, 2's comes late.
    let early = reports(&[(1, 2), (1, 3), (3, 1)]);
    r.decide(&early, &all, &rules(), t);
    let v = r.decide(&early, &all, &rules(), t + 3 * SEC);
    assert_eq!(
        down(&v),
        vec![3],
        "the broken-link rule: a tie, the higher id"
    );
    let late = reports(&[(1, 2), (1, 3), (3, 1), (2, 1)]);
    let v = r.decide(&late, &all, &rules(), t + 4 * SEC);
    assert_eq!(down(&v), vec![1, 3], "2 and 3 report 1: enough reporters");
    let v = r.decide(&late, &all, &rules(), t + 8 * SEC);
    assert!(
        !v.down.contains_key(&n(2)),
        "the late reporter went down too: {v:?}"
    );
    // Once 3's damping ends, only the cut-off node stays down.
    let v = r.decide(&late, &all, &rules(), t + 14 * SEC);
    assert_eq!(down(&v), vec![1]);
}
