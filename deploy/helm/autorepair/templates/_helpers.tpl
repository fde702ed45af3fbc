{{/* Names and labels shared by every template. */}}

{{- define "autorepair.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "autorepair.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "autorepair.labels" -}}
app.kubernetes.io/name: {{ include "autorepair.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "autorepair.selector" -}}
app.kubernetes.io/name: {{ include "autorepair.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "autorepair.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret of one consumer: (dict "root" $ "component" "ingest"|"worker"|"agent").
secrets.existing.<component>, else the older one-for-all secrets.existingSecret, else the
chart's <fullname>-<component>-secrets. */}}
{{- define "autorepair.secretName" -}}
{{- $root := .root -}}
{{- $existing := index (default dict $root.Values.secrets.existing) .component -}}
{{- if $existing -}}
{{- $existing -}}
{{- else if $root.Values.secrets.existingSecret -}}
{{- $root.Values.secrets.existingSecret -}}
{{- else -}}
{{- printf "%s-%s-secrets" (include "autorepair.fullname" $root) .component -}}
{{- end -}}
{{- end -}}

{{/* "true" when ingest verifies the agents' ServiceAccount tokens (TokenReview). */}}
{{- define "autorepair.tokenReview" -}}
{{- if and .Values.agent.enabled (eq .Values.agent.identity "serviceAccountToken") -}}true{{- end -}}
{{- end -}}

{{- define "autorepair.jobsNamespace" -}}
{{- default .Release.Namespace .Values.worker.jobsNamespace -}}
{{- end -}}

{{/* Ingest shards: a list of {name, suffix}; one unnamed shard when none are configured. */}}
{{- define "autorepair.ingestShards" -}}
{{- $out := list -}}
{{- if .Values.ingest.shards -}}
{{- range .Values.ingest.shards -}}
{{- $out = append $out (dict "name" .name "suffix" (printf "-ingest-%s" .name) "clusters" (default list .clusters)) -}}
{{- end -}}
{{- else -}}
{{- $out = append $out (dict "name" "" "suffix" "-ingest" "clusters" list) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* Environment of ingest and worker: config file, Temporal, and only the secrets the
component needs (BMC credentials and webhook URLs: worker; receiver and admin tokens:
ingest), each from that component's own Secret.
Call with (dict "root" $ "component" "ingest"|"worker"). */}}
{{- define "autorepair.controlPlaneEnv" -}}
{{- $root := .root -}}
{{- $secret := include "autorepair.secretName" . -}}
- name: AUTOREPAIR_CONFIG
  value: /etc/autorepair/autorepair.yaml
- name: TEMPORAL_ADDRESS
  value: {{ $root.Values.temporal.address | quote }}
- name: TEMPORAL_NAMESPACE
  value: {{ $root.Values.temporal.namespace | quote }}
- name: AUTOREPAIR__LEDGER__DSN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: ledger-dsn
{{- if eq .component "worker" }}
{{- range $env, $key := dict "AUTOREPAIR_BMC_USERNAME" "bmc-username" "AUTOREPAIR_BMC_PASSWORD" "bmc-password" "AUTOREPAIR_PROVISION_WEBHOOK" "provision-webhook" "AUTOREPAIR_TICKET_WEBHOOK" "ticket-webhook" "AUTOREPAIR_NOTIFY_WEBHOOK" "notify-webhook" }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- else }}
- name: AUTOREPAIR_INGEST_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: ingest-tokens
      optional: true
- name: AUTOREPAIR_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: admin-token
      optional: true
{{- end }}
{{- end -}}

{{/* Volumes of ingest and worker: the config, /tmp, the Temporal client credentials
(temporal.tls / temporal.apiKey) and, for ingest only, the repair API's tokens file --
single keys of the component's own Secret, never the whole Secret.
Call with (dict "root" $ "component" "ingest"|"worker"). */}}
{{- define "autorepair.controlPlaneVolumes" -}}
{{- $root := .root -}}
{{- $t := $root.Values.temporal -}}
- name: config
  configMap:
    name: {{ include "autorepair.fullname" $root }}-config
{{- if eq .component "ingest" }}
- name: secrets
  secret:
    secretName: {{ include "autorepair.secretName" . }}
    optional: true
    defaultMode: 0440
    items:
      - key: api-tokens
        path: api-tokens
{{- end }}
{{- if or $t.tls.enabled $t.apiKey }}
- name: temporal-credentials
  secret:
    secretName: {{ include "autorepair.secretName" . }}
    defaultMode: 0440
    items:
      {{- if and $t.tls.enabled $t.tls.clientCertificate }}
      - key: temporal-client-cert
        path: client.pem
      - key: temporal-client-key
        path: client.key
      {{- end }}
      {{- if and $t.tls.enabled $t.tls.serverCA }}
      - key: temporal-server-ca
        path: ca.pem
      {{- end }}
      {{- if $t.apiKey }}
      - key: temporal-api-key
        path: api-key
      {{- end }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{- define "autorepair.controlPlaneMounts" -}}
{{- $t := .root.Values.temporal -}}
- name: config
  mountPath: /etc/autorepair/autorepair.yaml
  subPath: autorepair.yaml
  readOnly: true
{{- if eq .component "ingest" }}
- name: secrets
  mountPath: /etc/autorepair/secrets
  readOnly: true
{{- end }}
{{- if or $t.tls.enabled $t.apiKey }}
- name: temporal-credentials
  mountPath: /etc/autorepair/temporal
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/* "true" when a configured cluster runs Kubernetes: ingest then reads its node list
(the inventory of ingest/inventory.py, through workers/inventory.py: list_node). */}}
{{- define "autorepair.kubeInventory" -}}
{{- $kube := false -}}
{{- range (default list .Values.config.clusters) -}}
{{- if eq (default "slurm" .scheduler) "kubernetes" -}}
{{- $kube = true -}}
{{- end -}}
{{- end -}}
{{- if $kube -}}true{{- end -}}
{{- end -}}

{{/* Refuses to render OTLP receivers nobody authenticates (docs/security.md), as
`autorepair ingest` refuses to start them (ingest.service.UNAUTHENTICATED_REFUSAL). */}}
{{- define "autorepair.receiverAuthCheck" -}}
{{- $auth := .Values.ingest.auth -}}
{{- $mtls := dig "ingest" "tls" "client_ca" "" (default dict .Values.config) -}}
{{- $tokensFile := dig "ingest" "tokens_file" "" (default dict .Values.config) -}}
{{- $insecure := or $auth.insecureAllowUnauthenticated (dig "ingest" "insecure_allow_unauthenticated" false (default dict .Values.config)) -}}
{{- if and $auth.tokensFile .Values.secrets.create (not .Values.secrets.existingSecret) (not .Values.secrets.ingestTokensFile) -}}
{{- fail "secrets.ingestTokensFile is required when ingest.auth.tokensFile is true and the chart creates the Secret: the receivers' per-node / collector tokens ('TOKEN ROLE SUBJECT' lines, docs/security.md); or set ingest.auth.tokensFile: false and authenticate otherwise" -}}
{{- end -}}
{{- $mtls = or $mtls (and .Values.ingest.tls.secretName .Values.ingest.tls.clientCA) -}}
{{- $shared := and .Values.agent.enabled (eq .Values.agent.identity "sharedToken") -}}
{{- if not (or (include "autorepair.tokenReview" .) $shared $auth.tokensFile .Values.secrets.ingestTokens $mtls $tokensFile $insecure) -}}
{{- fail "ingest.auth: the OTLP receivers would accept data from anyone: use agent.identity serviceAccountToken (the default), set ingest.auth.tokensFile (per-node / collector tokens), secrets.ingestTokens or ingest.tls (mTLS), or set ingest.auth.insecureAllowUnauthenticated: true to run without authentication" -}}
{{- end -}}
{{- end -}}

{{/* Refuses agent identities that do not hold: a shared token without the explicit
acknowledgement, a certificate identity without its volume or without mTLS on ingest. */}}
{{- define "autorepair.agentIdentityCheck" -}}
{{- $a := .Values.agent -}}
{{- if and (or (eq $a.identity "sharedToken") .Values.secrets.agentToken) (not $a.sharedToken.acknowledgeRisk) -}}
{{- fail "agent.sharedToken.acknowledgeRisk: a shared agent token is one credential for every node -- root on any node can read it and report faults (and get repairs) for every other node. Use agent.identity serviceAccountToken or certificate, or set agent.sharedToken.acknowledgeRisk: true" -}}
{{- end -}}
{{- if eq $a.identity "certificate" -}}
{{- if not $a.certificate.volume -}}
{{- fail "agent.certificate.volume: required with agent.identity certificate (a CSI volume issuing the pod a certificate with the URI SAN spiffe://<domain>/cluster/<cluster>/node/<node>)" -}}
{{- end -}}
{{- if not (and .Values.ingest.tls.secretName .Values.ingest.tls.clientCA) -}}
{{- fail "ingest.tls.secretName: required (with ingest.tls.clientCA: true) for agent.identity certificate: ingest must ask for client certificates" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Egress to DNS (networkPolicy.egress.dns: the resolver pods, UDP and TCP 53). */}}
{{- define "autorepair.dnsEgress" -}}
- to:
    {{- toYaml .Values.networkPolicy.egress.dns | nindent 4 }}
  ports:
    - {port: 53, protocol: UDP}
    - {port: 53, protocol: TCP}
{{- end -}}

{{/* Egress of ingest and the worker: DNS, the Temporal frontend, PostgreSQL and the
Kubernetes API. A peer with a podSelector (networkPolicy.temporal / .postgres) is reached
in its namespace only; else its `cidrs`; with neither, its port on any address. */}}
{{- define "autorepair.controlPlaneEgress" -}}
{{- $np := .Values.networkPolicy -}}
{{- include "autorepair.dnsEgress" . }}
{{- range $name, $peer := dict "temporal" $np.temporal "postgres" $np.postgres }}
# {{ $name }}
- ports:
    - {port: {{ $peer.port }}, protocol: TCP}
  {{- if $peer.podSelector }}
  to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ required (printf "networkPolicy.%s.namespace is required with its podSelector" $name) $peer.namespace }}
      podSelector:
        matchLabels:
          {{- toYaml $peer.podSelector | nindent 10 }}
  {{- else if $peer.cidrs }}
  to:
    {{- range $peer.cidrs }}
    - ipBlock: {cidr: {{ . | quote }}}
    {{- end }}
  {{- end }}
{{- end }}
# the Kubernetes API server (TokenReview, node lists, cordon, validation Jobs)
- ports:
    {{- range $np.egress.kubeApi.ports }}
    - {port: {{ . }}, protocol: TCP}
    {{- end }}
  {{- with $np.egress.kubeApi.cidrs }}
  to:
    {{- range . }}
    - ipBlock: {cidr: {{ . | quote }}}
    {{- end }}
  {{- end }}
{{- end -}}
