{{/* Chart name, or nameOverride. Also the app.kubernetes.io/name label and selector. */}}
{{- define "gpu-warden.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Object names: fullnameOverride, else the release name when it contains the chart name, else <release>-<name>. */}}
{{- define "gpu-warden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpu-warden.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-warden.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "gpu-warden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpu-warden.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selector labels: the name only, as deploy/base writes them (a DaemonSet's selector is immutable). */}}
{{- define "gpu-warden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-warden.name" . }}
{{- end -}}

{{- define "gpu-warden.labels" -}}
{{ include "gpu-warden.selectorLabels" . }}
app.kubernetes.io/part-of: gpu-warden
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* No default repository: nothing is published under a name the chart could know, and a
placeholder installed "successfully" left every agent in ImagePullBackOff (issue 39). */}}
{{- define "gpu-warden.image" -}}
{{- $repo := required "image.repository is required: the repository scripts/release.sh pushed the image to (e.g. --set image.repository=registry.example.com/platform/gpu-warden; docs/deploy.md, \"Releasing\")" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* guard.mode; YAML 1.1 reads an unquoted `off` as false, which means off. */}}
{{- define "gpu-warden.guardMode" -}}
{{- if eq (toString .Values.guard.mode) "false" -}}off{{- else -}}{{ .Values.guard.mode }}{{- end -}}
{{- end -}}

{{- define "gpu-warden.policyChecksum" -}}
{{- toYaml .Values.guard.policy | sha256sum | trunc 16 -}}
{{- end -}}

{{/*
A guard threshold ("5%", "2Gi", "2048Mi", "512MiB", or a bare number of MiB) as "pct:<n>" or
"mib:<n>", the way the agent reads it (src/guard/policy.rs, Threshold::parse); the schema has
already refused every other spelling.
*/}}
{{- define "gpu-warden.threshold" -}}
{{- $s := toString . | trim -}}
{{- if hasSuffix "%" $s -}}
pct:{{ trimSuffix "%" $s | trim | float64 }}
{{- else if regexMatch "^[0-9]+$" $s -}}
mib:{{ float64 $s }}
{{- else -}}
{{- $num := regexFind "^[0-9.]+" $s -}}
{{- $unit := trimPrefix $num $s | trim -}}
{{- if ne $unit "B" }}{{ $unit = trimSuffix "B" $unit }}{{ end -}}
{{- $scale := get (dict "B" 0.00000095367431640625 "Ki" 0.0009765625 "Mi" 1.0 "Gi" 1024.0 "Ti" 1048576.0) $unit -}}
mib:{{ mulf (float64 $num) $scale }}
{{- end -}}
{{- end -}}

{{/*
Cross-field checks JSON Schema cannot express, with the agent's own rule (Policy::validate):
soft must be above hard when both are percentages or both sizes (mixed units are ordered per
GPU by its total), and a percentage soft plus reclaimMargin must stay below 100%.
*/}}
{{- define "gpu-warden.validate" -}}
{{- $p := .Values.guard.policy | default dict -}}
{{- $hard := include "gpu-warden.threshold" (get $p "hard" | default "5%") | splitList ":" -}}
{{- $soft := include "gpu-warden.threshold" (get $p "soft" | default "10%") | splitList ":" -}}
{{- if and (eq (index $hard 0) (index $soft 0)) (le (float64 (index $soft 1)) (float64 (index $hard 1))) -}}
{{- fail (printf "guard.policy.soft (%v) must be above guard.policy.hard (%v): soft pressure is the early warning before hard" (get $p "soft" | default "10%") (get $p "hard" | default "5%")) -}}
{{- end -}}
{{- if hasKey $p "reclaimMargin" -}}
{{- $m := include "gpu-warden.threshold" (get $p "reclaimMargin") | splitList ":" -}}
{{- if and (eq (index $m 0) "pct") (eq (index $soft 0) "pct") (ge (addf (float64 (index $soft 1)) (float64 (index $m 1))) 100.0) -}}
{{- fail (printf "guard.policy.soft (%v) plus guard.policy.reclaimMargin (%v) must stay below 100%%" (get $p "soft" | default "10%") (get $p "reclaimMargin")) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.web.configSecret.name (or .Values.web.tls.secretName .Values.web.auth.bearerTokenSecret.name .Values.web.auth.basicAuthSecret.name) -}}
{{- fail "web.configSecret excludes web.tls and web.auth (the agent refuses --web.config.file beside the old flags): put TLS and users in the web config file" -}}
{{- end -}}
{{- if and .Values.web.auth.bearerTokenSecret.name .Values.web.auth.basicAuthSecret.name -}}
{{- fail "web.auth.bearerTokenSecret and web.auth.basicAuthSecret: set one of them, not both (the agent takes one kind of authentication)" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled .Values.web.auth.basicAuthSecret.name (not .Values.serviceMonitor.basicAuth) -}}
{{- fail "serviceMonitor.basicAuth: required when web.auth.basicAuthSecret is set and serviceMonitor.enabled (Prometheus needs the plain user and password; the agent's Secret only holds their hashes)" -}}
{{- end -}}
{{- $np := .Values.nodeAnnotations.prefix | default "gpu-warden.io" -}}
{{- if and (hasKey $p "annotationPrefix") (ne (get $p "annotationPrefix") $np) -}}
{{- fail (printf "guard.policy.annotationPrefix (%v) must equal nodeAnnotations.prefix (%v): one prefix names the Node keys the agent writes and the pod keys the guard and the extender read; set nodeAnnotations.prefix alone" (get $p "annotationPrefix") $np) -}}
{{- end -}}
{{- if and .Values.namespace.create (or (not .Values.namespaceOverride) (eq .Values.namespaceOverride .Release.Namespace)) -}}
{{- fail "namespace.create: true needs namespaceOverride naming another namespace than the release's (Helm stores the release in its namespace before creating objects; use --create-namespace instead)" -}}
{{- end -}}
{{- end -}}

{{/*
The scheduler profile's cross-field rules (scheduler.*), refused at render like the above.
*/}}
{{- define "gpu-warden.validateScheduler" -}}
{{- $s := .Values.scheduler -}}
{{- if $s.enabled -}}
{{- if eq $s.schedulerName "default-scheduler" -}}
{{- fail "scheduler.schedulerName: default-scheduler is the cluster's own scheduler; name this profile something else (pods opt in with spec.schedulerName)" -}}
{{- end -}}
{{- if and (gt (int $s.replicas) 1) (not $s.leaderElection) -}}
{{- fail (printf "scheduler.replicas is %d but scheduler.leaderElection is false: without leader election every replica would schedule, binding pods twice" (int $s.replicas)) -}}
{{- end -}}
{{- if eq (int $s.extender.port) (int $s.securePort) -}}
{{- fail (printf "scheduler.extender.port and scheduler.securePort are both %d: the extender and kube-scheduler share the pod's network namespace" (int $s.securePort)) -}}
{{- end -}}
{{- if not .Values.nodeAnnotations.enabled -}}
{{- fail "scheduler.enabled needs nodeAnnotations.enabled: the extender places pods by the free VRAM the agents annotate on their Nodes" -}}
{{- end -}}
{{- $prefix := get $s.extender.policy "annotationPrefix" | default "gpu-warden.io" -}}
{{- $agentPrefix := .Values.nodeAnnotations.prefix | default "gpu-warden.io" -}}
{{- if ne $prefix $agentPrefix -}}
{{- fail (printf "scheduler.extender.policy.annotationPrefix (%s) must be the agents' nodeAnnotations.prefix (%s): the extender reads the annotations they write" $prefix $agentPrefix) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The RuntimeClass the agent pods name. "auto" (the default): nvidia when the cluster has a
RuntimeClass of that name (the GPU Operator creates one), else none (EKS's AL2023 NVIDIA AMIs
make NVIDIA's runtime containerd's default and ship no RuntimeClass object: naming one that
does not exist leaves every agent pod unschedulable). `lookup` answers only against a live
cluster: under `helm template`, `--dry-run=client` or Argo CD it finds nothing, so auto renders
none there; set the name (or "") explicitly for those.
*/}}
{{- define "gpu-warden.runtimeClassName" -}}
{{- if eq (toString .Values.runtimeClassName) "auto" -}}
{{- if lookup "node.k8s.io/v1" "RuntimeClass" "" "nvidia" -}}nvidia{{- end -}}
{{- else -}}
{{- .Values.runtimeClassName -}}
{{- end -}}
{{- end -}}
