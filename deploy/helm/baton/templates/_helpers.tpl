{{/* Names, labels and the derived numbers every template shares. */}}

{{- define "baton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name. KubeRay derives pod and Service names from the RayCluster's name
("<name>-head-svc", "<name>-prefill-worker-xxxxx"), so keep it short enough for those
to stay under 63 characters.
*/}}
{{- define "baton.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "baton.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "baton.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Name of the Secret holding Ray's auth token (created by the chart or brought along). */}}
{{- define "baton.rayAuthSecretName" -}}
{{- default (printf "%s-ray-auth" (include "baton.fullname" .)) .Values.rayAuth.existingSecret }}
{{- end }}

{{/* Ray's token authentication env, as list items ("" when rayAuth is off). */}}
{{- define "baton.rayAuthEnv" -}}
{{- if .Values.rayAuth.enabled }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "baton.rayAuthSecretName" . }}
      key: {{ .Values.rayAuth.key }}
{{- end }}
{{- end }}

{{/*
A Secret holding one random token, created once: an upgrade keeps the token an earlier
install generated (a new one would log every operator out, or split a Ray cluster between
two tokens). lookup is empty under `helm template`. Call with
(dict "root" $ "name" NAME "key" KEY "value" VALUE); VALUE "" = random.
*/}}
{{- define "baton.tokenSecret" -}}
{{- $token := .value }}
{{- if not $token }}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name }}
{{- if and $existing $existing.data (hasKey $existing.data .key) }}
{{- $token = index $existing.data .key | b64dec }}
{{- else }}
{{- $token = randAlphaNum 40 }}
{{- end }}
{{- end }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ .name }}
  labels:
    {{- include "baton.labels" .root | nindent 4 }}
type: Opaque
data:
  {{ .key }}: {{ $token | b64enc | quote }}
{{- end }}

{{/* Name of the Secret holding the admin token (created by the chart or brought along). */}}
{{- define "baton.adminSecretName" -}}
{{- default (printf "%s-admin" (include "baton.fullname" .)) .Values.adminToken.existingSecret }}
{{- end }}

{{/*
Baton workers one pod of a pool holds: workersPerPod when set, else GPUs per pod / TP
(each worker asks Ray for `tp` GPUs and one unit of the pool's custom resource), or, with
serve.gpusPerWorker under 1, GPUs per pod / gpusPerWorker (workers sharing a GPU), else 1
on a CPU pool. Call with (dict "pool" .Values.prefill "serve" .Values.serve "role" "prefill").
*/}}
{{- define "baton.workersPerPod" -}}
{{- $tp := int .serve.tp }}
{{- $share := float64 .serve.gpusPerWorker }}
{{- $gpus := int .pool.gpu.count }}
{{- if and (lt $share 1.0) (gt $tp 1) }}
{{- fail (printf "serve.gpusPerWorker (%v) shares a GPU between workers; a worker of several TP ranks takes whole GPUs (set gpusPerWorker 1 or tp 1)" .serve.gpusPerWorker) }}
{{- end }}
{{- if gt (int .pool.workersPerPod) 0 }}
{{- int .pool.workersPerPod }}
{{- else if eq $gpus 0 }}
{{- 1 }}
{{- else if lt $share 1.0 }}
{{- int (floor (divf $gpus $share)) }}
{{- else if or (lt $gpus $tp) (ne (mod $gpus $tp) 0) }}
{{- fail (printf "%s.gpu.count (%d) must be a multiple of serve.tp (%d)" .role $gpus $tp) }}
{{- else }}
{{- div $gpus $tp }}
{{- end }}
{{- end }}

{{/* cuda when the pools have GPUs, cpu otherwise, unless serve.device says. */}}
{{- define "baton.device" -}}
{{- if .Values.serve.device }}
{{- .Values.serve.device }}
{{- else if and (gt (int .Values.prefill.gpu.count) 0) (gt (int .Values.decode.gpu.count) 0) }}
{{- "cuda" }}
{{- else }}
{{- "cpu" }}
{{- end }}
{{- end }}

