{{/* The prefix of the release's object names: the release name when it already says pyshuffle. */}}
{{- define "pyshuffle.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains "pyshuffle" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-pyshuffle" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select one role's pods ("component" is coordinator or worker). */}}
{{- define "pyshuffle.selectorLabels" -}}
app.kubernetes.io/name: pyshuffle
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Every label of one role's objects. */}}
{{- define "pyshuffle.labels" -}}
{{ include "pyshuffle.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end -}}

{{/* external-shuffle.coordinator.address: every coordinator pod by its stable name behind the
headless Service, comma-separated. "domain" follows the Service's name: "" from this namespace,
".<namespace>.svc" from any. */}}
{{- define "pyshuffle.coordinatorAddress" -}}
{{- $values := .root.Values -}}
{{- $addresses := list -}}
{{- range $index := until (int $values.coordinator.replicas) -}}
{{- $addresses = append $addresses (printf "%s-coordinator-%d.%s%s:%d" (include "pyshuffle.fullname" $.root) $index $values.coordinator.serviceName $.domain (int $values.coordinator.port)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{- define "pyshuffle.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The pods' ServiceAccount; empty (the namespace's default) when none is created or named. */}}
{{- define "pyshuffle.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "pyshuffle.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name }}
{{- end -}}
{{- end -}}

{{- define "pyshuffle.tokenSecret" -}}
{{ .Values.auth.existingSecret | default (printf "%s-token" (include "pyshuffle.fullname" .)) }}
{{- end -}}

{{/* Pods restart when the daemon's config changes. */}}
{{- define "pyshuffle.configChecksum" -}}
{{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- end -}}

{{/* Longer than the daemon's graceful shutdown, so that it finishes before SIGKILL. */}}
{{- define "pyshuffle.terminationGracePeriod" -}}
{{ add .Values.config.shutdownGraceSeconds 15 }}
{{- end -}}

{{/* The pod-level settings both roles share. */}}
{{- define "pyshuffle.podSecurity" -}}
# No Service environment variables (see values.yaml) and no API token: the daemon needs neither.
enableServiceLinks: false
automountServiceAccountToken: false
{{- with include "pyshuffle.serviceAccountName" . }}
serviceAccountName: {{ . }}
{{- end }}
terminationGracePeriodSeconds: {{ include "pyshuffle.terminationGracePeriod" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The container-level security settings both roles share. */}}
{{- define "pyshuffle.containerSecurity" -}}
securityContext:
  runAsNonRoot: true
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
{{- end -}}

{{/* Probes: started once the gRPC port serves grpc.health.v1 (overall service ""); then
ready and alive as the metrics port's /readyz (a worker: known to a coordinator and not
decommissioning) and /healthz say. */}}
{{- define "pyshuffle.probes" -}}
startupProbe:
  grpc:
    port: {{ .port }}
  periodSeconds: 2
  failureThreshold: {{ .startupFailures }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  timeoutSeconds: 2
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* Mounts of the config, the token and (when enabled) the TLS files. */}}
{{- define "pyshuffle.configMounts" -}}
- name: config
  mountPath: /etc/pyshuffle/config
  readOnly: true
- name: token
  mountPath: /etc/pyshuffle/token
  readOnly: true
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/pyshuffle/tls
  readOnly: true
{{- end }}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{- define "pyshuffle.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "pyshuffle.fullname" . }}-daemon
- name: token
  secret:
    secretName: {{ include "pyshuffle.tokenSecret" . }}
    # Group-readable: the files belong to root and to the fsGroup.
    defaultMode: 0440
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
# The root file system is read-only; Python and gRPC may still want a temp dir.
- name: tmp
  emptyDir:
    sizeLimit: 256Mi
{{- end -}}
