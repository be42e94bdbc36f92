//! Provisioning hosts through Metal3: the intent the gateway applies to a BareMetalHost (its
//! image, its user data, and for a host the site lacks its BMC and credentials), and following
//! the host until Metal3 is done with it or reports an error.

use std::collections::BTreeMap;

use bus_schema::domain::{NodeDesign, Role};
use bus_schema::host_setup::kernel_command_line;
use bus_schema::pb;
use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tracing::{debug, info};

use super::error::kube_error;
use super::marks::{self, FIELD_MANAGER, add_finalizer};
use super::metal3::BareMetalHost;
use super::ownership::intent_of;
use super::{KubeSite, UserData};
use crate::backend::{BackendError, HostRequest, ProvisioningState};

impl KubeSite {
    pub(super) async fn host(&self, name: &str) -> Result<Option<BareMetalHost>, BackendError> {
        self.hosts.get_opt(name).await.map_err(|e| kube_error(&format!("BareMetalHost {name}"), e))
    }

    /// Applies `intent` (the whole of what the gateway owns of the host) to host `name`.
    async fn apply_host(&self, name: &str, intent: &Value) -> Result<BareMetalHost, BackendError> {
        let params = PatchParams::apply(FIELD_MANAGER);
        self.hosts
            .patch(name, &params, &Patch::Apply(intent))
            .await
            .map_err(|e| kube_error(&format!("BareMetalHost {name}"), e))
    }

    /// Sets the host's `automatedCleaningMode` when the design names one and the host says
    /// otherwise (unspecified: the host's own stays, Metal3's default `metadata` when unset). A
    /// merge patch, not part of the host's applied intent: the CRD's default is the creator's,
    /// and the design's word on this field is meant to replace it.
    pub(super) async fn set_cleaning(&self, name: &str, cleaning: pb::CleaningMode) -> Result<(), BackendError> {
        let mode = match cleaning {
            pb::CleaningMode::Metadata => "metadata",
            pb::CleaningMode::Disabled => "disabled",
            pb::CleaningMode::Unspecified => return Ok(()),
        };
        let Some(host) = self.host(name).await? else { return Ok(()) };
        if host.spec.automated_cleaning_mode.as_deref() == Some(mode) {
            return Ok(());
        }
        let params = PatchParams { field_manager: Some(FIELD_MANAGER.to_string()), ..Default::default() };
        let body = json!({"spec": {"automatedCleaningMode": mode}});
        self.hosts
            .patch(name, &params, &Patch::Merge(&body))
            .await
            .map_err(|e| kube_error(&format!("BareMetalHost {name}"), e))?;
        info!(site = %self.cfg.site, host = name, mode, "cleaning mode set as the design says");
        Ok(())
    }

