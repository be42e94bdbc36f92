//! The Metal3 `BareMetalHost` (`metal3.io/v1alpha1`), the fields the gateway reads, with the
//! names and shapes of the upstream CRD (`deploy/crds/metal3/metal3.io_baremetalhosts.yaml`).
//!
//! These types are for reading: every field is optional, and unknown fields are ignored, so a
//! newer Metal3 still parses. Writes go through server-side apply of exactly the fields the
//! gateway owns ([`super::ownership`]), never a whole typed object.

use bus_schema::pb;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::backend::ProvisioningState;

#[derive(CustomResource, Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[kube(group = "metal3.io", version = "v1alpha1", kind = "BareMetalHost", namespaced, schema = "disabled")]
#[kube(status = "BareMetalHostStatus")]
#[serde(rename_all = "camelCase")]
pub struct BareMetalHostSpec {
    #[serde(default)]
    pub online: bool,
    #[serde(rename = "bootMACAddress", default, skip_serializing_if = "Option::is_none")]
    pub boot_mac_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_device_hints: Option<RootDeviceHints>,
    /// `metadata` or `disabled`: how Metal3 cleans the disks when the image comes off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automated_cleaning_mode: Option<String>,
    /// Who has claimed the host: CAPM3 names the `Metal3Machine` it provisions the host for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_ref: Option<ConsumerRef>,
}

/// `spec.consumerRef` (the fields landfall reads).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerRef {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
}

/// `spec.rootDeviceHints`: the disk the image is written to (the fields landfall sets).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RootDeviceHints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size_gigabytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BmcDetails {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub credentials_name: String,
}

