//! Field errors: what is wrong with one field of an object, named by its
//! path (`spec.containers[0].image`), as Kubernetes reports them in the
//! causes of an `Invalid` status.

use std::fmt;

/// What kind of problem a field has; the names are Kubernetes' cause types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `FieldValueRequired`
    Required,
    /// `FieldValueInvalid`, with the offending value as JSON.
    Invalid(String),
    /// `FieldValueDuplicate`, with the duplicated value.
    Duplicate(String),
    /// `FieldValueNotFound`, with the value that names nothing.
    NotFound(String),
    /// `FieldValueNotSupported`, with the value and the supported ones.
    NotSupported { value: String, supported: Vec<String> },
    /// `FieldValueForbidden`
    Forbidden,
    /// `FieldValueTooLong`, with the limit.
    TooLong(usize),
    /// `FieldValueTypeInvalid`: the JSON has the wrong shape for the type.
    TypeInvalid,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The path of the field, `spec.containers[0].image`.
    pub field: String,
    pub kind: FieldErrorKind,
    /// Why, in words; may be empty.
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::Required, detail: detail.into() }
    }

    /// `value` is shown as JSON, the way Kubernetes quotes strings.
    pub fn invalid(field: impl Into<String>, value: &serde_json::Value, detail: impl Into<String>) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::Invalid(value.to_string()), detail: detail.into() }
    }

    pub fn duplicate(field: impl Into<String>, value: &serde_json::Value) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::Duplicate(value.to_string()), detail: String::new() }
    }

    pub fn not_found(field: impl Into<String>, value: &serde_json::Value) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::NotFound(value.to_string()), detail: String::new() }
    }

    pub fn not_supported(field: impl Into<String>, value: &serde_json::Value, supported: &[&str]) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::NotSupported {
                value: value.to_string(),
                supported: supported.iter().map(|s| s.to_string()).collect(),
            },
            detail: String::new(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::Forbidden, detail: detail.into() }
    }

    pub fn too_long(field: impl Into<String>, limit: usize) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::TooLong(limit), detail: String::new() }
    }

    pub fn type_invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError { field: field.into(), kind: FieldErrorKind::TypeInvalid, detail: detail.into() }
    }

    /// Kubernetes' cause type (`FieldValueRequired`, ...).
    pub fn reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) => "FieldValueInvalid",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
            FieldErrorKind::NotFound(_) => "FieldValueNotFound",
            FieldErrorKind::NotSupported { .. } => "FieldValueNotSupported",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong(_) => "FieldValueTooLong",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
        }
    }

    /// The message without the field path (a cause's `message`).
    pub fn body(&self) -> String {
        let with_detail = |head: String| if self.detail.is_empty() { head } else { format!("{head}: {}", self.detail) };
        match &self.kind {
            FieldErrorKind::Required => with_detail("Required value".into()),
            FieldErrorKind::Invalid(v) => with_detail(format!("Invalid value: {v}")),
            FieldErrorKind::Duplicate(v) => with_detail(format!("Duplicate value: {v}")),
            FieldErrorKind::NotFound(v) => with_detail(format!("Not found: {v}")),
            FieldErrorKind::NotSupported { value, supported } => {
                let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
                with_detail(format!("Unsupported value: {value}: supported values: {}", list.join(", ")))
            }
            FieldErrorKind::Forbidden => with_detail("Forbidden".into()),
            FieldErrorKind::TooLong(n) => with_detail(format!("Too long: may not be more than {n} bytes")),
            FieldErrorKind::TypeInvalid => with_detail("Invalid value".into()),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Builds field paths: `Path::new("spec").child("containers").index(0)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Path(String);

impl Path {
    pub fn new(root: &str) -> Self {
        Path(root.to_string())
    }

    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            Path(name.to_string())
        } else {
            Path(format!("{}.{}", self.0, name))
        }
    }

    pub fn index(&self, i: usize) -> Self {
        Path(format!("{}[{}]", self.0, i))
    }

    /// A map entry: `metadata.labels[app]`.
    pub fn key(&self, k: &str) -> Self {
        Path(format!("{}[{}]", self.0, k))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Path> for String {
    fn from(p: Path) -> String {
        p.0
    }
}

impl From<&Path> for String {
    fn from(p: &Path) -> String {
        p.0.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_kubernetes_writes_them() {
        let p = Path::new("spec").child("containers").index(0).child("image");
        assert_eq!(FieldError::required(&p, "").to_string(), "spec.containers[0].image: Required value");
        let e = FieldError::invalid("metadata.name", &serde_json::json!("Foo_"), "must be lowercase");
        assert_eq!(e.to_string(), "metadata.name: Invalid value: \"Foo_\": must be lowercase");
        let e = FieldError::not_supported("spec.restartPolicy", &serde_json::json!("Sometimes"), &["Always", "Never"]);
        assert_eq!(
            e.to_string(),
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"Never\""
        );
    }
}
