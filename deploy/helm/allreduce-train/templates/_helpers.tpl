{{/* Labels of every object; call with (dict "root" $ "component" "worker"). */}}
{{- define "allreduce-train.labels" -}}
app.kubernetes.io/name: allreduce-train
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The runs volume's claim: runs.claimName, or RELEASE-runs when the chart creates it. */}}
{{- define "allreduce-train.claimName" -}}
{{- if .Values.runs.claimName }}{{ .Values.runs.claimName }}{{ else if .Values.runs.create }}{{ .Release.Name }}-runs{{ end }}
{{- end }}

{{/* The trainer's arguments, one YAML list item per line. */}}
{{- define "allreduce-train.trainerArgs" -}}
{{- $v := .Values }}
{{- if $v.resume }}
- "--name"
- {{ .Release.Name | quote }}
- "--resume"
- "auto"
{{- end }}
- "--model"
- {{ $v.model | quote }}
{{- if $v.dataset }}
- "--dataset"
- {{ $v.dataset | quote }}
{{- end }}
{{- if $v.epochs }}
- "--epochs"
- {{ $v.epochs | quote }}
{{- end }}
{{- if eq $v.strategy "allreduce" }}
- "--strategy"
- "allreduce"
{{- else }}
- "--strategy"
- "ps"
- "--ps-placement"
- {{ trimPrefix "ps-" $v.strategy | quote }}
{{- if eq $v.strategy "ps-dedicated" }}
- "--ps-servers"
- {{ $v.psServers | quote }}
{{- end }}
- "--ps-mode"
- {{ $v.psMode | quote }}
{{- end }}
{{- range $v.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}
