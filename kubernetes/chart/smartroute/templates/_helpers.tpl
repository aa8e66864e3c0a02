{{/* Name of the chart, overridable. */}}
{{- define "smartroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every resource: release-chart, or the release alone when it already names the chart.
At most 38 characters: the log collector's StatefulSet (-log-collector) must stay within
52, or its pods' controller-revision-hash label passes 63; without the collector 47, for
the -worker-metrics Service (63). Refused rather than cut, which could make two releases' names one. */}}
{{- define "smartroute.fullname" -}}
{{- $full := "" }}
{{- if .Values.fullnameOverride }}
{{- $full = .Values.fullnameOverride | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $full = .Release.Name | trimSuffix "-" }}
{{- else }}
{{- $full = printf "%s-%s" .Release.Name $name | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- $max := ternary 38 47 .Values.logCollector.enabled }}
{{- if gt (len $full) $max }}
{{- fail (printf "the full name %q is %d characters, and at most %d leave room for every object's suffix: set fullnameOverride (or a shorter release name)" $full (len $full) $max) }}
{{- end }}
{{- $full }}
{{- end }}

{{/* What the pods' checksum/auth annotation hashes: the credentials as the values give
them, not the rendered Secret, whose generated ones are drawn anew at each render (the
first upgrade would roll every pod for nothing; an upgrade keeps the installed ones). */}}
{{- define "smartroute.authChecksum" -}}
{{- toJson .Values.auth | sha256sum }}
{{- end }}

{{/* Labels of every resource. */}}
{{- define "smartroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "smartroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: include with (dict "ctx" $ "component" "dispatcher"). */}}
{{- define "smartroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "smartroute.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image reference of a smartroute component: include with (dict "ctx" $ "repository" "..."). */}}
{{- define "smartroute.image" -}}
{{- $reg := .ctx.Values.image.registry -}}
{{- $tag := default .ctx.Chart.AppVersion .ctx.Values.image.tag -}}
{{- if $reg }}{{ printf "%s/%s:%s" (trimSuffix "/" $reg) .repository $tag }}{{ else }}{{ printf "%s:%s" .repository $tag }}{{ end }}
{{- end }}

{{- define "smartroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}{{ default (include "smartroute.fullname" .) .Values.serviceAccount.name }}{{ else }}{{ default "default" .Values.serviceAccount.name }}{{ end }}
{{- end }}

{{/* Name of the Secret holding the tokens and keys. */}}
{{- define "smartroute.authSecret" -}}
{{- default (printf "%s-auth" (include "smartroute.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{/* Scheme of HTTP probes: HTTPS when the dispatcher and collector serve TLS. */}}
{{- define "smartroute.probeScheme" -}}
{{- if .Values.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* Pod fields shared by every pod. */}}
{{- define "smartroute.podCommon" -}}
serviceAccountName: {{ include "smartroute.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Scheduling fields of one component's values (nodeSelector, tolerations, affinity). */}}
{{- define "smartroute.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
