{{- define "handoff.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- /* Service names are DNS labels (63 characters): leave room for the suffix. */ -}}
{{- define "handoff.webhookName" -}}{{ include "handoff.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}
{{- define "handoff.certSecret" -}}{{ include "handoff.webhookName" . }}-cert{{- end -}}

{{- define "handoff.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "handoff.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "handoff.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/*
The Lease names one rbac.sidecarBindings entry may hold: its leases, then its
shard set's prefix0 … prefix(count-1), as JSON (a list).
*/}}
{{- define "handoff.bindingLeases" -}}
{{- $names := .leases | default list }}
{{- with .shards }}
{{- range $i := until (int .count) }}
{{- $names = append $names (printf "%s%d" $.shards.prefix $i) }}
{{- end }}
{{- end }}
{{- toJson $names }}
{{- end }}

{{/*
The metrics scraper as a NetworkPolicy peer (networkPolicy.scraper): its
namespaceSelector and podSelector, those given; "" when neither is, and then
no pod may scrape (the node still may).
*/}}
{{- define "handoff.scraperPeer" -}}
{{- $peer := dict }}
{{- with .Values.networkPolicy.scraper.namespaceSelector }}{{ $_ := set $peer "namespaceSelector" . }}{{ end }}
{{- with .Values.networkPolicy.scraper.podSelector }}{{ $_ := set $peer "podSelector" . }}{{ end }}
{{- if $peer }}{{ toJson $peer }}{{ end }}
{{- end }}
