{{/* Chart name, shortened to the DNS label limit. */}}
{{- define "shc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name when it already contains the chart name. */}}
{{- define "shc.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shc.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "shc.labels" -}}
helm.sh/chart: {{ include "shc.chart" . }}
{{ include "shc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sglang-hicache
{{- end }}

{{/* Labels selecting the operator pods. */}}
{{- define "shc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "shc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shc.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "shc.peeringName" -}}
{{- default (include "shc.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Operator image reference: by digest when one is given, else by tag (default appVersion). */}}
{{- define "shc.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Path of the operator configuration file inside the pod. */}}
{{- define "shc.configPath" -}}
/etc/sglang-hicache/operator.yaml
{{- end }}

{{/* Command-line arguments of the operator (python -m hicache_operator ...). */}}
{{- define "shc.operatorArgs" -}}
- run
- --liveness=http://0.0.0.0:{{ .Values.health.port }}/healthz
- --metrics-port={{ .Values.metrics.port }}
{{- if .Values.peering.enabled }}
- --peering={{ include "shc.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
{{- end }}

{{/* Cluster-scoped reads: kopf observes CRDs (and namespaces when restricted to some); the
operator reads the StorageClass of an SSD claim it is asked to grow (allowVolumeExpansion), a
CR's namespace for its Pod Security Admission label (get), and, only for a Pending pod whose
SSD claim is bound, that claim's PersistentVolume (get) and the nodes (list: is the volume's
node gone or unschedulable). */}}
{{- define "shc.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
- apiGroups: [storage.k8s.io]
  resources: [storageclasses]
  verbs: [get]
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get]
- apiGroups: [""]
  resources: [nodes]
  verbs: [list]
{{- if .Values.operatorConfig.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get, list, watch]
{{- else }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.operatorConfig.watchNamespaces) }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/* Namespaced rules: the CRs, the children the planner builds, what status reads, events. */}}
{{- define "shc.workloadRules" -}}
- apiGroups: [hicache.sglang.ai]
  resources: [sglanghicaches]
  verbs: [get, list, watch, patch]
- apiGroups: [hicache.sglang.ai]
  resources: [sglanghicaches/status]
  verbs: [get, patch]
{{- /* blockOwnerDeletion on the children's ownerReferences needs this where the
OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift). */}}
- apiGroups: [hicache.sglang.ai]
  resources: [sglanghicaches/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services, configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
{{- /* The router of a CR (spec.router): its Deployment, ServiceAccount, and a Role that
reads pods in the CR's namespace with its RoleBinding. Granting that Role needs no escalate or
bind verb: the operator holds the same pod permissions below. */}}
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, delete]
{{- /* Pods: status, and the pod IPs whose SGLang /metrics the operator reads over HTTP (no
pods/proxy); patched by in-place rollouts (updateStrategy InPlaceIfPossible: engine image,
labels, annotations; engine pods are never deleted), which also set their readiness gate's
condition (pods/status) and create and delete short-lived pull pods (the new engine image
pulled on a pod's node ahead of its restart: no privileges, no token). SSD claims: grown when
claimTemplate.size grows (patch), deleted with the CR on request. A Pending pod whose SSD claim
is bound to a lost node: claim and pod deleted (claimTemplate.rebindAfterSeconds). */}}
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and .Values.peering.enabled .Values.operatorConfig.watchNamespaces }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}
