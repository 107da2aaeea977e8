{{/* Names ------------------------------------------------------------------------------- */}}

{{- define "attnstore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "attnstore.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The name of one component's objects: (dict "context" $ "component" "scheduler") */}}
{{- define "attnstore.componentName" -}}
{{- printf "%s-%s" (include "attnstore.fullname" .context) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "attnstore.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels: (dict "context" $ "component" "kvstore-daemon") ------------------------------- */}}

{{- define "attnstore.selectorLabels" -}}
app.kubernetes.io/name: {{ include "attnstore.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "attnstore.labels" -}}
{{ include "attnstore.selectorLabels" . }}
helm.sh/chart: {{ include "attnstore.chart" .context }}
app.kubernetes.io/version: {{ .context.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .context.Release.Service }}
app.kubernetes.io/part-of: attnstore
{{- end }}

{{/* A label selector string for the scheduler's pod discovery. */}}
{{- define "attnstore.selectorString" -}}
{{- printf "app.kubernetes.io/instance=%s,app.kubernetes.io/component=%s" .context.Release.Name .component }}
{{- end }}

{{/* Images: (dict "context" $ "image" .Values.daemon.image "suffix" "") ------------------ */}}
{{- define "attnstore.image" -}}
{{- $tag := .image.tag | default (printf "%s%s" .context.Chart.AppVersion (.suffix | default "")) }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}

{{/* The worker image's variant suffix: its torch build follows gpu.enabled. */}}
{{- define "attnstore.workerImageSuffix" -}}
{{- if .Values.worker.gpu.enabled }}-cuda{{ else }}-cpu{{ end }}
{{- end }}

{{/* Settings as environment variables: (dict "prefix" "ATTNSTORE_DAEMON_" "settings" $map).
Keys are setting names (lower case); lists and maps become JSON, which the services parse;
whole numbers print without an exponent (values.yaml numbers reach templates as floats). */}}
{{- define "attnstore.settingsEnv" -}}
{{- $prefix := .prefix }}
{{- range $key, $value := .settings }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "%s%s" $prefix (upper $key) }}
  value: {{ include "attnstore.settingValue" $value | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "attnstore.settingValue" -}}
{{- if or (kindIs "slice" .) (kindIs "map" .) }}
{{- toJson . }}
{{- else if and (kindIs "float64" .) (eq . (floor .)) }}
{{- int64 . }}
{{- else }}
{{- . }}
{{- end }}
{{- end }}

{{/* Where the daemon mounts SSD directory i (one mount per hostPath). */}}
{{- define "attnstore.ssdMountPath" -}}
{{- printf "/var/lib/attnstore/ssd/%d" . }}
{{- end }}

{{/* The daemon's memory: the arena (tmpfs pages charged to the daemon) plus its own overhead. */}}
{{- define "attnstore.daemonMemoryBytes" -}}
{{- add (int64 .Values.daemon.dram.capacityBytes) (int64 .Values.daemon.memoryOverheadBytes) }}
{{- end }}

{{/* The scheduler's Redis URL as an env entry (in-chart, external URL or Secret); none = in-memory sessions. */}}
{{- define "attnstore.redisEnv" -}}
{{- if .Values.redis.enabled }}
- name: ATTNSTORE_SCHEDULER_REDIS_URL
  value: {{ printf "redis://%s:%d/0" (include "attnstore.componentName" (dict "context" . "component" "redis")) (int .Values.redis.port) | quote }}
{{- else if or .Values.externalRedis.url .Values.externalRedis.existingSecret }}
- name: ATTNSTORE_SCHEDULER_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.externalRedis.existingSecret | default (include "attnstore.componentName" (dict "context" . "component" "redis-url")) }}
      key: {{ .Values.externalRedis.existingSecretKey }}
{{- end }}
{{- end }}

{{- define "attnstore.usesRedis" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret }}true{{ end }}
{{- end }}

{{/* Security contexts shared by the attnstore containers (uid/gid 10001, as in the images). */}}
{{- define "attnstore.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "attnstore.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Native gRPC probes on the standard health service: (dict "port" 50051 "startupFailureThreshold" 60 "livenessFailureThreshold" 3) */}}
{{- define "attnstore.grpcProbes" -}}
startupProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: {{ .startupFailureThreshold }}
readinessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: {{ .livenessFailureThreshold }}
{{- end }}

{{- define "attnstore.schedulerServiceAccount" -}}
{{- if .Values.scheduler.serviceAccount.create }}
{{- .Values.scheduler.serviceAccount.name | default (include "attnstore.componentName" (dict "context" . "component" "scheduler")) }}
{{- else }}
{{- .Values.scheduler.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}
