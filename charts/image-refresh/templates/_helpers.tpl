{{/* Names and labels. */}}
{{- define "image-refresh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "image-refresh.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "image-refresh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "image-refresh.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "image-refresh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "image-refresh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "image-refresh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "image-refresh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The image of image-refresh itself: repository[:tag][@digest]. */}}
{{- define "image-refresh.image" -}}
{{- $repo := required "image.repository is required (the registry and repository of your image-refresh build)" .Values.image.repository }}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s:%s@%s" $repo $tag .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{/*
The workloads the config names, as JSON:
  {"<namespace>": {"kinds": {"Deployment": ["a", "b"]}, "targets": true}}
Anchors and targets both count (every one is read and may be patched);
"targets" marks a namespace that holds a target, whose pod templates'
imagePullSecrets are read. Callers: include … | fromJson.
*/}}
{{- define "image-refresh.workloads" -}}
{{- $out := dict }}
{{- $kinds := list "Deployment" "DaemonSet" "StatefulSet" "CronJob" }}
{{- range .Values.config.kinds }}{{ $kinds = append $kinds .kind }}{{ end }}
{{- range $gi, $g := .Values.config.groups }}
{{- $refs := list (dict "w" $g.anchor "target" false "at" (printf "/config/groups/%d/anchor/kind" $gi)) }}
{{- range $ii, $img := $g.images }}
{{- range $ti, $t := $img.targets }}
{{- $refs = append $refs (dict "w" $t "target" true "at" (printf "/config/groups/%d/images/%d/targets/%d/kind" $gi $ii $ti)) }}
{{- end }}
{{- end }}
{{- range $r := $refs }}
{{- if not (has $r.w.kind $kinds) }}
{{- fail (printf "%s: %s is not a kind image-refresh can pin: one of %s, or a kind declared under config.kinds (docs/kinds.md)" $r.at $r.w.kind (join ", " $kinds)) }}
{{- end }}
{{- end }}
{{- range $r := $refs }}
{{- $ns := get $out $r.w.namespace | default (dict "kinds" (dict) "targets" false "copies" (list)) }}
{{- $names := get $ns.kinds $r.w.kind | default (list) }}
{{- $_ := set $ns.kinds $r.w.kind (append $names $r.w.name | uniq | sortAlpha) }}
{{- if $r.target }}{{ $_ := set $ns "targets" true }}{{ else }}{{ $_ := set $ns "copies" (append $ns.copies (include "image-refresh.stateCopy" $r.w) | uniq | sortAlpha) }}{{ end }}
{{- $_ := set $out $r.w.namespace $ns }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The name of the ConfigMap that keeps the copy of a group's state beside
its anchor (R25; internal/statestore.Name): image-refresh-state-<kind>-<name>,
or image-refresh-state- and 40 hex digits of its SHA-256 when longer than
253 characters.
*/}}
{{- define "image-refresh.stateCopy" -}}
{{- $n := printf "image-refresh-state-%s-%s" (lower .kind) .name }}
{{- if gt (len $n) 253 }}{{ $n = printf "image-refresh-state-%s" (sha256sum $n | trunc 40) }}{{ end }}
{{- $n }}
{{- end }}

