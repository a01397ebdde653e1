"""The official Python Kubernetes client against a Skiff apiserver.

Usage: client_check.py http://HOST:PORT NAMESPACE

Lists, watches from a resourceVersion, creates, patches and deletes through
the `kubernetes` package (installed by `make test`), and exits non-zero with
a message on the first thing that is not as a Kubernetes apiserver would do.
"""

import sys
import threading

from kubernetes import client, watch


def main() -> None:
    server, namespace = sys.argv[1], sys.argv[2]
    config = client.Configuration()
    config.host = server
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
    print("ok")


if __name__ == "__main__":
    main()
