{{- /*
The image both components run: repository:tag, the tag the chart's appVersion unless set.
*/ -}}
{{- define "swimlb.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- /*
The labels of every object of a component (`controller` or `speaker`), the selector's too.
*/ -}}
{{- define "swimlb.selectorLabels" -}}
app.kubernetes.io/name: swimlb
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{- /*
The Pod template's imagePullSecrets, from .Values.imagePullSecrets (names, or {name: ...}).
*/ -}}
{{- define "swimlb.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  {{- if kindIs "string" . }}
  - name: {{ . }}
  {{- else }}
  - {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}
{{- end -}}