{{/*
The resource of a workload kind (internal/workload's kind table), or of a
kind config.kinds declares (K2): its resource, else the usual plural the
binary guesses too (meta.UnsafeGuessKindToResource). Called with
(dict "kind" KIND "root" $).
*/}}
{{- define "image-refresh.resource" -}}
{{- $builtin := (dict "Deployment" "deployments" "DaemonSet" "daemonsets" "StatefulSet" "statefulsets" "CronJob" "cronjobs") }}
{{- if hasKey $builtin .kind }}
{{- get $builtin .kind }}
{{- else }}
{{- range .root.Values.config.kinds }}
{{- if eq .kind $.kind }}
{{- if .resource }}{{ .resource }}
{{- else }}
{{- $s := lower .kind }}
{{- if hasSuffix "s" $s }}{{ $s }}es{{ else if hasSuffix "y" $s }}{{ trimSuffix "y" $s }}ies{{ else }}{{ $s }}s{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The API group of a workload kind (internal/workload's kind table), or of a
kind config.kinds declares (K2). Called with (dict "kind" KIND "root" $).
*/}}
{{- define "image-refresh.apiGroup" -}}
{{- $builtin := (dict "Deployment" "apps" "DaemonSet" "apps" "StatefulSet" "apps" "CronJob" "batch") }}
{{- if hasKey $builtin .kind }}
{{- get $builtin .kind }}
{{- else }}
{{- range .root.Values.config.kinds }}
{{- if eq .kind $.kind }}{{ .group }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The kinds config.kinds declares (K2), by API group, as JSON
{"argoproj.io": ["rollouts"]}: discovery and its webhooks cover them
beside the built-in kinds.
*/}}
{{- define "image-refresh.declared" -}}
{{- $out := dict }}
{{- range .Values.config.kinds }}
{{- $r := include "image-refresh.resource" (dict "kind" .kind "root" $) }}
{{- $_ := set $out .group (append (get $out .group | default (list)) $r | uniq | sortAlpha) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
The resources of the kinds the config names, by API group, as JSON
{"apps": ["daemonsets", "deployments"], "batch": ["cronjobs"]}: `run`
watches exactly these kinds, in every namespace of the config.
*/}}
{{- define "image-refresh.watched" -}}
{{- $out := dict }}
{{- range $ns, $info := include "image-refresh.workloads" . | fromJson }}
{{- range $kind, $names := $info.kinds }}
{{- $group := include "image-refresh.apiGroup" (dict "kind" $kind "root" $) }}
{{- $_ := set $out $group (append (get $out $group | default (list)) (include "image-refresh.resource" (dict "kind" $kind "root" $)) | uniq | sortAlpha) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
Seconds (a float) in a Go duration string ("10m", "1h30m", "1.5h",
"500ms"): the syntax the binary's config accepts (time.ParseDuration).
*/}}
{{- define "image-refresh.seconds" -}}
{{- $units := dict "h" 3600.0 "m" 60.0 "s" 1.0 "ms" 0.001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ns" 0.000000001 }}
{{- $total := 0.0 }}
{{- range $part := regexFindAll "[0-9]*\\.?[0-9]+(ns|us|µs|μs|ms|s|m|h)|[0-9]+\\.(ns|us|µs|μs|ms|s|m|h)" (toString .) -1 }}
{{- $num := regexFind "^[0-9.]+" $part }}
{{- $unit := trimPrefix $num $part }}
{{- $total = addf $total (mulf (float64 $num) (get $units $unit)) }}
{{- end }}
{{- $total }}
{{- end }}

{{/*
activeDeadlineSeconds of the tick Job: cronjob.activeDeadlineSeconds when
set; else the tick's own deadline (R14, internal/config
EffectiveTickTimeout: tickTimeout, or (distinct workloads incl. anchors,
plus those of each onFailedRollout: rollback group again, + 1)
× rolloutTimeout + 2m) plus 60 s, so the tick hits its deadline, reports
RefreshError and exits before the Job controller kills the pod.
*/}}
{{- define "image-refresh.activeDeadlineSeconds" -}}
{{- if .Values.cronjob.activeDeadlineSeconds }}
{{- .Values.cronjob.activeDeadlineSeconds | int64 }}
{{- else }}
{{- $tick := include "image-refresh.seconds" (.Values.config.tickTimeout | default "0s") | float64 }}
{{- if not (gt $tick 0.0) }}
{{- $n := 0 }}
{{- range $ns, $info := include "image-refresh.workloads" . | fromJson }}
{{- range $kind, $names := $info.kinds }}
{{- $n = add $n (len $names) }}
{{- end }}
{{- end }}
{{- range .Values.config.groups }}
{{- if eq (toString .onFailedRollout) "rollback" }}
{{- $seen := dict (printf "%s/%s/%s" .anchor.kind .anchor.namespace .anchor.name) true }}
{{- range .images }}{{- range .targets }}
{{- $_ := set $seen (printf "%s/%s/%s" .kind .namespace .name) true }}
{{- end }}{{- end }}
{{- $n = add $n (len $seen) }}
{{- end }}
{{- end }}
{{- $rollout := include "image-refresh.seconds" (.Values.config.rolloutTimeout | default "10m") | float64 }}
{{- $tick = addf (mulf (add $n 1) $rollout) 120 }}
{{- end }}
{{- addf $tick 60 | ceil | int64 }}
{{- end }}
{{- end }}

{{/* The config file, exactly .Values.config. */}}
{{- define "image-refresh.configFile" -}}
{{ toYaml .Values.config }}
{{- end }}

{{/* Volumes and mounts shared by the CronJob and the Deployment. */}}
{{- define "image-refresh.volumes" -}}
- name: config
  configMap:
    name: {{ include "image-refresh.fullname" . }}
    items:
      - {key: config.yaml, path: config.yaml}
{{- if .Values.registryAuth.dockerConfigSecret }}
- name: docker-config
  secret:
    secretName: {{ .Values.registryAuth.dockerConfigSecret }}
    items:
      - {key: .dockerconfigjson, path: config.json}
{{- end }}
{{- if and .Values.webhook.enabled (eq .Values.mode "controller") .Values.webhook.certSecret }}
- name: webhook-certs
  secret:
    secretName: {{ .Values.webhook.certSecret }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- with .Values.promotionSigning.secret }}
- name: promotion-signing
  secret:
    secretName: {{ . }}
{{- end }}
{{- range .Values.verificationKeys }}
- name: verification-{{ .name }}
  {{- if .secret }}
  secret:
    secretName: {{ .secret }}
  {{- else }}
  configMap:
    name: {{ .configMap }}
  {{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "image-refresh.volumeMounts" -}}
- {name: config, mountPath: /etc/image-refresh, readOnly: true}
{{- if .Values.registryAuth.dockerConfigSecret }}
- {name: docker-config, mountPath: /var/run/image-refresh/docker, readOnly: true}
{{- end }}
{{- if and .Values.webhook.enabled (eq .Values.mode "controller") .Values.webhook.certSecret }}
- {name: webhook-certs, mountPath: /var/run/image-refresh/webhook, readOnly: true}
{{- end }}
{{- if .Values.promotionSigning.secret }}
- {name: promotion-signing, mountPath: /var/run/image-refresh/promotion, readOnly: true}
{{- end }}
{{- range .Values.verificationKeys }}
- {name: verification-{{ .name }}, mountPath: /var/run/image-refresh/verification/{{ .name }}, readOnly: true}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "image-refresh.env" -}}
{{- if .Values.registryAuth.dockerConfigSecret }}
- {name: DOCKER_CONFIG, value: /var/run/image-refresh/docker}
{{- end }}
{{- if and .Values.notify.enabled (eq .Values.mode "controller") }}
# The notification secret: from a Secret, never an argument (R20).
- name: IMAGE_REFRESH_NOTIFY_TOKEN
  valueFrom:
    secretKeyRef: {name: {{ .Values.notify.tokenSecret | quote }}, key: {{ .Values.notify.tokenSecretKey | quote }}}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the CronJob and the Deployment. */}}
{{- define "image-refresh.podSpec" -}}
serviceAccountName: {{ include "image-refresh.serviceAccountName" . }}
# Needed: image-refresh talks to the API server as this ServiceAccount.
automountServiceAccountToken: true
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  {{- include "image-refresh.volumes" . | nindent 2 }}
{{- end }}

