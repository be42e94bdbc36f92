//! How long each step of the simulated site takes: the [`SimConfig`] presets, the time a host
//! spends in each Metal3 state, and the waiting itself.

use std::time::Duration;

use crate::backend::ProvisioningState as S;

/// How long each step of the simulated site takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// BareMetalHost `registering`: the BMC credentials are checked.
    pub registering: Duration,
    /// `inspecting`: Ironic boots the inspection ramdisk and reports the hardware.
    pub inspecting: Duration,
    /// `preparing`: RAID and firmware settings are applied.
    pub preparing: Duration,
    /// `provisioning`: the OS image is written and the host rebooted into it.
    pub provisioning: Duration,
    /// `deprovisioning`: the disks are cleaned.
    pub deprovisioning: Duration,
    /// BPA's binaries install, for the whole cluster (nodes install in parallel).
    pub install_binaries: Duration,
    /// Producing the application cluster's kubeconfig the first time.
    pub kubeconfig: Duration,
    /// Applying a set of container packages to the application cluster.
    pub apply_containers: Duration,
    /// Copying one missing artifact into the site's cache.
    pub stage_per_artifact: Duration,
}

impl SimConfig {
    /// Durations like those of a real site, in minutes.
    pub fn realistic() -> Self {
        let min = |m: f64| Duration::from_secs_f64(m * 60.0);
        Self {
            registering: min(1.0),
            inspecting: min(3.0),
            preparing: min(2.0),
            provisioning: min(8.0),
            deprovisioning: min(4.0),
            install_binaries: min(6.0),
            kubeconfig: min(0.5),
            apply_containers: min(1.5),
            stage_per_artifact: min(0.75),
        }
    }

    /// Tens to hundreds of milliseconds per step, for tests.
    pub fn fast() -> Self {
        let ms = Duration::from_millis;
        Self {
            registering: ms(20),
            inspecting: ms(50),
            preparing: ms(30),
            provisioning: ms(100),
            deprovisioning: ms(40),
            install_binaries: ms(80),
            kubeconfig: ms(10),
            apply_containers: ms(40),
            stage_per_artifact: ms(10),
        }
    }

    /// Every step takes no time.
    pub fn instant() -> Self {
        Self::fast().map(|_| Duration::ZERO)
    }

    /// Divides every duration by `factor`: `realistic().time_scale(60.0)` turns minutes into seconds.
    ///
    /// # Panics
    /// If `factor` is not a positive finite number.
    pub fn time_scale(self, factor: f64) -> Self {
        assert!(factor.is_finite() && factor > 0.0, "time scale must be positive and finite, got {factor}");
        self.map(|d| d.div_f64(factor))
    }

    /// Replacing one binary on one node: a quarter of [`SimConfig::install_binaries`], which
    /// installs every binary and bootstraps the cluster.
    pub fn patch_binary(&self) -> Duration {
        self.install_binaries / 4
    }

    /// How long a host stays in `state` before Metal3 moves it on; nothing in a state it rests in.
    pub(super) fn dwell(&self, state: S) -> Duration {
        match state {
            S::Registering => self.registering,
            S::Inspecting => self.inspecting,
            S::Preparing => self.preparing,
            S::Provisioning => self.provisioning,
            S::Deprovisioning => self.deprovisioning,
            _ => Duration::ZERO,
        }
    }

    /// Handing `missing` artifacts the site does not have yet to its provisioning.
    pub(super) fn staging(&self, missing: usize) -> Duration {
        self.stage_per_artifact.saturating_mul(u32::try_from(missing).unwrap_or(u32::MAX))
    }

    fn map(self, f: impl Fn(Duration) -> Duration) -> Self {
        Self {
            registering: f(self.registering),
            inspecting: f(self.inspecting),
            preparing: f(self.preparing),
            provisioning: f(self.provisioning),
            deprovisioning: f(self.deprovisioning),
            install_binaries: f(self.install_binaries),
            kubeconfig: f(self.kubeconfig),
            apply_containers: f(self.apply_containers),
            stage_per_artifact: f(self.stage_per_artifact),
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self::fast()
    }
}

/// Waits `d`; a step that takes no time does not yield.
pub(super) async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_scale() {
        assert_eq!(SimConfig::realistic().time_scale(60.0).provisioning, Duration::from_secs(8));
        assert_eq!(SimConfig::instant().provisioning, Duration::ZERO);
    }

    #[test]
    fn a_host_dwells_only_in_the_states_metal3_moves_it_on_from() {
        let c = SimConfig::fast();
        assert_eq!(c.dwell(S::Inspecting), c.inspecting);
        assert_eq!(c.dwell(S::Deprovisioning), c.deprovisioning);
        assert_eq!(c.dwell(S::Available), Duration::ZERO);
        assert_eq!(c.dwell(S::Provisioned), Duration::ZERO);
    }

    #[test]
    fn staging_takes_its_time_per_missing_artifact() {
        let c = SimConfig::fast();
        assert_eq!(c.staging(0), Duration::ZERO);
        assert_eq!(c.staging(3), c.stage_per_artifact * 3);
        assert_eq!(c.staging(usize::MAX), c.stage_per_artifact * u32::MAX);
    }
}
