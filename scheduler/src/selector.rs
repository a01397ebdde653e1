//! Label selectors (pods, namespaces) and node selector terms (node
//! affinity), parsed once into a form that matches without allocating.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The label map of an object without labels.
pub(crate) static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// A requirement's operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operator {
    /// The label is one of the values.
    In,
    /// The label is absent or none of the values.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// The label is an integer greater than the one value (node selectors only).
    Gt,
    /// The label is an integer less than the one value (node selectors only).
    Lt,
}

/// One requirement on one label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// How the label's value is compared.
    pub operator: Operator,
    /// Sorted values (one for Gt/Lt, none for Exists/DoesNotExist).
    pub values: Vec<String>,
}

impl Requirement {
    fn new(key: &str, operator: &str, values: Option<&Vec<String>>, node: bool) -> Option<Requirement> {
        let operator = match operator {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            "Gt" if node => Operator::Gt,
            "Lt" if node => Operator::Lt,
            _ => return None,
        };
        let mut values = values.cloned().unwrap_or_default();
        values.sort();
        values.dedup();
        let valid = match operator {
            Operator::In | Operator::NotIn => !values.is_empty(),
            Operator::Exists | Operator::DoesNotExist => values.is_empty(),
            Operator::Gt | Operator::Lt => values.len() == 1 && values[0].parse::<i64>().is_ok(),
        };
        valid.then(|| Requirement { key: key.to_string(), operator, values })
    }

    /// Whether `labels` meet this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.binary_search(v).is_ok()),
            Operator::NotIn => value.is_none_or(|v| self.values.binary_search(v).is_err()),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), Some(bound)) = (value.and_then(|v| v.parse::<i64>().ok()), self.values.first()) else {
                    return false;
                };
                let bound: i64 = bound.parse().unwrap_or_default();
                if self.operator == Operator::Gt {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

/// A parsed label selector: every requirement must hold. A selector that
/// did not parse (unknown operator, missing values) matches nothing, as
/// kube treats a selector it cannot convert.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    requirements: Vec<Requirement>,
    nothing: bool,
}

impl Selector {
    /// The selector `{}`: matches every object.
    pub fn everything() -> Selector {
        Selector { requirements: Vec::new(), nothing: false }
    }

    /// A selector that matches no object (a missing selector in an affinity term).
    pub fn nothing() -> Selector {
        Selector { requirements: Vec::new(), nothing: true }
    }

    /// Parses a metav1 label selector.
    pub fn from_label_selector(s: &LabelSelector) -> Selector {
        let mut requirements = Vec::new();
        for (k, v) in s.match_labels.iter().flatten() {
            requirements.push(Requirement { key: k.clone(), operator: Operator::In, values: vec![v.clone()] });
        }
        for e in s.match_expressions.iter().flatten() {
            match Requirement::new(&e.key, &e.operator, e.values.as_ref(), false) {
                Some(r) => requirements.push(r),
                None => return Selector::nothing(),
            }
        }
        Selector::from_requirements(requirements)
    }

    /// A selector of `labels`' key=value pairs (a Service's or RC's selector);
    /// an empty map selects everything.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Selector {
        Selector::from_requirements(
            labels
                .iter()
                .map(|(k, v)| Requirement { key: k.clone(), operator: Operator::In, values: vec![v.clone()] })
                .collect(),
        )
    }

    fn from_requirements(mut requirements: Vec<Requirement>) -> Selector {
        requirements.sort();
        requirements.dedup();
        Selector { requirements, nothing: false }
    }

    /// Adds a requirement (kube's matchLabelKeys / mismatchLabelKeys).
    pub(crate) fn with(mut self, requirement: Requirement) -> Selector {
        self.requirements.push(requirement);
        self.requirements.sort();
        self.requirements.dedup();
        self
    }

    /// Whether `labels` match.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.nothing && self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector matches no object at all.
    pub fn is_nothing(&self) -> bool {
        self.nothing
    }

    /// The requirements, sorted.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// A requirement `key In (values)` an index can answer, the one with
    /// the fewest values; None when the selector has no In requirement.
    pub fn index_hint(&self) -> Option<&Requirement> {
        self.requirements.iter().filter(|r| r.operator == Operator::In).min_by_key(|r| r.values.len())
    }
}

/// One term of a node selector: every label expression and every field
/// expression must hold. A term with neither matches no node.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeTerm {
    labels: Vec<Requirement>,
    /// `matchFields` on `metadata.name`, the only field kube supports.
    names: Vec<Requirement>,
    valid: bool,
}

impl NodeTerm {
    /// Parses a node selector term.
    pub fn new(term: &NodeSelectorTerm) -> NodeTerm {
        let mut valid = true;
        let mut parse = |reqs: Option<&Vec<NodeSelectorRequirement>>, field: bool| -> Vec<Requirement> {
            let mut out = Vec::new();
            for r in reqs.into_iter().flatten() {
                let requirement = if field && r.key != "metadata.name" {
                    None
                } else if field {
                    Requirement::new(&r.key, &r.operator, r.values.as_ref(), false)
                        .filter(|r| matches!(r.operator, Operator::In | Operator::NotIn))
                } else {
                    Requirement::new(&r.key, &r.operator, r.values.as_ref(), true)
                };
                match requirement {
                    Some(req) => out.push(req),
                    None => valid = false,
                }
            }
            out
        };
        let labels = parse(term.match_expressions.as_ref(), false);
        let names = parse(term.match_fields.as_ref(), true);
        let valid = valid && !(labels.is_empty() && names.is_empty());
        NodeTerm { labels, names, valid }
    }

