"""The Helm chart in deploy/helm/autorepair, rendered by Helm's own engine.

Rendering uses PyPI ``helm-python-sdk`` (``helm_python``): ctypes bindings to
``libhelm_c``, a C ABI over Helm's official Go SDK (v4), shipped inside the wheel. Its
``Chart.render`` is what ``helm template`` runs (values merged, ``values.schema.json``
enforced, ``required``/``fail`` honoured) and ``lint`` is ``helm lint``. Every rendered
object is validated against the Kubernetes OpenAPI schemas with ``kubernetes-validate``
(strict: unknown fields are errors).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

helm = pytest.importorskip(
    "helm_python", reason="helm-python-sdk (Helm's Go SDK as a wheel) is not installed"
)
import kubernetes_validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "autorepair"
NS = "autorepair"
RELEASE = "ar"
FULL = "ar-autorepair"
#: Oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schema
#: kubernetes-validate ships.
KUBE_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())

RECEIVER_TOKENS = "tok-017 node gpu-east/gpu-017\ntok-col collector gpu-east\n"
BASE: dict[str, Any] = {
    "agent": {"cluster": "gpu-east"},
    "secrets": {"create": True, "ledgerDsn": "postgresql://ar:pw@pg:5432/ar",
                "ingestTokensFile": RECEIVER_TOKENS},
}


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render the chart like ``helm template ar deploy/helm/autorepair -n autorepair``."""
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(_merge(BASE, values or {}), name=RELEASE, namespace=NS)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


def test_helm_lint_strict_has_no_warnings_or_errors() -> None:
    report = helm.lint(str(CHART), BASE, strict=True, namespace=NS)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"ingest": {"shards": [{"name": "east", "clusters": ["gpu-east"]},
                               {"name": "west", "clusters": ["gpu-west"]}]},
         "agent": {"shard": "west", "privileged": False}},
        {"agent": {"enabled": False}, "rbac": {"nodeWatcher": "ingest"},
         "worker": {"replicas": 1, "jobsNamespace": "autorepair-validation"},
         "ingest": {"auth": {"tokensFile": True}},
         "secrets": {"create": False, "existingSecret": "site-secrets"}},
        {"secrets": {"bmcUsername": "admin", "bmcPassword": "pw", "ingestTokens": "a,b",
                     "adminToken": "t", "apiTokens": "tok operator alice\n",
                     "agentToken": "agent-tok"},
         "agent": {"identity": "sharedToken", "sharedToken": {"acknowledgeRisk": True}}},
    ],
    ids=["defaults", "shards-unprivileged-agent", "no-agent-existing-secret", "all-secrets"],
)
def test_rendered_manifests_validate_against_kubernetes_schemas(values: dict[str, Any]) -> None:
    docs = render(values)
    assert docs
    for doc in docs:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_expected_objects(default_docs: list[dict[str, Any]]) -> None:
    kinds = sorted({(d["kind"], d["metadata"]["name"]) for d in default_docs})
    assert kinds == sorted([
        ("ConfigMap", f"{FULL}-config"),
        ("Secret", f"{FULL}-ingest-secrets"),
        ("Secret", f"{FULL}-worker-secrets"),
        ("NetworkPolicy", f"{FULL}-ingest"),
        ("NetworkPolicy", f"{FULL}-worker"),
        ("NetworkPolicy", f"{FULL}-agent"),
        ("ClusterRole", f"{FULL}-token-review"),
        ("ClusterRoleBinding", f"{FULL}-token-review"),
        ("Role", f"{FULL}-agent-pods"),
        ("RoleBinding", f"{FULL}-agent-pods"),
        ("ServiceAccount", f"{FULL}-ingest"),
        ("ServiceAccount", f"{FULL}-worker"),
        ("ServiceAccount", f"{FULL}-agent"),
        ("ClusterRole", f"{FULL}-kube-activities"),
        ("ClusterRoleBinding", f"{FULL}-kube-activities"),
        ("ClusterRole", f"{FULL}-node-watcher"),
        ("ClusterRoleBinding", f"{FULL}-node-watcher"),
        ("Role", f"{FULL}-validation-jobs"),
        ("RoleBinding", f"{FULL}-validation-jobs"),
        ("Deployment", f"{FULL}-ingest"),
        ("Service", f"{FULL}-ingest"),
        ("Deployment", f"{FULL}-worker"),
        ("PodDisruptionBudget", f"{FULL}-worker"),
        ("DaemonSet", f"{FULL}-agent"),
    ])


