//! IP networks in CIDR notation, with containment, on `std::net` alone.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::de::{Deserialize, Deserializer, Visitor};

/// An IPv4 or IPv6 network, e.g. `10.1.0.0/24`, `fd00::/64`. Host bits must be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a string is not a network in CIDR notation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a network in CIDR notation ({1})")]
pub struct CidrError(String, &'static str);

impl Cidr {
    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` lies in this network (an address of the other family never does).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(ip) & mask == u128::from(net)
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let fail = |why| CidrError(s.to_string(), why);
        let (address, prefix) = s.split_once('/').ok_or_else(|| fail("address/prefix, e.g. 10.1.0.0/24"))?;
        let network: IpAddr = address.parse().map_err(|_| fail("the address does not parse"))?;
        let prefix: u8 = prefix.parse().map_err(|_| fail("the prefix is not a number"))?;
        let bits = if network.is_ipv4() { 32 } else { 128 };
        if prefix > bits {
            return Err(fail("the prefix is longer than the address"));
        }
        let cidr = Self { network, prefix };
        let host_bits_zero = match network {
            IpAddr::V4(a) => u32::from(a).checked_shl(u32::from(prefix)).unwrap_or(0) == 0,
            IpAddr::V6(a) => u128::from(a).checked_shl(u32::from(prefix)).unwrap_or(0) == 0,
        };
        if !host_bits_zero {
            return Err(fail("host bits are set"));
        }
        Ok(cidr)
    }
}

impl TryFrom<String> for Cidr {
    type Error = CidrError;

    fn try_from(s: String) -> Result<Self, CidrError> {
        s.parse()
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CidrVisitor;

        impl Visitor<'_> for CidrVisitor {
            type Value = Cidr;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a network in CIDR notation, e.g. 10.1.0.0/24")
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Cidr, E> {
                s.parse().map_err(E::custom)
            }
        }

        // A visitor, not `try_from`, so that the error carries the field's path.
        deserializer.deserialize_str(CidrVisitor)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn contains_addresses_of_its_own_family_only() {
        let net: Cidr = "10.1.0.0/24".parse().unwrap();
        assert!(net.contains(ip("10.1.0.0")));
        assert!(net.contains(ip("10.1.0.255")));
        assert!(!net.contains(ip("10.1.1.0")));
        assert!(!net.contains(ip("::ffff:10.1.0.1")));
        let v6: Cidr = "fd00:1::/64".parse().unwrap();
        assert!(v6.contains(ip("fd00:1::42")));
        assert!(!v6.contains(ip("fd00:2::42")));
        assert!(!v6.contains(ip("10.1.0.1")));
    }

    #[test]
    fn edge_prefixes() {
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("192.0.2.1")));
        assert!("::/0".parse::<Cidr>().unwrap().contains(ip("2001:db8::1")));
        let host: Cidr = "192.0.2.7/32".parse().unwrap();
        assert!(host.contains(ip("192.0.2.7")));
        assert!(!host.contains(ip("192.0.2.6")));
        assert_eq!(host.to_string(), "192.0.2.7/32");
    }

    #[test]
    fn refuses_malformed_networks() {
        for (bad, why) in [
            ("10.1.0.0", "address/prefix"),
            ("10.1.0/24", "address does not parse"),
            ("10.1.0.0/x", "not a number"),
            ("10.1.0.0/33", "longer"),
            ("fd00::/129", "longer"),
            ("10.1.0.1/24", "host bits"),
        ] {
            let err = bad.parse::<Cidr>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