    pub(super) async fn apply_secret(
        &self,
        name: &str,
        data: BTreeMap<String, ByteString>,
        purpose: &str,
    ) -> Result<(), BackendError> {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.cfg.namespace.clone()),
                labels: Some(BTreeMap::from([(marks::PURPOSE_LABEL.to_string(), purpose.to_string())])),
                ..Default::default()
            },
            type_: Some("Opaque".into()),
            data: Some(data),
            ..Default::default()
        };
        let mut body = serde_json::to_value(&secret).unwrap_or(Value::Null);
        body["apiVersion"] = json!("v1");
        body["kind"] = json!("Secret");
        let params = PatchParams::apply(FIELD_MANAGER);
        self.secrets
            .patch(name, &params, &Patch::Apply(&body))
            .await
            .map_err(|e| kube_error(&format!("Secret {name}"), e))?;
        Ok(())
    }

    /// The user data Secret `node` references, written first when the gateway generates it.
    ///
    /// The design's kernel parameters go in there: a GRUB drop-in appending them to the kernel
    /// command line (`/etc/default/grub.d/`, as Debian and Ubuntu images read it), `update-grub`,
    /// and one reboot at the end of the first boot. User data the site keeps itself cannot carry
    /// them, so a node with kernel parameters is refused there rather than booted without them.
    async fn user_data_for(&self, node: &NodeDesign) -> Result<String, BackendError> {
        let params = &node.kernel_parameters;
        let node = node.name.as_str();
        match &self.cfg.user_data {
            UserData::Existing(name) if !params.is_empty() => Err(BackendError::permanent_reason(format!(
                "the design gives {node} kernel parameters ({}), but its user data is the site's own Secret {name}, \
                 which landfall does not write: generate the user data (--ssh-authorized-keys) or set them in {name}",
                kernel_command_line(params)
            ))),
            UserData::Existing(name) => Ok(name.clone()),
            UserData::Generated { ssh_authorized_keys } => {
                let name = marks::user_data_secret(node);
                let mut cloud_config = format!("#cloud-config\nhostname: {node}\n");
                if !ssh_authorized_keys.is_empty() {
                    cloud_config.push_str("ssh_authorized_keys:\n");
                    for key in ssh_authorized_keys {
                        cloud_config.push_str(&format!("  - {key}\n"));
                    }
                }
                if !params.is_empty() {
                    // Checked on arrival: nothing in them can quote, expand or end the line.
                    let line = kernel_command_line(params);
                    cloud_config.push_str(&format!(
                        "write_files:\n  - path: /etc/default/grub.d/90-landfall.cfg\n    content: |\n      \
                         GRUB_CMDLINE_LINUX_DEFAULT=\"$GRUB_CMDLINE_LINUX_DEFAULT {line}\"\n\
                         runcmd:\n  - [update-grub]\npower_state:\n  mode: reboot\n  condition: true\n"
                    ));
                }
                let data = BTreeMap::from([("userData".to_string(), ByteString(cloud_config.into_bytes()))]);
                self.apply_secret(&name, data, "user-data").await?;
                Ok(name)
            }
        }
    }

    /// The intent of a host the site does not have yet: the gateway creates it from the design,
    /// with its BMC credentials in a Secret of its own.
    async fn new_host_intent(&self, req: &HostRequest) -> Result<Value, BackendError> {
        let name = req.node.name.as_str();
        let Some(bmc) = &req.bmc else {
            if req.bmc_out_of_reach {
                return Err(BackendError::transient_reason(format!(
                    "host {name} has no BareMetalHost, and its BMC credentials wait for the hub to be reachable"
                )));
            }
            return Err(BackendError::permanent_reason(format!(
                "host {name} has no BareMetalHost and the hub holds no BMC credentials to create one (landfall bmc set)"
            )));
        };
        let credentials = marks::bmc_secret(name);
        let data = BTreeMap::from([
            ("username".to_string(), ByteString(bmc.username.clone().into_bytes())),
            ("password".to_string(), ByteString(bmc.password.clone().into_bytes())),
        ]);
        self.apply_secret(&credentials, data, "bmc-credentials").await?;
        Ok(json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": name, "namespace": self.cfg.namespace,
                         "labels": {marks::ROLE_LABEL: role_label(req.node.role)}},
            // `online` is required by the CRD: a host first registered without its image (to be
            // inspected for its network data) must carry it already.
            "spec": {"online": true, "bootMACAddress": req.node.boot_mac.as_str(),
                     "bmc": {"address": req.node.bmc_address.as_str(), "credentialsName": credentials}},
        }))
    }

    pub(super) fn image_url(&self, sha256: &str) -> String {
        let base = self.cfg.image_base_url.trim_end_matches('/');
        format!("{base}/sha256/{sha256}")
    }

    /// The host of `req` as the gateway wants it before an image goes on: created when the
    /// site lacks it, inspected when its network data needs its NICs, its root device hints
    /// and network data set. Returns the intent (not applied yet) and the state the host was
    /// in first, which is sent on `progress`.
    async fn prepare_host(
        &self,
        req: &HostRequest,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(Value, Option<ProvisioningState>), BackendError> {
        let name = req.node.name.as_str();
        let existing = self.host(name).await?;
        // The state before the image goes on is the first one reported: Metal3 may have moved on
        // by the time the watch below starts.
        let before = existing.as_ref().and_then(BareMetalHost::state);
        if let Some(s) = before {
            let _ = progress.send(s);
        }
        let mut intent = match &existing {
            Some(host) => intent_of(host, FIELD_MANAGER),
            None => self.new_host_intent(req).await?,
        };
        // The network data names the host's ports by the MACs inspection finds: a host not
        // inspected yet is registered without an image first, and waited for.
        let has_nics = |h: &BareMetalHost| {
            h.status.as_ref().and_then(|s| s.hardware.as_ref()).is_some_and(|hw| !hw.nics.is_empty())
        };
        intent["metadata"]["annotations"][marks::NODE] = json!(name);
        let mut existing = existing;
        if req.node.network.is_some() && !existing.as_ref().is_some_and(has_nics) {
            add_finalizer(&mut intent);
            self.apply_host(name, &intent).await?;
            info!(site = %self.cfg.site, host = name, "waiting for inspection: the host's network data needs its NICs");
            self.follow(name, progress, before, has_nics).await?;
            existing = self.host(name).await?;
        }
        self.set_up_host(&req.node, existing.as_ref(), &mut intent["spec"]).await?;
        add_finalizer(&mut intent);
        Ok((intent, before))
    }

    /// Sets the host's image (with its user data, online) and follows it to `provisioned`.
    ///
    /// For a site Cluster API builds (`enroll_only`), the host is enrolled instead: prepared
    /// the same way and labelled with its role (what the machine templates select hosts by),
    /// but given no image. CAPM3 claims it for a machine and writes the image and bootstrap
    /// data; this follows the host until Metal3 has provisioned it with `req`'s image.
    ///
    /// # Errors
    /// For an enrollment, `Permanent` before anything is written when the bootstrap cluster
    /// does not serve the Cluster API and CAPM3 kinds landfall writes.
    pub(super) async fn provision(
        &self,
        req: &HostRequest,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        if req.enroll_only {
            self.served().await?;
        }
        let name = req.node.name.as_str();
        let (mut intent, before) = self.prepare_host(req, progress).await?;
        let url = self.image_url(&req.image.checksum);
        intent["spec"]["online"] = json!(true);
        if req.enroll_only {
            intent["metadata"]["labels"][marks::ROLE_LABEL] = json!(role_label(req.node.role));
        } else {
            let user_data = self.user_data_for(&req.node).await?;
            let spec = &mut intent["spec"];
            spec["image"] = json!({"url": url, "checksum": req.image.checksum,
                                   "checksumType": req.image.checksum_type, "format": req.image.format});
            spec["userData"] = json!({"name": user_data, "namespace": self.cfg.namespace});
        }
        self.apply_host(name, &intent).await?;
        self.set_cleaning(name, req.node.cleaning).await?;
        match req.enroll_only {
            true => {
                info!(site = %self.cfg.site, host = name, "enrolled for Cluster API: waiting for a machine to claim it")
            }
            false => info!(site = %self.cfg.site, host = name, %url, "image set"),
        }
        self.follow(name, progress, before, |host| {
            host.state() == Some(ProvisioningState::Provisioned)
                && host.provisioned_image().is_some_and(|i| i.url == url)
        })
        .await?;
        let p = &req.package;
        self.record_versions(name, [(p.name.as_str(), p.version.as_str())]).await
    }

    /// Takes the image off the host (Metal3 deprovisions it) and waits until it is available,
    /// sending each state it passes on `progress`.
    pub(super) async fn deprovision(
        &self,
        name: &str,
        cleaning: pb::CleaningMode,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
    ) -> Result<(), BackendError> {
        let Some(host) = self.host(name).await? else {
            return Err(BackendError::permanent_reason(format!("host {name} has no BareMetalHost")));
        };
        // Reported from the state it is in, unless that is the image it is losing: a reimage
        // taken up again (its gateway died halfway) says where it stands.
        let before = host.state();
        if let Some(s) = before.filter(|s| *s != ProvisioningState::Provisioned) {
            let _ = progress.send(s);
        }
        let mut intent = intent_of(&host, FIELD_MANAGER);
        if let Some(spec) = intent.get_mut("spec").and_then(Value::as_object_mut) {
            spec.remove("image");
        }
        // How the disks are cleaned as the image comes off, when the design says: set before.
        self.set_cleaning(name, cleaning).await?;
        self.apply_host(name, &intent).await?;
        self.follow(name, progress, before, |h| {
            h.state() == Some(ProvisioningState::Available) && h.spec.image.as_ref().is_none_or(|i| i.url.is_empty())
        })
        .await
    }

    /// Watches host `name`, sending each new state on `progress` (`last`: the one sent already),
    /// until `done` holds, Metal3 reports an error for it, or the provisioning timeout passes.
    async fn follow(
        &self,
        name: &str,
        progress: &mpsc::UnboundedSender<ProvisioningState>,
        mut last: Option<ProvisioningState>,
        done: impl Fn(&BareMetalHost) -> bool,
    ) -> Result<(), BackendError> {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut updates = watcher(self.hosts.clone(), config).default_backoff().applied_objects().boxed();
        let deadline = tokio::time::sleep(self.cfg.provision_timeout);
        tokio::pin!(deadline);
        loop {
            let host = tokio::select! {
                _ = &mut deadline => {
                    let state = last.map_or("unknown".to_string(), |s: ProvisioningState| s.to_string());
                    return Err(BackendError::permanent_reason(format!(
                        "host {name} did not get there within {:?} (last state: {state})", self.cfg.provision_timeout
                    )));
                }
                next = updates.next() => match next {
                    Some(Ok(host)) => host,
                    Some(Err(e)) => { debug!(host = name, error = %e, "watch interrupted; resuming"); continue }
                    None => return Err(BackendError::transient_reason(format!("watch of host {name} ended"))),
                },
            };
            let state = host.state();
            if state.is_some() && state != last {
                last = state;
                if let Some(s) = state {
                    let _ = progress.send(s);
                }
            }
            if let Some((error_type, message)) = host.error() {
                return Err(BackendError::HostFailed {
                    host: name.to_string(),
                    error_type: error_type.to_string(),
                    message: message.to_string(),
                });
            }
            if done(&host) {
                return Ok(());
            }
        }
    }

    /// Notes on the host which version of each package it runs (`landfall.io/pkg.<name>`).
    pub(super) async fn record_versions<'a>(
        &self,
        name: &str,
        packages: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<(), BackendError> {
        let Some(host) = self.host(name).await? else { return Ok(()) };
        let mut intent = intent_of(&host, FIELD_MANAGER);
        let before = intent.clone();
        for (package, version) in packages {
            intent["metadata"]["annotations"][marks::package(package)] = json!(version);
        }
        if intent != before {
            self.apply_host(name, &intent).await?;
        }
        Ok(())
    }

    /// The version of `package` the host runs, as its annotation says.
    pub(super) fn version_on(host: &BareMetalHost, package: &str) -> Option<String> {
        host.annotations().get(&marks::package(package)).cloned()
    }
}

