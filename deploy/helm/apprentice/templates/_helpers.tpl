{{/* Names: every object is `<release>-apprentice-<part>` (or the release name when it holds "apprentice"). */}}
{{- define "apprentice.fullname" -}}
{{- if contains "apprentice" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-apprentice" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "apprentice.labels" -}}
app.kubernetes.io/name: apprentice
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector of one component: include with (dict "root" $ "component" "inference"). */}}
{{- define "apprentice.selectorLabels" -}}
app.kubernetes.io/name: apprentice
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "apprentice.componentLabels" -}}
{{ include "apprentice.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "apprentice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "apprentice.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* image: include with (dict "root" $ "override" .Values.inference.image). */}}
{{- define "apprentice.image" -}}
{{- $img := merge (deepCopy (.override | default dict)) .root.Values.image -}}
{{- printf "%s:%s" $img.repository ($img.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{- define "apprentice.authSecretName" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "apprentice.fullname" .)) -}}
{{- end -}}

{{- define "apprentice.tlsSecretName" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "apprentice.fullname" .)) -}}
{{- end -}}

{{/* The in-cluster address of a component's Service: include with (dict "root" $ "component" "weights"). */}}
{{- define "apprentice.host" -}}
{{- printf "%s-%s" (include "apprentice.fullname" .root) .component -}}
{{- end -}}

{{/* --- Kafka --------------------------------------------------------------------------------------- */}}
{{- define "apprentice.strimziCluster" -}}
{{- .Values.kafka.strimzi.clusterName | default (printf "%s-kafka" (include "apprentice.fullname" .)) -}}
{{- end -}}

{{/* The Secret Strimzi's user operator writes a KafkaUser's password into (its secretPrefix + the user). */}}
{{- define "apprentice.strimziUserSecret" -}}
{{- printf "%s-kafka-%s" (include "apprentice.fullname" .root) .principal -}}
{{- end -}}

{{- define "apprentice.strimziScram" -}}
{{- if and .Values.kafka.strimzi.enabled (eq .Values.kafka.strimzi.authentication "scram-sha-512") -}}true{{- end -}}
{{- end -}}

{{- define "apprentice.kafkaBootstrap" -}}
{{- if .Values.kafka.strimzi.enabled -}}
{{- printf "%s-kafka-bootstrap:%s" (include "apprentice.strimziCluster" .) (ternary "9093" "9092" (eq (include "apprentice.strimziScram" .) "true")) -}}
{{- else -}}
{{- required "kafka.external.bootstrap is required when kafka.strimzi.enabled is false" .Values.kafka.external.bootstrap -}}
{{- end -}}
{{- end -}}

{{/* Kafka client settings of one workload (shared/settings.py) and where its secrets are mounted: include
with (dict "root" $ "principal" "grader"). Every workload is its own principal of
shared/contracts/topic_access.py (SASL username = principal), so the broker's ACLs (files/kafka-acls.yaml)
apply to it alone; its password is mounted as a file from its own Secret, never put in the environment. */}}
{{- define "apprentice.kafkaSasl" -}}
{{- if eq (include "apprentice.strimziScram" .root) "true" -}}true
{{- else if and (not .root.Values.kafka.strimzi.enabled) (hasPrefix "SASL_" .root.Values.kafka.external.securityProtocol) -}}true
{{- end -}}
{{- end -}}

{{- define "apprentice.kafkaEnv" -}}
{{- $root := .root -}}
- name: APPRENTICE_KAFKA_BOOTSTRAP
  value: {{ include "apprentice.kafkaBootstrap" $root | quote }}
- name: APPRENTICE_STREAM_PARTITIONS
  value: {{ $root.Values.kafka.streamPartitions | int | quote }}
{{- if eq (include "apprentice.strimziScram" $root) "true" }}
- name: APPRENTICE_KAFKA_SECURITY_PROTOCOL
  value: SASL_SSL
