//! The down-out rule: a device down longer than the down-out interval is marked out
//! automatically (so `up` re-places its PGs), and goes back in when it comes back up. A device
//! an operator marked out stays out. The leader asks these functions what to change in the
//! device records; the records then feed the next map.

use crate::map::ClusterMap;
use basalt_types::DeviceId;

/// What the leader should change in the device records after publishing `map`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DownOut {
    /// In devices down for at least the interval: mark them out (automatically).
    pub mark_out: Vec<DeviceId>,
    /// Devices out automatically that are up again: mark them in.
    pub mark_in: Vec<DeviceId>,
    /// Unix seconds of the next time a down device reaches the interval, if any.
    pub next_due: Option<u64>,
}

/// The down-out decisions for `map` at unix time `now` with `interval_secs`.
pub fn down_out(map: &ClusterMap, now: u64, interval_secs: u64) -> DownOut {
    let mut out = DownOut::default();
    for (id, d) in &map.devices {
        if d.up {
            if d.auto_out {
                out.mark_in.push(*id);
            }
            continue;
        }
        let (true, Some(since)) = (d.r#in, d.down_since) else {
            continue;
        };
        let due = since.saturating_add(interval_secs);
        if due <= now {
            out.mark_out.push(*id);
        } else {
            out.next_due = Some(out.next_due.map_or(due, |n: u64| n.min(due)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::DeviceInfo;
    use basalt_types::NodeId;

    #[test]
    fn down_devices_go_out_after_the_interval_and_auto_out_ones_come_back() {
        let mut map = ClusterMap::default();
        let mut dev = |id: u32, up: bool, r#in: bool, auto_out: bool, since: Option<u64>| {
            let mut d = DeviceInfo::new(NodeId(1), "ssd", 1, 131072);
            (d.up, d.r#in, d.auto_out, d.down_since) = (up, r#in, auto_out, since);
            map.devices.insert(DeviceId(id), d);
        };
        dev(1, true, true, false, None); // healthy
        dev(2, false, true, false, Some(1000)); // down 600 s at now = 1600: due
        dev(3, false, true, false, Some(1500)); // down 100 s: due at 2100
        dev(4, false, false, false, Some(0)); // operator out: nothing to do
        dev(5, true, false, true, None); // auto out, back up: mark in
        dev(6, false, false, true, Some(0)); // auto out, still down: stays out
        let d = down_out(&map, 1600, 600);
        assert_eq!(d.mark_out, vec![DeviceId(2)]);
        assert_eq!(d.mark_in, vec![DeviceId(5)]);
        assert_eq!(d.next_due, Some(2100));
        assert_eq!(down_out(&map, 1599, 600).mark_out, Vec::<DeviceId>::new());
    }
}
