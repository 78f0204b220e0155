"""Issue 14: the Kubernetes manifests in deploy/kubernetes validate against the Kubernetes schemas
(offline, kubernetes-validate) and say what docs/deploy.md promises."""

from __future__ import annotations

import kubernetes_validate
import yaml

from tests.conftest import REPO

MANIFESTS = REPO / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30.0"


def documents() -> dict[str, dict]:
    found = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


def test_every_manifest_is_valid_against_the_kubernetes_schemas():
    found = documents()
    assert set(found) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler"}
    for document in found.values():
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_the_deployment_probes_ready_and_health_and_drains_longer_than_a_reply():
    pod = documents()["Deployment"]["spec"]["template"]["spec"]
    server = pod["containers"][0]
    assert server["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "preStop" in server["lifecycle"]
    grace = next(float(arg.split("=", 1)[1]) for arg in server["args"] if arg.startswith("--shutdown-grace="))
    assert pod["terminationGracePeriodSeconds"] > grace + 5  # preStop sleep + reply grace + exit
    assert any(arg.startswith("--state-url=") for arg in server["args"])
    assert any(arg.startswith("--voices-url=") for arg in server["args"])


def test_autoscaling_reads_a_metric_the_server_exports():
    from session_server.metrics import ServerMetrics

    hpa = documents()["HorizontalPodAutoscaler"]
    names = [metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]]
    metrics = ServerMetrics()
    metrics.watch(lambda: None, lambda: 0)
    exported = metrics.render().decode()
    assert all(f"# TYPE {name} gauge" in exported for name in names)
