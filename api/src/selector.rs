//! Label and field selectors: parsing (Kubernetes' syntax), matching, and
//! the fields each kind can be selected by.
//!
//! # Label selectors
//! [`LabelSelector::parse`] reads the string syntax of
//! `k8s.io/apimachinery/pkg/labels` (`?labelSelector=` and `kubectl -l`):
//! comma-separated requirements, all of which must hold:
//!
//! | syntax                    | holds when the label is                     |
//! |---------------------------|---------------------------------------------|
//! | `key=value`, `key==value` | present and equal to the value              |
//! | `key!=value`              | absent or different                         |
//! | `key in (a,b)`            | present and one of the values               |
//! | `key notin (a,b)`         | absent or none of the values                |
//! | `key`                     | present                                     |
//! | `!key`                    | absent                                      |
//! | `key>1`, `key<1`          | present, an integer, and greater/less       |
//!
//! Whitespace between tokens is ignored; the empty string selects everything.
//! Keys must be qualified names and values label values, checked by
//! [`crate::validation`]'s name rules as Kubernetes checks them.
//! [`LabelSelector::from_api`] reads the structured `metav1.LabelSelector`
//! (`matchLabels` + `matchExpressions`) that ReplicaSets, Deployments, Jobs
//! and friends carry.
//!
//! # Field selectors
//! [`FieldSelector::parse`] reads `k8s.io/apimachinery/pkg/fields` syntax:
//! `field=value`, `field==value` and `field!=value`, comma separated, with
//! `\,`, `\=` and `\\` escaping those characters in values. Fields are
//! matched against the [`Fields`] of an object, which [`object_fields`]
//! extracts per kind; [`supported_fields`] lists which fields a kind can be
//! selected by, and [`FieldSelector::check_supported`] refuses others with
//! Kubernetes' message.
//!
//! Both selector types normalise what they parse (requirements sorted,
//! duplicates dropped, `==` read as `=`), so two selectors that differ only
//! in spelling compare equal, and their `Display` is a canonical string that
//! parses back to an equal selector.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use crate::resources::{self, Kind};
use crate::validation::{is_label_value, is_qualified_name};

/// A selector that could not be parsed or is not allowed; the message says
/// what and where, in the style of Kubernetes' own errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

fn err<T>(message: impl Into<String>) -> Result<T, SelectorError> {
    Err(SelectorError(message.into()))
}

// ---------------------------------------------------------------------------
// Keys and values, checked as labels are (k8s.io/apimachinery/pkg/util/validation)
// ---------------------------------------------------------------------------

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let errors = is_qualified_name(key);
    if errors.is_empty() {
        Ok(())
    } else {
        err(format!("invalid label key {key:?}: {}", errors.join("; ")))
    }
}

fn validate_value(key: &str, value: &str) -> Result<(), SelectorError> {
    let errors = is_label_value(value);
    if errors.is_empty() {
        Ok(())
    } else {
        err(format!("invalid label value {value:?} for key {key:?}: {}", errors.join("; ")))
    }
}

// ---------------------------------------------------------------------------
// Label selectors
// ---------------------------------------------------------------------------

/// How a label [`Requirement`] compares the label with its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    /// `key`: the label is present, with any value.
    Exists,
    /// `!key`: the label is absent.
    DoesNotExist,
    /// `key=value` (or `==`): the label is present and equals the value.
    Equals,
    /// `key!=value`: the label is absent or differs from the value.
    NotEquals,
    /// `key in (a,b)`: the label is present and one of the values.
    In,
    /// `key notin (a,b)`: the label is absent or none of the values.
    NotIn,
    /// `key>n`: the label is present, an integer, and greater than `n`.
    GreaterThan,
    /// `key<n`: the label is present, an integer, and less than `n`.
    LessThan,
}

/// One condition of a [`LabelSelector`] on one label key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: BTreeSet<String>,
}

impl Requirement {
    /// A validated requirement: the key a qualified name, every value a label
    /// value, and as many values as the operator takes (none for
    /// `Exists`/`DoesNotExist`, one for `Equals`/`NotEquals`/`GreaterThan`/
    /// `LessThan`, at least one for `In`/`NotIn`). Kubernetes' `NewRequirement`.
    pub fn new(
        key: impl Into<String>,
        operator: Operator,
        values: impl IntoIterator<Item = String>,
    ) -> Result<Self, SelectorError> {
        let key = key.into();
        let values: BTreeSet<String> = values.into_iter().collect();
        validate_key(&key)?;
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                return err(format!("key {key:?}: for 'in', 'notin' operators, values set can't be empty"));
            }
            Operator::Equals | Operator::NotEquals if values.len() != 1 => {
                return err(format!("key {key:?}: exact-match compatibility requires one single value"));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                return err(format!("key {key:?}: values set must be empty for exists and does not exist"));
            }
            Operator::GreaterThan | Operator::LessThan => {
                if values.len() != 1 {
                    return err(format!("key {key:?}: for 'Gt', 'Lt' operators, exactly one value is required"));
                }
                if let Some(bad) = values.iter().find(|v| v.parse::<i64>().is_err()) {
                    return err(format!(
                        "invalid label value {bad:?} for key {key:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                }
            }
            _ => {}
        }
        for value in &values {
            validate_value(&key, value)?;
        }
        Ok(Requirement { key, operator, values })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// The values, sorted; empty for `Exists` and `DoesNotExist`.
    pub fn values(&self) -> &BTreeSet<String> {
        &self.values
    }

    /// Whether `labels` satisfy this requirement. As in Kubernetes, `!=` and
    /// `notin` hold for objects without the label.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let label = labels.get(&self.key);
        match self.operator {
            Operator::Exists => label.is_some(),
            Operator::DoesNotExist => label.is_none(),
            Operator::Equals | Operator::In => label.is_some_and(|v| self.values.contains(v)),
            Operator::NotEquals | Operator::NotIn => label.is_none_or(|v| !self.values.contains(v)),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(Ok(have)) = label.map(|v| v.parse::<i64>()) else {
                    return false;
                };
                let mut wanted = self.values.iter().map(|v| v.parse::<i64>());
                match (wanted.next(), wanted.next()) {
                    (Some(Ok(want)), None) => {
                        if self.operator == Operator::GreaterThan {
                            have > want
                        } else {
                            have < want
                        }
                    }
                    _ => false,
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = || self.values.iter().map(String::as_str).collect::<Vec<_>>().join(",");
        match self.operator {
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::Equals => write!(f, "{}={}", self.key, values()),
            Operator::NotEquals => write!(f, "{}!={}", self.key, values()),
            Operator::GreaterThan => write!(f, "{}>{}", self.key, values()),
            Operator::LessThan => write!(f, "{}<{}", self.key, values()),
            Operator::In => write!(f, "{} in ({})", self.key, values()),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, values()),
        }
    }
}

/// A label selector: requirements that must all hold. The empty selector
/// (the default) matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct LabelSelector {
    /// Sorted and without duplicates, so equal selectors compare equal.
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses Kubernetes' label selector syntax (see the module
    /// documentation). The empty (or all-blank) string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut parser = Parser { tokens: lex(s), pos: 0 };
        Ok(Self::from_requirements(parser.parse()?))
    }

    /// A selector of the given requirements (all must hold).
    pub fn from_requirements(requirements: impl IntoIterator<Item = Requirement>) -> Self {
        let mut requirements: Vec<Requirement> = requirements.into_iter().collect();
        requirements.sort();
        requirements.dedup();
        LabelSelector { requirements }
    }

    /// The selector requiring every label of `labels` with its value, like a
    /// Service's `spec.selector`; keys and values are validated.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Result<Self, SelectorError> {
        let requirements = labels
            .iter()
            .map(|(k, v)| Requirement::new(k.clone(), Operator::Equals, [v.clone()]))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::from_requirements(requirements))
    }

    /// Whether this selector has no requirements, and so matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// A `metav1.LabelSelector` (matchLabels + matchExpressions) as JSON.
    ///
    /// `matchLabels` entries become `key=value` requirements and
    /// `matchExpressions` the requirement of their operator (`In`, `NotIn`,
    /// `Exists`, `DoesNotExist`); `In`/`NotIn` need values and
    /// `Exists`/`DoesNotExist` must have none. Keys and values are validated.
    ///
    /// As in Kubernetes (`LabelSelectorAsSelector`), the empty selector `{}`
    /// matches everything, while a *missing* (nil) selector matches nothing.
    /// This function only sees JSON objects, so telling the two apart is the
    /// caller's job: do not call it for an absent field, and note that
    /// `null` is refused here rather than read as either.
    pub fn from_api(selector: &Value) -> Result<Self, SelectorError> {
        let Some(selector) = selector.as_object() else {
            return err(format!("label selector must be an object, not {}", json_type(selector)));
        };
        let mut requirements = Vec::new();
        match selector.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (key, value) in labels {
                    let Some(value) = value.as_str() else {
                        return err(format!("matchLabels.{key}: must be a string, not {}", json_type(value)));
                    };
                    let requirement = Requirement::new(key.clone(), Operator::Equals, [value.to_string()])
                        .map_err(|e| SelectorError(format!("matchLabels: {e}")))?;
                    requirements.push(requirement);
                }
            }
            Some(other) => return err(format!("matchLabels: must be an object, not {}", json_type(other))),
        }
        match selector.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(expressions)) => {
                for (i, expression) in expressions.iter().enumerate() {
                    let path = format!("matchExpressions[{i}]");
                    let requirement = expression_requirement(expression)
                        .map_err(|SelectorError(e)| SelectorError(format!("{path}{e}")))?;
                    requirements.push(requirement);
                }
            }
            Some(other) => return err(format!("matchExpressions: must be an array, not {}", json_type(other))),
        }
        Ok(Self::from_requirements(requirements))
    }
}