fn role_label(role: Role) -> &'static str {
    match role {
        Role::Master => "master",
        Role::Worker => "worker",
    }
}

#[cfg(test)]
mod tests {
    use bus_schema::domain::{NodeDesign, Package};
    use bus_schema::pb;
    use http::{Method, StatusCode};

    use super::*;
    use crate::backend::BmcCredentials;
    use crate::kube_site::testing::{APPLY_QUERY, b64, mocked, next};

    fn request(bmc: Option<BmcCredentials>) -> HostRequest {
        let node = NodeDesign {
            name: "n1".try_into().unwrap(),
            role: Role::Worker,
            boot_mac: "52:54:00:00:00:01".to_string().try_into().unwrap(),
            bmc_address: "redfish://10.0.0.1/redfish/v1/Systems/1".to_string().try_into().unwrap(),
            labels: BTreeMap::new(),
            network: None,
            root_device: None,
            kernel_parameters: Default::default(),
            cleaning: Default::default(),
        };
        let package = Package {
            name: "ubuntu".try_into().unwrap(),
            version: "22.04".try_into().unwrap(),
            kind: pb::PackageKind::OsImage,
            sha256: "ab".repeat(32).try_into().unwrap(),
            size: 1,
            object_key: String::new(),
            chart: None,
            render: None,
        };
        let mut req = HostRequest::new(node, &package);
        req.bmc = bmc;
        req
    }

