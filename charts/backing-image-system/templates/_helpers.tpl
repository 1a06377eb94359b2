{{- define "bis.name" -}}backing-image-system{{- end -}}

{{- define "bis.labels" -}}
app.kubernetes.io/name: {{ include "bis.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "bis.serviceAccountName" -}}backing-image-system-service-account{{- end -}}

