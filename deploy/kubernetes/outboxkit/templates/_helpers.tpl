{{/* Names and labels. */}}
{{- define "outboxkit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outboxkit.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "outboxkit.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "outboxkit.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "outboxkit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "outboxkit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one worker: (dict "root" $ "component" "relay" "worker" "relay"). */}}
{{- define "outboxkit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "outboxkit.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
outboxkit.io/worker: {{ .worker }}
{{- end -}}

{{/*
An object's labels as one map, so that no key appears twice (tools built on yaml.v3 refuse a
mapping with a duplicate key): the chart's labels, a worker's selector labels (with "worker"),
else its "component", then the user's "extra" labels, which never replace the chart's own.
(dict "root" $ "component" "relay" "worker" "relay" "extra" .Values.podLabels)
*/}}
{{- define "outboxkit.labelMap" -}}
{{- $labels := fromYaml (include "outboxkit.labels" .root) -}}
{{- if .worker -}}
{{- $labels = mergeOverwrite $labels (fromYaml (include "outboxkit.selectorLabels" .)) -}}
{{- else if .component -}}
{{- $_ := set $labels "app.kubernetes.io/component" .component -}}
{{- end -}}
{{- toYaml (merge $labels (.extra | default dict)) -}}
{{- end -}}

{{- define "outboxkit.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "outboxkit.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret every worker reads: the chart's own with secrets.create, else the one named. */}}
{{- define "outboxkit.secretName" -}}
{{- if .Values.secrets.create -}}
{{- include "outboxkit.fullname" . -}}
{{- else if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- fail "set secrets.existingSecret (a Secret with the workers' database URLs), or secrets.create with secrets.values" -}}
{{- end -}}
{{- end -}}

{{/* The container image: your service's, which outboxkit's version says nothing about. */}}
{{- define "outboxkit.image" -}}
{{- $repository := required "image.repository: your service's image, with outboxkit installed (outboxkit publishes none)" .Values.image.repository -}}
{{- $tag := required "image.tag: the tag of your service's image (the chart's appVersion is outboxkit's version, not your image's)" (.Values.image.tag | default "" | toString) -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}

{{/* A setting a worker cannot run without, from its env or the shared config: the name of
the worker, the setting and what it is, or the chart fails to render.
(dict "root" $ "env" $w.env "name" "OUTBOXKIT_TOPICS" "worker" "relay" "what" "…") */}}
{{- define "outboxkit.requireSetting" -}}
{{- $value := include "outboxkit.setting" (dict "root" .root "env" .env "name" .name "default" "") -}}
{{- if not $value -}}
{{- fail (printf "%s: set %s (%s) in its env or in config" .worker .name .what) -}}
{{- end -}}
{{- end -}}

{{/*
A setting as a worker sees it: its own env, else the shared config, else the default.
(dict "root" $ "env" $worker.env "name" "OUTBOXKIT_SESSION_TIMEOUT" "default" 10)
*/}}
{{- define "outboxkit.setting" -}}
{{- $env := .env | default dict -}}
{{- if hasKey $env .name -}}
{{- index $env .name -}}
{{- else if hasKey .root.Values.config .name -}}
{{- index .root.Values.config .name -}}
{{- else -}}
{{- .default -}}
{{- end -}}
{{- end -}}

{{/*
Seconds a stopping relay may take: the side tasks' cancel grace (5 s), the block workers'
drain (OUTBOXKIT_REVOKE_TIMEOUT, then 5 s of cancel grace), leaving the group
(OUTBOXKIT_REVOKE_TIMEOUT + OUTBOXKIT_SESSION_TIMEOUT): relay/engine.py, relay/supervisor.py.
*/}}
{{- define "outboxkit.relayStopBound" -}}
{{- $revoke := include "outboxkit.setting" (dict "root" .root "env" .worker.env "name" "OUTBOXKIT_REVOKE_TIMEOUT" "default" 20) | float64 -}}
{{- $session := include "outboxkit.setting" (dict "root" .root "env" .worker.env "name" "OUTBOXKIT_SESSION_TIMEOUT" "default" 10) | float64 -}}
{{- addf (mulf 2 $revoke) $session 10 | ceil | int -}}
{{- end -}}

{{/* Seconds a stopping inbox worker may take to commit and leave: 2 × the session timeout
(inbox/consumer.py). */}}
{{- define "outboxkit.inboxStopBound" -}}
{{- $session := include "outboxkit.setting" (dict "root" .root "env" .worker.env "name" "OUTBOXKIT_SESSION_TIMEOUT" "default" 10) | float64 -}}
{{- mulf 2 $session | ceil | int -}}
{{- end -}}

{{/* The pod's grace period: the worker's bound plus a margin, or the value given (never
below the bound). (dict "root" $ "worker" $w "bound" N) */}}
{{- define "outboxkit.grace" -}}
{{- $bound := .bound | int -}}
{{- if kindIs "invalid" .worker.terminationGracePeriodSeconds -}}
{{- add $bound (.worker.terminationMarginSeconds | int) -}}
{{- else if le (.worker.terminationGracePeriodSeconds | int) $bound -}}
{{- fail (printf "%s: terminationGracePeriodSeconds %v must be above the worker's own stop bound, %d s" .name .worker.terminationGracePeriodSeconds $bound) -}}
{{- else -}}
{{- .worker.terminationGracePeriodSeconds | int -}}
{{- end -}}
{{- end -}}

{{/* The startup probe's failure threshold: OUTBOXKIT_STARTUP_GRACE plus a margin. */}}
{{- define "outboxkit.startupFailures" -}}
{{- $grace := include "outboxkit.setting" (dict "root" .root "env" .worker.env "name" "OUTBOXKIT_STARTUP_GRACE" "default" 60) | float64 -}}
{{- $p := .root.Values.startupProbe -}}
{{- divf (addf $grace $p.startupMarginSeconds) $p.periodSeconds | ceil | int -}}
{{- end -}}

{{/*
The pod template of one worker: (dict "root" $ "name" "relay" "component" "relay"
"worker" $w "args" (list "relay") "bound" N).
*/}}
{{- define "outboxkit.podTemplate" -}}
{{- $root := .root -}}
{{- $w := .worker -}}
metadata:
  labels:
    {{- include "outboxkit.labelMap" (dict "root" $root "component" .component "worker" .name "extra" $root.Values.podLabels) | nindent 4 }}
  annotations:
    checksum/config: {{ toJson (list $root.Values.config $w.env) | sha256sum }}
    {{- with (merge (dict) ($w.podAnnotations | default dict) $root.Values.podAnnotations) }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "outboxkit.serviceAccountName" $root }}
  terminationGracePeriodSeconds: {{ include "outboxkit.grace" (dict "root" $root "worker" $w "bound" .bound "name" .name) }}
  {{- with $root.Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.podSecurityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .component }}
      image: {{ include "outboxkit.image" $root | quote }}
      imagePullPolicy: {{ $root.Values.image.pullPolicy }}
      command: ["outboxkit"]
      args:
        {{- range .args }}
        - {{ . | quote }}
        {{- end }}
      ports:
        - name: http
          containerPort: {{ $root.Values.httpPort }}
          protocol: TCP
      env:
        - name: OUTBOXKIT_HTTP_PORT
          value: {{ $root.Values.httpPort | quote }}
        {{- include "outboxkit.env" (dict "root" $root "env" $w.env "databaseUrlKey" $w.databaseUrlKey "extraEnv" $w.extraEnv) | trim | nindent 8 }}
      startupProbe:
        httpGet:
          path: /metrics
          port: http
        periodSeconds: {{ $root.Values.startupProbe.periodSeconds }}
        failureThreshold: {{ include "outboxkit.startupFailures" (dict "root" $root "worker" $w) }}
      readinessProbe:
        {{- toYaml $w.readinessProbe | nindent 8 }}
      livenessProbe:
        {{- toYaml $w.livenessProbe | nindent 8 }}
      {{- with $w.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.securityContext }}
      securityContext:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      volumeMounts:
        {{- include "outboxkit.volumeMounts" $root | nindent 8 }}
  volumes:
    {{- include "outboxkit.volumes" $root | nindent 4 }}
  {{- with ($w.nodeSelector | default $root.Values.nodeSelector) }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($w.tolerations | default $root.Values.tolerations) }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with ($w.affinity | default $root.Values.affinity) }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}


{{/*
A container's environment: the shared config and the worker's own settings (its own win), the
database URL from the Secret's key databaseUrlKey, the Kafka SASL and TLS settings, extraEnv.
(dict "root" $ "env" $w.env "databaseUrlKey" "database-url" "extraEnv" $w.extraEnv); without
"databaseUrlKey", no database URL.
*/}}
{{- define "outboxkit.env" -}}
{{- $root := .root -}}
{{- $env := .env | default dict -}}
{{- $secret := include "outboxkit.secretName" $root -}}
{{- range $name, $value := $root.Values.config }}
{{- if not (hasKey $env $name) }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- range $name, $value := $env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- if .databaseUrlKey }}
- name: OUTBOXKIT_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .databaseUrlKey }}
{{- end }}
- name: OUTBOXKIT_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $root.Values.secrets.kafkaSaslUsernameKey }}
      optional: true
