"""Items 1, 3 and 13 of issue 27 in the Helm chart (rendered by Helm's engine and validated
against the Kubernetes schemas, as tests/deploy/test_helm_chart.py does):

- 1: the agents' default identity is a projected ServiceAccount token for ingest's
  audience, which the rendered ingest configuration verifies with TokenReview for the
  DaemonSet's own service account; the certificate identity renders with its CSI volume;
  a shared agent token renders only with ``agent.sharedToken.acknowledgeRisk: true``.
- 3: ``temporal.tls`` / ``temporal.apiKey`` reach both Temporal clients (ingest, worker)
  as files named in the rendered ``temporal`` section; NetworkPolicies say who reaches
  ingest, the API, the worker, the agents, and (when selected) Temporal and PostgreSQL.
- 13: one Secret per consumer: BMC credentials only in the worker's, receiver identities
  and API tokens only in ingest's, and no pod mounts a whole Secret.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.deploy.test_helm_chart import (
    FULL,
    KUBE_VERSIONS,
    NS,
    _container,
    by_kind,
    helm,
    kubernetes_validate,
    render,
)

CERT_VOLUME = {"csi": {"driver": "spiffe.csi.cert-manager.io", "readOnly": True}}
SHARED = {"agent": {"identity": "sharedToken", "sharedToken": {"acknowledgeRisk": True}},
          "secrets": {"agentToken": "one-for-all"}}
TEMPORAL = {"temporal": {"tls": {"enabled": True, "serverName": "frontend.temporal"},
                         "apiKey": True},
            "secrets": {"temporalClientCert": "CERT", "temporalClientKey": "KEY",
                        "temporalServerCA": "CA", "temporalApiKey": "APIKEY"}}


def _validate(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def _config(docs: list[dict[str, Any]], tmp_path: Path) -> Any:
    from workers.config import load_config

    path = tmp_path / "autorepair.yaml"
    path.write_text(by_kind(docs, "ConfigMap")[f"{FULL}-config"]["data"]["autorepair.yaml"])
    return load_config(path, environ={"AUTOREPAIR__LEDGER__DSN": "postgresql://x@y/z"})


def _pod(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return dict(by_kind(docs, kind)[name]["spec"]["template"]["spec"])


def test_deploy_default_agent_identity_is_a_projected_service_account_token(
        tmp_path: Path) -> None:
    from ingest.kube_tokens import TokenReviewer

    docs = render()
    ds = by_kind(docs, "DaemonSet")[f"{FULL}-agent"]
    pod, c = _pod(docs, "DaemonSet", f"{FULL}-agent"), _container(ds)
    vol = {v["name"]: v for v in pod["volumes"]}["identity"]
    assert vol["projected"]["sources"] == [{"serviceAccountToken": {
        "audience": "autorepair-ingest", "expirationSeconds": 600, "path": "token"}}]
    env = {e["name"]: e for e in c["env"]}
    assert env["AUTOREPAIR_AGENT_TOKEN_FILE"]["value"] == "/var/run/autorepair/identity/token"
    mount = {m["name"]: m for m in c["volumeMounts"]}["identity"]
    assert mount["mountPath"] == "/var/run/autorepair/identity" and mount["readOnly"]
    assert "AUTOREPAIR_AGENT_TOKEN" not in env  # no shared credential on any node
    assert pod["automountServiceAccountToken"] is False  # and no API token
    assert not [d for d in docs if d["kind"] == "Secret"
                and d["metadata"]["name"] == f"{FULL}-agent-secrets"]
    # ingest verifies exactly that account's tokens for that audience, bound to the cluster
    cfg = _config(docs, tmp_path)
    sat = cfg.ingest.service_account_tokens
    assert sat.enabled and sat.audience == "autorepair-ingest"
    assert sat.service_accounts == [f"{NS}/{pod['serviceAccountName']}"]
    assert TokenReviewer.from_config(sat, [c.name for c in cfg.clusters]).cluster == "gpu-east"
    _validate(docs)


@pytest.mark.parametrize("values", [
    {"agent": {"identity": "sharedToken"}, "secrets": {"agentToken": "t"}},
    {"secrets": {"agentToken": "t"}},  # a token given under the default identity
])
def test_deploy_shared_agent_token_needs_acknowledge_risk(values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError) as err:
        render(values)
    assert "agent.sharedToken.acknowledgeRisk" in str(err.value)


def test_deploy_shared_agent_token_with_acknowledge_risk_is_the_agents_alone() -> None:
    docs = render(SHARED)
    c = _container(by_kind(docs, "DaemonSet")[f"{FULL}-agent"])
    ref = {e["name"]: e for e in c["env"]}["AUTOREPAIR_AGENT_TOKEN"]["valueFrom"]
    assert ref["secretKeyRef"] == {"name": f"{FULL}-agent-secrets", "key": "agent-token"}
    secrets = by_kind(docs, "Secret")
    assert set(secrets[f"{FULL}-agent-secrets"]["stringData"]) == {"agent-token"}
    for other in ("ingest", "worker"):
        assert "agent-token" not in secrets[f"{FULL}-{other}-secrets"]["stringData"]
    # ingest accepts it (as a collector token: what acknowledgeRisk acknowledges)
    assert secrets[f"{FULL}-ingest-secrets"]["stringData"]["ingest-tokens"] == "one-for-all"
    _validate(docs)


def test_deploy_certificate_identity_renders_with_its_volume_and_mtls(tmp_path: Path) -> None:
    values = {"agent": {"identity": "certificate", "certificate": {"volume": CERT_VOLUME}},
              "ingest": {"tls": {"secretName": "ingest-tls"}}}
    docs = render(values)
    ds = by_kind(docs, "DaemonSet")[f"{FULL}-agent"]
    c, pod = _container(ds), _pod(docs, "DaemonSet", f"{FULL}-agent")
    args = dict(zip(c["args"][2::2], c["args"][3::2], strict=True))
    assert args["--endpoint"] == f"https://{FULL}-ingest.{NS}.svc:4318"
    assert args["--client-cert"] == "/var/run/autorepair/identity/tls.crt"
    assert args["--client-key"] == "/var/run/autorepair/identity/tls.key"
    assert args["--ca-file"] == "/var/run/autorepair/identity/ca.crt"
    assert {v["name"]: v for v in pod["volumes"]}["identity"] == {"name": "identity",
                                                                   **CERT_VOLUME}
    cfg = _config(docs, tmp_path)
    assert cfg.ingest.tls.client_ca == "/etc/autorepair/tls/ca.crt"
    assert not cfg.ingest.service_account_tokens.enabled
    ingest = _pod(docs, "Deployment", f"{FULL}-ingest")
    assert {v["name"]: v for v in ingest["volumes"]}["tls"]["secret"]["secretName"] == (
        "ingest-tls")
    _validate(docs)
    for bad, needle in (({"agent": {"identity": "certificate"},
                          "ingest": {"tls": {"secretName": "t"}}}, "agent.certificate.volume"),
                        ({"agent": {"identity": "certificate",
                                    "certificate": {"volume": CERT_VOLUME}}},
                         "ingest.tls.secretName")):
        with pytest.raises(helm.HelmError) as err:
            render(bad)
        assert needle in str(err.value)


def test_deploy_temporal_tls_and_api_key_reach_both_clients(tmp_path: Path) -> None:
    docs = render(TEMPORAL)
    cfg = _config(docs, tmp_path)
    t = cfg.temporal
    assert (t.tls.client_cert, t.tls.client_key, t.tls.server_ca, t.tls.server_name) == (
        "/etc/autorepair/temporal/client.pem", "/etc/autorepair/temporal/client.key",
        "/etc/autorepair/temporal/ca.pem", "frontend.temporal")
    assert t.api_key_file == "/etc/autorepair/temporal/api-key"
    secrets = by_kind(docs, "Secret")
    for comp in ("ingest", "worker"):
        pod = _pod(docs, "Deployment", f"{FULL}-{comp}")
        vol = {v["name"]: v for v in pod["volumes"]}["temporal-credentials"]["secret"]
        assert vol["secretName"] == f"{FULL}-{comp}-secrets"
        files = {i["path"]: i["key"] for i in vol["items"]}
        assert files == {"client.pem": "temporal-client-cert", "client.key": "temporal-client-key",
                         "ca.pem": "temporal-server-ca", "api-key": "temporal-api-key"}
        mount = {m["name"]: m for m in _container(by_kind(docs, "Deployment")[
            f"{FULL}-{comp}"])["volumeMounts"]}["temporal-credentials"]
        assert mount["mountPath"] == "/etc/autorepair/temporal" and mount["readOnly"]
        data = secrets[f"{FULL}-{comp}-secrets"]["stringData"]
        assert data["temporal-api-key"] == "APIKEY" and data["temporal-client-key"] == "KEY"
    _validate(docs)
    # Temporal Cloud: TLS with the system roots, an API key, no client certificate
    cloud = render({"temporal": {"address": "ns.acct.tmprl.cloud:7233",
                                 "tls": {"enabled": True, "clientCertificate": False,
                                         "serverCA": False}, "apiKey": True},
                    "secrets": {"temporalApiKey": "k"}})
    t = _config(cloud, tmp_path).temporal
    assert t.tls.enabled and t.tls.server_name == "ns.acct.tmprl.cloud"
    assert t.tls.client_cert is None and t.tls.server_ca is None
    with pytest.raises(helm.HelmError, match=r"secrets\.temporalApiKey"):
        render({"temporal": {"apiKey": True}})


def test_deploy_network_policies_say_who_reaches_what() -> None:
    docs = render({"networkPolicy": {
        "otlpFrom": [{"namespaceSelector": {"matchLabels": {"name": "otel"}}}],
        "temporal": {"podSelector": {"app.kubernetes.io/component": "frontend"}},
        "postgres": {"namespace": "db", "podSelector": {"app": "pg"}}}})
    nps = by_kind(docs, "NetworkPolicy")
    ingest = nps[f"{FULL}-ingest"]["spec"]
    assert ingest["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "ingest"
    otlp, api = ingest["ingress"]
    assert {p["port"] for p in otlp["ports"]} == {4317, 4318}
    assert otlp["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "agent")
    assert otlp["from"][1] == {"namespaceSelector": {"matchLabels": {"name": "otel"}}}
    assert [p["port"] for p in api["ports"]] == [8080] and api["from"] == [{"podSelector": {}}]
    # the loopback admin port is in no policy: nothing outside the pod reaches it
    assert 8081 not in {p["port"] for r in ingest["ingress"] for p in r["ports"]}
    worker = nps[f"{FULL}-worker"]["spec"]
    assert [p["port"] for r in worker["ingress"] for p in r["ports"]] == [9464]
    assert nps[f"{FULL}-agent"]["spec"]["ingress"] == []
    for name, ns, port in (("temporal", "temporal", 7233), ("postgres", "db", 5432)):
        np = nps[f"{FULL}-{name}-clients"]
        assert np["metadata"]["namespace"] == ns
        rule = np["spec"]["ingress"][0]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        peer = rule["from"][0]
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": NS}
        comps = {e["key"]: e["values"] for e in peer["podSelector"]["matchExpressions"]}
        assert comps["app.kubernetes.io/component"] == ["ingest", "worker"]
    _validate(docs)
    assert not by_kind(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_deploy_one_secret_per_consumer_least_privilege() -> None:
    docs = render({"secrets": {"bmcUsername": "admin", "bmcPassword": "B0mc",
                               "ingestTokensFile": "t collector gpu-east\n",
                               "apiTokens": "tok operator alice\n", "adminToken": "adm",
                               "provisionWebhook": "https://u:p@prov/x",
                               "ticketWebhook": "https://tix/?key=k"},
                   "ingest": {"auth": {"tokensFile": True}}})
    secrets = by_kind(docs, "Secret")
    assert set(secrets) == {f"{FULL}-ingest-secrets", f"{FULL}-worker-secrets"}
    assert set(secrets[f"{FULL}-worker-secrets"]["stringData"]) == {
        "ledger-dsn", "bmc-username", "bmc-password", "provision-webhook", "ticket-webhook"}
    assert set(secrets[f"{FULL}-ingest-secrets"]["stringData"]) == {
        "ledger-dsn", "ingest-tokens-file", "api-tokens", "admin-token"}
    for comp in ("ingest", "worker"):
        pod = _pod(docs, "Deployment", f"{FULL}-{comp}")
        for v in pod["volumes"]:  # only single keys of the pod's own Secret
            if "secret" in v:
                assert v["secret"]["secretName"] == f"{FULL}-{comp}-secrets"
                assert v["secret"]["items"], f"{comp} mounts the whole Secret ({v['name']})"
        env = {e["name"]: e for e in _container(
            by_kind(docs, "Deployment")[f"{FULL}-{comp}"])["env"]}
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in env.values()
                if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs == {f"{FULL}-{comp}-secrets"}
    worker_vols = {v["name"] for v in _pod(docs, "Deployment", f"{FULL}-worker")["volumes"]}
    assert "secrets" not in worker_vols  # the API tokens file is ingest's
    ingest_api = {v["name"]: v for v in _pod(docs, "Deployment", f"{FULL}-ingest")["volumes"]}
    assert ingest_api["secrets"]["secret"]["items"] == [{"key": "api-tokens",
                                                         "path": "api-tokens"}]
    _validate(docs)
    # Secrets you manage, one per consumer
    own = render({"secrets": {"create": False, "existing": {"ingest": "ing", "worker": "wrk"}}})
    assert not by_kind(own, "Secret")
    for comp, name in (("ingest", "ing"), ("worker", "wrk")):
        env = _container(by_kind(own, "Deployment")[f"{FULL}-{comp}"])["env"]
        assert {e["valueFrom"]["secretKeyRef"]["name"] for e in env
                if "secretKeyRef" in e.get("valueFrom", {})} == {name}


def _egress(docs: list[dict[str, Any]], component: str) -> list[dict[str, Any]]:
    spec = by_kind(docs, "NetworkPolicy")[f"{FULL}-{component}"]["spec"]
    assert "Egress" in spec["policyTypes"]  # default-deny: only the rules below
    return list(spec["egress"])


def _ports(rule: dict[str, Any]) -> set[tuple[int, str]]:
    return {(p["port"], p["protocol"]) for p in rule["ports"]}


def test_deploy_egress_is_default_deny_and_opened_per_pod() -> None:
    """Issue 27 item 3 (egress): ingest, the worker and the agents get egress rules, default
    deny, with values that open what an operator needs."""
    docs = render()
    dns = {(53, "UDP"), (53, "TCP")}
    for comp in ("ingest", "worker"):
        rules = _egress(docs, comp)
        by_ports = {frozenset(_ports(r)): r for r in rules}
        assert set(by_ports) == {frozenset(dns), frozenset({(7233, "TCP")}),
                                 frozenset({(5432, "TCP")}),
                                 frozenset({(443, "TCP"), (6443, "TCP")})}, comp
        assert by_ports[frozenset(dns)]["to"][0]["podSelector"]["matchLabels"] == {
            "k8s-app": "kube-dns"}
    # the agents reach DNS and ingest's OTLP ports, nothing else (no API server, no BMC)
    agent = _egress(docs, "agent")
    assert [_ports(r) for r in agent] == [dns, {(4317, "TCP"), (4318, "TCP")}]
    assert agent[1]["to"][0]["podSelector"]["matchLabels"][
        "app.kubernetes.io/component"] == "ingest"
    # no BMC or webhook egress until the operator names it
    assert not any((623, "UDP") in _ports(r) for r in _egress(docs, "worker"))
    _validate(docs)

    docs = render({"networkPolicy": {
        "temporal": {"podSelector": {"app": "frontend"}},
        "postgres": {"cidrs": ["10.20.0.0/24"]},
        "egress": {"kubeApi": {"cidrs": ["10.96.0.1/32"], "ports": [443]},
                   "bmc": {"cidrs": ["10.50.0.0/16"]},
                   "webhooks": {"to": [{"ipBlock": {"cidr": "0.0.0.0/0",
                                                    "except": ["10.0.0.0/8"]}}]},
                   "extra": {"worker": [{"ports": [{"port": 6817, "protocol": "TCP"}]}],
                             "agent": [{"ports": [{"port": 8443, "protocol": "TCP"}]}]}}}})
    worker = {frozenset(_ports(r)): r for r in _egress(docs, "worker")}
    t = worker[frozenset({(7233, "TCP")})]["to"][0]
    assert t["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "temporal"}
    assert t["podSelector"]["matchLabels"] == {"app": "frontend"}
    assert worker[frozenset({(5432, "TCP")})]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]
    https = [r["to"] for r in _egress(docs, "worker") if _ports(r) == {(443, "TCP")}]
    assert [{"ipBlock": {"cidr": "10.96.0.1/32"}}] in https  # the API server only
    assert worker[frozenset({(443, "TCP"), (623, "UDP")})]["to"] == [
        {"ipBlock": {"cidr": "10.50.0.0/16"}}]
    hooks = [r for r in _egress(docs, "worker") if r.get("to", [{}])[0].get("ipBlock", {})
             .get("cidr") == "0.0.0.0/0"]
    assert len(hooks) == 1 and _ports(hooks[0]) == {(443, "TCP")}
    assert frozenset({(6817, "TCP")}) in worker
    ingest = {frozenset(_ports(r)) for r in _egress(docs, "ingest")}
    assert frozenset({(443, "TCP"), (623, "UDP")}) not in ingest  # BMCs: the worker only
    assert frozenset({(6817, "TCP")}) not in ingest
    assert _ports(_egress(docs, "agent")[-1]) == {(8443, "TCP")}
    _validate(docs)

    off = by_kind(render({"networkPolicy": {"egress": {"enabled": False}}}), "NetworkPolicy")
    assert all(d["spec"]["policyTypes"] == ["Ingress"] and "egress" not in d["spec"]
               for d in off.values())
    with pytest.raises(helm.HelmError, match=r"cidrs"):
        render({"networkPolicy": {"egress": {"bmc": {"cidrs": ["not-a-cidr"]}}}})