    #[tokio::test]
    async fn a_host_the_site_lacks_gets_its_bmc_credentials_in_a_secret_of_its_own() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let creds = BmcCredentials { username: "admin".into(), password: "s3cret!".into() };
        let server = tokio::spawn(async move { next(&mut handle, (StatusCode::OK, json!({}))).await });
        let intent = site.new_host_intent(&request(Some(creds))).await.unwrap();
        let (method, uri, body) = server.await.unwrap();
        assert_eq!(
            (method, uri.as_str()),
            (Method::PATCH, format!("/api/v1/namespaces/metal3/secrets/n1-bmc-secret{APPLY_QUERY}").as_str())
        );
        assert_eq!(
            body,
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                   "metadata": {"name": "n1-bmc-secret", "namespace": "metal3", "labels": {"landfall.io/purpose": "bmc-credentials"}},
                   "data": {"username": b64("admin"), "password": b64("s3cret!")}})
        );
        assert_eq!(
            intent["spec"]["bmc"],
            json!({"address": "redfish://10.0.0.1/redfish/v1/Systems/1", "credentialsName": "n1-bmc-secret"})
        );
        assert_eq!(intent["spec"]["bootMACAddress"], json!("52:54:00:00:00:01"));
        assert_eq!(intent["spec"]["online"], json!(true), "the CRD requires it");
        assert_eq!(intent["metadata"]["labels"], json!({marks::ROLE_LABEL: "worker"}));
    }

    #[tokio::test]
    async fn without_credentials_no_host_is_created_and_nothing_is_written() {
        let (site, mut handle, _dir) = mocked(UserData::Existing("ud".into()));
        let err = site.new_host_intent(&request(None)).await.unwrap_err();
        assert!(matches!(&err, BackendError::Permanent { .. } if err.reason().contains("landfall bmc set")), "{err}");
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(100), handle.next_request()).await;
        assert!(quiet.is_err(), "a request was made");
    }

    #[tokio::test]
    async fn kernel_parameters_go_in_the_generated_user_data_as_a_grub_drop_in_and_one_reboot() {
        let (site, mut handle, _dir) = mocked(UserData::Generated { ssh_authorized_keys: vec![] });
        let server = tokio::spawn(async move { next(&mut handle, (StatusCode::OK, json!({}))).await });
        let mut node = request(None).node;
        node.kernel_parameters = [("isolcpus", "2-7"), ("nosmt", "")].map(|(k, v)| (k.into(), v.into())).into();
        assert_eq!(site.user_data_for(&node).await.unwrap(), "n1-user-data");
        let (_, _, body) = server.await.unwrap();
        let cloud_config = "#cloud-config\nhostname: n1\nwrite_files:\n  - path: /etc/default/grub.d/90-landfall.cfg\n    \
                            content: |\n      GRUB_CMDLINE_LINUX_DEFAULT=\"$GRUB_CMDLINE_LINUX_DEFAULT isolcpus=2-7 nosmt\"\n\
                            runcmd:\n  - [update-grub]\npower_state:\n  mode: reboot\n  condition: true\n";
        assert_eq!(body["data"], json!({"userData": b64(cloud_config)}));
    }

    #[tokio::test]
    async fn generated_user_data_is_a_secret_per_host_with_its_hostname_and_keys() {
        let keys = vec!["ssh-ed25519 AAAAC3Nza landfall@hub".to_string()];
        let (site, mut handle, _dir) = mocked(UserData::Generated { ssh_authorized_keys: keys });
        let server = tokio::spawn(async move { next(&mut handle, (StatusCode::OK, json!({}))).await });
        assert_eq!(site.user_data_for(&request(None).node).await.unwrap(), "n1-user-data");
        let (method, uri, body) = server.await.unwrap();
        assert_eq!(
            (method, uri.as_str()),
            (Method::PATCH, format!("/api/v1/namespaces/metal3/secrets/n1-user-data{APPLY_QUERY}").as_str())
        );
        let cloud_config =
            "#cloud-config\nhostname: n1\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3Nza landfall@hub\n";
        assert_eq!(body["data"], json!({"userData": b64(cloud_config)}));
        assert_eq!(body["metadata"]["labels"], json!({"landfall.io/purpose": "user-data"}));

        let (existing, mut quiet, _dir) = mocked(UserData::Existing("site-user-data".into()));
        let mut tuned = request(None).node;
        tuned.kernel_parameters = [("isolcpus", "2-7"), ("nosmt", "")].map(|(k, v)| (k.into(), v.into())).into();
        let err = existing.user_data_for(&tuned).await.unwrap_err();
        assert!(matches!(err, BackendError::Permanent { .. }), "{err}");
        assert!(err.reason().contains("kernel parameters (isolcpus=2-7 nosmt)"), "{err}");
        assert_eq!(existing.user_data_for(&request(None).node).await.unwrap(), "site-user-data");
        assert!(tokio::time::timeout(std::time::Duration::from_millis(100), quiet.next_request()).await.is_err());
    }
}
