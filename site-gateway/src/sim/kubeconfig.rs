//! The application cluster's kubeconfig at the simulated site: generated once, when the cluster
//! exists, with a random stand-in for a CA certificate and a bootstrap-token-like client token.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use tracing::debug;

use super::SimSite;
use super::state::no_cluster;
use super::timing::pause;
use crate::backend::BackendError;

/// The random bytes of a kubeconfig: its CA certificate's body, then its token.
const CA_BYTES: usize = 780;
const TOKEN_LEN: usize = 22;
type Random = [u8; CA_BYTES + TOKEN_LEN];

impl SimSite {
    /// The cluster's kubeconfig, generated the first time it is asked for once the cluster exists.
    pub(super) async fn cluster_kubeconfig(&self) -> Result<Vec<u8>, BackendError> {
        let master = {
            let st = self.inner.lock();
            if let Some(kubeconfig) = &st.kubeconfig {
                return Ok(kubeconfig.clone());
            }
            st.cluster_master.clone().ok_or_else(no_cluster)?
        };
        pause(self.inner.config.kubeconfig).await;
        let mut random: Random = [0; CA_BYTES + TOKEN_LEN];
        getrandom::fill(&mut random)
            .map_err(|e| BackendError::transient("no randomness for the cluster's kubeconfig", e))?;
        let mut guard = self.inner.lock();
        let st = &mut *guard;
        let kubeconfig = st.kubeconfig.get_or_insert_with(|| {
            st.effects.kubeconfigs_generated += 1;
            debug!(site = %self.inner.site, master, "kubeconfig generated");
            render(&self.inner.site, &master, &random)
        });
        Ok(kubeconfig.clone())
    }
}

const KUBECONFIG: &str = "\
apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://{master}.{site}.landfall.local:6443
  name: {site}
contexts:
- context:
    cluster: {site}
    user: landfall-admin@{site}
  name: landfall-admin@{site}
current-context: landfall-admin@{site}
preferences: {}
users:
- name: landfall-admin@{site}
  user:
    token: {token}
";

/// The kubeconfig of `site`'s cluster, whose API server runs on `master`, with a CA certificate
/// and a token made of `random`.
fn render(site: &str, master: &str, random: &Random) -> Vec<u8> {
    const ALNUM: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let (ca, token) = random.split_at(CA_BYTES);
    let der: Vec<u8> = [0x30, 0x82, 0x03, 0x0c].iter().chain(ca).copied().collect();
    let b64 = base64(&der);
    let lines: Vec<_> = b64.as_bytes().chunks(64).map(String::from_utf8_lossy).collect();
    let pem = format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"));
    let token: String = token.iter().map(|b| char::from(ALNUM[usize::from(*b) % ALNUM.len()])).collect();
    let (id, secret) = token.split_at(6);
    KUBECONFIG
        .replace("{master}", master)
        .replace("{site}", site)
        .replace("{token}", &format!("{id}.{secret}"))
        .replace("{ca}", &base64(pem.as_bytes()))
        .into_bytes()
}

/// Standard base64, with padding.
fn base64(data: &[u8]) -> String {
    STANDARD.encode(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SiteBackend;
    use crate::sim::testing::{package, provisioned_site};

    #[test]
    fn base64_is_standard_with_padding() {
        assert_eq!([base64(b"Man"), base64(b"Ma"), base64(b"M")], ["TWFu", "TWE=", "TQ=="]);
    }

    #[test]
    fn a_kubeconfig_names_its_master_and_site_and_carries_a_ca_and_a_token() {
        let random: Random = std::array::from_fn(|i| u8::try_from(i % 251).unwrap());
        let text = String::from_utf8(render("edge-01", "m-1", &random)).unwrap();
        assert!(text.contains("server: https://m-1.edge-01.landfall.local:6443"), "{text}");
        let token = text.lines().find_map(|l| l.trim().strip_prefix("token: ")).unwrap();
        let (id, secret) = token.split_once('.').unwrap();
        assert_eq!((id.len(), secret.len()), (6, 16));
        let ca = text.lines().find_map(|l| l.trim().strip_prefix("certificate-authority-data: ")).unwrap();
        let pem = String::from_utf8(STANDARD.decode(ca).unwrap()).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----\nMIIDDA") && pem.ends_with("-----END CERTIFICATE-----\n"));
        assert!(pem.lines().all(|l| l.len() <= 64), "{pem}");
        assert_eq!(render("edge-01", "m-1", &random), text.as_bytes(), "the same randomness, the same kubeconfig");
    }

    #[tokio::test(start_paused = true)]
    async fn the_cluster_kubeconfig_is_generated_once_and_containers_apply_once() {
        let (site, req) = provisioned_site().await;
        let containers = [package("cni", 'd', 5)];
        assert!(matches!(site.kubeconfig().await, Err(BackendError::Transient { .. })));
        assert!(matches!(site.apply_container_packages(&containers).await, Err(BackendError::Transient { .. })));
        site.install_binaries(&req).await.unwrap();
        let first = String::from_utf8(site.kubeconfig().await.unwrap()).unwrap();
        assert!(first.contains("server: https://m-1.edge-01.landfall.local:6443"), "{first}");
        assert!(first.contains("kind: Config") && first.contains("current-context: landfall-admin@edge-01"));
        assert_eq!(site.kubeconfig().await.unwrap(), first.as_bytes());
        site.apply_container_packages(&containers).await.unwrap();
        site.apply_container_packages(&containers).await.unwrap();
        let effects = site.effects();
        assert_eq!((effects.kubeconfigs_generated, effects.container_applies), (1, 1));
    }
}
