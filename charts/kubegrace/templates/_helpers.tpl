{{/*
Base name of every object. Not derived from the release name: the operator is
told its object names by flag, and there is one kubegrace per cluster (the CRD
and the webhook configuration are cluster-wide), so stable names
(`kubegrace-webhook`, ...) are worth more than per-release ones.
*/}}
{{- define "kubegrace.fullname" -}}
{{- default "kubegrace" .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Names shared with the operator (passed to it as flags). */}}
{{- define "kubegrace.operatorName" -}}{{ include "kubegrace.fullname" . }}-operator{{- end -}}
{{- define "kubegrace.webhookServiceName" -}}{{ include "kubegrace.fullname" . }}-webhook{{- end -}}
{{- define "kubegrace.webhookConfigName" -}}{{ include "kubegrace.fullname" . }}-sidecar-injector{{- end -}}
{{- define "kubegrace.validatingWebhookConfigName" -}}{{ include "kubegrace.fullname" . }}-route-validator{{- end -}}
{{- define "kubegrace.leaseName" -}}{{ include "kubegrace.fullname" . }}-operator{{- end -}}

{{/*
Secret holding the webhook's serving certificate. The operator writes its own
(`<name>-webhook-cert`); cert-manager writes a different one (`<name>-webhook-tls`)
so that switching modes never leaves two writers fighting over one Secret.
*/}}
{{- define "kubegrace.certSecretName" -}}{{ include "kubegrace.fullname" . }}-webhook-cert{{- end -}}
{{- define "kubegrace.certManagerSecretName" -}}{{ include "kubegrace.fullname" . }}-webhook-tls{{- end -}}
{{- define "kubegrace.certificateName" -}}{{ include "kubegrace.fullname" . }}-webhook{{- end -}}
{{- define "kubegrace.issuerName" -}}{{ include "kubegrace.fullname" . }}-selfsigned{{- end -}}

{{- define "kubegrace.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kubegrace.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kubegrace.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that never change for the life of the release: Deployment selector, PDB, spread. */}}
{{- define "kubegrace.selectorLabels" -}}
app.kubernetes.io/name: kubegrace
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kubegrace.labels" -}}
helm.sh/chart: {{ include "kubegrace.chart" . }}
app.kubernetes.io/name: kubegrace
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kubegrace
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* <registry>/<repository>:<tag>[@<digest>], the component's tag falling back to image.tag, then to the chart's appVersion; with a digest the runtime pulls by digest and the tag is for readers. */}}
{{- define "kubegrace.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $tag := default (default $root.Chart.AppVersion $root.Values.image.tag) $img.tag -}}
{{- $digest := "" -}}
{{- with $img.digest }}{{ $digest = printf "@%s" . }}{{ end -}}
{{- if $root.Values.image.registry -}}
{{- printf "%s/%s:%s%s" $root.Values.image.registry $img.repository $tag $digest -}}
{{- else -}}
{{- printf "%s:%s%s" $img.repository $tag $digest -}}
{{- end -}}
{{- end -}}

{{/* Is the pod lifecycle `sleep` action available (on by default from 1.30)? */}}
{{- define "kubegrace.hasPreStopSleep" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version -}}true{{- end -}}
{{- end -}}

{{- /*
Namespace of the webhook-check probe pod (the hook Job's and the operator's
heal probe): the release namespace, served for the probe alone by the
`check.inject.kubegrace.io` entry; with watchNamespaces, the first watched
namespace instead (the operator answers reviews for those only), through the
ordinary `pod.inject.kubegrace.io` entry.
*/}}
{{- define "kubegrace.checkNamespace" -}}
{{- with .Values.watchNamespaces -}}{{ first (uniq .) }}{{- else -}}{{ .Release.Namespace }}{{- end -}}
{{- end -}}
{{- define "kubegrace.webhookCheckName" -}}{{ include "kubegrace.fullname" . }}-webhook-check{{- end -}}
