{{/*
The names are fixed, as packaging/kubernetes/daemonset.yaml has them: one devgate per
cluster (its ClusterRole is cluster-wide, and the hook files on each node are one set).
*/}}

{{/* The selector: the plain manifest's, so that either can take over from the other. */}}
{{- define "devgate.selectorLabels" -}}
app.kubernetes.io/name: devgate
{{- end }}

{{- define "devgate.labels" -}}
{{ include "devgate.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "devgate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "devgate.serviceAccountName" -}}
{{ .Values.serviceAccount.name | default "devgate-agent" }}
{{- end }}

{{/* devgate's config.json as text: a string as it is, a map as JSON. */}}
{{- define "devgate.configJson" -}}
{{- if kindIs "string" .Values.config -}}
{{ .Values.config }}
{{- else -}}
{{ toPrettyJson .Values.config }}
{{- end }}
{{- end }}

{{/* The config's state_dir (devgate's default /run/devgate): where the agent writes. */}}
{{- define "devgate.stateDir" -}}
{{- $c := .Values.config -}}
{{- if kindIs "string" $c }}{{ $c = fromJson $c }}{{ end -}}
{{ get $c "state_dir" | default "/run/devgate" }}
{{- end }}

{{- define "devgate.checkValues" -}}
{{- if not (has .Values.agent.effect (list "None" "NoSchedule" "NoExecute")) }}
{{- fail (printf "agent.effect must be None, NoSchedule or NoExecute, not %q" (toString .Values.agent.effect)) }}
{{- end }}
{{- if not (hasPrefix "/" (include "devgate.stateDir" .)) }}
{{- fail "config.state_dir must be an absolute path" }}
{{- end }}
{{- end }}
