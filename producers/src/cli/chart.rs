//! Helm charts on the command line: a chart archive checked with the real helm before it is
//! registered (`package upload --kind helm-chart`), and a site's render printed (`package
//! render`).

use std::path::Path;

use anyhow::Context;
use bus_schema::pb;
use consumers::helm::{Helm, HelmError, Template, traits};
use serde_json::Value;

/// Why a chart was refused at registration: helm's own words.
#[derive(Debug)]
pub struct ChartRefused(pub String);

impl std::fmt::Display for ChartRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ChartRefused {}

/// Whether helm's refusal may be the values each site's design will give: a value the chart
/// requires (`required`, a template that needs it) or a property its schema requires.
fn wants_site_values(said: &str) -> bool {
    let schema = "values don't meet the specifications of the schema";
    if said.contains(schema) {
        let problems: Vec<&str> = said.lines().filter(|l| l.trim_start().starts_with("- at ")).collect();
        return !problems.is_empty() && problems.iter().all(|l| l.contains("missing property"));
    }
    said.contains("execution error at")
}

/// `chart` completed from the archive at `file`: its name and version, and whether it uses
/// `lookup` or makes random values. The archive is rendered once with the package's values:
/// a chart helm cannot render is refused with helm's message, unless what it lacks is a value
/// the sites' designs may give (that is said, and the chart is registered).
///
/// # Errors
/// [`ChartRefused`] (inside the error) when helm refuses the chart; others when helm cannot run.
pub async fn checked(file: &Path, mut chart: pb::HelmChart) -> anyhow::Result<pb::HelmChart> {
    let helm = Helm::locate().map_err(anyhow::Error::msg)?;
    let refused = |e: HelmError| match e {
        HelmError::Refused(said) => anyhow::Error::new(ChartRefused(said)),
        e => anyhow::Error::new(e),
    };
    let meta = helm.chart(file).await.map_err(refused)?;
    let found = traits(file).await.map_err(refused)?;
    let values: Value = match chart.values.trim() {
        "" => Value::Object(Default::default()),
        text => bus_schema::yaml::from_str(text).context("--values")?,
    };
    let trial = Template {
        chart: file,
        release: &chart.release,
        namespace: &chart.namespace,
        values: std::slice::from_ref(&values),
        kube_version: None,
        api_versions: &[],
    };
    match helm.template(&trial).await {
        Ok(_) => {}
        Err(HelmError::Refused(said)) if wants_site_values(&said) => {
            eprintln!(
                "note: {} {} renders only with values the sites' designs give (a site whose design lacks them is \
                 refused at its render, nothing applied): {said}",
                meta.name, meta.version
            );
        }
        Err(e) => return Err(refused(e)),
    }
    if !found.lookup.is_empty() {
        eprintln!(
            "note: {} calls lookup ({}): rendered at the hub, without the cluster, it finds nothing",
            meta.name,
            found.lookup.join(", ")
        );
    }
    if !found.random.is_empty() {
        eprintln!(
            "note: {} makes random values ({}): each site's render is made once and kept until its chart or \
             values change",
            meta.name,
            found.random.join(", ")
        );
    }
    chart.chart_name = meta.name;
    chart.chart_version = meta.version;
    chart.uses_lookup = !found.lookup.is_empty();
    chart.makes_random = !found.random.is_empty();
    Ok(chart)
}

/// Refuses a chart with helm's reason, for the caller's exit code.
pub fn refusal(e: &anyhow::Error) -> Option<String> {
    e.downcast_ref::<ChartRefused>().map(|r| r.0.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_site_may_still_give_is_told_from_what_is_wrong() {
        let missing = "values don't meet the specifications of the schema(s) in the following chart(s):\nc:\n- at '': missing property 'site'\n";
        let wrong = "values don't meet the specifications of the schema(s) in the following chart(s):\nc:\n- at '/replicas': minimum: got 0, want 1\n";
        assert!(wants_site_values(missing));
        assert!(!wants_site_values(wrong));
        assert!(wants_site_values("execution error at (c/templates/cm.yaml:4:20): site.name is required"));
        assert!(!wants_site_values("parse error at (c/templates/bad.yaml:2): unclosed action"));
    }
}
