{{/* Chart name, truncated to a DNS label. */}}
{{- define "chatfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release name, plus the chart name unless the release name already holds it. */}}
{{- define "chatfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "chatfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "chatfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: chatfleet
{{- end }}

{{/* Labels selecting the operator's pods. */}}
{{- define "chatfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chatfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The ServiceAccount the operator runs as. */}}
{{- define "chatfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "chatfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image: repository@digest, else repository:tag (tag defaults to appVersion). */}}
{{- define "chatfleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Watched namespaces, one per line (scope namespaces only; default the release namespace). */}}
{{- define "chatfleet.watchNamespaces" -}}
{{- if eq .Values.watch.scope "namespaces" }}
{{- $namespaces := .Values.watch.namespaces | default (list .Release.Namespace) }}
{{- range $namespaces }}
{{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Whether kopf peering (hot standby) is on: more than one replica. */}}
{{- define "chatfleet.peering" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/* Checks across values that the JSON schema cannot phrase clearly. */}}
{{- define "chatfleet.validate" -}}
{{- if and (eq .Values.watch.scope "cluster") .Values.watch.namespaces }}
{{- fail "watch.namespaces is set but watch.scope is cluster (which watches every namespace): set watch.scope=namespaces to watch only the listed namespaces, or empty watch.namespaces" }}
{{- end }}
{{- $prom := .Values.operator.prometheus }}
{{- if and $prom.ca.configMap $prom.ca.secret }}
{{- fail "operator.prometheus.ca names both a configMap and a secret: set one of them" }}
{{- end }}
{{- if and $prom.insecureSkipVerify (or $prom.ca.configMap $prom.ca.secret) }}
{{- fail "operator.prometheus.insecureSkipVerify is set with operator.prometheus.ca: a CA verifies the certificate that insecureSkipVerify ignores; set one of them" }}
{{- end }}
{{- if and $prom.bearerToken.secret $prom.bearerToken.serviceAccountToken.enabled }}
{{- fail "operator.prometheus.bearerToken names a secret and enables serviceAccountToken: set one of them" }}
{{- end }}
{{- if and (or $prom.bearerToken.secret $prom.bearerToken.serviceAccountToken.enabled) (not $prom.bearerToken.hosts) }}
{{- fail "operator.prometheus.bearerToken.hosts: list the hosts the token may be sent to (over https only): a ChatbotService's author chooses its Prometheus address" }}
{{- end }}
{{- end }}

{{/* Where the operator pod finds the Prometheus CA bundle and bearer token (empty when not configured). */}}
{{- define "chatfleet.prometheusCaFile" -}}
{{- $ca := .Values.operator.prometheus.ca }}
{{- if or $ca.configMap $ca.secret }}/etc/chatfleet/prometheus/ca/ca.crt{{ end }}
{{- end }}

{{- define "chatfleet.prometheusTokenFile" -}}
{{- $t := .Values.operator.prometheus.bearerToken }}
{{- if or $t.serviceAccountToken.enabled $t.secret }}/etc/chatfleet/prometheus/token/token{{ end }}
{{- end }}

{{/* "true" when the operator serves /metrics and the chart scrapes them: monitoring.operatorPodMonitor.enabled
when set (true or false), else on with the other Prometheus Operator monitoring (fleetPodMonitor or
prometheusRule, whose CRDs the PodMonitor needs too). */}}
{{- define "chatfleet.operatorMetrics" -}}
{{- $m := .Values.monitoring }}
{{- if kindIs "bool" $m.operatorPodMonitor.enabled }}
{{- if $m.operatorPodMonitor.enabled }}true{{ end }}
{{- else if or $m.fleetPodMonitor.enabled $m.prometheusRule.enabled }}true
{{- end }}
{{- end }}
