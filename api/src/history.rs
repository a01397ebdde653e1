//! Stub: replaced by the history module (summaries and diffs).
use serde_json::Value;
pub fn summarize(_old: Option<&Value>, _new: Option<&Value>) -> String {
    todo!()
}
pub fn unified_diff(_from: &Value, _to: &Value, _from_label: &str, _to_label: &str) -> String {
    todo!()
}
pub fn to_yaml(_v: &Value) -> String {
    todo!()
}