    /// The nodes this term can match, as an index can name them: those
    /// of its `metadata.name In` field, or of its label `In` requirement
    /// with the fewest values. None when it names no such set.
    fn narrowing(&self) -> Option<Narrowing<'_>> {
        if !self.valid {
            return Some(Narrowing::Nothing);
        }
        if let Some(names) = self.names.iter().find(|r| r.operator == Operator::In) {
            return Some(Narrowing::Names(&names.values));
        }
        let labels = self.labels.iter().filter(|r| r.operator == Operator::In).min_by_key(|r| r.values.len())?;
        Some(Narrowing::Labels { key: &labels.key, values: &labels.values })
    }

    /// Whether the node with `labels` and `name` matches.
    pub fn matches(&self, labels: &BTreeMap<String, String>, name: &str) -> bool {
        self.valid
            && self.labels.iter().all(|r| r.matches(labels))
            && self.names.iter().all(|r| {
                let found = r.values.binary_search_by(|v| v.as_str().cmp(name)).is_ok();
                (r.operator == Operator::In) == found
            })
    }
}

/// A required node selector: any term may match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NodeSelectorTerms {
    terms: Vec<NodeTerm>,
}

impl NodeSelectorTerms {
    /// Parses `requiredDuringSchedulingIgnoredDuringExecution`.
    pub fn new(selector: &NodeSelector) -> NodeSelectorTerms {
        NodeSelectorTerms { terms: selector.node_selector_terms.iter().map(NodeTerm::new).collect() }
    }

    /// Whether some term matches the node.
    pub fn matches(&self, labels: &BTreeMap<String, String>, name: &str) -> bool {
        self.terms.iter().any(|t| t.matches(labels, name))
    }

    /// Per term, the nodes it can match (see [`Narrowing`]); None when some
    /// term can match nodes no index names.
    pub(crate) fn narrowing(&self) -> Option<Vec<Narrowing<'_>>> {
        self.terms.iter().map(NodeTerm::narrowing).collect()
    }
}

/// A superset of the nodes a node selector term matches, as the cluster's
/// indexes name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Narrowing<'a> {
    /// Nodes with one of these names.
    Names(&'a [String]),
    /// Nodes labelled `key` with one of these values.
    Labels { key: &'a str, values: &'a [String] },
    /// No node (a malformed term).
    Nothing,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: if values.is_empty() { None } else { Some(values.iter().map(|v| v.to_string()).collect()) },
        }
    }

    #[test]
    fn label_selectors_match_as_kube_matches_them() {
        let app = labels(&[("app", "web"), ("tier", "front")]);
        let cases = [
            (LabelSelector::default(), true),
            (LabelSelector { match_labels: Some(labels(&[("app", "web")])), ..Default::default() }, true),
            (LabelSelector { match_labels: Some(labels(&[("app", "db")])), ..Default::default() }, false),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("app", "In", &["db", "web"])]),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector { match_expressions: Some(vec![expr("app", "NotIn", &["web"])]), ..Default::default() },
                false,
            ),
            (
                LabelSelector { match_expressions: Some(vec![expr("zone", "NotIn", &["a"])]), ..Default::default() },
                true,
            ),
            (LabelSelector { match_expressions: Some(vec![expr("tier", "Exists", &[])]), ..Default::default() }, true),
            (
                LabelSelector {
                    match_expressions: Some(vec![expr("tier", "DoesNotExist", &[])]),
                    ..Default::default()
                },
                false,
            ),
            // Gt is not a label selector operator: the selector matches nothing.
            (LabelSelector { match_expressions: Some(vec![expr("tier", "Gt", &["1"])]), ..Default::default() }, false),
            (LabelSelector { match_expressions: Some(vec![expr("app", "In", &[])]), ..Default::default() }, false),
        ];
        for (i, (selector, want)) in cases.iter().enumerate() {
            assert_eq!(Selector::from_label_selector(selector).matches(&app), *want, "case {i}");
        }
        assert!(!Selector::nothing().matches(&app));
    }

    #[test]
    fn node_terms_match_labels_and_the_node_name_field() {
        let node = labels(&[("zone", "a"), ("cores", "8")]);
        let term = |exprs: Vec<(&str, &str, &[&str])>, fields: Vec<(&str, &str, &[&str])>| {
            let conv = |v: Vec<(&str, &str, &[&str])>| {
                Some(
                    v.into_iter()
                        .map(|(k, op, vals)| NodeSelectorRequirement {
                            key: k.into(),
                            operator: op.into(),
                            values: Some(vals.iter().map(|s| s.to_string()).collect()),
                        })
                        .collect::<Vec<_>>(),
                )
            };
            NodeTerm::new(&NodeSelectorTerm { match_expressions: conv(exprs), match_fields: conv(fields) })
        };
        let cases = [
            (term(vec![("zone", "In", &["a"])], vec![]), true),
            (term(vec![("cores", "Gt", &["4"])], vec![]), true),
            (term(vec![("cores", "Lt", &["4"])], vec![]), false),
            (term(vec![("cores", "Gt", &["x"])], vec![]), false),
            (term(vec![], vec![("metadata.name", "In", &["n1"])]), true),
            (term(vec![], vec![("metadata.name", "NotIn", &["n1"])]), false),
            (term(vec![("zone", "In", &["a"])], vec![("metadata.name", "In", &["n2"])]), false),
            (term(vec![], vec![("metadata.uid", "In", &["n1"])]), false),
            (term(vec![], vec![]), false),
        ];
        for (i, (t, want)) in cases.iter().enumerate() {
            assert_eq!(t.matches(&node, "n1"), *want, "case {i}");
        }
    }
}
