//! Metal3's BareMetalHost state machine as the simulated site plays it, as plain decisions: the
//! state a new host walks to next, and what a provisioning request does given its host.

use super::state::{Attempt, Host, Image};
use crate::backend::ProvisioningState as S;

/// The state a new host walks to once it is done with `state`: registering → inspecting →
/// preparing → available. `None` once it is out of that walk.
pub(super) fn registration_next(state: S) -> Option<S> {
    match state {
        S::Registering => Some(S::Inspecting),
        S::Inspecting => Some(S::Preparing),
        S::Preparing => Some(S::Available),
        _ => None,
    }
}

/// What a request to provision a host with an image does, given the host as it is now.
#[derive(Debug)]
pub(super) enum Step<'a> {
    /// The host already runs the image.
    Done,
    /// The host is busy (registering, or provisioning another image); look again when its state changes.
    Wait,
    /// A provisioning with this image is under way: wait for its result.
    Join(&'a Attempt),
    /// Start a provisioning: from `provisioned` with another image, the disks are cleaned first
    /// (`deprovisioning`); from `available`, the image is written at once (`provisioning`).
    Start { redeploy: bool },
}

impl Step<'_> {
    /// The state a started provisioning puts its host in.
    pub(super) fn first_state(redeploy: bool) -> S {
        if redeploy { S::Deprovisioning } else { S::Provisioning }
    }
}

/// What provisioning `host` with `wanted` does now.
pub(super) fn provision_step<'a>(host: &'a Host, wanted: &Image) -> Step<'a> {
    if let Some(attempt) = &host.attempt {
        return if attempt.image == *wanted { Step::Join(attempt) } else { Step::Wait };
    }
    match host.state() {
        S::Provisioned if host.image.as_ref() == Some(wanted) => Step::Done,
        S::Provisioned => Step::Start { redeploy: true },
        S::Available => Step::Start { redeploy: false },
        _ => Step::Wait,
    }
}

#[cfg(test)]
mod tests {
    use bus_schema::domain::PackageRef;
    use tokio::sync::watch;

    use super::*;
    use crate::backend::ImageSpec;

    fn image(checksum: &str) -> Image {
        let spec = ImageSpec {
            url: format!("artifacts://os/{checksum}"),
            checksum: checksum.into(),
            checksum_type: "sha256".into(),
            format: "raw".into(),
        };
        let package = PackageRef { name: "ubuntu".try_into().unwrap(), version: checksum.try_into().unwrap() };
        Image { spec, package }
    }

    fn host(state: S, image: Option<Image>, attempt: Option<Image>) -> Host {
        let mut host = Host::in_state(state);
        host.image = image;
        host.attempt = attempt.map(|image| Attempt { image, done: watch::channel(None).1 });
        host
    }

    #[test]
    fn a_new_host_walks_registering_inspecting_preparing_available_and_rests() {
        let mut walk = vec![S::Registering];
        while let Some(next) = registration_next(*walk.last().unwrap()) {
            walk.push(next);
        }
        assert_eq!(walk, [S::Registering, S::Inspecting, S::Preparing, S::Available]);
        assert_eq!(registration_next(S::Provisioning), None);
    }

    #[test]
    fn provisioning_starts_only_from_a_resting_host_and_joins_the_same_image() {
        let (a, b) = (image("a"), image("b"));
        let step = |state, image, attempt| match provision_step(&host(state, image, attempt), &a) {
            Step::Done => "done",
            Step::Wait => "wait",
            Step::Join(attempt) if attempt.image == a => "join",
            Step::Join(_) => "join another",
            Step::Start { redeploy: false } => "start",
            Step::Start { redeploy: true } => "redeploy",
        };
        assert_eq!(step(S::Available, None, None), "start");
        assert_eq!(step(S::Provisioned, Some(a.clone()), None), "done");
        assert_eq!(step(S::Provisioned, Some(b.clone()), None), "redeploy");
        assert_eq!(step(S::Inspecting, None, None), "wait");
        assert_eq!(step(S::Provisioning, None, Some(a.clone())), "join");
        assert_eq!(step(S::Provisioning, None, Some(b)), "wait");
        assert_eq!((Step::first_state(true), Step::first_state(false)), (S::Deprovisioning, S::Provisioning));
    }
}
