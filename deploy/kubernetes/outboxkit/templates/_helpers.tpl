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

{{- define "outboxkit.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "outboxkit.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "outboxkit.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else if .Values.secrets.create -}}
{{- include "outboxkit.fullname" . -}}
{{- else -}}
{{- fail "set secrets.existingSecret (a Secret with the workers' database URLs), or secrets.create with secrets.values" -}}
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
{{- $secret := include "outboxkit.secretName" $root -}}
metadata:
  labels:
    {{- include "outboxkit.labels" $root | nindent 4 }}
    {{- include "outboxkit.selectorLabels" (dict "root" $root "component" .component "worker" .name) | nindent 4 }}
    {{- with $root.Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
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
      image: {{ printf "%s:%s" (required "image.repository: your service's image, with outboxkit installed" $root.Values.image.repository) (default $root.Chart.AppVersion $root.Values.image.tag) | quote }}
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
        {{- range $name, $value := $root.Values.config }}
        {{- if not (hasKey ($w.env | default dict) $name) }}
        - name: {{ $name }}
          value: {{ $value | toString | quote }}
        {{- end }}
        {{- end }}
        {{- range $name, $value := $w.env }}
        - name: {{ $name }}
          value: {{ $value | toString | quote }}
        {{- end }}
        - name: OUTBOXKIT_DATABASE_URL
          valueFrom:
            secretKeyRef:
              name: {{ $secret }}
              key: {{ $w.databaseUrlKey }}
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
        {{- with $w.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
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
        - name: tmp
          mountPath: /tmp
        {{- if $root.Values.kafkaTls.existingSecret }}
        - name: kafka-tls
          mountPath: /etc/outboxkit/kafka-tls
          readOnly: true
        {{- end }}
        {{- if $root.Values.databaseTls.existingSecret }}
        - name: database-tls
          mountPath: /etc/outboxkit/database-tls
          readOnly: true
        {{- end }}
  volumes:
    - name: tmp
      emptyDir: {}
    {{- if $root.Values.kafkaTls.existingSecret }}
    - name: kafka-tls
      secret:
        secretName: {{ $root.Values.kafkaTls.existingSecret }}
        defaultMode: 0440
    {{- end }}
    {{- if $root.Values.databaseTls.existingSecret }}
    - name: database-tls
      secret:
        secretName: {{ $root.Values.databaseTls.existingSecret }}
        defaultMode: 0440
    {{- end }}
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
