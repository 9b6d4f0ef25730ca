{{/*
The spellings values.schema.json leaves to the templates, so that a refusal says what is
expected ("a duration like \"10s\"") instead of quoting a regular expression of hundreds of
characters (issue 39). Each rule is the program's own (durations: src/model/units.rs,
parse_duration; thresholds: src/guard/policy.rs, Threshold::parse; selectors and label names:
src/guard/selector.rs); deploy/tests/config-agreement.yaml holds the cases both must agree on.
Go's regexp and the programs both take ASCII whitespace only.
*/}}

{{- define "gpu-warden.re.duration" -}}{{ `^\s*(0\s*|([0-9]+\s*(nsec|ns|usec|us|µs|μs|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d)\s*)+)$` }}{{- end -}}
{{- define "gpu-warden.re.thresholdAboveZero" -}}{{ `^\s*(0*([1-9][0-9]?(\.[0-9]*)?|\.[0-9]*[1-9][0-9]*)\s*%|(0*[1-9][0-9]*(\.[0-9]*)?|0*\.[0-9]*[1-9][0-9]*)\s*(B|KiB?|MiB?|GiB?|TiB?)|0*[1-9][0-9]*)\s*$` }}{{- end -}}
{{- define "gpu-warden.re.watchRate" -}}{{ `^\s*(0*([1-9][0-9]{0,3}(\.[0-9]*)?|10000(\.0*)?|\.[0-9]*[1-9][0-9]*)\s*%|(0*[1-9][0-9]*(\.[0-9]*)?|0*\.[0-9]*[1-9][0-9]*)\s*(B|KiB?|MiB?|GiB?|TiB?))\s*$` }}{{- end -}}
{{- define "gpu-warden.re.reclaimMargin" -}}{{ `^\s*(0*([0-9]{1,2}(\.[0-9]*)?|\.[0-9]+)\s*%|[0-9]+(\.[0-9]*)?\s*(B|KiB?|MiB?|GiB?|TiB?)|[0-9]+)\s*$` }}{{- end -}}
{{- define "gpu-warden.re.selector" -}}{{ `^\s*((!([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?|([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(!=|==|=)([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?|([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)(\s*,\s*(!([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?|([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(!=|==|=)([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?|([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?))*)?\s*$` }}{{- end -}}
{{- define "gpu-warden.re.labelKey" -}}{{ `^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$` }}{{- end -}}

