{{- define "acme.podAnnotations" -}}
acme.example/revision: {{ .Values.revision | quote }}
{{- end -}}
