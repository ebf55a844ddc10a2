{{- /*
The workload's service account: serviceAccount.name, else the release's name
(as a subchart: <release>-<its name or alias>).
*/ -}}
{{- define "handoff-workload.serviceAccountName" -}}
{{- if .Values.serviceAccount.name }}{{ .Values.serviceAccount.name }}
{{- else if .Chart.IsRoot }}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end -}}

{{- /*
The platform's self-service ClusterRole: sidecarClusterRole, else
<platform fullname>-sidecar, the fullname worked out as the handoff chart's
handoff.fullname does from platform.fullnameOverride or platform.release
(default: handoff on its own, this release as a subchart).
*/ -}}
{{- define "handoff-workload.sidecarClusterRole" -}}
{{- if .Values.sidecarClusterRole }}{{ .Values.sidecarClusterRole }}
{{- else }}
{{- $p := .Values.platform | default dict }}
{{- $release := $p.release | default (ternary "handoff" .Release.Name .Chart.IsRoot) }}
{{- $full := $p.fullnameOverride | default (ternary $release (printf "%s-handoff" $release) (contains "handoff" $release)) }}
{{- printf "%s-sidecar" ($full | trunc 63 | trimSuffix "-") }}
{{- end }}
{{- end -}}

{{- /* The labels of every object of a release, as a YAML map. */ -}}
{{- define "handoff-workload.labels" -}}
{{- toYaml (dict
  "app.kubernetes.io/name" .Chart.Name
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" (.Chart.AppVersion | toString)
  "app.kubernetes.io/managed-by" .Release.Service
  "app.kubernetes.io/part-of" "handoff"
  "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-")) }}
{{- end }}
