{{- /* The chart's name, or nameOverride. */ -}}
{{- define "handoff.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /*
The prefix of every object's name: fullnameOverride, else the release name
when it holds the chart's name, else <release>-<name>.
*/ -}}
{{- define "handoff.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "handoff.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* Service names are DNS labels (63 characters): leave room for the suffix. */ -}}
{{- define "handoff.webhookName" -}}{{ include "handoff.fullname" . | trunc 55 | trimSuffix "-" }}-webhook{{- end -}}
{{- /*
The webhook's service account: serviceAccount.name, else the webhook's name
(serviceAccount.create false with no name: the webhook's name too, which
must then exist).
*/ -}}
{{- define "handoff.serviceAccountName" -}}{{ .Values.serviceAccount.name | default (include "handoff.webhookName" .) }}{{- end -}}
{{- define "handoff.certSecret" -}}{{ include "handoff.webhookName" . }}-cert{{- end -}}

{{- /*
The labels of every object: the standard app.kubernetes.io ones (version:
the chart's appVersion), then commonLabels, which may not replace them.
*/ -}}
{{- define "handoff.labels" -}}
{{- $std := dict
  "app.kubernetes.io/name" (include "handoff.name" .)
  "app.kubernetes.io/instance" .Release.Name
  "app.kubernetes.io/version" (.Chart.AppVersion | toString)
  "app.kubernetes.io/managed-by" .Release.Service
  "app.kubernetes.io/part-of" "handoff"
  "helm.sh/chart" (printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-") }}
{{- toYaml (merge $std (.Values.commonLabels | default dict)) }}
{{- end -}}

{{- define "handoff.selectorLabels" -}}
app.kubernetes.io/name: {{ include "handoff.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- /*
The webhook pods' labels: podLabels, commonLabels and the standard labels;
the selector's and the standard ones win over podLabels and commonLabels.
*/ -}}
{{- define "handoff.podLabels" -}}
{{- $labels := merge (include "handoff.selectorLabels" . | fromYaml) (include "handoff.labels" . | fromYaml) (.Values.webhook.podLabels | default dict) }}
{{- toYaml $labels }}
{{- end -}}

{{- /*
An image reference from one image value ({repository, tag, digest}) and the
root context: <registry/>repository@digest when a digest is given (it wins
over the tag), else :tag, else :appVersion. global.imageRegistry, when set,
takes the place of the repository's registry (its first element when that
holds a "." or ":" or is localhost), as common charts do.
Call as: include "handoff.imageRef" (dict "image" .Values.image "root" $)
*/ -}}
{{- define "handoff.imageRef" -}}
{{- $repo := .image.repository }}
{{- with (.root.Values.global | default dict).imageRegistry }}
{{- $parts := splitList "/" $repo }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $parts = rest $parts }}
{{- end }}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) (join "/" $parts) }}
{{- end }}
{{- if .image.digest }}
{{- printf "%s@%s" $repo .image.digest }}
{{- else }}
{{- printf "%s:%s" $repo (.image.tag | default .root.Chart.AppVersion | toString) }}
{{- end }}
{{- end -}}

{{- /*
A map without its null values, as YAML: a key set to null in values is left
out (Helm drops it only where the chart's own values have it).
*/ -}}
{{- define "handoff.withoutNulls" -}}
{{- $out := dict }}
{{- range $k, $v := . }}{{ if not (kindIs "invalid" $v) }}{{ $_ := set $out $k $v }}{{ end }}{{ end }}
{{- toYaml $out }}
{{- end -}}

{{- /*
The ref of the docs that match this chart's release: its appVersion when that
is a release's tag (vX.Y.Z, or vX.Y.Z-PRE without a dev or dirty
identifier, as version.Released), else main (a development build). Links to
runbooks, hints and the dashboard's docs go to the installed version's docs.
*/ -}}
{{- define "handoff.docsRef" -}}
{{- $v := .Chart.AppVersion | toString }}
{{- if and (regexMatch "^v[0-9]+\\.[0-9]+\\.[0-9]+(-[0-9A-Za-z.-]+)?$" $v) (not (regexMatch "(^|[-.])(dev|dirty)([.]|$)" (trimPrefix "v" $v | splitList "-" | rest | join "-"))) }}
{{- $v }}
{{- else }}main{{ end }}
{{- end -}}

