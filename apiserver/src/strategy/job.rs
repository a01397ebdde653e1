//! Jobs: generation counts spec changes, and a Job without a manual
//! selector selects its pods by its own uid, as Kubernetes generates it.

use serde_json::{json, Value};
use skiff_api::meta;
use skiff_api::resources::ResourceInfo;

use super::Strategy;

pub struct Job;

impl Strategy for Job {
    fn tracks_generation(&self) -> bool {
        true
    }

    fn prepare_for_create(&self, info: &ResourceInfo, obj: &mut Value) {
        super::Default.prepare_for_create(info, obj);
        select_own_pods(obj);
    }
}

/// Labels on the template and a selector on them, unless the Job asks for
/// a manual selector. Runs before a `generateName` is resolved, so such a
/// Job's `job-name` labels are empty.
fn select_own_pods(job: &mut Value) {
    if job["spec"]["manualSelector"] == json!(true) {
        return;
    }
    let uid = meta::uid(job).unwrap_or_default().to_string();
    let name = meta::name(job).unwrap_or_default().to_string();
    job["spec"]["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}});
    let labels = &mut job["spec"]["template"]["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", &uid),
        ("controller-uid", &uid),
        ("batch.kubernetes.io/job-name", &name),
        ("job-name", &name),
    ] {
        labels[k] = json!(v);
    }
}

#[cfg(test)]
mod tests {
    use skiff_api::resources::{self, Kind};

    use super::*;

    #[test]
    fn a_job_selects_its_pods_by_uid_unless_its_selector_is_manual() {
        let info = resources::of(Kind::Job);
        let mut job =
            json!({"metadata": {"name": "pi", "uid": "u1"}, "spec": {"template": {}}, "status": {"active": 1}});
        Job.prepare_for_create(info, &mut job);
        assert!(job.get("status").is_none());
        assert_eq!(job["spec"]["selector"], json!({"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}}));
        assert_eq!(job["spec"]["template"]["metadata"]["labels"]["job-name"], "pi");
        let manual = json!({"metadata": {"name": "pi", "uid": "u1"}, "spec": {"manualSelector": true, "selector": {"matchLabels": {"a": "b"}}}});
        let mut job = manual.clone();
        Job.prepare_for_create(info, &mut job);
        assert_eq!(job, manual);
    }
}
