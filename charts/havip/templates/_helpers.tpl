{{/*
Names. The default names do not depend on the release name (havip-operator, havip-agent,
…: what every earlier version of the chart used). Renaming the agents' DaemonSet on an
upgrade reads to the running agents as an uninstall (their DaemonSet is gone), and they
remove their VIPs: set nameOverride/fullnameOverride at install time only.
*/}}

{{/* The app.kubernetes.io/name label: nameOverride, or "havip". */}}
{{- define "havip.name" -}}
{{- .Values.nameOverride | default "havip" -}}
{{- end }}

{{/* The prefix of every object's name: fullnameOverride, else the name. */}}
{{- define "havip.fullname" -}}
{{- .Values.fullnameOverride | default (include "havip.name" .) -}}
{{- end }}

{{/* The operator's Deployment, ServiceAccount, ClusterRole, Role, leader-election Lease. */}}
{{- define "havip.operator.name" -}}
{{- include "havip.fullname" . }}-operator
{{- end }}

{{/* The agents' DaemonSet, ServiceAccount, ClusterRole, Role. */}}
{{- define "havip.agent.name" -}}
{{- include "havip.fullname" . }}-agent
{{- end }}

{{/* The username of a ServiceAccount of the chart's (for the admission policies). */}}
{{- define "havip.operator.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "havip.operator.name" . }}
{{- end }}
{{- define "havip.agent.username" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "havip.agent.name" . }}
{{- end }}

{{/*
Refuses the namespaces Kubernetes itself uses: the agents' Role reads every Secret of the
release namespace (the pairs' heartbeat keys live there), which in kube-system or default
would be the cluster's own Secrets too. Included by rbac-agent.yaml.
*/}}
{{- define "havip.checkNamespace" -}}
{{- if has .Release.Namespace (list "kube-system" "kube-public" "kube-node-lease" "default") }}
{{- fail (printf "havip must not be installed into the namespace %s: its agents may read every Secret of its namespace (the heartbeat keys live there). Install it into a namespace of its own: helm install havip charts/havip -n havip-system --create-namespace" .Release.Namespace) }}
{{- end }}
{{- end }}

{{/*
Where the agents' Events go: the Events of cluster-scoped objects (HAPairs) may only be in
default or kube-system (the API server refuses an events.k8s.io Event of such an object
elsewhere), and the agents' recorder writes them into default.
*/}}
{{- define "havip.eventsNamespace" -}}
default
{{- end }}

{{/* Common labels. */}}
{{- define "havip.labels" -}}
app.kubernetes.io/name: {{ include "havip.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* The labels that select a component's pods: (dict "root" $ "component" "agent"). */}}
{{- define "havip.selectorLabels" -}}
app.kubernetes.io/name: {{ include "havip.name" .root }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/*
A component's pod labels: the chart's, then the podLabels value's. The schema refuses
podLabels that name a selector label; on any other key the chart's own value wins.
(dict "root" $ "component" "agent" "extra" .Values.agent.podLabels)
*/}}
{{- define "havip.podLabels" -}}
{{ include "havip.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- $own := include "havip.labels" .root | fromYaml }}
{{- range $k, $v := .extra }}
{{- if not (hasKey $own $k) }}
{{ $k }}: {{ $v | quote }}
{{- end }}
{{- end }}
{{- end }}

{{- define "havip.image" -}}
{{ .root.Values.image.repository }}/{{ .name }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/*
The agents' metrics bind address as the agent's --metrics-address takes it, and the host
the kubelet's probes must ask (empty: the pod IP, which on the host network is the node's
status.hostIP).
  hostIP:    $(HAVIP_HOST_IP):<port>. The downward API gives an IPv6 host IP unbracketed
             and the image has no shell: the agent reads IPv6:PORT with the last colon
             before the port. Probes: the pod IP (= status.hostIP).
  loopback:  127.0.0.1:<port>; probes ask host 127.0.0.1 (the kubelet runs on the node).
  an IP:     that address (IPv6 bracketed here); probes ask it, unless it is 0.0.0.0 or
             :: (every address of the node, the VIPs included), when the pod IP answers.
*/}}
{{- define "havip.agent.metricsAddress" -}}
{{- $bind := .Values.agent.metricsBindAddress | toString -}}
{{- $port := .Values.agent.metricsPort -}}
{{- if eq $bind "hostIP" -}}
$(HAVIP_HOST_IP):{{ $port }}
{{- else if eq $bind "loopback" -}}
127.0.0.1:{{ $port }}
{{- else if contains ":" $bind -}}
[{{ $bind }}]:{{ $port }}
{{- else -}}
{{ $bind }}:{{ $port }}
{{- end -}}
{{- end }}

{{- define "havip.agent.probeHost" -}}
{{- $bind := .Values.agent.metricsBindAddress | toString -}}
{{- if eq $bind "loopback" -}}
127.0.0.1
{{- else if not (has $bind (list "hostIP" "0.0.0.0" "::")) -}}
{{ $bind }}
{{- end -}}
{{- end }}

{{/* The Prometheus job names of the ServiceMonitors' targets (the metrics Services' names). */}}
{{- define "havip.agent.job" -}}
{{- include "havip.agent.name" . }}-metrics
{{- end }}
{{- define "havip.operator.job" -}}
{{- include "havip.operator.name" . }}-metrics
{{- end }}
