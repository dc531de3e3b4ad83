{{/* Names: "<release>-<chart>" unless the release name already contains the chart name. */}}
{{- define "ei.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ei.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A component's name; 52 characters leave room for StatefulSet pod suffixes. */}}
{{- define "ei.component" -}}
{{- printf "%s-%s" (include "ei.fullname" .root | trunc 40 | trimSuffix "-") .name | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "ei.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: evolving-infra
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "gateway") */}}
{{- define "ei.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ei.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ei.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ei.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "ei.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* Secret names and keys. */}}
{{- define "ei.secretName" -}}
{{- include "ei.component" (dict "root" . "name" "secrets") -}}
{{- end -}}

{{- define "ei.adminTokenSecretName" -}}
{{- default (include "ei.secretName" .) .Values.adminToken.existingSecret -}}
{{- end -}}

{{- define "ei.dbUrlSecretName" -}}
{{- if and (not .Values.postgresql.enabled) .Values.externalDatabase.existingSecret -}}
{{- .Values.externalDatabase.existingSecret -}}
{{- else -}}
{{- include "ei.secretName" . -}}
{{- end -}}
{{- end -}}

{{- define "ei.dbUrlSecretKey" -}}
{{- if and (not .Values.postgresql.enabled) .Values.externalDatabase.existingSecret -}}
{{- .Values.externalDatabase.existingSecretKey -}}
{{- else -}}
dbUrl
{{- end -}}
{{- end -}}

{{- define "ei.redisEnabled" -}}
{{- if or .Values.redis.enabled .Values.externalRedis.url .Values.externalRedis.existingSecret -}}true{{- end -}}
{{- end -}}

{{- define "ei.redisUrlSecretName" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
{{- .Values.externalRedis.existingSecret -}}
{{- else -}}
{{- include "ei.secretName" . -}}
{{- end -}}
{{- end -}}

{{- define "ei.redisUrlSecretKey" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.existingSecret -}}
{{- .Values.externalRedis.existingSecretKey -}}
{{- else -}}
redisUrl
{{- end -}}
{{- end -}}

{{/*
A generated secret value that survives upgrades: reuse the value already in the
cluster (lookup answers nothing under `helm template`), else a new random one.
Call with (dict "root" $ "key" "adminToken" "length" 40).
*/}}
{{- define "ei.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace (include "ei.secretName" .root) -}}
{{- if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum (int .length) -}}
{{- end -}}
{{- end -}}

{{- define "ei.postgresqlPassword" -}}
{{- if .Values.postgresql.auth.password -}}
{{- .Values.postgresql.auth.password -}}
{{- else -}}
{{- include "ei.persistentRandom" (dict "root" . "key" "postgresPassword" "length" 32) -}}
{{- end -}}
{{- end -}}

{{/* Stable per-pod URLs of the workers through the headless Service. */}}
{{- define "ei.workerUrls" -}}
{{- $sts := include "ei.component" (dict "root" . "name" "worker") -}}
{{- $svc := include "ei.component" (dict "root" . "name" "worker-peers") -}}
{{- $urls := list -}}
{{- range $i := until (int .Values.workers.replicas) -}}
{{- $urls = append $urls (printf "http://%s-%d.%s.%s.svc:%d" $sts $i $svc $.Release.Namespace (int $.Values.workers.port)) -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* The model volume and its mount, shared by gateway and workers. */}}
{{- define "ei.modelVolume" -}}
- name: model
{{ toYaml .Values.model.volume | indent 2 }}
{{- end -}}

{{- define "ei.modelVolumeMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end -}}

{{/* Checks that fail the render with a clear message instead of a broken deploy. */}}
{{/* OpenTelemetry environment of the gateway and the workers (values: tracing); `service` names the process. */}}
{{- define "ei.tracingEnv" -}}
{{- $t := .root.Values.tracing -}}
{{- if $t.enabled }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $t.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: "http/protobuf"
- name: OTEL_TRACES_SAMPLER
  value: "parentbased_traceidratio"
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $t.sampleRatio | quote }}
- name: OTEL_SERVICE_NAME
  value: {{ printf "evolving-infra-%s" .service | quote }}
{{- range $name, $value := $t.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "ei.validate" -}}
{{- if and (not .Values.postgresql.enabled) (not .Values.externalDatabase.url) (not .Values.externalDatabase.existingSecret) -}}
{{- fail "postgresql.enabled=false needs externalDatabase.url or externalDatabase.existingSecret" -}}
{{- end -}}
{{- if and (gt (int .Values.gateway.replicas) 1) (not (include "ei.redisEnabled" .)) -}}
{{- fail "gateway.replicas > 1 needs a shared KV directory: set redis.enabled=true or externalRedis.url" -}}
{{- end -}}
{{- if and (gt (int .Values.gateway.processes) 1) (not (include "ei.redisEnabled" .)) -}}
{{- fail "gateway.processes > 1 needs Redis: set redis.enabled=true or externalRedis.url" -}}
{{- end -}}
{{- if gt (float64 .Values.gateway.settings.leadership.renewSeconds) (divf .Values.gateway.settings.leadership.leaseTtlSeconds 2) -}}
{{- fail "gateway.settings.leadership.renewSeconds must be at most leaseTtlSeconds / 2" -}}
{{- end -}}
{{- if and .Values.adminToken.value (lt (len .Values.adminToken.value) 16) -}}
{{- fail "adminToken.value must be at least 16 characters (gateway/admin/auth.py)" -}}
{{- end -}}
{{- if lt (int .Values.workers.replicas) 1 -}}
{{- fail "workers.replicas must be >= 1" -}}
{{- end -}}
{{- $blockSize := int .Values.gateway.settings.blockSize -}}
{{- if or (lt $blockSize 1) (ne (mod $blockSize 32) 0) -}}
{{- fail "gateway.settings.blockSize must be a positive multiple of 32 (workers/engine.py)" -}}
{{- end -}}
{{- if and .Values.tracing.enabled (not .Values.tracing.endpoint) -}}
{{- fail "tracing.enabled needs tracing.endpoint (the collector's OTLP/HTTP URL)" -}}
{{- end -}}
{{- if or (lt (float64 .Values.tracing.sampleRatio) 0.0) (gt (float64 .Values.tracing.sampleRatio) 1.0) -}}
{{- fail "tracing.sampleRatio must be in [0, 1]" -}}
{{- end -}}
{{- if lt (int .Values.workers.gpus) 1 -}}
{{- fail "workers.gpus must be >= 1" -}}
{{- end -}}
{{- end -}}
