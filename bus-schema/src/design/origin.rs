//! Which document a value or an error comes from: the document kinds, and an [`Origin`] (kind,
//! name, source and position) that errors and inherited values carry.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use super::error::DesignError;

/// The kinds of design document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
pub enum Kind {
    /// The site: labels, region, networks, cluster spec.
    Site,
    /// What a model of machine brings: interfaces, disks, labels.
    HardwareProfile,
    /// A layer of host configuration, inheriting from a parent.
    HostProfile,
    /// One machine.
    Node,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Site, Kind::HardwareProfile, Kind::HostProfile, Kind::Node];

    /// The kind as written in `kind:`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Site => "Site",
            Kind::HardwareProfile => "HardwareProfile",
            Kind::HostProfile => "HostProfile",
            Kind::Node => "Node",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            let all: Vec<_> = Kind::ALL.iter().map(|k| k.as_str()).collect();
            format!("{s:?} is not a kind ({})", all.join(", "))
        })
    }
}

/// Which document something comes from: its kind and name, its source and its position there.
///
/// Displays as `Kind/name`; [`Origin::location`] adds the source, e.g.
/// `HostProfile/control (profiles.yaml #2)`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin {
    /// The document's kind.
    pub kind: Kind,
    /// The document's name.
    pub name: String,
    /// Where the document was read from, e.g. a file name.
    pub source: String,
    /// The document's position in its source, from 1.
    pub index: usize,
}

impl Origin {
    /// `Kind/name (source #index)`: how errors name a document.
    pub fn location(&self) -> String {
        format!("{self} ({} #{})", self.source, self.index)
    }

    /// An error in this document's `field`.
    pub fn error(&self, field: impl Into<String>, reason: impl Into<String>) -> DesignError {
        DesignError::new(self.location(), field, reason)
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}
