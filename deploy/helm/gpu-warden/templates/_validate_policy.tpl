{{/*
The policies' cross-field and range rules that values.schema.json cannot express, each the
rule the program itself applies at start (guard: src/guard/policy.rs, Policy::validate;
extender: src/extender/config.rs, PolicyFile::policy). A render that passes these and the
schema gives a policy `gpu-warden check-config` accepts: deploy/tests/check_config_agreement.py
feeds both the same table (deploy/tests/config-agreement.yaml) in CI.
*/}}

{{/*
A duration ("10s", "1m 30s", "500ms", "5000µs") in milliseconds; _validate_spelling.tpl has
already refused every other spelling.
*/}}
{{- define "gpu-warden.durationMs" -}}
{{- $scale := dict "nsec" 0.000001 "ns" 0.000001 "usec" 0.001 "us" 0.001 "µs" 0.001 "μs" 0.001 "msec" 1.0 "ms" 1.0 "seconds" 1000.0 "second" 1000.0 "sec" 1000.0 "s" 1000.0 "minutes" 60000.0 "minute" 60000.0 "min" 60000.0 "m" 60000.0 "hours" 3600000.0 "hour" 3600000.0 "hr" 3600000.0 "h" 3600000.0 "days" 86400000.0 "day" 86400000.0 "d" 86400000.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9]+\\s*[a-zµμ]+" (toString . | trim) -1 -}}
{{- $n := regexFind "^[0-9]+" . -}}
{{- $u := trimPrefix $n . | trim -}}
{{- $total = addf $total (mulf (float64 $n) (get $scale $u | default 0.0)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{- define "gpu-warden.validatePolicy" -}}
{{- $p := .Values.guard.policy | default dict -}}
{{- $ms := dict -}}
{{- range $k, $d := dict "grace" "10s" "horizon" "5s" "fastInterval" "100ms" "fastIntervalMin" "5ms" "actBudget" "100ms" -}}
{{- $v := get $p $k | default $d -}}
{{- $_ := set $ms $k (float64 (include "gpu-warden.durationMs" $v)) -}}
{{- $_ := set $ms (printf "%sText" $k) (ternary (toString $v) (printf "%s, the default" $d) (hasKey $p $k)) -}}
{{- end -}}
{{- /* The trend keeps 256 readings: at 5 ms that covers the 1 s before a soft crossing. */ -}}
{{- if lt (get $ms "fastInterval") 5.0 -}}
{{- fail (printf "guard.policy.fastInterval (%s) must be at least 5ms" (get $ms "fastIntervalText")) -}}
{{- end -}}
{{- if lt (get $ms "fastIntervalMin") 5.0 -}}
{{- fail (printf "guard.policy.fastIntervalMin (%s) must be at least 5ms" (get $ms "fastIntervalMinText")) -}}
{{- end -}}
{{- if gt (get $ms "fastIntervalMin") (get $ms "fastInterval") -}}
{{- fail (printf "guard.policy.fastIntervalMin (%s) must not exceed guard.policy.fastInterval (%s)" (get $ms "fastIntervalMinText") (get $ms "fastIntervalText")) -}}
{{- end -}}
{{- if gt (get $ms "actBudget") (get $ms "horizon") -}}
{{- fail (printf "guard.policy.actBudget (%s) must not exceed guard.policy.horizon (%s)" (get $ms "actBudgetText") (get $ms "horizonText")) -}}
{{- end -}}
{{- if gt (get $ms "fastInterval") (get $ms "grace") -}}
{{- fail (printf "guard.policy.fastInterval (%s) must not exceed guard.policy.grace (%s): the fast watch must sample within the grace period" (get $ms "fastIntervalText") (get $ms "graceText")) -}}
{{- end -}}
{{- if hasKey $p "watchRate" -}}
{{- $r := include "gpu-warden.threshold" (get $p "watchRate") | splitList ":" -}}
{{- if and (eq (index $r 0) "mib") (lt (float64 (index $r 1)) 1.0) -}}
{{- fail (printf "guard.policy.watchRate (%v) must be a percentage in (0%%, 10000%%] or a size of at least 1Mi" (get $p "watchRate")) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpu-warden.validateExtenderPolicy" -}}
{{- if .Values.scheduler.enabled -}}
{{- $p := .Values.scheduler.extender.policy | default dict -}}
{{- range $k := list "staleAfter" "ledgerTtl" -}}
{{- if hasKey $p $k -}}
{{- $v := float64 (include "gpu-warden.durationMs" (get $p $k)) -}}
{{- if or (lt $v 1.0) (gt $v 3600000.0) -}}
{{- fail (printf "scheduler.extender.policy.%s (%v) must be from 1ms to 1h" $k (get $p $k)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $l := get $p "learned" | default dict -}}
{{- /* A query a millisecond would be a load test of the Prometheus it asks. */ -}}
{{- range $k, $floor := dict "refresh" (list 10000.0 "10s") "maxAge" (list 1.0 "1ms") -}}
{{- if hasKey $l $k -}}
{{- $v := float64 (include "gpu-warden.durationMs" (get $l $k)) -}}
{{- if or (lt $v (index $floor 0)) (gt $v 3600000.0) -}}
{{- fail (printf "scheduler.extender.policy.learned.%s (%v) must be from %s to 1h" $k (get $l $k) (index $floor 1)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (hasKey $l "window") (not (regexMatch "[1-9]" (toString $l.window))) -}}
{{- fail (printf "scheduler.extender.policy.learned.window (%v) must be above zero, like 7d" $l.window) -}}
{{- end -}}
{{- /* The learned-needs source's transport (issue 39), as LearnedFile::transport checks it. */ -}}
{{- if and (get $l "caFile") (not (hasPrefix "https://" (toString (get $l "prometheusUrl")))) -}}
{{- fail "scheduler.extender.policy.learned.caFile is only used with an https:// prometheusUrl" -}}
{{- end -}}
{{- if and (get $l "bearerTokenFile") (get $l "basicAuth") -}}
{{- fail "scheduler.extender.policy.learned.bearerTokenFile and learned.basicAuth exclude each other; set one" -}}
{{- end -}}
{{- end -}}
{{- end -}}