- name: OUTBOXKIT_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $root.Values.secrets.kafkaSaslPasswordKey }}
      optional: true
- name: OUTBOXKIT_KAFKA_SSL_KEY_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $root.Values.secrets.kafkaSslKeyPasswordKey }}
      optional: true
{{- with $root.Values.kafkaTls }}
{{- if .existingSecret }}
- name: OUTBOXKIT_KAFKA_SSL_CA_FILE
  value: {{ printf "/etc/outboxkit/kafka-tls/%s" .caKey | quote }}
{{- if .clientCertificate }}
- name: OUTBOXKIT_KAFKA_SSL_CERT_FILE
  value: {{ printf "/etc/outboxkit/kafka-tls/%s" .certKey | quote }}
- name: OUTBOXKIT_KAFKA_SSL_KEY_FILE
  value: {{ printf "/etc/outboxkit/kafka-tls/%s" .keyKey | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- with .extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A container's mounts: a writable /tmp (the root filesystem is read-only), the Kafka and
database TLS files. */}}
{{- define "outboxkit.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.kafkaTls.existingSecret }}
- name: kafka-tls
  mountPath: /etc/outboxkit/kafka-tls
  readOnly: true
{{- end }}
{{- if .Values.databaseTls.existingSecret }}
- name: database-tls
  mountPath: /etc/outboxkit/database-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "outboxkit.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.kafkaTls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafkaTls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- if .Values.databaseTls.existingSecret }}
- name: database-tls
  secret:
    secretName: {{ .Values.databaseTls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{/* The labels a Prometheus Operator object carries for its Prometheus to select it: `labels`,
and `release` (kube-prometheus-stack's Prometheus selects by its own Helm release's name). */}}
{{- define "outboxkit.operatorLabels" -}}
{{- $labels := deepCopy (.labels | default dict) -}}
{{- if .release -}}
{{- $_ := set $labels "release" .release -}}
{{- end -}}
{{- toYaml $labels -}}
{{- end -}}

{{/* The ServiceAccount of the hook Jobs. They run before the release's objects exist, so not
the one the chart creates: jobs.serviceAccountName (the namespace's default when empty), or the
existing one the workers use when the chart creates none. */}}
{{- define "outboxkit.hookServiceAccountName" -}}
{{- if .Values.jobs.serviceAccountName -}}
{{- .Values.jobs.serviceAccountName -}}
{{- else if .Values.serviceAccount.create -}}
default
{{- else -}}
{{- include "outboxkit.serviceAccountName" . -}}
{{- end -}}
{{- end -}}

{{/* Every topic of the release as a YAML list: createTopics.topics, else the OUTBOXKIT_TOPICS
of the relay and of each inbox (without repeats). */}}
{{- define "outboxkit.allTopics" -}}
{{- $topics := list -}}
{{- if .Values.createTopics.topics -}}
{{- $topics = .Values.createTopics.topics -}}
{{- else -}}
{{- $settings := list -}}
{{- if .Values.relay.enabled -}}
{{- $settings = append $settings (include "outboxkit.setting" (dict "root" . "env" .Values.relay.env "name" "OUTBOXKIT_TOPICS" "default" "")) -}}
{{- end -}}
{{- range $entry := .Values.inboxes -}}
{{- $w := mergeOverwrite (deepCopy $.Values.inboxDefaults) $entry -}}
{{- $settings = append $settings (include "outboxkit.setting" (dict "root" $ "env" $w.env "name" "OUTBOXKIT_TOPICS" "default" "")) -}}
{{- end -}}
{{- range $setting := $settings -}}
{{- range $topic := splitList "," $setting -}}
{{- if trim $topic -}}
{{- $topics = append $topics (trim $topic) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml (uniq $topics) -}}
{{- end -}}

{{/* One container of a hook Job: (dict "root" $ "name" "migrate" "job" .Values.migrate "args"
(list "migrate") "database" true). */}}
{{- define "outboxkit.jobContainer" -}}
{{- $root := .root -}}
- name: {{ .name }}
  image: {{ include "outboxkit.image" $root | quote }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command: ["outboxkit"]
  args:
    {{- range .args }}
    - {{ . | quote }}
    {{- end }}
  env:
    {{- include "outboxkit.env" (dict "root" $root "env" .job.env "databaseUrlKey" (ternary .job.databaseUrlKey "" .database) "extraEnv" .job.extraEnv) | trim | nindent 4 }}
  {{- with .job.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $root.Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "outboxkit.volumeMounts" $root | nindent 4 }}
{{- end -}}