def _rules_of(docs: list[dict[str, Any]], sa: str) -> set[tuple[str, str, str, str]]:
    """(scope namespace or '*', apiGroup, resource, verb) granted to service account ``sa``."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("ClusterRole", "Role")}
    granted: set[tuple[str, str, str, str]] = set()
    for b in docs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa and s["namespace"] == NS
                   for s in b["subjects"]):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        scope = b["metadata"].get("namespace", "*") if b["kind"] == "RoleBinding" else "*"
        for rule in role["rules"]:
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for v in rule["verbs"]:
                        assert "*" not in (g, r, v), f"wildcard in {role['metadata']['name']}"
                        granted.add((scope, g, r, v))
    return granted


#: What the code asks of the API server, no more: activities/scheduler/kube.py
#: (read_node, patch_node, list_pod_for_all_namespaces, create_namespaced_pod_eviction),
#: workers/watchers/kube.py (list_node, patch_node; watch for a watch-based watcher),
#: events create for repair steps, validation Jobs in one namespace (and their pods' logs:
#: activities/validation/kube.py).
WORKER_RIGHTS = {
    ("*", "", "nodes", "get"), ("*", "", "nodes", "list"), ("*", "", "nodes", "watch"),
    ("*", "", "nodes", "patch"),
    ("*", "", "pods", "list"),
    ("*", "", "pods/eviction", "create"),
    ("*", "", "events", "create"),
    (NS, "batch", "jobs", "create"), (NS, "batch", "jobs", "get"),
    (NS, "batch", "jobs", "delete"),
    (NS, "", "pods", "list"), (NS, "", "pods/log", "get"),
}
NODE_WATCHER_RIGHTS = {("*", "", "nodes", v) for v in ("get", "list", "watch", "patch")}
#: ingest/kube_tokens.py: create_token_review, read_namespaced_pod (the agents' pods).
TOKEN_REVIEW_RIGHTS = {("*", "authentication.k8s.io", "tokenreviews", "create"),
                       (NS, "", "pods", "get")}


def test_rbac_is_least_privilege(default_docs: list[dict[str, Any]]) -> None:
    assert _rules_of(default_docs, f"{FULL}-worker") == WORKER_RIGHTS
    assert _rules_of(default_docs, f"{FULL}-ingest") == TOKEN_REVIEW_RIGHTS
    assert _rules_of(default_docs, f"{FULL}-agent") == set()
    sas = by_kind(default_docs, "ServiceAccount")
    assert sas[f"{FULL}-worker"]["automountServiceAccountToken"] is True
    assert sas[f"{FULL}-ingest"]["automountServiceAccountToken"] is True  # TokenReview
    assert sas[f"{FULL}-agent"]["automountServiceAccountToken"] is False


def test_node_watcher_can_move_to_ingest_and_jobs_namespace_is_configurable() -> None:
    docs = render({"rbac": {"nodeWatcher": "ingest"},
                   "worker": {"jobsNamespace": "autorepair-validation"}})
    assert _rules_of(docs, f"{FULL}-ingest") == NODE_WATCHER_RIGHTS | TOKEN_REVIEW_RIGHTS
    worker = _rules_of(docs, f"{FULL}-worker")
    assert {r for r in worker if r[0] != "*"} == {
        ("autorepair-validation", g, r, v) for (_, g, r, v) in WORKER_RIGHTS if _ != "*"}
    assert by_kind(docs, "ServiceAccount")[f"{FULL}-ingest"]["automountServiceAccountToken"]


def test_validation_jobs_role_can_be_left_out() -> None:
    docs = render({"rbac": {"validationJobs": False}})
    assert _rules_of(docs, f"{FULL}-worker") == {r for r in WORKER_RIGHTS if r[0] == "*"}


def test_rbac_create_false_renders_no_rbac() -> None:
    docs = render({"rbac": {"create": False}})
    assert not [d for d in docs if d["kind"].endswith(("Role", "RoleBinding"))]


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    containers = doc["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def test_ingest_service_ports_probes_and_no_admin_port(default_docs: list[dict[str, Any]]) -> None:
    svc = by_kind(default_docs, "Service")[f"{FULL}-ingest"]
    dep = by_kind(default_docs, "Deployment")[f"{FULL}-ingest"]
    c = _container(dep)
    cports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert cports == {"otlp-grpc": 4317, "otlp-http": 4318, "http": 8080}
    assert {(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        (4317, "otlp-grpc"), (4318, "otlp-http"), (8080, "http")}
    # 8081 is the loopback-only admin endpoint (docs/design.md §4.2): never exposed.
    assert all(p["port"] != 8081 for d in by_kind(default_docs, "Service").values()
               for p in d["spec"]["ports"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["args"] == ["autorepair", "ingest"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    sel = svc["spec"]["selector"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in sel.items())
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"


def test_control_plane_hardening_and_secret_split(default_docs: list[dict[str, Any]]) -> None:
    deps = by_kind(default_docs, "Deployment")
    for name, comp in ((f"{FULL}-ingest", "ingest"), (f"{FULL}-worker", "worker")):
        pod = deps[name]["spec"]["template"]["spec"]
        c = _container(deps[name])
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["serviceAccountName"] == f"{FULL}-{comp}"
        env = {e["name"]: e for e in c["env"]}
        assert env["AUTOREPAIR_CONFIG"]["value"] == "/etc/autorepair/autorepair.yaml"
        for e in env.values():  # secrets only by reference, never inline
            if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]:
                assert e["valueFrom"]["secretKeyRef"]["name"] == f"{FULL}-{comp}-secrets"
        ref = env["AUTOREPAIR__LEDGER__DSN"]["valueFrom"]["secretKeyRef"]
        assert ref["key"] == "ledger-dsn" and not ref.get("optional")
        bmc = {"AUTOREPAIR_BMC_USERNAME", "AUTOREPAIR_BMC_PASSWORD"}
        tokens = {"AUTOREPAIR_INGEST_TOKENS", "AUTOREPAIR_ADMIN_TOKEN"}
        if comp == "worker":
            assert bmc <= env.keys() and not tokens & env.keys()
        else:
            assert tokens <= env.keys() and not bmc & env.keys()


def test_configmap_is_a_valid_autorepair_yaml_without_secrets(tmp_path: Path) -> None:
    from workers.config import load_config

    secret_values = {"ledgerDsn": "postgresql://ar:S3cretPw@pg/ar", "bmcPassword": "B0mcPw",
                     "agentToken": "AgentTok", "ingestTokens": "IngTok", "adminToken": "AdmTok"}
    docs = render({"secrets": secret_values,
                   "agent": {"identity": "sharedToken", "sharedToken": {"acknowledgeRisk": True}},
                   "temporal": {"address": "temporal.prod:7233", "namespace": "gpu-prod"},
                   "config": {"threshold": {"k": 2.5},
                              "clusters": [{"name": "gpu-east", "scheduler": "kubernetes",
                                            "gpu_nodes": 64}]}})
    cm = by_kind(docs, "ConfigMap")[f"{FULL}-config"]
    text = cm["data"]["autorepair.yaml"]
    for v in secret_values.values():
        assert v not in text and v not in yaml.safe_dump(cm)
    path = tmp_path / "autorepair.yaml"
    path.write_text(text)
    env = {"AUTOREPAIR__LEDGER__DSN": "postgresql://x@y/z"}
    cfg = load_config(path, environ=env)
    assert cfg.temporal.address == "temporal.prod:7233"
    assert cfg.temporal.namespace == "gpu-prod"
    assert cfg.threshold.k == 2.5 and cfg.threshold.statistical_min == 5
    assert cfg.cluster("gpu-east").gpu_node_count == 64
    secret = by_kind(docs, "Secret")[f"{FULL}-worker-secrets"]
    assert secret["stringData"]["bmc-password"] == "B0mcPw"
    # A config change rolls the pods.
    before = by_kind(render(), "Deployment")[f"{FULL}-worker"]
    after = by_kind(docs, "Deployment")[f"{FULL}-worker"]
    key = "checksum/config"
    assert (before["spec"]["template"]["metadata"]["annotations"][key]
            != after["spec"]["template"]["metadata"]["annotations"][key])


def test_default_values_config_loads(tmp_path: Path) -> None:
    from workers.config import load_config

    cm = by_kind(render(), "ConfigMap")[f"{FULL}-config"]
    path = tmp_path / "autorepair.yaml"
    path.write_text(cm["data"]["autorepair.yaml"])
    assert load_config(path, environ={}).temporal.task_queue == "autorepair"


def test_existing_secret_is_used_and_none_created() -> None:
    docs = render({"secrets": {"create": False, "existingSecret": "site-secrets"}})
    assert not by_kind(docs, "Secret")
    refs = {e["valueFrom"]["secretKeyRef"]["name"]
            for d in docs if d["kind"] in ("Deployment", "DaemonSet")
            for e in _container(d)["env"] if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
    assert refs == {"site-secrets"}


def test_agent_daemonset_minimal_privileges(default_docs: list[dict[str, Any]]) -> None:
    ds = by_kind(default_docs, "DaemonSet")[f"{FULL}-agent"]
    pod = ds["spec"]["template"]["spec"]
    c = _container(ds)
    assert c["args"][:2] == ["autorepair-agent", "run"]
    args = dict(zip(c["args"][2::2], c["args"][3::2], strict=True))
    assert args == {"--endpoint": f"http://{FULL}-ingest.{NS}.svc:4318",
                    "--cluster": "gpu-east", "--node": "$(NODE_NAME)"}
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    # No GPU claimed, no API token, no host namespaces.
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert pod["automountServiceAccountToken"] is False
    for host_ns in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host_ns)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"operator": "Exists"} in pod["tolerations"]  # keeps reporting while cordoned
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["kmsg"] == {"name": "kmsg", "mountPath": "/dev/kmsg", "readOnly": True}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["kmsg"]["hostPath"] == {"path": "/dev/kmsg", "type": "CharDevice"}
    assert set(vols) == {"kmsg", "state", "tmp", "identity"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["runAsUser"] == 0  # caps only reach root; root-owned hostPath


def test_agent_unprivileged_mode_keeps_only_syslog() -> None:
    ds = by_kind(render({"agent": {"privileged": False}}), "DaemonSet")[f"{FULL}-agent"]
    sc = _container(ds)["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}


def test_shards_get_their_own_deployment_service_and_agent_endpoint() -> None:
    docs = render({"ingest": {"shards": [{"name": "east", "clusters": ["gpu-east"]},
                                         {"name": "west", "clusters": ["gpu-west", "w2"]}]},
                   "agent": {"shard": "west"}})
    deps, svcs = by_kind(docs, "Deployment"), by_kind(docs, "Service")
    assert set(svcs) == {f"{FULL}-ingest-east", f"{FULL}-ingest-west"}
    assert {f"{FULL}-ingest-east", f"{FULL}-ingest-west"} <= set(deps)
    west = deps[f"{FULL}-ingest-west"]
    assert west["metadata"]["annotations"]["autorepair/clusters"] == "gpu-west,w2"
    assert svcs[f"{FULL}-ingest-west"]["spec"]["selector"]["autorepair/shard"] == "west"
    assert west["spec"]["template"]["metadata"]["labels"]["autorepair/shard"] == "west"
    c = _container(by_kind(docs, "DaemonSet")[f"{FULL}-agent"])
    assert c["args"][c["args"].index("--endpoint") + 1] == f"http://{FULL}-ingest-west.{NS}.svc:4318"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"ingest": {"replicas": 3}}, "/ingest/replicas"),
        ({"rbac": {"nodeWatcher": "everyone"}}, "/rbac/nodeWatcher"),
        ({"temporal": {"address": "no-port"}}, "/temporal/address"),
        ({"agent": {"endpoint": "ftp://x"}}, "/agent/endpoint"),
        ({"ingest": {"shards": [{"name": "Bad_Name"}]}}, "/ingest/shards/0/name"),
        ({"agent": {"cluster": ""}}, "agent.cluster"),
        ({"secrets": {"ledgerDsn": ""}}, "secrets.ledgerDsn"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert needle in str(err.value)


def _probe_command(docs: list[dict[str, Any]]) -> list[str]:
    c = _container(by_kind(docs, "Deployment")[f"{FULL}-worker"])
    cmd = c["readinessProbe"]["exec"]["command"]
    assert cmd == c["startupProbe"]["exec"]["command"]
    return list(cmd)


def test_worker_probe_command_really_checks_the_temporal_frontend() -> None:
    """Run the rendered exec probe: succeeds against a listening port, fails on a closed one."""
    cmd = _probe_command(render())
    assert cmd[0] == "python"
    argv = [sys.executable, *cmd[1:]]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        ok = subprocess.run(argv, env={"TEMPORAL_ADDRESS": f"127.0.0.1:{port}"},
                            capture_output=True, timeout=10)
    assert ok.returncode == 0, ok.stderr
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    bad = subprocess.run(argv, env={"TEMPORAL_ADDRESS": f"127.0.0.1:{closed}"},
                         capture_output=True, timeout=10)
    assert bad.returncode != 0


def test_receiver_tokens_file_is_wired_to_ingest_only(tmp_path: Path) -> None:
    """The Secret's ``ingest-tokens-file`` is mounted in ingest as ``ingest.tokens_file``:
    the rendered config plus the container's environment load into identities that bind
    each node token to its node."""
    from ingest.auth import ReceiverAuth, load_identities
    from workers.config import load_config

    docs = render({"ingest": {"auth": {"tokensFile": True}}})
    secret = by_kind(docs, "Secret")[f"{FULL}-ingest-secrets"]
    assert secret["stringData"]["ingest-tokens-file"] == RECEIVER_TOKENS
    deps = by_kind(docs, "Deployment")
    ingest, worker = deps[f"{FULL}-ingest"], deps[f"{FULL}-worker"]
    c = _container(ingest)
    mount = {m["name"]: m for m in c["volumeMounts"]}["receiver-tokens"]
    assert mount["readOnly"] and mount["mountPath"] == "/etc/autorepair/receiver-tokens"
    vol = {v["name"]: v for v in ingest["spec"]["template"]["spec"]["volumes"]}[
        "receiver-tokens"]["secret"]
    assert vol["items"] == [{"key": "ingest-tokens-file", "path": "tokens"}]
    assert vol["secretName"] == f"{FULL}-ingest-secrets" and not vol.get("optional")
    assert "receiver-tokens" not in {
        v["name"] for v in worker["spec"]["template"]["spec"]["volumes"]}
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    tokens = tmp_path / "tokens"
    tokens.write_text(secret["stringData"]["ingest-tokens-file"])
    assert env["AUTOREPAIR__INGEST__TOKENS_FILE"] == "/etc/autorepair/receiver-tokens/tokens"
    env["AUTOREPAIR__INGEST__TOKENS_FILE"] = str(tokens)  # where the kubelet would put it
    path = tmp_path / "autorepair.yaml"
    path.write_text(by_kind(docs, "ConfigMap")[f"{FULL}-config"]["data"]["autorepair.yaml"])
    cfg = load_config(path, environ={k: v for k, v in env.items()
                                     if k.startswith("AUTOREPAIR__")})
    assert cfg.ingest.tokens_file == str(tokens) and not cfg.ingest.insecure_allow_unauthenticated
    auth = ReceiverAuth(load_identities(cfg.ingest.tokens_file))
    who = auth.from_header("Bearer tok-017")
    assert who is not None and who.may_report("gpu-east", "gpu-017")
    assert not who.may_report("gpu-east", "gpu-018")


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"secrets": {"ingestTokensFile": ""}, "ingest": {"auth": {"tokensFile": True}}},
         "secrets.ingestTokensFile is required"),
        ({"secrets": {"ingestTokensFile": ""}, "agent": {"enabled": False}},
         "ingest.auth.insecureAllowUnauthenticated"),
    ],
)
def test_chart_refuses_receivers_without_auth(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert needle in str(err.value)


@pytest.mark.parametrize(
    "values",
    [
        {"ingest": {"auth": {"tokensFile": False}}, "secrets": {"ingestTokens": "shared"}},
        {"ingest": {"auth": {"tokensFile": False}},
         "config": {"ingest": {"tls": {"cert": "/c", "key": "/k", "client_ca": "/ca"}}}},
        {"secrets": {"create": False, "existingSecret": "site"}},  # the pod needs the key
    ],
)
def test_other_receiver_auth_renders(values: dict[str, Any]) -> None:
    c = _container(by_kind(render(values), "Deployment")[f"{FULL}-ingest"])
    assert "AUTOREPAIR__INGEST__INSECURE_ALLOW_UNAUTHENTICATED" not in {
        e["name"] for e in c["env"]}


def test_insecure_receivers_only_when_asked_and_said() -> None:
    docs = render({"secrets": {"ingestTokensFile": ""},
                   "ingest": {"auth": {"tokensFile": False,
                                       "insecureAllowUnauthenticated": True}}})
    c = _container(by_kind(docs, "Deployment")[f"{FULL}-ingest"])
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["AUTOREPAIR__INGEST__INSECURE_ALLOW_UNAUTHENTICATED"] == "true"
    assert "AUTOREPAIR__INGEST__TOKENS_FILE" not in env


def test_kubernetes_clusters_give_ingest_the_node_list() -> None:
    """Ingest reads a Kubernetes cluster's node list (the inventory: unknown nodes are
    observed, not repaired); list only, and only when such a cluster is configured."""
    docs = render({"config": {"clusters": [{"name": "gpu-east", "scheduler": "kubernetes"}]}})
    assert _rules_of(docs, f"{FULL}-ingest") == {("*", "", "nodes", "list")} | TOKEN_REVIEW_RIGHTS
    assert by_kind(docs, "ServiceAccount")[f"{FULL}-ingest"]["automountServiceAccountToken"]
    slurm = render({"config": {"clusters": [{"name": "gpu-east", "scheduler": "slurm"}]}})
    assert _rules_of(slurm, f"{FULL}-ingest") == TOKEN_REVIEW_RIGHTS


def test_worker_versioning_values_and_draining_builds(tmp_path: Path) -> None:
    """Worker Versioning (docs/runbook.md "Upgrade the workers"): the current build's
    workers and one Deployment per draining build, each polling as its own build id; the
    ConfigMap carries the deployment name and the switches."""
    docs = render({"image": {"tag": "0.4.0"},
                   "worker": {"drainingBuilds": [{"buildId": "0.3.0"}]}})
    workers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["name"].startswith(f"{FULL}-worker")}
    assert set(workers) == {f"{FULL}-worker", f"{FULL}-worker-build-0-3-0"}

    def build_of(d: dict[str, Any]) -> tuple[str, str]:
        c = d["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        return c["image"].rsplit(":", 1)[1], env["AUTOREPAIR__TEMPORAL__BUILD_ID"]

    assert build_of(workers[f"{FULL}-worker"]) == ("0.4.0", "0.4.0")
    old = workers[f"{FULL}-worker-build-0-3-0"]
    assert build_of(old) == ("0.3.0", "0.3.0")
    # the current Deployment's selector never matches a draining build's pods
    sel = workers[f"{FULL}-worker"]["spec"]["selector"]["matchLabels"]
    labels = old["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in sel.items())
    for d in workers.values():
        kubernetes_validate.validate(d, KUBE_VERSIONS[-1], strict=True)
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    conf = yaml.safe_load(cm["data"]["autorepair.yaml"])["temporal"]
    assert conf["worker_versioning"] is True and conf["deployment_name"] == "autorepair"
    assert conf["promote_on_start"] is True
    with pytest.raises(Exception, match="buildId"):
        render({"worker": {"drainingBuilds": [{"tag": "x"}]}})