/// One `matchExpressions` item; errors start with the field (`.key: ...`)
/// or `: ` so the caller can prefix the item's path.
fn expression_requirement(expression: &Value) -> Result<Requirement, SelectorError> {
    let Some(expression) = expression.as_object() else {
        return err(format!(": must be an object, not {}", json_type(expression)));
    };
    let key = match expression.get("key") {
        Some(Value::String(key)) => key.as_str(),
        None | Some(Value::Null) => "",
        Some(other) => return err(format!(".key: must be a string, not {}", json_type(other))),
    };
    let operator = match expression.get("operator") {
        Some(Value::String(op)) => match op.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return err(format!(
                    ".operator: {other:?} is not a valid label selector operator (In, NotIn, Exists, DoesNotExist)"
                ))
            }
        },
        None | Some(Value::Null) => return err(".operator: Required value"),
        Some(other) => return err(format!(".operator: must be a string, not {}", json_type(other))),
    };
    let values = match expression.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(values)) => {
            let mut strings = Vec::with_capacity(values.len());
            for (j, value) in values.iter().enumerate() {
                match value.as_str() {
                    Some(s) => strings.push(s.to_string()),
                    None => return err(format!(".values[{j}]: must be a string, not {}", json_type(value))),
                }
            }
            strings
        }
        Some(other) => return err(format!(".values: must be an array, not {}", json_type(other))),
    };
    Requirement::new(key, operator, values).map_err(|SelectorError(e)| SelectorError(format!(": {e}")))
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl fmt::Display for LabelSelector {
    /// The canonical form: requirements sorted by key, joined with `,`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The tokens of the label selector language (Kubernetes' lexer).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    End,
    OpenPar,
    ClosedPar,
    Comma,
    /// `!`
    Bang,
    Equals,
    DoubleEquals,
    NotEquals,
    GreaterThan,
    LessThan,
    In,
    NotIn,
    Identifier(String),
}

impl Token {
    /// The token as an identifier, if it can be one: `in` and `notin` are
    /// keywords only where an operator is expected, names elsewhere.
    fn identifier(&self) -> Option<&str> {
        match self {
            Token::Identifier(s) => Some(s),
            Token::In => Some("in"),
            Token::NotIn => Some("notin"),
            _ => None,
        }
    }

    /// The token quoted as the user wrote it, for error messages.
    fn describe(&self) -> String {
        let literal = match self {
            Token::End => return "end of string".to_string(),
            Token::OpenPar => "(",
            Token::ClosedPar => ")",
            Token::Comma => ",",
            Token::Bang => "!",
            Token::Equals => "=",
            Token::DoubleEquals => "==",
            Token::NotEquals => "!=",
            Token::GreaterThan => ">",
            Token::LessThan => "<",
            Token::In => "in",
            Token::NotIn => "notin",
            Token::Identifier(s) => s,
        };
        format!("'{literal}'")
    }
}

fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Splits a label selector into tokens, ending with [`Token::End`]. Every
/// character is part of some token, so lexing cannot fail; anything odd ends
/// up in an identifier that fails validation.
fn lex(s: &str) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(is_whitespace);
        let mut chars = rest.chars();
        let Some(c) = chars.next() else {
            break;
        };
        let next = chars.next();
        let (token, len) = match (c, next) {
            ('!', Some('=')) => (Token::NotEquals, 2),
            ('=', Some('=')) => (Token::DoubleEquals, 2),
            ('!', _) => (Token::Bang, 1),
            ('=', _) => (Token::Equals, 1),
            ('(', _) => (Token::OpenPar, 1),
            (')', _) => (Token::ClosedPar, 1),
            (',', _) => (Token::Comma, 1),
            ('>', _) => (Token::GreaterThan, 1),
            ('<', _) => (Token::LessThan, 1),
            _ => {
                let len = rest.find(|c| is_whitespace(c) || is_special(c)).unwrap_or(rest.len());
                let word = &rest[..len];
                let token = match word {
                    "in" => Token::In,
                    "notin" => Token::NotIn,
                    _ => Token::Identifier(word.to_string()),
                };
                (token, len)
            }
        };
        tokens.push(token);
        rest = &rest[len..];
    }
    tokens.push(Token::End);
    tokens
}

/// Kubernetes' recursive-descent label selector parser, over the tokens.
struct Parser {
    tokens: Vec<Token>,
    pos: usize,
}

impl Parser {
    fn peek(&self) -> &Token {
        self.tokens.get(self.pos).unwrap_or(&Token::End)
    }

    fn next(&mut self) -> Token {
        let token = self.peek().clone();
        if self.pos < self.tokens.len() {
            self.pos += 1;
        }
        token
    }

    fn starts_requirement(token: &Token) -> bool {
        token.identifier().is_some() || *token == Token::Bang
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let token = self.peek();
            if *token == Token::End {
                return Ok(requirements);
            }
            if !Self::starts_requirement(token) {
                return err(format!("found {}, expected: !, identifier, or 'end of string'", token.describe()));
            }
            let requirement = self
                .requirement()
                .map_err(|SelectorError(e)| SelectorError(format!("unable to parse requirement: {e}")))?;
            requirements.push(requirement);
            match self.next() {
                Token::End => return Ok(requirements),
                Token::Comma => {
                    let after = self.peek();
                    if !Self::starts_requirement(after) {
                        return err(format!("found {}, expected: identifier after ','", after.describe()));
                    }
                }
                other => return err(format!("found {}, expected: ',' or 'end of string'", other.describe())),
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut token = self.next();
        let negated = token == Token::Bang;
        if negated {
            token = self.next();
        }
        let Some(key) = token.identifier() else {
            return err(format!("found {}, expected: identifier", token.describe()));
        };
        let key = key.to_string();
        validate_key(&key)?;
        if negated {
            return Requirement::new(key, Operator::DoesNotExist, []);
        }
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Requirement::new(key, Operator::Exists, []);
        }
        let operator = match self.next() {
            Token::In => Operator::In,
            Token::NotIn => Operator::NotIn,
            Token::Equals | Token::DoubleEquals => Operator::Equals,
            Token::NotEquals => Operator::NotEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            other => {
                return err(format!(
                    "found {} after key {key:?}, expected: in, notin, =, ==, !=, >, <",
                    other.describe()
                ))
            }
        };
        let values = match operator {
            Operator::In | Operator::NotIn => self.value_set()?,
            _ => self.exact_value()?,
        };
        Requirement::new(key, operator, values)
    }

    /// `(a,b,c)`; an empty entry (`()`, `(a,)`, `(,a)`) is the empty value.
    fn value_set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        let token = self.next();
        if token != Token::OpenPar {
            return err(format!("found {}, expected: '('", token.describe()));
        }
        let mut values = BTreeSet::new();
        match self.peek() {
            Token::ClosedPar => {
                self.next();
                values.insert(String::new());
                return Ok(values);
            }
            Token::Comma => {}
            token if token.identifier().is_some() => {}
            token => return err(format!("found {}, expected: ',', ')' or identifier", token.describe())),
        }
        loop {
            let token = self.next();
            if let Some(value) = token.identifier() {
                values.insert(value.to_string());
                match self.peek() {
                    Token::Comma => {}
                    Token::ClosedPar => {
                        self.next();
                        return Ok(values);
                    }
                    other => return err(format!("found {}, expected: ',' or ')'", other.describe())),
                }
            } else if token == Token::Comma {
                // Empty entries (`(,a)`, `(a,,b)`, `(a,)`) are the empty value.
                if values.is_empty() {
                    values.insert(String::new());
                }
                match self.peek() {
                    Token::ClosedPar => {
                        self.next();
                        values.insert(String::new());
                        return Ok(values);
                    }
                    Token::Comma => {
                        self.next();
                        values.insert(String::new());
                    }
                    _ => {}
                }
            } else {
                return err(format!("found {}, expected: ',', or identifier", token.describe()));
            }
        }
    }

    /// The one value after `=`, `==`, `!=`, `>` or `<`; nothing before `,`
    /// or the end is the empty value.
    fn exact_value(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        if matches!(self.peek(), Token::End | Token::Comma) {
            return Ok(BTreeSet::from([String::new()]));
        }
        let token = self.next();
        match token.identifier() {
            Some(value) => Ok(BTreeSet::from([value.to_string()])),
            None => err(format!("found {}, expected: identifier", token.describe())),
        }
    }
}