- name: APPRENTICE_KAFKA_SASL_MECHANISM
  value: SCRAM-SHA-512
- name: APPRENTICE_KAFKA_SASL_USERNAME
  value: {{ .principal | quote }}
- name: APPRENTICE_KAFKA_SASL_PASSWORD_FILE
  value: /secrets/kafka-user/password
- name: APPRENTICE_KAFKA_SSL_CA
  value: /secrets/kafka-ca/ca.crt
{{- else if not $root.Values.kafka.strimzi.enabled }}
{{- $ext := $root.Values.kafka.external }}
- name: APPRENTICE_KAFKA_SECURITY_PROTOCOL
  value: {{ $ext.securityProtocol | quote }}
{{- if hasPrefix "SASL_" $ext.securityProtocol }}
- name: APPRENTICE_KAFKA_SASL_MECHANISM
  value: {{ $ext.saslMechanism | quote }}
- name: APPRENTICE_KAFKA_SASL_USERNAME
  value: {{ $ext.saslUsername | default .principal | quote }}
- name: APPRENTICE_KAFKA_SASL_PASSWORD_FILE
  value: /secrets/kafka-user/password
{{- end }}
{{- if $ext.caSecret.name }}
- name: APPRENTICE_KAFKA_SSL_CA
  value: /secrets/kafka-ca/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{/* Include with the root context. */}}
{{- define "apprentice.kafkaVolumeMounts" -}}
{{- if eq (include "apprentice.kafkaSasl" (dict "root" .)) "true" }}
- name: kafka-user
  mountPath: /secrets/kafka-user
  readOnly: true
{{- end }}
{{- if or (eq (include "apprentice.strimziScram" .) "true") (and (not .Values.kafka.strimzi.enabled) .Values.kafka.external.caSecret.name) }}
- name: kafka-ca
  mountPath: /secrets/kafka-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* Include with (dict "root" $ "principal" "grader"). With an external cluster the password Secret's
name may hold `{principal}` (kafka.external.saslPasswordSecret.name), so each workload gets its own. */}}
{{- define "apprentice.kafkaVolumes" -}}
{{- $root := .root -}}
{{- if eq (include "apprentice.strimziScram" $root) "true" }}
- name: kafka-user
  secret:
    secretName: {{ include "apprentice.strimziUserSecret" . }}
    defaultMode: 0440
    items: [{key: password, path: password}]
- name: kafka-ca
  secret:
    secretName: {{ printf "%s-cluster-ca-cert" (include "apprentice.strimziCluster" $root) }}
    items: [{key: ca.crt, path: ca.crt}]
{{- else if not $root.Values.kafka.strimzi.enabled }}
{{- $ext := $root.Values.kafka.external }}
{{- if hasPrefix "SASL_" $ext.securityProtocol }}
- name: kafka-user
  secret:
    secretName: {{ required "kafka.external.saslPasswordSecret.name is required with a SASL_* securityProtocol" $ext.saslPasswordSecret.name | replace "{principal}" .principal }}
    defaultMode: 0440
    items: [{key: {{ $ext.saslPasswordSecret.key }}, path: password}]
{{- end }}
{{- if $ext.caSecret.name }}
- name: kafka-ca
  secret:
    secretName: {{ $ext.caSecret.name }}
    items: [{key: {{ $ext.caSecret.key }}, path: ca.crt}]
{{- end }}
{{- end }}
{{- end -}}

{{/* --- What every service container shares ----------------------------------------------------------
Include with (dict "root" $ "principal" "grader" "token" "service.token" "idSecret" true): the environment
of a service: Kafka (as its principal), model, state folders, the key ring it accepts, the token it presents, TLS. */}}
{{- define "apprentice.env" -}}
{{- $root := .root -}}
{{ include "apprentice.kafkaEnv" (dict "root" $root "principal" (required "apprentice.env needs a principal" .principal)) }}
- name: APPRENTICE_TOPIC_PREFIX
  value: {{ $root.Values.topicPrefix | quote }}
