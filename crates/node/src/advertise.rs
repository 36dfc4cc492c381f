//! The address a node advertises to clients (in its node record and so in the cluster map).
//!
//! An explicit `--advertise` wins. A specific listen address is advertised as bound. A node
//! listening on every address (`0.0.0.0` or `[::]`) advertises this host's primary address: the
//! source address the kernel picks for the default route (found by connecting a UDP socket,
//! which sends nothing). A host without a default route cannot know which of its addresses
//! other hosts reach, so the node refuses to start and asks for `--advertise`. (Advertising
//! 127.0.0.1, as earlier versions did, made every other host dial itself.)

use crate::error::NodeError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The address to advertise for a listener bound to `bound`.
pub(crate) fn address(explicit: Option<&str>, bound: SocketAddr) -> Result<String, NodeError> {
    if let Some(a) = explicit {
        return Ok(a.to_string());
    }
    if !bound.ip().is_unspecified() {
        return Ok(bound.to_string());
    }
    let ip = primary_ip(bound.is_ipv6()).ok_or_else(|| {
        NodeError::Config(format!(
            "the node listens on {bound} (every address) and this host has no default route, \
             so it cannot tell which address other hosts reach it on; pass --advertise IP:PORT"
        ))
    })?;
    Ok(SocketAddr::new(ip, bound.port()).to_string())
}

/// The source address of this host's default route, for IPv4 or IPv6.
fn primary_ip(v6: bool) -> Option<IpAddr> {
    // Documentation addresses (RFC 5737, RFC 3849): routed like any other, never contacted.
    let (local, remote): (IpAddr, IpAddr) = if v6 {
        (Ipv6Addr::UNSPECIFIED.into(), "2001:db8::1".parse().ok()?)
    } else {
        (
            Ipv4Addr::UNSPECIFIED.into(),
            Ipv4Addr::new(198, 51, 100, 1).into(),
        )
    };
    let socket = UdpSocket::bind(SocketAddr::new(local, 0)).ok()?;
    socket.connect(SocketAddr::new(remote, 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explicit_and_specific_addresses_are_advertised_as_given() {
        let bound: SocketAddr = "10.1.2.3:7000".parse().unwrap();
        assert_eq!(address(None, bound).unwrap(), "10.1.2.3:7000");
        assert_eq!(
            address(Some("node7.example:7000"), bound).unwrap(),
            "node7.example:7000"
        );
        let any: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        assert_eq!(address(Some("192.0.2.9:1"), any).unwrap(), "192.0.2.9:1");
    }

    #[test]
    fn every_address_is_advertised_as_the_default_route_source_or_refused() {
        let any: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        match (primary_ip(false), address(None, any)) {
            (Some(ip), Ok(a)) => {
                assert_eq!(a, SocketAddr::new(ip, 7000).to_string());
                assert!(!ip.is_unspecified());
            }
            (None, Err(e)) => assert!(e.to_string().contains("--advertise"), "{e}"),
            (ip, a) => panic!("inconsistent: primary {ip:?}, advertised {a:?}"),
        }
    }
}
