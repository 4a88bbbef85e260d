{{/*
The chart renders config/'s own files (linked under files/) and changes only what a value
names, so the kustomize install and the chart cannot drift apart.
*/}}

{{/* The labels of every object: config/'s common label and Helm's own. */}}
{{- define "gpuqueue.labels" -}}
app.kubernetes.io/part-of: gpuqueue
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The operator's username, the one identity the admission policies exempt. */}}
{{- define "gpuqueue.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpuqueue-operator
{{- end }}

{{/* Namespaces the webhook and the pod-creation policy leave alone. */}}
{{- define "gpuqueue.excludedNamespaces" -}}
{{- toYaml (append .Values.webhook.excludedNamespaces .Release.Namespace | uniq) }}
{{- end }}

{{/*
gpuqueue.objects (dict "root" $ "path" "files/...") -> a YAML list of the file's objects, with
the operator's namespace and username of config/ replaced by the release's.
*/}}
{{- define "gpuqueue.objects" -}}
{{- $text := .root.Files.Get .path -}}
{{- if not $text }}{{ fail (printf "%s is missing or empty: the chart renders config/'s files through the links under files/; package the chart with `helm package`, which copies them" .path) }}{{ end -}}
{{- $text = $text | replace "system:serviceaccount:gpuqueue-system:gpuqueue-operator" (include "gpuqueue.operatorUser" .root) -}}
{{- $objects := list -}}
{{- range regexSplit "(?m)^---[ \t]*$" $text -1 -}}
{{- $object := fromYaml . -}}
{{- if hasKey $object "Error" }}{{ fail (printf "%s: %s" $.path $object.Error) }}{{ end -}}
{{- if $object.kind }}{{ $objects = append $objects $object }}{{ end -}}
{{- end -}}
{{- toYaml $objects -}}
{{- end }}

{{/*
gpuqueue.render (dict "root" $ "object" $object): one object, in the release's namespace if it
is namespaced, with the common labels.
*/}}
{{- define "gpuqueue.render" -}}
{{- $metadata := .object.metadata -}}
{{- $_ := set $metadata "labels" (merge (dict) ($metadata.labels | default dict) (include "gpuqueue.labels" .root | fromYaml)) -}}
{{- if hasKey $metadata "namespace" }}{{ $_ := set $metadata "namespace" .root.Release.Namespace }}{{ end -}}
{{- range .object.subjects | default list }}{{ if eq .kind "ServiceAccount" }}{{ $_ := set . "namespace" $.root.Release.Namespace }}{{ end }}{{ end }}
---
{{ toYaml .object }}
{{- end }}

{{/* gpuqueue.renderFile (dict "root" $ "path" "files/..."): every object of a file, unchanged. */}}
{{- define "gpuqueue.renderFile" -}}
{{- range include "gpuqueue.objects" . | fromYamlArray }}
{{ include "gpuqueue.render" (dict "root" $.root "object" .) }}
{{- end }}
{{- end }}