{{/* (list "<values path>" value "<rule>" [aboveZero]): fails naming the path when a string value
is misspelt (or, with aboveZero, a duration is zero). */}}
{{- define "gpu-warden.checkSpelling" -}}
{{- $key := index . 0 -}}{{- $v := index . 1 -}}{{- $rule := index . 2 -}}
{{- $aboveZero := and (gt (len .) 3) (index . 3) -}}
{{- $what := get (dict
  "duration" "a duration like \"10s\" or \"500ms\" (whole numbers; units ns, us, ms, s, m, h, d)"
  "thresholdAboveZero" "a percentage in (0%, 100%) like \"5%\", a size above zero like \"2Gi\"/\"2048Mi\", or a number of MiB"
  "watchRate" "growth per second the fast watch is sized for: a percentage of the GPU's memory in (0%, 10000%] like \"200%\", a size of at least 1Mi like \"256Gi\" (checked at render), or a number of MiB"
  "reclaimMargin" "a percentage in [0%, 100%) like \"2%\", a size like \"2Gi\"/\"2048Mi\", or a number of MiB (0 allowed)"
  "selector" "an equality-based label selector like \"workload-type=gpu-ci,team!=infra\" (key=value, key!=value, key, !key; set-based terms such as `in` are not supported)"
  "labelKey" "a name like \"nvidia.com/gpu\" or \"project.runner.gitlab.com/id\" ([prefix/]name; prefix a DNS subdomain, name at most 63 letters, digits, '-', '_', '.')"
) $rule -}}
{{- if kindIs "string" $v -}}
{{- if and (eq $rule "selector") (eq (trim $v) "") -}}
{{- fail (printf "%s is empty: omit the key to select every pod" $key) -}}
{{- end -}}
{{- if not (regexMatch (include (printf "gpu-warden.re.%s" $rule) dict) $v) -}}
{{- fail (printf "%s: %q is not %s" $key $v $what) -}}
{{- end -}}
{{- if and (eq $rule "duration") $aboveZero (not (regexMatch "[1-9]" $v)) -}}
{{- fail (printf "%s: %q must be above zero, like \"10s\" or \"500ms\"" $key $v) -}}
{{- end -}}
{{- if and (eq $rule "labelKey") (contains "/" $v) (gt (len (index (splitList "/" $v) 0)) 253) -}}
{{- fail (printf "%s: %q is not %s" $key $v $what) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-warden.validateSpellings" -}}
{{- $p := .Values.guard.policy | default dict -}}
{{- range $k := list "grace" "horizon" "fastInterval" "fastIntervalMin" "actBudget" "cooldownTimeout" "inDoubtTimeout" -}}
{{- if hasKey $p $k }}{{ include "gpu-warden.checkSpelling" (list (printf "guard.policy.%s" $k) (get $p $k) "duration" true) }}{{ end -}}
{{- end -}}
{{- if and (hasKey $p "rateLimit") (kindIs "map" $p.rateLimit) (hasKey $p.rateLimit "per") -}}
{{- include "gpu-warden.checkSpelling" (list "guard.policy.rateLimit.per" $p.rateLimit.per "duration" true) -}}
{{- end -}}
{{- range $k := list "hard" "soft" -}}
{{- if hasKey $p $k }}{{ include "gpu-warden.checkSpelling" (list (printf "guard.policy.%s" $k) (get $p $k) "thresholdAboveZero") }}{{ end -}}
{{- end -}}
{{- range $k := list "watchRate" "reclaimMargin" "selector" -}}
{{- if hasKey $p $k }}{{ include "gpu-warden.checkSpelling" (list (printf "guard.policy.%s" $k) (get $p $k) $k) }}{{ end -}}
{{- end -}}
{{- range $k := list "heartbeat" "minInterval" "overPromiseInterval" -}}
{{- with get $.Values.nodeAnnotations $k }}{{ include "gpu-warden.checkSpelling" (list (printf "nodeAnnotations.%s" $k) . "duration" true) }}{{ end -}}
{{- end -}}
{{- with .Values.jobPeaks.underusedMinHeld }}{{ include "gpu-warden.checkSpelling" (list "jobPeaks.underusedMinHeld" . "duration") }}{{ end -}}
{{- range $k := list "renewInterval" "duration" -}}
{{- with get $.Values.lease $k }}{{ include "gpu-warden.checkSpelling" (list (printf "lease.%s" $k) . "duration" true) }}{{ end -}}
{{- end -}}
{{- if .Values.scheduler.enabled -}}
{{- $e := .Values.scheduler.extender.policy | default dict -}}
{{- range $k := list "staleAfter" "ledgerTtl" -}}
{{- if hasKey $e $k }}{{ include "gpu-warden.checkSpelling" (list (printf "scheduler.extender.policy.%s" $k) (get $e $k) "duration") }}{{ end -}}
{{- end -}}
{{- if hasKey $e "resource" }}{{ include "gpu-warden.checkSpelling" (list "scheduler.extender.policy.resource" $e.resource "labelKey") }}{{ end -}}
{{- $l := get $e "learned" | default dict -}}
{{- range $k := list "refresh" "maxAge" -}}
{{- if hasKey $l $k }}{{ include "gpu-warden.checkSpelling" (list (printf "scheduler.extender.policy.learned.%s" $k) (get $l $k) "duration") }}{{ end -}}
{{- end -}}
{{- if hasKey $l "projectLabel" }}{{ include "gpu-warden.checkSpelling" (list "scheduler.extender.policy.learned.projectLabel" $l.projectLabel "labelKey") }}{{ end -}}
{{- range $i, $d := get $e "defaults" | default list -}}
{{- if hasKey $d "selector" }}{{ include "gpu-warden.checkSpelling" (list (printf "scheduler.extender.policy.defaults[%d].selector" $i) $d.selector "selector") }}{{ end -}}
{{- end -}}
{{- end -}}
{{- end -}}
