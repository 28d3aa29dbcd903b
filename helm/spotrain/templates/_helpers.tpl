{{/* Names, labels and the environment every spotrain process reads. */}}

{{- define "spotrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "spotrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "spotrain.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "spotrain.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "spotrain.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "spotrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spotrain
{{- end }}

{{/* Selector labels of one component: pass (dict "root" $ "component" "scaler"). */}}
{{- define "spotrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spotrain.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "spotrain.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end }}
{{- end }}

{{/* The four services: values key, Python module, Kubernetes name and env prefix. */}}
{{- define "spotrain.services" -}}
services:
  - {key: submitter, module: submitter, name: submitter, prefix: SUBMITTER}
  - {key: scaler, module: scaler, name: scaler, prefix: SCALER}
  - {key: preemptionWatcher, module: preemption_watcher, name: preemption-watcher, prefix: PREEMPTION_WATCHER}
  - {key: checkpointer, module: checkpointer, name: checkpointer, prefix: CHECKPOINTER}
{{- end }}

{{- define "spotrain.rayHeadService" -}}
{{- default (printf "%s-head-svc" (include "spotrain.fullname" .)) .Values.ray.headService }}
{{- end }}

{{- define "spotrain.serviceAccountName" -}}
{{- printf "%s-%s" (include "spotrain.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* One env var per setting: (dict "prefix" "SPOTRAIN_SCALER_" "settings" $map);
     strings as they are, everything else as JSON; null means "use the default". */}}
{{- define "spotrain.settingsEnv" -}}
{{- $prefix := .prefix }}
{{- range $key, $value := .settings }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "%s%s" $prefix (upper $key) }}
  value: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* BusSettings for one process: (dict "root" $ "secret" "name-of-its-creds-secret"). */}}
{{- define "spotrain.busEnv" -}}
{{- include "spotrain.settingsEnv" (dict "prefix" "SPOTRAIN_" "settings" .root.Values.bus) }}
{{- if and .root.Values.natsCredentials.enabled (eq .root.Values.natsCredentials.type "creds") }}
- name: SPOTRAIN_NATS_CREDS_FILE
  value: {{ printf "/var/run/secrets/spotrain/nats/%s" .root.Values.natsCredentials.key | quote }}
{{- end }}
{{- end }}

{{- define "spotrain.natsCredsVolumeMount" -}}
{{- if and .Values.natsCredentials.enabled (eq .Values.natsCredentials.type "creds") }}
- name: nats-creds
  mountPath: /var/run/secrets/spotrain/nats
  readOnly: true
{{- end }}
{{- end }}

{{/* The Secret volume of one process's NATS credentials: (dict "root" $ "secret" name). */}}
{{- define "spotrain.natsCredsVolume" -}}
{{- if and .root.Values.natsCredentials.enabled (eq .root.Values.natsCredentials.type "creds") }}
- name: nats-creds
  secret:
    secretName: {{ .secret }}
    defaultMode: 0440
    items:
      - key: {{ .root.Values.natsCredentials.key }}
        path: {{ .root.Values.natsCredentials.key }}
{{- end }}
{{- end }}

{{/* A role's environment file from `spotrain nats-config` (user, password, inbox prefix),
     loaded whole from its Secret: (dict "root" $ "secret" name). */}}
{{- define "spotrain.natsEnvFrom" -}}
{{- if and .root.Values.natsCredentials.enabled (eq .root.Values.natsCredentials.type "env") }}
envFrom:
  - secretRef:
      name: {{ .secret }}
{{- end }}
{{- end }}

{{/* A Workload Identity annotation, and any others: pass the serviceAccount values. */}}
{{- define "spotrain.serviceAccountAnnotations" -}}
{{- $annotations := deepCopy (default dict .annotations) }}
{{- if .gcpServiceAccount }}
{{- $_ := set $annotations "iam.gke.io/gcp-service-account" .gcpServiceAccount }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* What values.schema.json cannot say: values needed together, and pools that agree.
     Fails the install with one message naming everything missing. */}}
{{- define "spotrain.validate" -}}
{{- $problems := list }}
{{- if not .Values.checkpoints.root }}
{{- $problems = append $problems "checkpoints.root is required: the gs://BUCKET/PREFIX folder every job checkpoints under" }}
{{- end }}
{{- if eq .Values.scaler.settings.provider "gke" }}
{{- range $value, $name := dict "gcp.project" .Values.gcp.project "gke.location" .Values.gke.location "gke.cluster" .Values.gke.cluster }}
{{- if not $name }}
{{- $problems = append $problems (printf "%s is required by the scaler's gke provider (the GKE cluster whose node pools it resizes)" $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- $watcher := .Values.preemptionWatcher.settings }}
{{- if and (has "gce-pubsub" $watcher.sources) (not $watcher.pubsub_subscription) }}
{{- $problems = append $problems "preemptionWatcher.settings.pubsub_subscription is required by the gce-pubsub source (projects/P/subscriptions/S)" }}
{{- end }}
{{- $seen := dict }}
{{- range .Values.pools }}
{{- if hasKey $seen .name }}
{{- $problems = append $problems (printf "pools: the name %s is used twice" .name) }}
{{- end }}
{{- $_ := set $seen .name true }}
{{- if gt (int (default 0 .min_nodes)) (int .max_nodes) }}
{{- $problems = append $problems (printf "pools: %s has min_nodes above max_nodes" .name) }}
{{- end }}
{{- end }}
{{- /* Against a cluster (install, upgrade, --dry-run=server) helm can look things up and
     the API server says what it serves; offline (helm template) both are empty, and this
     check is left to the install. */}}
{{- if and .Values.ray.enabled (lookup "v1" "Namespace" "" "kube-system") }}
{{- if not (.Capabilities.APIVersions.Has "ray.io/v1/RayCluster") }}
{{- $problems = append $problems "the cluster serves no ray.io/v1 RayCluster: install the KubeRay operator (v1.5, docs/deploy-gke.md step 4) before spotrain" }}
{{- end }}
{{- end }}
{{- if and (not .Values.ray.enabled) (not .Values.ray.headService) }}
{{- $problems = append $problems "ray.headService is required when ray.enabled is false: the head Service of the RayCluster to use" }}
{{- end }}
{{- with $problems }}
{{- fail (printf "\n  - %s" (join "\n  - " .)) }}
{{- end }}
{{- end }}

{{- /* Ray's token authentication, for the Ray pods and the services that call Ray. */}}
{{- define "spotrain.rayAuthEnv" -}}
{{- if .root.Values.ray.auth.enabled }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .root.Values.ray.auth.tokenSecret }}
      key: {{ .root.Values.ray.auth.key }}
{{- else }}
- name: RAY_AUTH_MODE
  value: disabled
{{- end }}
{{- end }}