{{- define "baton.modelDir" -}}
{{- if .Values.model.path }}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) (trimPrefix "/" .Values.model.path) }}
{{- else }}
{{- .Values.model.mountPath }}
{{- end }}
{{- end }}

{{/* The model volume, mounted read-only on every pod. */}}
{{- define "baton.modelVolume" -}}
- name: model
{{- if eq .Values.model.source "pvc" }}
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
{{- else if eq .Values.model.source "hostPath" }}
  hostPath:
    path: {{ .Values.model.hostPath.path }}
    type: {{ .Values.model.hostPath.type }}
{{- else }}
{{- fail (printf "model.source must be pvc or hostPath, not %q" .Values.model.source) }}
{{- end }}
{{- end }}

{{- define "baton.modelMount" -}}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}

{{/* Redis URL for --redis: "" when Redis is off; $(BATON_REDIS_URL) when in a Secret. */}}
{{- define "baton.redisUrl" -}}
{{- $sources := 0 }}
{{- if .Values.redis.enabled }}{{ $sources = add1 $sources }}{{ end }}
{{- if .Values.redis.externalUrl }}{{ $sources = add1 $sources }}{{ end }}
{{- if .Values.redis.existingSecret }}{{ $sources = add1 $sources }}{{ end }}
{{- if gt $sources 1 }}
{{- fail "set only one of redis.enabled, redis.externalUrl and redis.existingSecret" }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- printf "redis://%s-redis:6379/0" (include "baton.fullname" .) }}
{{- else if .Values.redis.externalUrl }}
{{- .Values.redis.externalUrl }}
{{- else if .Values.redis.existingSecret }}
{{- "$(BATON_REDIS_URL)" }}
{{- end }}
{{- end }}

