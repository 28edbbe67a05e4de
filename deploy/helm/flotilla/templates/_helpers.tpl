{{/* Names and labels. */}}
{{- define "flotilla.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (list $ "gateway") or (list $ "worker" group). */}}
{{- define "flotilla.selector" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- if gt (len .) 2 }}
flotilla/group: {{ index . 2 }}
{{- end }}
{{- end -}}

{{- define "flotilla.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
A model's subject token and consumer name, as embedder/queue/jetstream/config.py's
subject_token writes them: letters, digits and '-' as they are, any other character as
_XX per UTF-8 byte. The worker's durable consumer of a model is workers-<token>.
*/}}
{{- define "flotilla.subjectToken" -}}
{{- range $c := splitList "" . -}}
{{- if regexMatch "^[A-Za-z0-9-]$" $c -}}
{{- $c -}}
{{- else -}}
{{- regexReplaceAll "(..)" (printf "%X" $c) "_${1}" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.consumer" -}}
workers-{{ include "flotilla.subjectToken" . }}
{{- end -}}

{{/* A model's consumers, one per deadline lane (the most urgent first; the last is the
model's own, as without lanes), comma-separated: as embedder.queue.jetstream.config names them. */}}
{{- define "flotilla.laneConsumers" -}}
{{- $own := include "flotilla.consumer" .model -}}
{{- $out := list -}}
{{- range $i := until (len .lanes) -}}{{- $out = append $out (printf "%s_d%d" $own $i) -}}{{- end -}}
{{- join "," (append $out $own) -}}
{{- end -}}

{{/* A model's subjects, in the order of its consumers. */}}
{{- define "flotilla.laneSubjects" -}}
{{- $own := printf "%s.%s" .prefix (include "flotilla.subjectToken" .model) -}}
{{- $out := list -}}
{{- range $i := until (len .lanes) -}}{{- $out = append $out (printf "%s.d%d" $own $i) -}}{{- end -}}
{{- join "," (append $out $own) -}}
{{- end -}}

{{/* The fleet file's text: fleet.content (text or a map), else the bundled fleet. */}}
{{- define "flotilla.fleetText" -}}
{{- if kindIs "map" .Values.fleet.content -}}
{{- toYaml .Values.fleet.content -}}
{{- else -}}
{{- .Values.fleet.content | default (.Files.Get "files/fleet.yaml") -}}
{{- end -}}
{{- end -}}

{{/*
The fleet's models as a map (JSON), relative adapter folders made absolute against
fleet.relativeTo: flotilla reads them beside the fleet file, and a ConfigMap has nothing
beside it.
*/}}
{{- define "flotilla.fleetModels" -}}
{{- $fleet := include "flotilla.fleetText" . | fromYaml -}}
{{- if hasKey $fleet "Error" -}}
{{- fail (printf "fleet.content is not YAML: %s" $fleet.Error) -}}
{{- end -}}
{{- if not (kindIs "map" $fleet.models) -}}
{{- fail "fleet.content: a fleet is a mapping with 'models', a map of model name -> entry" -}}
{{- end -}}
{{- $base := trimSuffix "/" .Values.fleet.relativeTo -}}
{{- range $name, $entry := $fleet.models -}}
{{- if and (kindIs "map" $entry) (kindIs "map" $entry.adapters) -}}
{{- range $adapter, $dir := $entry.adapters -}}
{{- if and (kindIs "string" $dir) (not (hasPrefix "/" $dir)) (not (hasPrefix "~" $dir)) -}}
{{- $_ := set $entry.adapters $adapter (printf "%s/%s" $base $dir) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toJson $fleet.models -}}
{{- end -}}

{{/*
The fleet's model names in the file's order (JSON list): the first is the default model
of a request that names none, and a map forgets its order. Model keys are the lines under
`models:` indented as its first key; a model not found so (flow style) comes last.
*/}}
{{- define "flotilla.fleetOrder" -}}
{{- $models := include "flotilla.fleetModels" . | fromJson -}}
{{- $order := list -}}
{{- $indent := "" -}}
{{- $inside := false -}}
{{- range $line := splitList "\n" (include "flotilla.fleetText" .) -}}
{{- if regexMatch "^models\\s*:" $line -}}
{{- $inside = true -}}
{{- else if and $inside (regexMatch "^[^\\s#]" $line) -}}
{{- $inside = false -}}
{{- else if and $inside (regexMatch "^\\s+[^\\s#]" $line) -}}
{{- $lead := regexFind "^\\s+" $line -}}
{{- $key := regexReplaceAll "^\\s+([^:#]+?)\\s*:.*$" $line "${1}" | trimAll "\"'" -}}
{{- if and (eq $indent "") (hasKey $models $key) -}}
{{- $indent = $lead -}}
{{- end -}}
{{- if and (eq $lead $indent) (hasKey $models $key) (not (has $key $order)) -}}
{{- $order = append $order $key -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $name := keys $models | sortAlpha -}}
{{- if not (has $name $order) -}}
{{- $order = append $order $name -}}
{{- end -}}
{{- end -}}
{{- toJson $order -}}
{{- end -}}

{{/* A fleet file of the named models, in that order: (list $ names). */}}
{{- define "flotilla.fleetOf" -}}
{{- $root := index . 0 -}}
{{- $models := include "flotilla.fleetModels" $root | fromJson -}}
models:
{{- range $name := index . 1 }}
{{- if not (hasKey $models $name) }}
{{- fail (printf "workers.groups: model %q is not in the fleet (%s)" $name (keys $models | sortAlpha | join ", ")) }}
{{- end }}
{{ toYaml (dict $name (index $models $name)) | indent 2 }}
{{- end }}
{{- end -}}

{{/* A group's settings: the workers' own, overridden by the group's (JSON). */}}
{{- define "flotilla.group" -}}
{{- $root := index . 0 -}}
{{- $group := index . 1 -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$" ($group.name | default "")) -}}
{{- fail (printf "workers.groups: name %q is not a DNS label of at most 20 characters" ($group.name | default "")) -}}
{{- end -}}
{{- $merged := mergeOverwrite (deepCopy (omit $root.Values.workers "groups" "enabled")) (deepCopy $group) -}}
{{- if not $merged.models -}}
{{- $_ := set $merged "models" (include "flotilla.fleetOrder" $root | fromJsonArray) -}}
{{- end -}}
{{- toJson $merged -}}
{{- end -}}

{{/*
Container env from maps of variable -> value and variable -> Secret key: (list $ chart
user secrets). `chart` holds what this chart derives from its values (connections, names
the ScaledObjects repeat); a user map setting one of those fails, naming the value to set.
*/}}
{{- define "flotilla.env" -}}
{{- $root := index . 0 -}}
{{- $chart := index . 1 -}}
{{- $user := mergeOverwrite (deepCopy ($root.Values.env | default dict)) (deepCopy (index . 2 | default dict)) -}}
{{- $secret := mergeOverwrite (deepCopy ($root.Values.secretEnv | default dict)) (deepCopy (index . 3 | default dict)) -}}
{{- range $name := concat (keys $user) (keys $secret) -}}
{{- if hasKey $chart $name -}}
{{- fail (printf "env %s is set by this chart from its values (nats, kafka, qdrant, adapters, ingest): set it there" $name) -}}
{{- end -}}
{{- end -}}
{{- $plain := mergeOverwrite (deepCopy $chart) $user -}}
{{- range $name := keys $plain | sortAlpha }}
- name: {{ $name }}
  value: {{ index $plain $name | toString | quote }}
{{- end }}
{{- range $name := keys $secret | sortAlpha }}
{{- $ref := index $secret $name }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- end -}}

{{/* The JetStream variables gateways and workers share: the KEDA triggers name the same. */}}
{{- define "flotilla.queueEnv" -}}
{{- $env := dict "FLOTILLA_NATS" .Values.nats.url "FLOTILLA_NATS_STREAM" .Values.nats.stream "FLOTILLA_NATS_SUBJECT_PREFIX" .Values.nats.subjectPrefix -}}
{{- if .Values.adapters.enabled -}}
{{- $_ := set $env "FLOTILLA_ADAPTERS_DIR" "/adapters" -}}
{{- end -}}
{{- with .Values.nats.deadlineLanesMs -}}
{{- $_ := set $env "FLOTILLA_NATS_DEADLINE_LANES_MS" (join "," .) -}}
{{- end -}}
{{- toJson $env -}}
{{- end -}}

{{- define "flotilla.storeEnv" -}}
{{- if .Values.qdrant.url -}}
{{- toJson (dict "FLOTILLA_STORE" "qdrant" "FLOTILLA_QDRANT_URL" .Values.qdrant.url) -}}
{{- else -}}
{{- toJson dict -}}
{{- end -}}
{{- end -}}

{{- define "flotilla.adaptersClaim" -}}
{{- .Values.adapters.existingClaim | default (printf "%s-adapters" (include "flotilla.fullname" .)) -}}
{{- end -}}

{{/* GPU and other resources: (list resources gpu). */}}
{{- define "flotilla.resources" -}}
{{- $resources := deepCopy (index . 0 | default dict) -}}
{{- $gpu := index . 1 -}}
{{- if and $gpu (gt (int $gpu.count) 0) -}}
{{- $limits := $resources.limits | default dict -}}
{{- $_ := set $limits $gpu.resource (int $gpu.count) -}}
{{- $_ := set $resources "limits" $limits -}}
{{- end -}}
{{- toYaml $resources -}}
{{- end -}}
