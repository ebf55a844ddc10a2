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