{{/*
The `baton serve` command line of the head, one argument per line. Secrets reach it as
$(VAR) references the kubelet expands from the container's env, so no token is stored
in the RayCluster object.
*/}}
{{- define "baton.serveArgs" -}}
{{- $prefillPods := int .Values.prefill.replicas }}
{{- $decodePods := int .Values.decode.replicas }}
{{- $prefillPer := include "baton.workersPerPod" (dict "pool" .Values.prefill "serve" .Values.serve "role" "prefill") | int }}
{{- $decodePer := include "baton.workersPerPod" (dict "pool" .Values.decode "serve" .Values.serve "role" "decode") | int }}
- baton
- serve
- --address
- auto
- --model
- {{ include "baton.modelDir" . | quote }}
- --mode
- {{ .Values.serve.mode | quote }}
- --prefill
- {{ mul $prefillPods $prefillPer | quote }}
- --decode
- {{ mul $decodePods $decodePer | quote }}
- --policy
- {{ .Values.serve.policy | quote }}
- --decode-policy
- {{ .Values.serve.decodePolicy | quote }}
- --host
- "0.0.0.0"
- --port
- {{ .Values.serve.port | quote }}
- --grpc-port
- {{ .Values.serve.grpcPort | quote }}
- --tp
- {{ .Values.serve.tp | quote }}
- --device
- {{ include "baton.device" . | quote }}
- --dtype
- {{ .Values.serve.dtype | quote }}
{{- if .Values.serve.speculative }}
- --speculative
- {{ .Values.serve.speculative | quote }}
- --num-speculative-tokens
- {{ .Values.serve.numSpeculativeTokens | quote }}
{{- end }}
{{- if .Values.serve.speculativeModel }}
- --speculative-model
- {{ .Values.serve.speculativeModel | quote }}
{{- end }}
{{- if ne .Values.serve.kvCacheDtype "auto" }}
- --kv-cache-dtype
- {{ .Values.serve.kvCacheDtype | quote }}
{{- end }}
{{- if .Values.serve.quantization }}
- --quantization
- {{ .Values.serve.quantization | quote }}
{{- end }}
- --threads
- {{ .Values.serve.threads | quote }}
{{- if .Values.serve.kvCacheGb }}
- --kv-cache-gb
- {{ .Values.serve.kvCacheGb | quote }}
{{- end }}
{{- if .Values.serve.kvOffloadHostGb }}
- --kv-offload-host-gb
- {{ .Values.serve.kvOffloadHostGb | quote }}
{{- end }}
{{- if .Values.serve.kvOffloadDiskGb }}
- --kv-offload-disk-gb
- {{ .Values.serve.kvOffloadDiskGb | quote }}
- --kv-offload-dir
- /var/cache/baton-kv
{{- end }}
- --gpu-memory-utilization
- {{ .Values.serve.gpuMemoryUtilization | quote }}
- --gpus-per-worker
- {{ .Values.serve.gpusPerWorker | quote }}
- --max-num-seqs
- {{ .Values.serve.maxNumSeqs | quote }}
- --max-num-batched-tokens
- {{ .Values.serve.maxNumBatchedTokens | quote }}
{{- if not .Values.serve.cudaGraphs }}
- --no-cuda-graphs
{{- end }}
- --transport
- {{ .Values.serve.transport | quote }}
- --request-timeout
- {{ .Values.serve.requestTimeout | quote }}
{{- with .Values.serve.limits.rateLimit }}
- --rate-limit
- {{ . | quote }}
{{- end }}
{{- with .Values.serve.limits.rateBurst }}
- --rate-burst
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.serve.limits.maxConcurrentPerKey }}
- --max-concurrent-per-key
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.serve.limits.maxConcurrentRequests }}
- --max-concurrent-requests
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.serve.limits.maxQueuedRequests }}
- --max-queued-requests
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.serve.limits.queueTimeout }}
- --queue-timeout
- {{ . | quote }}
{{- end }}
{{- with .Values.serve.limits.maxBodyBytes }}
- --max-body-bytes
- {{ . | int64 | quote }}
{{- end }}
{{- with .Values.serve.autoscale }}
{{- if .enabled }}
- --autoscale
- --ttft-slo
- {{ .ttftSlo | quote }}
- --itl-slo
- {{ .itlSlo | quote }}
- --min-prefill
- {{ .minPrefill | int64 | quote }}
- --max-prefill
- {{ .maxPrefill | int64 | quote }}
- --min-decode
- {{ .minDecode | int64 | quote }}
- --max-decode
- {{ .maxDecode | int64 | quote }}
- --autoscale-interval
- {{ .interval | quote }}
- --scale-up-cooldown
- {{ .scaleUpCooldown | quote }}
- --scale-down-cooldown
- {{ .scaleDownCooldown | quote }}
- --scale-up-lead
- {{ .scaleUpLead | quote }}
- --scale-down-headroom
- {{ .scaleDownHeadroom | quote }}
{{- end }}
{{- end }}
- --admin-token
- "$(BATON_ADMIN_TOKEN)"
{{- if .Values.apiKey.existingSecret }}
- --api-key
- "$(BATON_API_KEY)"
{{- end }}
{{- with include "baton.redisUrl" . }}
- --redis
- {{ . | quote }}
{{- end }}
{{- range .Values.serve.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{/*
Environment every Ray container gets, as list items: commonEnv, then the KV transport
settings (kvTransport, a pool's own kvTransport on top, then kvTransport.env), then Ray's
token authentication. Call with
(dict "root" $ "pool" .Values.prefill), or (dict "root" $ "pool" (dict)) for the head.
*/}}
{{- define "baton.rayEnv" -}}
{{- $root := .root }}
{{- $transport := mergeOverwrite (deepCopy $root.Values.kvTransport) (deepCopy (default (dict) .pool.kvTransport)) }}
{{- if has "lo" (splitList "," $transport.netDevices) }}
{{- fail "kvTransport.netDevices must not name lo: KV between pods would never leave the node" }}
{{- end }}
{{- with $root.Values.commonEnv }}
{{ toYaml . }}
{{- end }}
{{- $names := dict "netDevices" "UCX_NET_DEVICES" "tls" "UCX_TLS" "ibGidIndex" "UCX_IB_GID_INDEX" "nixlLogLevel" "NIXL_LOG_LEVEL" }}
{{- range $key, $name := $names }}
{{- with index $transport $key }}
- name: {{ $name }}
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- with $transport.env }}
{{ toYaml . }}
{{- end }}
{{- include "baton.rayAuthEnv" $root }}
{{- end }}