{{/* Container-level settings shared by the CronJob and the Deployment. */}}
{{- define "image-refresh.container" -}}
image: {{ include "image-refresh.image" . | quote }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (include "image-refresh.env" . | trim) }}
env:
  {{- . | nindent 2 }}
{{- end }}
volumeMounts:
  {{- include "image-refresh.volumeMounts" . | nindent 2 }}
{{- end }}

{{/*
The discovery flags of tick and run (docs/discovery.md).
*/}}
{{- define "image-refresh.discoveryArgs" -}}
{{- if not .Values.discovery.enabled -}}
- --discovery=false
{{- else if .Values.discovery.watchNamespaces -}}
- --watch-namespaces
- {{ join "," .Values.discovery.watchNamespaces | quote }}
{{- end -}}
{{- end }}

{{/*
The rules discovery needs on the workloads it finds (rbac-discovery.yaml).
*/}}
{{- define "image-refresh.discoveryRules" -}}
# list{{ if .controller }}, watch{{ end }}: find the labelled workloads; get, patch: read the
# live images, the rollout status (R4) and the state annotations, re-pin
# (R9) and write the state. Every workload kind (docs/discovery.md).
- apiGroups: [apps]
  resources: [deployments, daemonsets, statefulsets]
  verbs: [get, list, patch{{ if .controller }}, watch{{ end }}]
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, list, patch{{ if .controller }}, watch{{ end }}]
{{- range $group, $resources := .declared }}
# The kinds config.kinds declares ({{ $group }}), K2.
- apiGroups: [{{ $group }}]
  resources: [{{ join ", " $resources }}]
  verbs: [get, list, patch{{ if $.controller }}, watch{{ end }}]
{{- end }}
# list{{ if .controller }}, watch{{ end }}: the pods, to compare the digest each runs (N1).
- apiGroups: [""]
  resources: [pods]
  verbs: [list{{ if .controller }}, watch{{ end }}]
# create, get, update: the findings and re-pins as Events (R15).
- apiGroups: [""]
  resources: [events]
  verbs: [create, get, update]
# {{ if .controller }}list, watch{{ else }}get{{ end }}: the imagePullSecrets of the pods' ServiceAccounts, which the kubelet
# pulls with too (the secrets themselves: registryAuth).{{ if .controller }} The controller
# reads them from its informer cache.{{ end }}
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [{{ if .controller }}list, watch{{ else }}get{{ end }}]
{{- with .secrets }}
# get: registry credentials, the registryAuth.pullSecrets by name only;
# never list (R20).
- apiGroups: [""]
  resources: [secrets]
  resourceNames: {{ toJson (uniq . | sortAlpha) }}
  verbs: [get]
{{- end }}
# get, create, update{{ if .controller }}, list, watch{{ end }}: the copy of each group's state, a ConfigMap
# beside its anchor that a rollback of the anchor cannot rewind (R25);
# delete: the copy of a workload let go.{{ if .controller }} The controller reads the copies
# from its informer cache, which lists only them (a label selector).{{ end }}
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, update, delete{{ if .controller }}, list, watch{{ end }}]
{{- if .controller }}
# create, patch: the controller's Events through events.k8s.io.
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
{{- end }}