- name: APPRENTICE_MODEL
  value: {{ $root.Values.model | quote }}
- name: APPRENTICE_LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
- name: APPRENTICE_HOME
  value: /data
- name: APPRENTICE_MODEL_CACHE
  value: /cache/models
# The root filesystem is read-only: libraries that write under $HOME (Hugging Face, torch, vLLM) get a volume.
- name: HOME
  value: /cache/home
- name: HF_HOME
  value: /cache/huggingface
- name: APPRENTICE_AUTH_KEYS_FILE
  value: /secrets/auth/keys.txt
- name: APPRENTICE_AUTH_TOKEN_FILE
  value: /secrets/auth/{{ .token }}
{{- if .idSecret }}
- name: APPRENTICE_INTERACTION_ID_SECRET_FILE
  value: /secrets/auth/interaction-id.secret
{{- end }}
{{- if $root.Values.tls.enabled }}
- name: APPRENTICE_TLS_CERT
  value: /secrets/tls/tls.crt
- name: APPRENTICE_TLS_KEY
  value: /secrets/tls/tls.key
- name: APPRENTICE_TLS_CA
  value: /secrets/tls/ca.crt
{{- end }}
- name: APPRENTICE_RECORD_SIGNATURES
  value: {{ $root.Values.recordKeys.signatures | quote }}
{{- if eq $root.Values.recordKeys.signatures "required" }}
- name: APPRENTICE_RECORD_KEYS_DIR
  value: /secrets/records
{{- end }}
{{- with $root.Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- range $k, $v := .env }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{/* Mounts without subPath, so that rotated keys and certificates reach running pods (the key ring is
re-read when its file changes). */}}
{{- define "apprentice.volumeMounts" -}}
- name: auth
  mountPath: /secrets/auth
  readOnly: true
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /secrets/tls
  readOnly: true
{{- end }}
{{- include "apprentice.kafkaVolumeMounts" . }}
{{- if eq .Values.recordKeys.signatures "required" }}
- name: record-keys
  mountPath: /secrets/records
  readOnly: true
{{- end }}
- name: data
  mountPath: /data
- name: cache
  mountPath: /cache
- name: tmp
  mountPath: /tmp
- name: probe
  mountPath: /probe
  readOnly: true
{{- end -}}

{{/* Include with (dict "root" $ "principal" "grader" "token" "service.token" "idSecret" true "data" <volume source or nil>). */}}
{{- define "apprentice.volumes" -}}
{{- $root := .root -}}
- name: auth
  secret:
    secretName: {{ include "apprentice.authSecretName" $root }}
    defaultMode: 0440
    items:
      - {key: keys.txt, path: keys.txt}
      - {key: {{ .token }}, path: {{ .token }}}
{{- if .idSecret }}
      - {key: interaction-id.secret, path: interaction-id.secret}
{{- end }}
{{- if $root.Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ include "apprentice.tlsSecretName" $root }}
    defaultMode: 0440
{{- end }}
{{- include "apprentice.kafkaVolumes" (dict "root" $root "principal" (required "apprentice.volumes needs a principal" .principal)) }}
{{- include "apprentice.recordKeysVolume" (dict "root" $root "principal" .principal) }}
- name: data
{{- if .data }}
{{ toYaml .data | indent 2 }}
{{- else }}
  emptyDir: {}
{{- end }}
- name: cache
  emptyDir: {}
- name: tmp
  emptyDir: {}
- name: probe
  configMap:
    name: {{ include "apprentice.fullname" $root }}-probe
{{- end -}}

{{/* Principals that sign records (tools/record_keys.py SIGNERS, less `operator`, who runs no Deployment). */}}
{{- define "apprentice.recordSigners" -}}
inference grader extractor trainer weights
{{- end -}}

