//! npm packages the tests run under Node.js, installed into the cache by a script and named by an
//! environment variable (`scripts/test` exports each).

use std::path::PathBuf;

/// The `node_modules` directory `var` names, checked to hold `package`; a clear failure, never a
/// skip, when it does not (`how` says how to get it).
pub fn modules(var: &str, package: &str, how: &str) -> PathBuf {
    let modules = std::env::var_os(var)
        .filter(|m| !m.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{var} is not set; {how}"));
    assert!(
        modules.join(package).join("package.json").exists(),
        "{var}={} holds no {package}; {how}",
        modules.display()
    );
    modules
}
