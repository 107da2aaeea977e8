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
{{- include "attnstore.redisUrlEnv" (dict "context" . "name" "ATTNSTORE_SCHEDULER_REDIS_URL") }}
{{- end }}

{{/* The Redis URL as the env entry `name`: (dict "context" $ "name" "ATTNSTORE_DAEMON_POOL_REDIS_URL");
the daemons' pool ledger lives in the scheduler's Redis. */}}
{{- define "attnstore.redisUrlEnv" -}}
{{- $values := .context.Values }}
{{- if $values.redis.enabled }}
- name: {{ .name }}
  value: {{ printf "redis://%s:%d/0" (include "attnstore.componentName" (dict "context" .context "component" "redis")) (int $values.redis.port) | quote }}
{{- else if or $values.externalRedis.url $values.externalRedis.existingSecret }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ $values.externalRedis.existingSecret | default (include "attnstore.componentName" (dict "context" .context "component" "redis-url")) }}
      key: {{ $values.externalRedis.existingSecretKey }}
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

{{/* Probes on the standard health service: (dict "context" $ "port" 50051 "healthPort" 50052
"startupFailureThreshold" 60 "livenessFailureThreshold" 3). Native gRPC probes speak no TLS and
present no client certificate: with tls.enabled the services serve health alone on the plaintext
healthPort (tls.health_listen_address) and the probes go there. */}}
{{- define "attnstore.grpcProbes" -}}
{{- $handler := dict "grpc" (dict "port" (int (ternary .healthPort .port .context.Values.tls.enabled))) }}
startupProbe:
  {{- toYaml $handler | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: {{ .startupFailureThreshold }}
readinessProbe:
  {{- toYaml $handler | nindent 2 }}
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  {{- toYaml $handler | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: {{ .livenessFailureThreshold }}
{{- end }}

{{/* TLS and internal auth (docs/security.md) -------------------------------------------- */}}

{{- define "attnstore.tlsDir" -}}/etc/attnstore/tls{{- end }}
{{- define "attnstore.tokensDir" -}}/etc/attnstore/tokens{{- end }}

{{- define "attnstore.checkSecurity" -}}
{{- $tls := .Values.tls }}
{{- $auth := .Values.internalAuth }}
{{- if and $tls.enabled (not $tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName: a Secret with tls.crt, tls.key and ca.crt" }}
{{- end }}
{{- if and $auth.enabled (not $tls.enabled) }}
{{- fail "internalAuth.enabled needs tls.enabled: tokens must not travel in clear text" }}
{{- end }}
{{- if and $auth.enabled (or (not $auth.secretName) (not $auth.adminTokenSha256)) }}
{{- fail "internalAuth.enabled needs internalAuth.secretName and adminTokenSha256: the scheduler's admin token" }}
{{- end }}
{{- if and $auth.enabled (not $tls.mutual) (not $auth.workerTokenSha256) }}
{{- fail "internalAuth.enabled without tls.mutual needs internalAuth.workerTokenSha256: the workers' token" }}
{{- end }}
{{- end }}

{{/* A server's tls setting as JSON: (dict "context" $ "mutual" true "healthPort" 50052) */}}
{{- define "attnstore.serverTLS" -}}
{{- $dir := include "attnstore.tlsDir" . }}
{{- $tls := dict "cert_file" (printf "%s/tls.crt" $dir) "key_file" (printf "%s/tls.key" $dir) }}
{{- if .mutual }}
{{- $_ := set $tls "client_ca_file" (printf "%s/ca.crt" $dir) }}
{{- $_ := set $tls "require_client_cert" true }}
{{- end }}
{{- $_ := set $tls "health_listen_address" (printf "0.0.0.0:%d" (int .healthPort)) }}
{{- toJson $tls }}
{{- end }}

{{/* The internal_auth setting of daemons and workers as JSON. */}}
{{- define "attnstore.internalAuth" -}}
{{- $auth := .Values.internalAuth }}
{{- toJson (dict "enabled" true "token_sha256" ($auth.workerTokenSha256 | default list) "admin_token_sha256" $auth.adminTokenSha256) }}
{{- end }}

{{/* An outgoing channel's setting as JSON: (dict "context" $ "token" "admin-token"); token "" = none. */}}
{{- define "attnstore.channel" -}}
{{- $tls := .context.Values.tls }}
{{- $dir := include "attnstore.tlsDir" . }}
{{- $channel := dict "tls" true "ca_file" (printf "%s/ca.crt" $dir) "server_name" $tls.serverName }}
{{- if $tls.mutual }}
{{- $_ := set $channel "cert_file" (printf "%s/tls.crt" $dir) }}
{{- $_ := set $channel "key_file" (printf "%s/tls.key" $dir) }}
{{- end }}
{{- if .token }}
{{- $_ := set $channel "token_file" (printf "%s/%s" (include "attnstore.tokensDir" .) .token) }}
{{- end }}
{{- toJson $channel }}
{{- end }}

{{/* The token a pod sends ("admin-token", "worker-token") or "": (dict "context" $ "component" "scheduler") */}}
{{- define "attnstore.token" -}}
{{- $values := .context.Values }}
{{- if $values.internalAuth.enabled }}
{{- if eq .component "scheduler" }}admin-token{{ else if not $values.tls.mutual }}worker-token{{ end }}
{{- end }}
{{- end }}

{{/* Volume mounts of the TLS Secret and the pod's token: (dict "context" $ "component" "inference-worker") */}}
{{- define "attnstore.securityVolumeMounts" -}}
{{- if .context.Values.tls.enabled }}
- name: tls
  mountPath: {{ include "attnstore.tlsDir" . }}
  readOnly: true
{{- end }}
{{- if include "attnstore.token" . }}
- name: tokens
  mountPath: {{ include "attnstore.tokensDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "attnstore.securityVolumes" -}}
{{- if .context.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .context.Values.tls.secretName }}
    defaultMode: 0440  # the key is readable by the pod's group (fsGroup) only
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- with include "attnstore.token" . }}
- name: tokens
  secret:
    secretName: {{ $.context.Values.internalAuth.secretName }}
    defaultMode: 0440
    items:
      - {key: {{ . }}, path: {{ . }}}
{{- end }}
{{- end }}

{{- define "attnstore.schedulerServiceAccount" -}}
{{- if .Values.scheduler.serviceAccount.create }}
{{- .Values.scheduler.serviceAccount.name | default (include "attnstore.componentName" (dict "context" . "component" "scheduler")) }}
{{- else }}
{{- .Values.scheduler.serviceAccount.name | default "default" }}
{{- end }}
{{- end }}