// ---------------------------------------------------------------------------
// Field selectors
// ---------------------------------------------------------------------------

/// The selectable fields of one object, by field name.
pub type Fields = BTreeMap<&'static str, String>;

/// One `field=value` or `field!=value` term of a [`FieldSelector`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FieldRequirement {
    field: String,
    /// `!=` rather than `=`.
    negated: bool,
    value: String,
}

impl FieldRequirement {
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Whether this is `field!=value` rather than `field=value`.
    pub fn negated(&self) -> bool {
        self.negated
    }

    /// The value, unescaped.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether `fields` satisfy this term; a missing field is the empty string.
    pub fn matches(&self, fields: &Fields) -> bool {
        let have = fields.get(self.field.as_str()).map_or("", String::as_str);
        (have == self.value) != self.negated
    }
}

impl fmt::Display for FieldRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = if self.negated { "!=" } else { "=" };
        write!(f, "{}{op}{}", self.field, escape_field_value(&self.value))
    }
}

/// A field selector: terms that must all hold. The empty selector (the
/// default) matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FieldSelector {
    /// Sorted and without duplicates, so equal selectors compare equal.
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `field=value,field!=value,...` as Kubernetes' `fields` package
    /// does: terms split at commas not escaped with `\`, each at its first
    /// `!=`, `==` or `=`; values unescaped (`\,` `\=` `\\`; any other escape,
    /// or a bare `,` or `=`, is an error). Empty terms are skipped and no
    /// whitespace is trimmed (` a=b` selects the field ` a`). Unlike
    /// Kubernetes, a term without a field name (`=x`) is refused here rather
    /// than later as an unsupported field.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for term in split_field_terms(s) {
            if term.is_empty() {
                continue;
            }
            let Some((field, op, raw)) = split_field_term(term) else {
                return err(format!(
                    "invalid selector: '{s}'; can't understand '{term}': expected field=value, field==value or field!=value"
                ));
            };
            if field.is_empty() {
                return err(format!("invalid selector: '{s}'; can't understand '{term}': the field name is empty"));
            }
            let value = unescape_field_value(raw)
                .map_err(|SelectorError(e)| SelectorError(format!("invalid field selector: {e} in '{term}'")))?;
            requirements.push(FieldRequirement { field: field.to_string(), negated: op == "!=", value });
        }
        Ok(Self::from_requirements(requirements))
    }

    fn from_requirements(mut requirements: Vec<FieldRequirement>) -> Self {
        requirements.sort();
        requirements.dedup();
        FieldSelector { requirements }
    }

    /// The selector requiring `field=value`.
    pub fn exactly(field: impl Into<String>, value: impl Into<String>) -> Self {
        FieldSelector {
            requirements: vec![FieldRequirement { field: field.into(), negated: false, value: value.into() }],
        }
    }

    /// Whether this selector has no terms, and so matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The terms, sorted by field.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// Whether `fields` satisfy every term; a field missing from `fields` is
    /// the empty string, as in Kubernetes.
    pub fn matches(&self, fields: &Fields) -> bool {
        self.requirements.iter().all(|r| r.matches(fields))
    }

    /// The value `field` must equal (`spec.nodeName=n1`), for indexing.
    /// With several such terms on one field (which then match nothing), the
    /// first in sorted order.
    pub fn exact(&self, field: &str) -> Option<&str> {
        self.requirements.iter().find(|r| !r.negated && r.field == field).map(|r| r.value.as_str())
    }

    /// Refuses fields `kind` cannot be selected by.
    pub fn check_supported(&self, kind: Kind) -> Result<(), SelectorError> {
        let supported = supported_fields(kind);
        match self.requirements.iter().find(|r| !supported.contains(&r.field.as_str())) {
            Some(r) => err(format!("field label not supported: {}", r.field)),
            None => Ok(()),
        }
    }
}

impl fmt::Display for FieldSelector {
    /// The canonical form: terms sorted, values escaped, joined with `,`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, requirement) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{requirement}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for FieldSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Splits at commas not preceded by an escaping backslash; the backslashes
/// stay in the terms. Kubernetes' `splitTerms`.
fn split_field_terms(s: &str) -> Vec<&str> {
    if s.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == ',' {
            terms.push(&s[start..i]);
            start = i + 1;
        }
    }
    terms.push(&s[start..]);
    terms
}

/// Splits a term at its first operator (`!=`, then `==`, then `=` at each
/// position): field, operator, raw value. Kubernetes' `splitTerm`.
fn split_field_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if let Some(value) = rest.strip_prefix(op) {
                return Some((&term[..i], op, value));
            }
        }
    }
    None
}

/// Kubernetes' `fields.UnescapeValue`.
fn unescape_field_value(raw: &str) -> Result<String, SelectorError> {
    let mut value = String::with_capacity(raw.len());
    let mut escaped = false;
    for c in raw.chars() {
        if escaped {
            match c {
                '\\' | ',' | '=' => value.push(c),
                other => return err(format!("invalid escape sequence: \\{other}")),
            }
            escaped = false;
        } else {
            match c {
                '\\' => escaped = true,
                ',' | '=' => return err(format!("unescaped character in value: '{c}'")),
                other => value.push(other),
            }
        }
    }
    if escaped {
        return err("invalid escape sequence: \\ at the end of the value");
    }
    Ok(value)
}

/// Escapes `\`, `,` and `=` in a field selector value. Kubernetes'
/// `fields.EscapeValue`.
pub fn escape_field_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

// ---------------------------------------------------------------------------
// Selectable fields per kind
// ---------------------------------------------------------------------------

const METADATA_NAME: &str = "metadata.name";
const METADATA_NAMESPACE: &str = "metadata.namespace";

static META_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE];

static POD_FIELDS: &[&str] = &[
    METADATA_NAME,
    METADATA_NAMESPACE,
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

static EVENT_FIELDS: &[&str] = &[
    METADATA_NAME,
    METADATA_NAMESPACE,
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

static SECRET_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE, "type"];
static NODE_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE, "spec.unschedulable"];
static NAMESPACE_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE, "status.phase"];
static REPLICA_SET_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE, "status.replicas"];
static REPLICATION_CONTROLLER_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE, "status.replicas"];
static JOB_FIELDS: &[&str] = &[METADATA_NAME, METADATA_NAMESPACE, "status.successful"];

/// The fields objects of `kind` can be selected by: `metadata.name` and
/// `metadata.namespace` for every kind, plus the kind's own, as Kubernetes.
pub fn supported_fields(kind: Kind) -> &'static [&'static str] {
    match kind {
        Kind::Pod => POD_FIELDS,
        Kind::Event => EVENT_FIELDS,
        Kind::Secret => SECRET_FIELDS,
        Kind::Node => NODE_FIELDS,
        Kind::Namespace => NAMESPACE_FIELDS,
        Kind::ReplicaSet => REPLICA_SET_FIELDS,
        Kind::ReplicationController => REPLICATION_CONTROLLER_FIELDS,
        Kind::Job => JOB_FIELDS,
        Kind::Service
        | Kind::Endpoints
        | Kind::EndpointSlice
        | Kind::ConfigMap
        | Kind::ServiceAccount
        | Kind::Lease
        | Kind::Deployment
        | Kind::DaemonSet
        | Kind::CronJob
        | Kind::ResourceQuota
        | Kind::LimitRange
        | Kind::PriorityClass
        | Kind::PodDisruptionBudget
        | Kind::CustomResourceDefinition
        | Kind::Role
        | Kind::ClusterRole
        | Kind::RoleBinding
        | Kind::ClusterRoleBinding
        | Kind::Custom => META_FIELDS,
    }
}

/// The string at a JSON pointer, or the empty string.
fn string_at(obj: &Value, pointer: &str) -> String {
    at(obj, pointer).and_then(Value::as_str).unwrap_or_default().to_string()
}

/// `true`/`false` at a JSON pointer, `false` when absent.
fn bool_at(obj: &Value, pointer: &str) -> String {
    at(obj, pointer).and_then(Value::as_bool).unwrap_or(false).to_string()
}

