//! The one error type of design handling: which document, which field, why.

/// One problem found in a design, located in the document that causes it.
///
/// `document` names the kind, the name, the source and the position of the document in its
/// source, e.g. `Node/node-3 (site.yaml #4)`; `field` is the field path as written in YAML, e.g.
/// `addressing[provisioning].ip`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, thiserror::Error)]
#[error("{document}: {field}: {reason}")]
pub struct DesignError {
    /// The document at fault, e.g. `HostProfile/control (profiles.yaml #2)`.
    pub document: String,
    /// The field at fault, as written in YAML.
    pub field: String,
    /// Why the value is refused.
    pub reason: String,
}

impl DesignError {
    /// An error in `document`'s `field`.
    pub fn new(document: impl Into<String>, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { document: document.into(), field: field.into(), reason: reason.into() }
    }
}

/// Collects errors in the order they are found, each once.
#[derive(Debug, Default)]
pub(crate) struct Errors(Vec<DesignError>);

impl Errors {
    /// Records `error` unless the same error is already recorded.
    pub(crate) fn push(&mut self, error: DesignError) {
        if !self.0.contains(&error) {
            self.0.push(error);
        }
    }

    pub(crate) fn extend(&mut self, errors: impl IntoIterator<Item = DesignError>) {
        for error in errors {
            self.push(error);
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn into_vec(self) -> Vec<DesignError> {
        self.0
    }

    /// `Ok(value)` when nothing was recorded, else every recorded error.
    pub(crate) fn into_result<T>(self, value: T) -> Result<T, Vec<DesignError>> {
        if self.0.is_empty() { Ok(value) } else { Err(self.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_document_field_and_reason() {
        let e = DesignError::new("Node/node-3 (site.yaml #4)", "bootMac", "is used twice");
        assert_eq!(e.to_string(), "Node/node-3 (site.yaml #4): bootMac: is used twice");
    }

    #[test]
    fn collects_each_error_once_in_order() {
        let mut errors = Errors::default();
        errors.push(DesignError::new("b", "f", "r"));
        errors.push(DesignError::new("a", "f", "r"));
        errors.push(DesignError::new("b", "f", "r"));
        assert_eq!(
            errors.into_result(()).unwrap_err().iter().map(|e| e.document.as_str()).collect::<Vec<_>>(),
            ["b", "a"]
        );
    }
}
