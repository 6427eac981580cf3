{{/*
One worker group of the RayCluster: the pods of one pool. Each pod is one Ray node that
advertises `num-gpus` GPUs and `<role>: workersPerPod` of the pool's custom resource; a
Baton worker asks for `tp` GPUs (on CUDA; serve.gpusPerWorker of one when under 1) plus one
`<role>`, so the pool controller's actors land only on their own pool's nodes, at most
workersPerPod of them per pod.
Call with (dict "root" $ "role" "prefill" "pool" .Values.prefill).
*/}}
{{- define "baton.workerGroup" -}}
{{- $root := .root }}
{{- $pool := .pool }}
{{- $role := .role }}
{{- $gpus := int $pool.gpu.count }}
{{- $perPod := include "baton.workersPerPod" (dict "pool" $pool "serve" $root.Values.serve "role" $role) | int }}
{{- /* In unified mode every worker runs both phases and asks for `unified` instead. */}}
{{- $resource := ternary "unified" $role (eq $root.Values.serve.mode "unified") }}
{{- if gt (int $pool.minReplicas) (int $pool.replicas) }}
{{- fail (printf "%s.minReplicas must not exceed %s.replicas" $role $role) }}
{{- end }}
{{- if lt (int $pool.maxReplicas) (int $pool.replicas) }}
{{- fail (printf "%s.maxReplicas must be at least %s.replicas" $role $role) }}
{{- end }}
- groupName: {{ $role }}
  replicas: {{ $pool.replicas }}
  minReplicas: {{ $pool.minReplicas }}
  maxReplicas: {{ $pool.maxReplicas }}
  rayStartParams:
    {{- /* Ray reads the custom resources as a JSON string; KubeRay wants it quoted. */}}
    resources: {{ printf "\"{\\\"%s\\\": %d}\"" $resource $perPod | squote }}
    num-gpus: {{ $gpus | quote }}
    {{- range $key, $value := $pool.rayStartParams }}
    {{ $key }}: {{ $value | quote }}
    {{- end }}
  template:
    metadata:
      labels:
        {{- include "baton.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ $role }}
    spec:
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- $selector := deepCopy (default (dict) $pool.nodeSelector) }}
      {{- if $pool.gpu.product }}
      {{- $_ := set $selector "nvidia.com/gpu.product" $pool.gpu.product }}
      {{- end }}
      {{- with $selector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pool.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $pool.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      containers:
        - name: ray-worker
          image: {{ include "baton.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["/bin/bash", "-c"]
          args:
            - |
              ulimit -n 65536 || true
              # KubeRay puts this pod's `ray start` (blocking) in the variable; eval so
              # the quoting of --resources survives.
              eval "exec ${KUBERAY_GEN_RAY_START_CMD}"
          env:
            - name: BATON_POOL
              value: {{ $role }}
            {{- include "baton.rayEnv" (dict "root" $root "pool" $pool) | nindent 12 }}
            {{- with $pool.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- $requests := deepCopy (default (dict) $pool.resources.requests) }}
          {{- $limits := deepCopy (default (dict) $pool.resources.limits) }}
          {{- if gt $gpus 0 }}
          {{- $_ := set $requests $pool.gpu.resourceName $gpus }}
          {{- $_ := set $limits $pool.gpu.resourceName $gpus }}
          {{- end }}
          {{- with $pool.securityContext }}
          securityContext:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          resources:
            {{- with $requests }}
            requests:
              {{- toYaml . | nindent 14 }}
            {{- end }}
            {{- with $limits }}
            limits:
              {{- toYaml . | nindent 14 }}
            {{- end }}
          volumeMounts:
            {{- include "baton.modelMount" $root | nindent 12 }}
            - name: dshm
              mountPath: /dev/shm
            {{- if $root.Values.serve.kvOffloadDiskGb }}
            - name: kv-offload
              mountPath: /var/cache/baton-kv
            {{- end }}
          lifecycle:
            preStop:
              exec:
                command: ["/bin/bash", "-c", "ray stop"]
      volumes:
        {{- include "baton.modelVolume" $root | nindent 8 }}
        - name: dshm
          emptyDir:
            medium: Memory
            sizeLimit: {{ $pool.shmSize }}
        {{- if $root.Values.serve.kvOffloadDiskGb }}
        # The disk KV tier's file (per TP rank; unlinked once mapped).
        - name: kv-offload
          emptyDir:
            sizeLimit: {{ printf "%vGi" $root.Values.serve.kvOffloadDiskGb }}
        {{- end }}
{{- end }}
