{{/* Names, labels and derived settings shared by every template of the PDPair chart. */}}

{{- define "pdpair.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdpair.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pdpair.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "pdpair.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "pdpair.operatorSelector" -}}
app.kubernetes.io/name: {{ include "pdpair.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "pdpair.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "pdpair.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The agents' ClusterRole; the operator binds each PDPair's agent ServiceAccount to it. */}}
{{- define "pdpair.agentClusterRole" -}}
{{- printf "%s-agent" (include "pdpair.fullname" .) -}}
{{- end -}}

{{/* The namespace whose PDPairs the operator reconciles (ignored with operator.allNamespaces). */}}
{{- define "pdpair.watchNamespace" -}}
{{- default .Release.Namespace .Values.operator.watchNamespace -}}
{{- end -}}

{{/* The CRDs shipped under files/crds/ (copies of the repository's crds/), parsed. */}}
{{- define "pdpair.crds" -}}
{{- $crds := list -}}
{{- range $path, $_ := .Files.Glob "files/crds/*.yaml" -}}
{{- $crds = append $crds ($.Files.Get $path | fromYaml) -}}
{{- end -}}
{{- dict "items" $crds | toJson -}}
{{- end -}}

{{- define "pdpair.image" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}
