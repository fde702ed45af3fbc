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

{{- define "autorepair.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- printf "%s-secrets" (include "autorepair.fullname" .) -}}
{{- end -}}
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
component needs (BMC credentials: worker; receiver and admin tokens: ingest).
Call with (dict "root" $ "component" "ingest"|"worker"). */}}
{{- define "autorepair.controlPlaneEnv" -}}
{{- $root := .root -}}
{{- $secret := include "autorepair.secretName" $root -}}
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
- name: AUTOREPAIR_BMC_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: bmc-username
      optional: true
- name: AUTOREPAIR_BMC_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: bmc-password
      optional: true
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

{{/* Volumes shared by ingest and worker. */}}
{{- define "autorepair.controlPlaneVolumes" -}}
- name: config
  configMap:
    name: {{ include "autorepair.fullname" . }}-config
- name: secrets
  secret:
    secretName: {{ include "autorepair.secretName" . }}
    optional: true
    defaultMode: 0440
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}

{{- define "autorepair.controlPlaneMounts" -}}
- name: config
  mountPath: /etc/autorepair/autorepair.yaml
  subPath: autorepair.yaml
  readOnly: true
- name: secrets
  mountPath: /etc/autorepair/secrets
  readOnly: true
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
{{- if not (or $auth.tokensFile .Values.secrets.ingestTokens $mtls $tokensFile $insecure) -}}
{{- fail "ingest.auth: the OTLP receivers would accept data from anyone: set ingest.auth.tokensFile (per-node / collector tokens), secrets.ingestTokens or config.ingest.tls.client_ca (mTLS), or set ingest.auth.insecureAllowUnauthenticated: true to run without authentication" -}}
{{- end -}}
{{- end -}}