{{/* The record-signing keys directory of one workload: every public key (the ConfigMap) and, for a
principal that signs, its own private key alone (its own Secret): a pod never holds another's key.
Include with (dict "root" $ "principal" "grader"). */}}
{{- define "apprentice.recordKeysVolume" -}}
{{- $rk := .root.Values.recordKeys -}}
{{- if eq $rk.signatures "required" }}
- name: record-keys
  projected:
    defaultMode: 0440
    sources:
      - configMap:
          name: {{ include "apprentice.fullname" .root }}-record-keys
          # ConfigMap keys cannot hold `@`: `<principal>.<key_id>.pub` there, `<principal>@<key_id>.pub` here
          items:
{{- range $name, $_ := $rk.publicKeys }}
            - {key: {{ printf "%s.pub" (replace "@" "." $name) }}, path: {{ printf "%s.pub" $name }}}
{{- end }}
{{- if has .principal (splitList " " (include "apprentice.recordSigners" .root)) }}
      - secret:
          name: {{ $rk.privateKeySecret | replace "{principal}" .principal | quote }}
          items: [{key: {{ printf "%s.key" .principal }}, path: {{ printf "%s.key" .principal }}}]
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level settings shared by every Deployment: include with (dict "root" $ "svc" .Values.<service>). */}}
{{- define "apprentice.podSpec" -}}
serviceAccountName: {{ include "apprentice.serviceAccountName" .root }}
automountServiceAccountToken: false
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
securityContext:
{{ toYaml .root.Values.podSecurityContext | indent 2 }}
{{- with .svc.nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .svc.tolerations }}
tolerations:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .svc.affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end -}}

{{/* Annotations that roll the pods when the grader config changes (secrets rotate in place). */}}
{{- define "apprentice.podAnnotations" -}}
{{- with .svc.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* gRPC health probe (the probe ConfigMap): include with (dict "root" $ "port" 50051 "component" "inference"). */}}
{{- define "apprentice.grpcProbe" -}}
exec:
  command: ["python", "/probe/health_probe.py", "{{ .port }}", "{{ include "apprentice.host" . }}"]
{{- end -}}

{{/* Replication factor of topics the services create themselves (the grader's internal topics). */}}
{{- define "apprentice.replication" -}}
{{- if .Values.kafka.strimzi.enabled -}}
{{- min .Values.kafka.replicationFactor .Values.kafka.strimzi.replicas -}}
{{- else -}}
{{- .Values.kafka.replicationFactor -}}
{{- end -}}
{{- end -}}

{{/* The Apprentice topics (contract names, shared/topics.py): partitions bound how many replicas of a
consumer share the work (the stream topics' count is kafka.streamPartitions, docs/capacity.md); the knowledge topic is compacted (the latest snapshot per key is the knowledge
base). tests/deploy/test_helm.py checks this list against shared/topics.py. */}}
{{- define "apprentice.topics" -}}
{{- $p := required "kafka.streamPartitions must be set" .Values.kafka.streamPartitions | int }}
{{- if lt $p 1 }}{{ fail "kafka.streamPartitions must be at least 1" }}{{ end }}
- {name: apprentice.interactions.v1, partitions: {{ $p }}, retentionMs: 604800000}
- {name: apprentice.feedback.v1, partitions: {{ $p }}, retentionMs: 604800000}
- {name: apprentice.graded.v1, partitions: {{ $p }}, retentionMs: 604800000}
- {name: apprentice.knowledge.v1, partitions: 3, retentionMs: -1, compacted: true}
- {name: apprentice.checkpoints.v1, partitions: 1, retentionMs: 604800000}
- {name: apprentice.model-updates.v1, partitions: 1, retentionMs: 604800000}
- {name: apprentice.deadletter.v1, partitions: 1, retentionMs: 2592000000}
- {name: apprentice.audit.v1, partitions: 1, retentionMs: 31536000000}
- {name: apprentice.grader-rules.v1, partitions: 1, retentionMs: -1, compacted: true}
{{- end -}}