/// The value at a JSON pointer, as [`Value::pointer`] finds it, without its
/// cost: serde_json unescapes every segment into a new `String` (two
/// `replace` calls each), which for the ten fields of a pod, read for every
/// change a watch feed filters, was 3% of a busy leader's CPU. Segments with
/// an escape (`~`) are left to serde_json.
fn at<'a>(obj: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.contains('~') {
        return obj.pointer(pointer);
    }
    if pointer.is_empty() {
        return Some(obj);
    }
    let mut here = obj;
    for segment in pointer.strip_prefix('/')?.split('/') {
        here = match here {
            Value::Object(map) => map.get(segment)?,
            Value::Array(items) => {
                // RFC 6901 array indexes: digits, no sign, no leading zero.
                let plain = !segment.starts_with('+') && (segment == "0" || !segment.starts_with('0'));
                items.get(if plain { segment.parse::<usize>().ok()? } else { return None })?
            }
            _ => return None,
        };
    }
    Some(here)
}

/// The integer at a JSON pointer as a string, `0` when absent.
fn int_at(obj: &Value, pointer: &str) -> String {
    match at(obj, pointer) {
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(u)) => u.to_string(),
            (None, None) => n.to_string(),
        },
        _ => "0".to_string(),
    }
}

/// The values of the [`supported_fields`] of an object of `kind` (exactly
/// those fields). What the object lacks is the empty string, except the
/// booleans (`false`) and counts (`0`) Kubernetes reads from Go zero values.
/// Cluster-scoped objects have the namespace `""` (custom ones are stored
/// without one, the registry drops it).
pub fn object_fields(kind: Kind, obj: &Value) -> Fields {
    let mut fields = Fields::new();
    fields.insert(METADATA_NAME, string_at(obj, "/metadata/name"));
    let namespaced = kind == Kind::Custom || resources::of(kind).namespaced;
    let namespace = if namespaced { string_at(obj, "/metadata/namespace") } else { String::new() };
    fields.insert(METADATA_NAMESPACE, namespace);
    match kind {
        Kind::Pod => {
            fields.insert("spec.nodeName", string_at(obj, "/spec/nodeName"));
            fields.insert("spec.restartPolicy", string_at(obj, "/spec/restartPolicy"));
            fields.insert("spec.schedulerName", string_at(obj, "/spec/schedulerName"));
            fields.insert("spec.serviceAccountName", string_at(obj, "/spec/serviceAccountName"));
            fields.insert("spec.hostNetwork", bool_at(obj, "/spec/hostNetwork"));
            fields.insert("status.phase", string_at(obj, "/status/phase"));
            // Kubernetes reads the first of `podIPs`; `podIP` mirrors it.
            let mut pod_ip = string_at(obj, "/status/podIPs/0/ip");
            if pod_ip.is_empty() {
                pod_ip = string_at(obj, "/status/podIP");
            }
            fields.insert("status.podIP", pod_ip);
            fields.insert("status.nominatedNodeName", string_at(obj, "/status/nominatedNodeName"));
        }
        Kind::Event => {
            for (field, pointer) in [
                ("involvedObject.kind", "/involvedObject/kind"),
                ("involvedObject.namespace", "/involvedObject/namespace"),
                ("involvedObject.name", "/involvedObject/name"),
                ("involvedObject.uid", "/involvedObject/uid"),
                ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
                ("involvedObject.resourceVersion", "/involvedObject/resourceVersion"),
                ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
                ("reason", "/reason"),
                ("reportingComponent", "/reportingComponent"),
                ("type", "/type"),
            ] {
                fields.insert(field, string_at(obj, pointer));
            }
            // Events written through events.k8s.io have no source.component;
            // Kubernetes falls back to the reporting controller.
            let mut source = string_at(obj, "/source/component");
            if source.is_empty() {
                source = string_at(obj, "/reportingComponent");
            }
            fields.insert("source", source);
        }
        Kind::Secret => {
            fields.insert("type", string_at(obj, "/type"));
        }
        Kind::Node => {
            fields.insert("spec.unschedulable", bool_at(obj, "/spec/unschedulable"));
        }
        Kind::Namespace => {
            fields.insert("status.phase", string_at(obj, "/status/phase"));
        }
        Kind::ReplicaSet | Kind::ReplicationController => {
            fields.insert("status.replicas", int_at(obj, "/status/replicas"));
        }
        Kind::Job => {
            // Kubernetes names the field `successful` but reads `succeeded`.
            fields.insert("status.successful", int_at(obj, "/status/succeeded"));
        }
        Kind::Service
        | Kind::Endpoints
        | Kind::EndpointSlice
        | Kind::ConfigMap
        | Kind::ServiceAccount
        | Kind::Lease
        | Kind::Deployment
        | Kind::DaemonSet
        | Kind::CronJob
        | Kind::ResourceQuota
        | Kind::LimitRange
        | Kind::PriorityClass
        | Kind::PodDisruptionBudget
        | Kind::CustomResourceDefinition
        | Kind::Role
        | Kind::ClusterRole
        | Kind::RoleBinding
        | Kind::ClusterRoleBinding
        | Kind::Custom => {}
    }
    fields
}

/// What of an object of `kind` its selectors and its place in a watch
/// read: `metadata.name`, `namespace` and `labels`, and every path
/// [`object_fields`] reads for the kind (a path's whole value is kept).
fn selected_paths(kind: Kind) -> &'static [&'static [&'static str]] {
    macro_rules! with_meta {
        ($($path:expr),* $(,)?) => {
            &[&["metadata", "name"], &["metadata", "namespace"], &["metadata", "labels"], $($path),*]
        };
    }
    match kind {
        Kind::Pod => with_meta![
            &["spec", "nodeName"],
            &["spec", "restartPolicy"],
            &["spec", "schedulerName"],
            &["spec", "serviceAccountName"],
            &["spec", "hostNetwork"],
            &["status", "phase"],
            &["status", "podIPs"],
            &["status", "podIP"],
            &["status", "nominatedNodeName"],
        ],
        Kind::Event => with_meta![&["involvedObject"], &["reason"], &["reportingComponent"], &["type"], &["source"]],
        Kind::Secret => with_meta![&["type"]],
        Kind::Node => with_meta![&["spec", "unschedulable"]],
        Kind::Namespace => with_meta![&["status", "phase"]],
        Kind::ReplicaSet | Kind::ReplicationController => with_meta![&["status", "replicas"]],
        Kind::Job => with_meta![&["status", "succeeded"]],
        _ => with_meta![],
    }
}