/// `spec.image`, and `status.provisioning.image` (what was last provisioned).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Image {
    #[serde(default)]
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretReference {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BareMetalHostStatus {
    #[serde(default)]
    pub operational_status: String,
    #[serde(default)]
    pub error_type: String,
    #[serde(default)]
    pub error_message: String,
    #[serde(default)]
    pub error_count: i64,
    #[serde(default)]
    pub provisioning: Provisioning,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<HardwareDetails>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Provisioning {
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<Image>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_vendor: Option<HardwareSystemVendor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_mebibytes: Option<u64>,
    #[serde(default)]
    pub nics: Vec<Nic>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareSystemVendor {
    #[serde(default)]
    pub manufacturer: String,
    #[serde(default)]
    pub product_name: String,
    #[serde(default)]
    pub serial_number: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Nic {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub speed_gbps: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub count: u32,
}

/// The `status.operationalStatus` of a host Metal3 has given up on until something changes.
pub const OPERATIONAL_ERROR: &str = "error";

impl BareMetalHost {
    /// Whether Cluster API holds the host: CAPM3 claimed it for a `Metal3Machine`.
    pub fn claimed_by_machine(&self) -> bool {
        self.spec.consumer_ref.as_ref().is_some_and(|c| c.kind == "Metal3Machine")
    }

    /// `status.provisioning.state`, parsed; `None` before Metal3 wrote one (or one unknown here).
    pub fn state(&self) -> Option<ProvisioningState> {
        self.status.as_ref().and_then(|s| ProvisioningState::parse(&s.provisioning.state))
    }

    /// Metal3's error for the host (`errorType`, `errorMessage`), when its operational status
    /// is `error`.
    pub fn error(&self) -> Option<(&str, &str)> {
        let s = self.status.as_ref()?;
        (s.operational_status == OPERATIONAL_ERROR || !s.error_type.is_empty())
            .then_some((s.error_type.as_str(), s.error_message.as_str()))
    }

    /// The image Metal3 last provisioned the host with.
    pub fn provisioned_image(&self) -> Option<&Image> {
        self.status.as_ref()?.provisioning.image.as_ref()
    }

    /// The address inspection saw on the NIC with this MAC (compared case-insensitively).
    pub fn ip_of(&self, mac: &str) -> Option<&str> {
        let hw = self.status.as_ref()?.hardware.as_ref()?;
        hw.nics.iter().find(|n| n.mac.eq_ignore_ascii_case(mac) && !n.ip.is_empty()).map(|n| n.ip.as_str())
    }

    /// Whether inspection is over: the host has hardware details, or it is in a state that
    /// comes after inspection (a host whose inspection is disabled never gets details).
    pub fn inspected(&self) -> bool {
        use ProvisioningState as S;
        let has_hardware = self.status.as_ref().is_some_and(|s| s.hardware.is_some());
        has_hardware
            || matches!(
                self.state(),
                Some(S::Preparing | S::Available | S::Provisioning | S::Provisioned | S::ExternallyProvisioned)
            )
    }

    /// What inspection found, in the bus's terms.
    pub fn hardware(&self) -> Option<pb::HostHardware> {
        let hw = self.status.as_ref()?.hardware.as_ref()?;
        let vendor = hw.system_vendor.clone().unwrap_or_default();
        let cpu = hw.cpu.clone().unwrap_or_default();
        Some(pb::HostHardware {
            cpu_count: cpu.count,
            cpu_model: cpu.model,
            ram_mib: hw.ram_mebibytes.unwrap_or_default(),
            nics: hw
                .nics
                .iter()
                .map(|n| pb::HostNic {
                    name: n.name.clone(),
                    mac: n.mac.clone(),
                    ip: n.ip.clone(),
                    speed_gbps: n.speed_gbps,
                })
                .collect(),
            manufacturer: vendor.manufacturer,
            product_name: vendor.product_name,
            serial_number: vendor.serial_number,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_as_metal3_writes_it_parses() {
        let host: BareMetalHost = serde_json::from_value(serde_json::json!({
            "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": "node-1", "namespace": "site"},
            "spec": {"online": true, "bootMACAddress": "52:54:00:00:00:01",
                     "bmc": {"address": "ipmi://10.0.0.1", "credentialsName": "node-1-bmc"},
                     "automatedCleaningMode": "metadata", "somethingNew": {"x": 1}},
            "status": {"operationalStatus": "OK", "errorMessage": "", "errorCount": 0, "poweredOn": true,
                       "provisioningFailCount": 0,
                       "provisioning": {"ID": "abc", "state": "available"},
                       "hardware": {"cpu": {"arch": "x86_64", "model": "Xeon", "count": 32, "clockMegahertz": 2400.5},
                                    "ramMebibytes": 131072,
                                    "systemVendor": {"manufacturer": "Dell", "productName": "R640", "serialNumber": "S1"},
                                    "nics": [{"name": "eno1", "mac": "52:54:00:00:00:01", "ip": "10.1.0.11", "speedGbps": 25},
                                             {"name": "eno2", "mac": "52:54:00:00:00:02", "ip": "", "pxe": false}]}}
        }))
        .unwrap();
        assert_eq!(host.state(), Some(ProvisioningState::Available));
        assert!(host.inspected());
        assert_eq!(host.error(), None);
        assert_eq!(host.ip_of("52:54:00:00:00:01"), Some("10.1.0.11"));
        assert_eq!(host.ip_of("52:54:00:00:00:02"), None, "a NIC without an address gives none");
        let hw = host.hardware().unwrap();
        assert_eq!((hw.cpu_count, hw.ram_mib, hw.nics.len(), hw.manufacturer.as_str()), (32, 131072, 2, "Dell"));
    }

    #[test]
    fn an_error_is_read_from_the_status() {
        let mut host = BareMetalHost::new("n", BareMetalHostSpec::default());
        host.status = Some(BareMetalHostStatus {
            operational_status: OPERATIONAL_ERROR.into(),
            error_type: "provisioning error".into(),
            error_message: "Image checksum mismatch".into(),
            ..Default::default()
        });
        assert_eq!(host.error(), Some(("provisioning error", "Image checksum mismatch")));
        assert!(!host.inspected());
    }
}