{{- /*
A document's text with the repository's links to main turned to the docs of
this release (handoff.docsRef). Call as: include "handoff.versionedDocs" (dict "text" $s "root" $)
*/ -}}
{{- define "handoff.versionedDocs" -}}
{{- .text | replace "github.com/handoff-dev/handoff/blob/main/" (printf "github.com/handoff-dev/handoff/blob/%s/" (include "handoff.docsRef" .root)) }}
{{- end -}}

{{- /* The webhook's image (image). */ -}}
{{- define "handoff.image" -}}
{{- include "handoff.imageRef" (dict "image" .Values.image "root" .) }}
{{- end -}}

{{- /* The injected sidecar's image (sidecar.image), also its install step's. */ -}}
{{- define "handoff.sidecarImage" -}}
{{- include "handoff.imageRef" (dict "image" .Values.sidecar.image "root" .) }}
{{- end -}}

{{- /*
The webhook pods' image pull secrets: global.imagePullSecrets (names, or
{name} objects, as umbrella charts give them) and imagePullSecrets, once each.
*/ -}}
{{- define "handoff.imagePullSecrets" -}}
{{- $names := list }}
{{- range concat ((.Values.global | default dict).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) }}
{{- if kindIs "string" . }}
{{- $names = append $names . }}
{{- else if and (kindIs "map" .) .name }}
{{- $names = append $names .name }}
{{- end }}
{{- end }}
{{- range $names | uniq }}
- name: {{ . }}
{{- end }}
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
{{- with .Values.networkPolicy.scraper.namespaceSelector }}{{ if or .matchLabels .matchExpressions }}{{ $_ := set $peer "namespaceSelector" . }}{{ end }}{{ end }}
{{- with .Values.networkPolicy.scraper.podSelector }}{{ if or .matchLabels .matchExpressions }}{{ $_ := set $peer "podSelector" . }}{{ end }}{{ end }}
{{- if $peer }}{{ toJson $peer }}{{ end }}
{{- end }}

{{- /*
The CEL condition that a request comes from a holder of a self-service
sidecar's rights (sidecar-self-service.yaml): any user, group or service
account a binding of the request's namespace binds to <fullname>-sidecar
(it may use handoff.dev/sidecars there) and that no wildcard grants every
resource (handoff.dev/wildcard-probe, which nothing grants by name). Not
only service accounts: a namespace's admin who bound the ClusterRole to a
User (before sidecar-bind-policy.yaml, or with it off) held pods/status
patch through it, and the pod-bound policies then refuse every write of
that User, whose requests name no pod.
*/ -}}
{{- define "handoff.selfServiceMatch" -}}
authorizer.group('handoff.dev').resource('sidecars').namespace(request.namespace).check('use').allowed() && !authorizer.group('handoff.dev').resource('wildcard-probe').namespace(request.namespace).check('use').allowed()
{{- end }}

{{- /*
The CEL condition that a request comes from a sidecar's service account:
one of rbac.sidecarBindings, or with rbac.selfService a self-service one.
"" when there is neither.
*/ -}}
{{- define "handoff.sidecarMatch" -}}
{{- $users := list }}
{{- range .Values.rbac.sidecarBindings }}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" .namespace .serviceAccount) }}
{{- end }}
{{- $terms := list }}
{{- with $users }}{{ $terms = append $terms (printf "request.userInfo.username in %s" (. | sortAlpha | toJson)) }}{{ end }}
{{- if .Values.rbac.selfService }}{{ $terms = append $terms (printf "(%s)" (include "handoff.selfServiceMatch" .)) }}{{ end }}
{{- join " || " $terms }}
{{- end }}
