"""The official Python Kubernetes client against a Skiff apiserver.

Usage: client_check.py URL NAMESPACE [CA CERT KEY]

With CA, CERT and KEY the URL is https:// and the client trusts CA and
presents the client certificate CERT (its key KEY), as a kubeconfig with
certificate-authority, client-certificate and client-key does.

Lists, watches from a resourceVersion, creates, patches and deletes through
the `kubernetes` package (installed by `make test`), then defines a custom
resource and works it as an operator does (watch, status, scale), and exits
non-zero with a message on the first thing that is not as a Kubernetes
apiserver would do.
"""

import sys
import threading
import time

from kubernetes import client, watch


def main() -> None:
    server, namespace = sys.argv[1], sys.argv[2]
    config = client.Configuration()
    config.host = server
    if len(sys.argv) == 6:
        config.ssl_ca_cert, config.cert_file, config.key_file = sys.argv[3:6]
    api_client = client.ApiClient(config)
    core = client.CoreV1Api(api_client)
    apps = client.AppsV1Api(api_client)

    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    listed = core.list_namespaced_config_map(namespace)
    assert listed.items == [], listed.items
    start = listed.metadata.resource_version
    assert start.isdigit(), start

    # Watch from the list's resourceVersion while writing.
    events = []
    done = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_config_map, namespace, resource_version=start, timeout_seconds=20):
            events.append((event["type"], event["object"].metadata.name, event["object"].data))
            if len(events) == 3:
                w.stop()
        done.set()

    watcher = threading.Thread(target=follow)
    watcher.start()

    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg", labels={"app": "py"}), data={"mode": "fast"})
    created = core.create_namespaced_config_map(namespace, cm)
    assert created.metadata.uid, created
    patched = core.patch_namespaced_config_map("cfg", namespace, {"data": {"mode": "slow"}})
    assert patched.data == {"mode": "slow"}, patched.data
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    core.delete_namespaced_config_map("cfg", namespace)

    assert done.wait(20), "the watch did not deliver three events"
    watcher.join()
    assert [e[0] for e in events] == ["ADDED", "MODIFIED", "DELETED"], events
    assert events[1][2] == {"mode": "slow"}, events

    # Typed objects round-trip: a deployment with a selector and a template.
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="web"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "web"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "web"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="web", image="nginx:1.27")]),
            ),
        ),
    )
    made = apps.create_namespaced_deployment(namespace, deployment)
    assert made.spec.strategy.type == "RollingUpdate", made.spec.strategy
    listed = apps.list_namespaced_deployment(namespace, label_selector="app=web")
    assert listed.items == [], "the deployment has no labels of its own"
    listed = apps.list_namespaced_deployment(namespace, field_selector="metadata.name=web")
    assert [d.metadata.name for d in listed.items] == ["web"], listed.items

    try:
        core.read_namespaced_config_map("cfg", namespace)
        raise AssertionError("a deleted configmap was found")
    except client.exceptions.ApiException as e:
        assert e.status == 404, e
    try:
        core.create_namespaced_pod(namespace, client.V1Pod(metadata=client.V1ObjectMeta(name="Bad_Name"),
                                                           spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")])))
        raise AssertionError("an invalid pod was created")
    except client.exceptions.ApiException as e:
        assert e.status == 422, e
    custom_resources(api_client, namespace)
    print("ok")


def custom_resources(api_client: client.ApiClient, namespace: str) -> None:
    """The operator pattern: define a resource, watch its objects, write
    their status and scale, and see the definition's removal take them."""
    extensions = client.ApiextensionsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    group, version, plural = "example.org", "v1", "pets"
    definition = client.V1CustomResourceDefinition.from_dict({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": "pet", "kind": "Pet"},
            "versions": [{
                "name": version, "served": True, "storage": True,
                "subresources": {"status": {}, "scale": {
                    "specReplicasPath": ".spec.legs", "statusReplicasPath": ".status.legs"}},
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "required": ["legs"], "properties": {
                            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
                            "sound": {"type": "string", "default": "purr"}}},
                        "status": {"type": "object", "properties": {
                            "legs": {"type": "integer"}, "seen": {"type": "boolean"}}},
                    },
                }},
            }],
        },
    })
    made = extensions.create_custom_resource_definition(definition)
    assert made.metadata.name == f"{plural}.{group}", made.metadata
    deadline = time.time() + 20
    while True:
        got = extensions.read_custom_resource_definition(f"{plural}.{group}")
        conditions = {c.type: c.status for c in (got.status.conditions or [])} if got.status else {}
        if conditions.get("Established") == "True":
            break
        assert time.time() < deadline, f"never Established: {conditions}"
        time.sleep(0.2)

    listed = custom.list_namespaced_custom_object(group, version, namespace, plural)
    assert listed["items"] == [], listed
    start = listed["metadata"]["resourceVersion"]

    # The operator: watch from the list's revision and mark what it sees.
    seen = []
    done = threading.Event()

    def operate() -> None:
        w = watch.Watch()
        for event in w.stream(custom.list_namespaced_custom_object, group, version, namespace, plural,
                              resource_version=start, timeout_seconds=20):
            obj = event["object"]
            seen.append((event["type"], obj["metadata"]["name"]))
            if event["type"] == "ADDED":
                custom.patch_namespaced_custom_object_status(
                    group, version, namespace, plural, obj["metadata"]["name"], {"status": {"seen": True}})
            if len(seen) == 2:
                w.stop()
        done.set()

    operator = threading.Thread(target=operate)
    operator.start()
    pet = {"apiVersion": f"{group}/{version}", "kind": "Pet", "metadata": {"name": "cat"},
           "spec": {"legs": 4, "extra": "pruned"}}
    created = custom.create_namespaced_custom_object(group, version, namespace, plural, pet)
    assert created["spec"] == {"legs": 4, "sound": "purr"}, created["spec"]
    assert done.wait(20), f"the operator saw only {seen}"
    operator.join()
    # Its own status write comes back to it as a change.
    assert seen == [("ADDED", "cat"), ("MODIFIED", "cat")], seen
    got = custom.get_namespaced_custom_object(group, version, namespace, plural, "cat")
    assert got["status"] == {"seen": True}, got

    # Merge patch, scale and the schema's bounds.
    patched = custom.patch_namespaced_custom_object(group, version, namespace, plural, "cat",
                                                    {"spec": {"sound": "meow"}})
    assert patched["spec"] == {"legs": 4, "sound": "meow"}, patched["spec"]
    scaled = custom.patch_namespaced_custom_object_scale(group, version, namespace, plural, "cat",
                                                         {"spec": {"replicas": 3}})
    assert scaled["kind"] == "Scale" and scaled["spec"]["replicas"] == 3, scaled
    assert custom.get_namespaced_custom_object(group, version, namespace, plural, "cat")["spec"]["legs"] == 3
    try:
        custom.patch_namespaced_custom_object(group, version, namespace, plural, "cat", {"spec": {"legs": 9}})
        raise AssertionError("a pet with 9 legs was accepted")
    except client.exceptions.ApiException as e:
        assert e.status == 422 and "spec.legs" in e.body, (e.status, e.body)

    # Deleting the definition deletes its objects.
    extensions.delete_custom_resource_definition(f"{plural}.{group}")
    deadline = time.time() + 20
    while True:
        try:
            custom.list_namespaced_custom_object(group, version, namespace, plural)
        except client.exceptions.ApiException as e:
            assert e.status == 404, e
            break
        assert time.time() < deadline, "the resource is still served after its definition went"
        time.sleep(0.2)


if __name__ == "__main__":
    main()