/// Decodes of the JSON object `json` only what its selectors read (see
/// [`object_fields`] and [`crate::meta::labels`]): the rest is parsed, so
/// bad JSON is still an error, but not built. A watch decodes every change
/// it filters, and a pod's spec and managed fields are most of its bytes.
pub fn selectable_parts(kind: Kind, json: &[u8]) -> serde_json::Result<Value> {
    use serde::de::DeserializeSeed;
    let paths: Vec<&[&str]> = selected_paths(kind).to_vec();
    let mut de = serde_json::Deserializer::from_slice(json);
    let value = Pick { paths: &paths, depth: 0 }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Keeps of a JSON value what `paths` (from `depth` on) name.
struct Pick<'p> {
    paths: &'p [&'p [&'p str]],
    depth: usize,
}

impl<'de> serde::de::DeserializeSeed<'de> for Pick<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pick<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            let key = key.0;
            let under: Vec<&[&str]> =
                self.paths.iter().copied().filter(|p| p.get(self.depth) == Some(&key.as_ref())).collect();
            if under.is_empty() {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if under.iter().any(|p| p.len() == self.depth + 1) {
                out.insert(key.into_owned(), map.next_value::<Value>()?);
            } else {
                let value = map.next_value_seed(Pick { paths: &under, depth: self.depth + 1 })?;
                out.insert(key.into_owned(), value);
            }
        }
        Ok(Value::Object(out))
    }

    // Above a kept path only objects matter: anything else holds no field.
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(Value::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_str<E>(self, _: &str) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// An object's key, borrowed from the input when it has no escapes.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(std::borrow::Cow::Owned(v)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::sample::select;
    use serde_json::json;

    use super::*;

    #[test]
    fn the_selectable_parts_select_as_the_whole_object_does() {
        let objects = [
            (
                Kind::Pod,
                json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "web-1", "namespace": "prod", "labels": {"app": "web", "tier": "a\"b"},
                        "annotations": {"x": "y"}, "managedFields": [{"manager": "m", "fieldsV1": {"f:spec": {}}}]},
                    "spec": {"nodeName": "node-1", "restartPolicy": "Never", "schedulerName": "s",
                        "serviceAccountName": "sa", "hostNetwork": true,
                        "containers": [{"name": "c", "image": "i", "args": ["a", 1, null, {"k": [true]}]}]},
                    "status": {"phase": "Running", "podIP": "10.0.0.2", "podIPs": [{"ip": "10.0.0.1"}],
                        "nominatedNodeName": "n", "conditions": [{"type": "Ready"}]}}),
            ),
            (Kind::Pod, json!({"metadata": {"name": "bare"}, "spec": null, "status": [1, 2]})),
            (
                Kind::Event,
                json!({"metadata": {"name": "e", "namespace": "prod"},
                    "involvedObject": {"kind": "Pod", "name": "web-1", "uid": "u", "fieldPath": "spec"},
                    "reason": "Started", "type": "Normal", "source": {"component": "kubelet"}, "message": "m"}),
            ),
            (Kind::Event, json!({"metadata": {"name": "e2"}, "reportingComponent": "ctl", "reason": "R"})),
            (
                Kind::Secret,
                json!({"metadata": {"name": "s", "namespace": "a"}, "type": "Opaque", "data": {"k": "dg=="}}),
            ),
            (Kind::Node, json!({"metadata": {"name": "n", "labels": {"zone": "z"}}, "spec": {"unschedulable": true}})),
            (Kind::Namespace, json!({"metadata": {"name": "ns"}, "status": {"phase": "Terminating"}})),
            (Kind::ReplicaSet, json!({"metadata": {"name": "rs", "namespace": "a"}, "status": {"replicas": 3}})),
            (Kind::Job, json!({"metadata": {"name": "j", "namespace": "a"}, "status": {"succeeded": 2}})),
            (
                Kind::Custom,
                json!({"metadata": {"name": "c", "namespace": "a", "labels": {"k": "v"}}, "spec": {"x": 1}}),
            ),
        ];
        for (kind, object) in objects {
            let bytes = serde_json::to_vec(&object).unwrap();
            let parts = selectable_parts(kind, &bytes).unwrap();
            assert_eq!(object_fields(kind, &parts), object_fields(kind, &object), "{kind:?}: {object}");
            assert_eq!(crate::meta::labels(&parts), crate::meta::labels(&object), "{object}");
            assert_eq!(crate::meta::namespace(&parts), crate::meta::namespace(&object), "{object}");
            assert!(parts["metadata"].get("managedFields").is_none() && parts.get("data").is_none(), "{parts}");
        }
        // Keys with escapes are read as the whole object reads them.
        let escaped = br#"{"metadata":{"n\u0061me":"x","labels":{"a\"b":"c"}},"spec":{"nodeName":"n\/1"}}"#;
        let parts = selectable_parts(Kind::Pod, escaped).unwrap();
        assert_eq!((parts["metadata"]["name"].as_str(), parts["spec"]["nodeName"].as_str()), (Some("x"), Some("n/1")));
        assert_eq!(parts["metadata"]["labels"]["a\"b"], "c");
        // What is not JSON is still refused.
        for bad in [&b"{"[..], b"{\"spec\": {\"containers\": [}}", b"{} {}", b"[1"] {
            assert!(selectable_parts(Kind::Pod, bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn label_error(s: &str) -> String {
        match LabelSelector::parse(s) {
            Ok(sel) => panic!("{s:?} parsed as {sel:?}"),
            Err(SelectorError(e)) => e,
        }
    }

    fn field_error(s: &str) -> String {
        match FieldSelector::parse(s) {
            Ok(sel) => panic!("{s:?} parsed as {sel:?}"),
            Err(SelectorError(e)) => e,
        }
    }

    fn only(sel: &LabelSelector) -> (&str, Operator, Vec<&str>) {
        assert_eq!(sel.requirements().len(), 1, "{sel:?}");
        let r = &sel.requirements()[0];
        (r.key(), r.operator(), r.values().iter().map(String::as_str).collect())
    }

    #[test]
    fn every_label_operator_parses() {
        let cases: &[(&str, Operator, &[&str])] = &[
            ("app=web", Operator::Equals, &["web"]),
            ("app==web", Operator::Equals, &["web"]),
            ("app!=web", Operator::NotEquals, &["web"]),
            ("app in (web,db)", Operator::In, &["db", "web"]),
            ("app notin (web)", Operator::NotIn, &["web"]),
            ("app", Operator::Exists, &[]),
            ("!app", Operator::DoesNotExist, &[]),
            ("app>3", Operator::GreaterThan, &["3"]),
            ("app<3", Operator::LessThan, &["3"]),
        ];
        for (s, op, values) in cases {
            let sel = LabelSelector::parse(s).unwrap();
            assert_eq!(only(&sel), ("app", *op, values.to_vec()), "{s}");
        }
    }

    #[test]
    fn whitespace_between_tokens_is_ignored() {
        let spaced = LabelSelector::parse("  app =  web ,\ttier\n!= db , env in ( a , b ) ,  ! gone , x  ").unwrap();
        let tight = LabelSelector::parse("app=web,tier!=db,env in (a,b),!gone,x").unwrap();
        assert_eq!(spaced, tight);
        assert_eq!(LabelSelector::parse("env in(a)").unwrap(), LabelSelector::parse("env in (a)").unwrap());
    }

    #[test]
    fn the_empty_string_selects_everything() {
        for s in ["", "   ", "\t\n"] {
            let sel = LabelSelector::parse(s).unwrap();
            assert!(sel.is_empty());
            assert!(sel.matches(&labels(&[])));
            assert!(sel.matches(&labels(&[("a", "b")])));
            assert_eq!(sel.to_string(), "");
        }
        assert!(LabelSelector::default().is_empty());
    }

    #[test]
    fn a_missing_value_is_the_empty_value() {
        assert_eq!(only(&LabelSelector::parse("a=").unwrap()), ("a", Operator::Equals, vec![""]));
        assert_eq!(only(&LabelSelector::parse("a!=").unwrap()), ("a", Operator::NotEquals, vec![""]));
        assert_eq!(only(&LabelSelector::parse("a in ()").unwrap()), ("a", Operator::In, vec![""]));
        assert_eq!(only(&LabelSelector::parse("a in (,b)").unwrap()), ("a", Operator::In, vec!["", "b"]));
        assert_eq!(only(&LabelSelector::parse("a in (b,)").unwrap()), ("a", Operator::In, vec!["", "b"]));
        assert_eq!(only(&LabelSelector::parse("a in (b,,c)").unwrap()), ("a", Operator::In, vec!["", "b", "c"]));
        let sel = LabelSelector::parse("a=").unwrap();
        assert!(sel.matches(&labels(&[("a", "")])));
        assert!(!sel.matches(&labels(&[])));
    }

    #[test]
    fn in_and_notin_are_names_outside_the_operator_position() {
        let sel = LabelSelector::parse("in in (notin,in),notin=in").unwrap();
        assert_eq!(sel.requirements()[0].key(), "in");
        assert_eq!(sel.requirements()[1].key(), "notin");
        assert!(sel.matches(&labels(&[("in", "notin"), ("notin", "in")])));
    }

    #[test]
    fn prefixed_keys_are_accepted() {
        let sel = LabelSelector::parse("app.kubernetes.io/name=web,k8s.io/x_Y.z-1").unwrap();
        assert!(sel.matches(&labels(&[("app.kubernetes.io/name", "web"), ("k8s.io/x_Y.z-1", "")])));
    }

    #[test]
    fn malformed_selectors_are_refused_naming_the_offending_text() {
        let cases: &[(&str, &str)] = &[
            ("a in (b", "found end of string, expected: ',' or ')'"),
            ("a in (b c)", "found 'c', expected: ',' or ')'"),
            ("a in b", "found 'b', expected: '('"),
            ("a in (=)", "found '=', expected: ',', ')' or identifier"),
            ("a in (b,=)", "found '=', expected: ',', or identifier"),
            ("a in", "found end of string, expected: '('"),
            ("=x", "found '=', expected: !, identifier, or 'end of string'"),
            ("a=b=c", "found '=', expected: ',' or 'end of string'"),
            ("a=b c", "found 'c', expected: ',' or 'end of string'"),
            ("a (b)", "found '(' after key \"a\", expected: in, notin, =, ==, !=, >, <"),
            ("a b", "found 'b' after key \"a\", expected: in, notin"),
            ("a=(b)", "found '(', expected: identifier"),
            ("a,", "found end of string, expected: identifier after ','"),
            ("a,,b", "found ',', expected: identifier after ','"),
            (",a", "found ',', expected: !, identifier"),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
            ("!!a", "found '!', expected: identifier"),
            ("a in (b))", "found ')', expected: ',' or 'end of string'"),
            // Kubernetes' quirk: `(,,)` and `(b,,)` fail though `(b,,,)` parses.
            ("a in (,,)", "found ')', expected: ',', or identifier"),
            ("a in (b,,)", "found ')', expected: ',', or identifier"),
            ("a>b", "for 'Gt', 'Lt' operators, the value must be an integer"),
            ("a<", "for 'Gt', 'Lt' operators, the value must be an integer"),
        ];
        for (s, want) in cases {
            let got = label_error(s);
            assert!(got.contains(want), "{s:?}: {got}");
        }
        assert!(label_error("a in (b").starts_with("unable to parse requirement: "));
    }

    #[test]
    fn invalid_keys_are_refused() {
        let long = "a".repeat(64);
        let cases: Vec<(String, &str)> = vec![
            ("-a=b".into(), "name part must consist of alphanumeric characters"),
            ("a-=b".into(), "name part must consist of alphanumeric characters"),
            ("a b c".into(), "found 'b'"),
            ("a/b/c".into(), "a qualified name must consist of"),
            ("/a".into(), "prefix part must be non-empty"),
            ("a/".into(), "name part must be non-empty"),
            ("Example.com/a".into(), "prefix part a lowercase RFC 1123 subdomain"),
            ("ex_ample.com/a".into(), "prefix part a lowercase RFC 1123 subdomain"),
            (format!("{long}=x"), "name part must be no more than 63 characters"),
            (format!("{}/a", "a".repeat(254)), "prefix part must be no more than 253 characters"),
            ("ünï=x".into(), "invalid label key \"ünï\""),
        ];
        for (s, want) in &cases {
            let got = label_error(s);
            assert!(got.contains(want), "{s:?}: {got}");
        }
        assert!(label_error("-a=b").contains("invalid label key \"-a\""));
        assert!(LabelSelector::parse(&format!("{}/{}", "a".repeat(253), "b".repeat(63))).is_ok());
    }

    #[test]
    fn invalid_values_are_refused() {
        let long = "v".repeat(64);
        let got = label_error(&format!("a={long}"));
        assert!(got.contains("must be no more than 63 characters"), "{got}");
        assert!(got.contains(&long), "{got}");
        assert!(LabelSelector::parse(&format!("a={}", "v".repeat(63))).is_ok());
        for s in ["a=-b", "a=b-", "a in (ok,bad_)", "a=b/c", "a!=.", "a=ü"] {
            let got = label_error(s);
            assert!(got.contains("a valid label must be an empty string"), "{s:?}: {got}");
            assert!(got.contains("invalid label value"), "{s:?}: {got}");
        }
    }

    #[test]
    fn equality_requires_the_label_with_the_value() {
        let sel = LabelSelector::parse("app=web").unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("x", "y")])));
        assert!(!sel.matches(&labels(&[("app", "db")])));
        assert!(!sel.matches(&labels(&[])));
    }

    #[test]
    fn notin_matches_objects_without_the_key() {
        let sel = LabelSelector::parse("env notin (prod,staging)").unwrap();
        assert!(sel.matches(&labels(&[])));
        assert!(sel.matches(&labels(&[("env", "dev")])));
        assert!(!sel.matches(&labels(&[("env", "prod")])));
    }

    #[test]
    fn not_equals_matches_objects_without_the_key() {
        let sel = LabelSelector::parse("env!=prod").unwrap();
        assert!(sel.matches(&labels(&[])));
        assert!(sel.matches(&labels(&[("env", "dev")])));
        assert!(!sel.matches(&labels(&[("env", "prod")])));
    }

    #[test]
    fn in_requires_the_key() {
        let sel = LabelSelector::parse("env in (prod,dev)").unwrap();
        assert!(sel.matches(&labels(&[("env", "dev")])));
        assert!(!sel.matches(&labels(&[("env", "qa")])));
        assert!(!sel.matches(&labels(&[])));
    }

    #[test]
    fn exists_and_does_not_exist_look_only_at_the_key() {
        let exists = LabelSelector::parse("gpu").unwrap();
        let absent = LabelSelector::parse("!gpu").unwrap();
        let with = labels(&[("gpu", "")]);
        let without = labels(&[("cpu", "x")]);
        assert!(exists.matches(&with) && !exists.matches(&without));
        assert!(!absent.matches(&with) && absent.matches(&without));
    }

    #[test]
    fn greater_and_less_than_compare_integers() {
        let sel = LabelSelector::parse("size>3,size<10").unwrap();
        assert!(sel.matches(&labels(&[("size", "5")])));
        assert!(!sel.matches(&labels(&[("size", "3")])));
        assert!(!sel.matches(&labels(&[("size", "10")])));
        assert!(!sel.matches(&labels(&[("size", "big")])));
        assert!(!sel.matches(&labels(&[])));
    }

    #[test]
    fn all_requirements_must_hold() {
        let sel = LabelSelector::parse("app=web,tier in (front),!canary").unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "front")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "front"), ("canary", "1")])));
        assert!(!sel.matches(&labels(&[("app", "web")])));
    }

    #[test]
    fn display_is_canonical_and_round_trips() {
        let sel = LabelSelector::parse(" z in (b, a) , !y,x==1 ,w notin (c),v!=2 ,u, t>4,s<5, z in (a,b)").unwrap();
        assert_eq!(sel.to_string(), "s<5,t>4,u,v!=2,w notin (c),x=1,!y,z in (a,b)");
        assert_eq!(LabelSelector::parse(&sel.to_string()).unwrap(), sel);
        assert_eq!(LabelSelector::parse("a in ()").unwrap().to_string(), "a in ()");
        assert_eq!(LabelSelector::parse("a in (,b)").unwrap().to_string(), "a in (,b)");
        assert_eq!("a=b".parse::<LabelSelector>().unwrap(), LabelSelector::parse("a==b").unwrap());
    }

    #[test]
    fn selectors_differing_only_in_order_are_equal() {
        assert_eq!(LabelSelector::parse("a=1,b=2").unwrap(), LabelSelector::parse("b=2,a=1,a=1").unwrap());
        assert_ne!(LabelSelector::parse("a=1").unwrap(), LabelSelector::parse("a!=1").unwrap());
    }

    #[test]
    fn from_labels_requires_each_label() {
        let sel = LabelSelector::from_labels(&labels(&[("app", "web"), ("tier", "")])).unwrap();
        assert_eq!(sel, LabelSelector::parse("app=web,tier=").unwrap());
        assert!(LabelSelector::from_labels(&labels(&[("bad key", "x")])).is_err());
    }

    #[test]
    fn from_api_reads_match_labels_and_expressions() {
        let api = json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["front", "back"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "canary", "operator": "DoesNotExist", "values": []},
            ]
        });
        let sel = LabelSelector::from_api(&api).unwrap();
        assert_eq!(sel, LabelSelector::parse("app=web,tier in (back,front),env notin (prod),gpu,!canary").unwrap());
        assert!(sel.matches(&labels(&[("app", "web"), ("tier", "front"), ("gpu", "")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("tier", "front")])));
    }

    #[test]
    fn from_api_empty_selector_matches_everything() {
        for api in [json!({}), json!({"matchLabels": {}, "matchExpressions": []}), json!({"matchLabels": null})] {
            let sel = LabelSelector::from_api(&api).unwrap();
            assert!(sel.is_empty());
            assert!(sel.matches(&labels(&[("any", "thing")])));
        }
    }

    #[test]
    fn from_api_refuses_invalid_selectors() {
        let cases = [
            (json!(null), "label selector must be an object, not null"),
            (json!("app=web"), "label selector must be an object, not a string"),
            (json!({"matchLabels": {"app": 1}}), "matchLabels.app: must be a string"),
            (json!({"matchLabels": {"-app": "x"}}), "invalid label key \"-app\""),
            (json!({"matchLabels": {"app": "x y"}}), "invalid label value \"x y\""),
            (json!({"matchLabels": []}), "matchLabels: must be an object"),
            (json!({"matchExpressions": {}}), "matchExpressions: must be an array"),
            (json!({"matchExpressions": [1]}), "matchExpressions[0]: must be an object"),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "matchExpressions[0].operator: \"Gt\" is not a valid label selector operator",
            ),
            (json!({"matchExpressions": [{"key": "a"}]}), "matchExpressions[0].operator: Required value"),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "matchExpressions[0]: key \"a\": for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]}),
                "values set can't be empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "values set must be empty for exists and does not exist",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": ["x"]}]}),
                "values set must be empty",
            ),
            (json!({"matchExpressions": [{"operator": "Exists"}]}), "invalid label key \"\""),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": [true]}]}),
                "matchExpressions[0].values[0]: must be a string",
            ),
            (
                json!({"matchExpressions": [
                    {"key": "a", "operator": "In", "values": ["ok"]},
                    {"key": "b", "operator": "In", "values": ["-"]},
                ]}),
                "matchExpressions[1]: invalid label value \"-\" for key \"b\"",
            ),
        ];
        for (api, want) in cases {
            match LabelSelector::from_api(&api) {
                Ok(sel) => panic!("{api} accepted as {sel:?}"),
                Err(SelectorError(got)) => assert!(got.contains(want), "{api}: {got}"),
            }
        }
    }

    fn fields(pairs: &[(&'static str, &str)]) -> Fields {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn field_selector_operators_parse_and_match() {
        let sel = FieldSelector::parse("spec.nodeName=n1,status.phase!=Failed,metadata.name==web").unwrap();
        assert_eq!(sel.requirements().len(), 3);
        let pod = fields(&[("spec.nodeName", "n1"), ("status.phase", "Running"), ("metadata.name", "web")]);
        assert!(sel.matches(&pod));
        let failed = fields(&[("spec.nodeName", "n1"), ("status.phase", "Failed"), ("metadata.name", "web")]);
        assert!(!sel.matches(&failed));
        assert_eq!(sel.to_string(), "metadata.name=web,spec.nodeName=n1,status.phase!=Failed");
    }

    #[test]
    fn the_empty_field_selector_selects_everything() {
        let sel = FieldSelector::parse("").unwrap();
        assert!(sel.is_empty());
        assert!(sel.matches(&fields(&[("a", "b")])));
        assert_eq!(sel.to_string(), "");
        // Kubernetes skips empty terms.
        assert_eq!(FieldSelector::parse(",a=b,,").unwrap(), FieldSelector::parse("a=b").unwrap());
    }

    #[test]
    fn a_missing_field_is_the_empty_string() {
        let unscheduled = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(unscheduled.matches(&fields(&[])));
        assert!(unscheduled.matches(&fields(&[("spec.nodeName", "")])));
        assert!(!unscheduled.matches(&fields(&[("spec.nodeName", "n1")])));
        let scheduled = FieldSelector::parse("spec.nodeName!=").unwrap();
        assert!(!scheduled.matches(&fields(&[])));
        assert!(FieldSelector::parse("spec.nodeName!=n1").unwrap().matches(&fields(&[])));
    }

    #[test]
    fn field_values_unescape_commas_equals_and_backslashes() {
        let sel = FieldSelector::parse(r"metadata.name=a\,b\=c\\d,reason=x").unwrap();
        assert_eq!(sel.exact("metadata.name"), Some(r"a,b=c\d"));
        assert_eq!(sel.exact("reason"), Some("x"));
        assert!(sel.matches(&fields(&[("metadata.name", r"a,b=c\d"), ("reason", "x")])));
        assert_eq!(sel.to_string(), r"metadata.name=a\,b\=c\\d,reason=x");
        assert_eq!(FieldSelector::parse(&sel.to_string()).unwrap(), sel);
        assert_eq!(escape_field_value(r"a,b=c\d"), r"a\,b\=c\\d");
    }

    #[test]
    fn malformed_field_selectors_are_refused() {
        let cases = [
            ("abc", "invalid selector: 'abc'; can't understand 'abc'"),
            ("a=b,c", "can't understand 'c'"),
            ("a=b=c", "unescaped character in value: '='"),
            (r"a=b\x", r"invalid escape sequence: \x in 'a=b\x'"),
            (r"a=b\", r"invalid escape sequence: \ at the end"),
            ("=x", "the field name is empty"),
            ("!=x", "the field name is empty"),
            (" ", "can't understand ' '"),
        ];
        for (s, want) in cases {
            let got = field_error(s);
            assert!(got.contains(want), "{s:?}: {got}");
        }
    }

    #[test]
    fn field_terms_split_at_the_first_operator() {
        let sel = FieldSelector::parse("a==b").unwrap();
        assert_eq!(sel.exact("a"), Some("b"));
        let sel = FieldSelector::parse("a!==b").unwrap_err();
        assert!(sel.0.contains("unescaped character in value: '='"), "{sel}");
        // No trimming: Kubernetes reads ` a` as the field name.
        let spaced = FieldSelector::parse(" a = b").unwrap();
        assert_eq!(spaced.requirements()[0].field(), " a ");
        assert_eq!(spaced.requirements()[0].value(), " b");
    }

    #[test]
    fn exact_returns_the_required_value_of_an_equality_only() {
        let sel = FieldSelector::parse("spec.nodeName==n1,status.phase!=Failed").unwrap();
        assert_eq!(sel.exact("spec.nodeName"), Some("n1"));
        assert_eq!(sel.exact("status.phase"), None);
        assert_eq!(sel.exact("metadata.name"), None);
        assert_eq!(FieldSelector::parse("spec.nodeName=").unwrap().exact("spec.nodeName"), Some(""));
        assert_eq!(FieldSelector::exactly("spec.nodeName", "n2").exact("spec.nodeName"), Some("n2"));
        assert_eq!(FieldSelector::exactly("a", "x,y").to_string(), r"a=x\,y");
    }

    #[test]
    fn check_supported_refuses_unknown_fields_with_the_kubernetes_message() {
        let sel = FieldSelector::parse("spec.nodeName=n1,metadata.namespace=default").unwrap();
        assert_eq!(sel.check_supported(Kind::Pod), Ok(()));
        assert_eq!(
            sel.check_supported(Kind::ConfigMap),
            Err(SelectorError("field label not supported: spec.nodeName".to_string()))
        );
        let err = FieldSelector::parse("status.podIPs=x").unwrap().check_supported(Kind::Pod).unwrap_err();
        assert_eq!(err.to_string(), "field label not supported: status.podIPs");
        assert!(FieldSelector::parse("metadata.name=a,metadata.namespace=")
            .unwrap()
            .check_supported(Kind::Node)
            .is_ok());
        assert!(FieldSelector::parse("").unwrap().check_supported(Kind::Lease).is_ok());
        assert!(FieldSelector::parse("involvedObject.uid=u,source=kubelet")
            .unwrap()
            .check_supported(Kind::Event)
            .is_ok());
    }

    const ALL_KINDS: [Kind; 24] = [
        Kind::Namespace,
        Kind::Pod,
        Kind::Node,
        Kind::Service,
        Kind::Endpoints,
        Kind::EndpointSlice,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::ServiceAccount,
        Kind::Event,
        Kind::Lease,
        Kind::ReplicationController,
        Kind::ReplicaSet,
        Kind::Deployment,
        Kind::DaemonSet,
        Kind::Job,
        Kind::CronJob,
        Kind::ResourceQuota,
        Kind::LimitRange,
        Kind::PriorityClass,
        Kind::Role,
        Kind::ClusterRole,
        Kind::RoleBinding,
        Kind::ClusterRoleBinding,
    ];

    #[test]
    fn object_fields_gives_exactly_the_supported_fields_of_every_kind() {
        for kind in ALL_KINDS {
            let want: BTreeSet<&str> = supported_fields(kind).iter().copied().collect();
            assert_eq!(want.len(), supported_fields(kind).len(), "{kind:?} lists a field twice");
            for obj in [json!({}), json!(null), json!({"metadata": {"name": "x", "namespace": "ns"}, "spec": 3})] {
                let got: BTreeSet<&str> = object_fields(kind, &obj).keys().copied().collect();
                assert_eq!(got, want, "{kind:?}");
            }
        }
    }

    #[test]
    fn object_fields_reads_a_realistic_pod() {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-7d4b9", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "node-1",
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "serviceAccountName": "web",
                "hostNetwork": true,
                "containers": [{"name": "web", "image": "nginx"}]
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.9",
                "podIPs": [{"ip": "10.0.0.9"}, {"ip": "fd00::9"}],
                "nominatedNodeName": "node-2"
            }
        });
        let f = object_fields(Kind::Pod, &pod);
        let want = fields(&[
            ("metadata.name", "web-7d4b9"),
            ("metadata.namespace", "shop"),
            ("spec.nodeName", "node-1"),
            ("spec.restartPolicy", "Always"),
            ("spec.schedulerName", "default-scheduler"),
            ("spec.serviceAccountName", "web"),
            ("spec.hostNetwork", "true"),
            ("status.phase", "Running"),
            ("status.podIP", "10.0.0.9"),
            ("status.nominatedNodeName", "node-2"),
        ]);
        assert_eq!(f, want);
        assert!(FieldSelector::parse("spec.nodeName=node-1,status.phase!=Succeeded").unwrap().matches(&f));
    }

    #[test]
    fn object_fields_of_a_new_pod_are_empty_with_host_network_false() {
        let pod = json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"containers": []}});
        let f = object_fields(Kind::Pod, &pod);
        assert_eq!(f["spec.nodeName"], "");
        assert_eq!(f["status.phase"], "");
        assert_eq!(f["status.podIP"], "");
        assert_eq!(f["spec.hostNetwork"], "false");
        assert!(FieldSelector::parse("spec.nodeName=").unwrap().matches(&f));
        // Only `podIP` set (an older writer): still read.
        let f = object_fields(Kind::Pod, &json!({"status": {"podIP": "10.1.1.1"}}));
        assert_eq!(f["status.podIP"], "10.1.1.1");
    }

    #[test]
    fn object_fields_reads_a_realistic_event() {
        let event = json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "web-7d4b9.17a3f", "namespace": "shop"},
            "involvedObject": {
                "kind": "Pod",
                "namespace": "shop",
                "name": "web-7d4b9",
                "uid": "0b5e-11",
                "apiVersion": "v1",
                "resourceVersion": "812",
                "fieldPath": "spec.containers{web}"
            },
            "reason": "Scheduled",
            "message": "Successfully assigned shop/web-7d4b9 to node-1",
            "source": {"component": "default-scheduler"},
            "reportingComponent": "default-scheduler",
            "type": "Normal",
            "count": 1
        });
        let f = object_fields(Kind::Event, &event);
        assert_eq!(f["metadata.name"], "web-7d4b9.17a3f");
        assert_eq!(f["involvedObject.kind"], "Pod");
        assert_eq!(f["involvedObject.namespace"], "shop");
        assert_eq!(f["involvedObject.name"], "web-7d4b9");
        assert_eq!(f["involvedObject.uid"], "0b5e-11");
        assert_eq!(f["involvedObject.apiVersion"], "v1");
        assert_eq!(f["involvedObject.resourceVersion"], "812");
        assert_eq!(f["involvedObject.fieldPath"], "spec.containers{web}");
        assert_eq!(f["reason"], "Scheduled");
        assert_eq!(f["reportingComponent"], "default-scheduler");
        assert_eq!(f["source"], "default-scheduler");
        assert_eq!(f["type"], "Normal");
        let sel = FieldSelector::parse("involvedObject.kind=Pod,involvedObject.name=web-7d4b9,type!=Warning").unwrap();
        assert!(sel.check_supported(Kind::Event).is_ok());
        assert!(sel.matches(&f));
    }

    #[test]
    fn event_source_falls_back_to_the_reporting_component() {
        let f = object_fields(Kind::Event, &json!({"reportingComponent": "kubelet", "source": {}}));
        assert_eq!(f["source"], "kubelet");
        let f = object_fields(Kind::Event, &json!({"reportingComponent": "x", "source": {"component": "y"}}));
        assert_eq!(f["source"], "y");
    }

    #[test]
    fn object_fields_of_other_kinds_follow_kubernetes() {
        let f = object_fields(Kind::Secret, &json!({"metadata": {"name": "s"}, "type": "kubernetes.io/tls"}));
        assert_eq!(f["type"], "kubernetes.io/tls");
        let f = object_fields(Kind::Node, &json!({"metadata": {"name": "n1", "namespace": "stray"}}));
        assert_eq!(f["spec.unschedulable"], "false");
        assert_eq!(f["metadata.namespace"], "", "nodes are cluster-scoped");
        let f = object_fields(Kind::Node, &json!({"spec": {"unschedulable": true}}));
        assert_eq!(f["spec.unschedulable"], "true");
        let f = object_fields(Kind::Namespace, &json!({"metadata": {"name": "a"}, "status": {"phase": "Terminating"}}));
        assert_eq!((f["metadata.name"].as_str(), f["status.phase"].as_str()), ("a", "Terminating"));
        assert_eq!(object_fields(Kind::ReplicaSet, &json!({"status": {"replicas": 3}}))["status.replicas"], "3");
        assert_eq!(object_fields(Kind::ReplicaSet, &json!({"status": {}}))["status.replicas"], "0");
        assert_eq!(object_fields(Kind::Job, &json!({"status": {"succeeded": 2}}))["status.successful"], "2");
        assert_eq!(object_fields(Kind::Job, &json!({}))["status.successful"], "0");
        let f = object_fields(Kind::ConfigMap, &json!({"metadata": {"name": "c", "namespace": "ns"}}));
        assert_eq!(f, fields(&[("metadata.name", "c"), ("metadata.namespace", "ns")]));
    }

    // ---- properties ----

    fn label_token() -> impl Strategy<Value = &'static str> {
        select(vec![
            "a", "b", "app", "x.io/k", "in", "notin", "1", "42", "v-1", "A_b", "-", "/", ".", "=", "==", "!=", "!",
            "(", ")", ",", ">", "<", " ", "\t", "ü",
        ])
    }

    fn field_token() -> impl Strategy<Value = &'static str> {
        select(vec!["a", "spec.nodeName", "x", "=", "==", "!=", "!", ",", "\\", "\\,", "\\=", "\\\\", " ", "é", ""])
    }

    /// A valid requirement, written with random spacing.
    fn valid_requirement() -> impl Strategy<Value = String> {
        let key = "([a-z0-9]([-a-z0-9]{0,3}[a-z0-9])?/)?[A-Za-z0-9]([-_.A-Za-z0-9]{0,5}[A-Za-z0-9])?";
        let value = "([A-Za-z0-9]([-_.A-Za-z0-9]{0,5}[A-Za-z0-9])?)?";
        // Lists of non-empty values: Kubernetes' grammar for empty entries is
        // irregular (`(a,)` parses, `(a,,)` does not).
        let listed = "[A-Za-z0-9]([-_.A-Za-z0-9]{0,5}[A-Za-z0-9])?";
        let ws = "[ \t]{0,2}";
        (key, ws, value, vec(listed, 1..4), 0..8usize, ws, "[0-9]{1,3}").prop_map(
            |(key, ws, value, values, op, ws2, number)| match op {
                0 => format!("{ws}{key}{ws2}={ws}{value}"),
                1 => format!("{key}{ws}=={ws2}{value}"),
                2 => format!("{key}{ws}!={ws2}{value}{ws}"),
                3 => format!("{ws}{key} in{ws2}({})", values.join(&format!("{ws},{ws2}"))),
                4 => format!("{key} notin ({}{ws}){ws2}", values.join(",")),
                5 => format!("{ws}{key}{ws2}"),
                6 => format!("!{ws}{key}"),
                _ => format!("{key}{ws}>{ws2}{number}"),
            },
        )
    }

    fn label_round_trip(s: &str) -> Result<(), TestCaseError> {
        if let Ok(sel) = LabelSelector::parse(s) {
            let shown = sel.to_string();
            prop_assert_eq!(LabelSelector::parse(&shown), Ok(sel.clone()), "{:?} shown as {:?}", s, shown);
        }
        Ok(())
    }

    fn field_round_trip(s: &str) -> Result<(), TestCaseError> {
        if let Ok(sel) = FieldSelector::parse(s) {
            let shown = sel.to_string();
            prop_assert_eq!(FieldSelector::parse(&shown), Ok(sel.clone()), "{:?} shown as {:?}", s, shown);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn at_finds_what_a_json_pointer_finds(
            segments in vec(select(vec!["metadata", "name", "a", "0", "1", "01", "+1", "", "x~1y", "x/y", "~0", "~"]), 0..4),
            slash in any::<bool>(),
        ) {
            let obj = json!({
                "metadata": {"name": "n", "a": [{"name": "first"}, {"x/y": 1}]},
                "a": [[1, 2], {"0": "zero", "1": [true]}],
                "x/y": {"~": 3},
                "0": {"01": "z", "+1": "plus"},
                "": {"": "empty"}
            });
            let mut pointer: String = segments.iter().map(|s| format!("/{s}")).collect();
            if !slash && !pointer.is_empty() {
                pointer.remove(0);
            }
            prop_assert_eq!(at(&obj, &pointer), obj.pointer(&pointer), "{}", pointer);
        }

        #[test]
        fn label_parse_never_panics_and_display_round_trips(s in any::<String>()) {
            label_round_trip(&s)?;
        }

        #[test]
        fn label_token_soup_never_panics_and_display_round_trips(tokens in vec(label_token(), 0..14)) {
            label_round_trip(&tokens.concat())?;
        }

        #[test]
        fn valid_label_selectors_parse_and_round_trip(reqs in vec(valid_requirement(), 0..5)) {
            let s = reqs.join(",");
            let sel = LabelSelector::parse(&s);
            prop_assert!(sel.is_ok(), "{:?}: {:?}", s, sel);
            label_round_trip(&s)?;
        }

        #[test]
        fn field_parse_never_panics_and_display_round_trips(s in any::<String>()) {
            field_round_trip(&s)?;
        }

        #[test]
        fn field_token_soup_never_panics_and_display_round_trips(tokens in vec(field_token(), 0..14)) {
            field_round_trip(&tokens.concat())?;
        }

        #[test]
        fn escaped_field_values_round_trip(field in "[a-zA-Z.]{1,12}", value in any::<String>()) {
            let sel = FieldSelector::parse(&format!("{field}={}", escape_field_value(&value)));
            prop_assert_eq!(sel.as_ref().ok().and_then(|s| s.exact(&field)), Some(value.as_str()));
        }

        #[test]
        fn object_fields_never_panics(kind in select(ALL_KINDS.to_vec()), n in any::<i64>(), s in ".{0,8}") {
            // Every field of the wrong type.
            let obj = json!({"metadata": {"name": n}, "spec": s, "status": {"replicas": s, "succeeded": -1.5}});
            let fields = object_fields(kind, &obj);
            prop_assert_eq!(fields.len(), supported_fields(kind).len());
        }
    }
}
