{{/*
Names. The fullname is the release name (so `helm install
bigfleet-libvirt-dc1` gives deploy/bigfleet-libvirt-dc1, as the operator
docs show), or fullnameOverride.
*/}}
{{- define "bigfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bigfleet.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bigfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bigfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "bigfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bigfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: capacity-provider
{{- end -}}

{{- define "bigfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bigfleet.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "bigfleet.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* libvirt or proxmox, after inference and consistency checks. */}}
{{- define "bigfleet.hypervisor" -}}
{{- $hv := .Values.hypervisor -}}
{{- if not $hv -}}
{{- $hv = ternary "proxmox" "libvirt" (not (empty .Values.proxmox.apiUrl)) -}}
{{- end -}}
{{- $hv -}}
{{- end -}}

{{/* Which chart ConfigMap keys exist; "" when the ConfigMap is not needed. */}}
{{- define "bigfleet.configKeys" -}}
{{- $keys := list -}}
{{- if .Values.offerings.content }}{{ $keys = append $keys "offerings.json" }}{{ end -}}
{{- if .Values.instanceTypes.content }}{{ $keys = append $keys "instance-types.json" }}{{ end -}}
{{- if .Values.libvirt.baseUserData }}{{ $keys = append $keys "user-data" }}{{ end -}}
{{- if .Values.proxmox.ca.content }}{{ $keys = append $keys "proxmox-ca.pem" }}{{ end -}}
{{- join "," $keys -}}
{{- end -}}

{{/*
Validation the schema cannot express. Every problem is reported at once,
so a values file is fixed in one round.
*/}}
{{- define "bigfleet.validate" -}}
{{- $hv := include "bigfleet.hypervisor" . -}}
{{- $v := .Values -}}
{{- $errs := list -}}
{{- if eq $hv "libvirt" -}}
  {{- if or $v.proxmox.apiUrl $v.proxmox.tokenId $v.proxmox.tokenSecret.name $v.proxmox.nodes $v.proxmox.pool $v.proxmox.fingerprint $v.proxmox.ca.content $v.proxmox.ca.configMapName -}}
    {{- $errs = append $errs "proxmox.* is set but the hypervisor is libvirt: set hypervisor: proxmox (and drop connect/libvirt.*), or drop the proxmox values" -}}
  {{- end -}}
  {{- if not $v.simulator -}}
    {{- if not $v.connect -}}{{- $errs = append $errs "connect is required for libvirt: one URI, or zone=uri pairs such as rack1=qemu+libssh://bigfleet@host-a/system?keyfile=/etc/bigfleet/libvirt-ssh/id_ed25519&known_hosts=/etc/bigfleet/libvirt-ssh/known_hosts&known_hosts_verify=normal (or set simulator: true for a demo)" -}}{{- end -}}
    {{- if not $v.libvirt.image -}}{{- $errs = append $errs "libvirt.image is required for libvirt: the golden base-image volume, e.g. ubuntu-24.04.qcow2" -}}{{- end -}}
  {{- end -}}
  {{- if and (contains "/etc/bigfleet/libvirt-ssh/" $v.connect) (not $v.credentials.ssh.secretName) -}}
    {{- $errs = append $errs "connect refers to /etc/bigfleet/libvirt-ssh/ but credentials.ssh.secretName is empty: create the SSH key Secret and name it there" -}}
  {{- end -}}
  {{- if and (contains "/etc/bigfleet/libvirt-pki" $v.connect) (not $v.credentials.libvirtTls.secretName) -}}
    {{- $errs = append $errs "connect refers to /etc/bigfleet/libvirt-pki but credentials.libvirtTls.secretName is empty: create the client-certificate Secret and name it there" -}}
  {{- end -}}
{{- else -}}
  {{- if $v.connect -}}{{- $errs = append $errs "connect is a libvirt setting but the hypervisor is proxmox" -}}{{- end -}}
  {{- if or $v.libvirt.image $v.libvirt.baseUserData $v.libvirt.kernel $v.credentials.ssh.secretName $v.credentials.libvirtTls.secretName -}}
    {{- $errs = append $errs "libvirt.* or credentials.{ssh,libvirtTls} is set but the hypervisor is proxmox" -}}
  {{- end -}}
  {{- if not $v.simulator -}}
    {{- if not $v.proxmox.apiUrl -}}{{- $errs = append $errs "proxmox.apiUrl is required for proxmox, e.g. https://pve1.example.internal:8006/api2/json" -}}{{- end -}}
    {{- if not $v.proxmox.tokenId -}}{{- $errs = append $errs "proxmox.tokenId is required for proxmox, e.g. bigfleet@pve!autoscaler" -}}{{- end -}}
    {{- if not $v.proxmox.tokenSecret.name -}}{{- $errs = append $errs "proxmox.tokenSecret.name is required for proxmox: the Secret holding the API token secret" -}}{{- end -}}
    {{- if not $v.proxmox.nodes -}}{{- $errs = append $errs "proxmox.nodes is required for proxmox: the cluster's node names" -}}{{- end -}}
    {{- if not (or $v.proxmox.ca.content $v.proxmox.ca.configMapName $v.proxmox.fingerprint) -}}
      {{- $errs = append $errs "proxmox needs a way to verify the API certificate: set proxmox.ca.content, proxmox.ca.configMapName or proxmox.fingerprint" -}}
    {{- end -}}
  {{- end -}}
  {{- if and $v.proxmox.ca.content $v.proxmox.ca.configMapName -}}
    {{- $errs = append $errs "set one of proxmox.ca.content and proxmox.ca.configMapName" -}}
  {{- end -}}
{{- end -}}
{{- if and $v.tls.mtls (not $v.tls.enabled) -}}{{- $errs = append $errs "tls.mtls needs tls.enabled: mTLS requires the server certificate too" -}}{{- end -}}
{{- if and $v.tls.enabled (not $v.tls.secretName) -}}{{- $errs = append $errs "tls.enabled needs tls.secretName: a Secret with tls.crt, tls.key (and ca.crt for mtls)" -}}{{- end -}}
{{- if and $v.state.persistence.enabled (not $v.state.enabled) -}}{{- $errs = append $errs "state.persistence.enabled needs state.enabled" -}}{{- end -}}
{{- if $v.ha.enabled -}}
  {{- if or $v.state.enabled $v.state.persistence.enabled -}}
    {{- $errs = append $errs "ha.enabled keeps the state in etcd: set state.enabled and state.persistence.enabled to false (replicas cannot share a state volume)" -}}
  {{- end -}}
  {{- if not $v.ha.etcd.endpoints -}}
    {{- $errs = append $errs "ha.enabled needs ha.etcd.endpoints: the etcd members' client addresses, e.g. [etcd-0.etcd:2379, etcd-1.etcd:2379, etcd-2.etcd:2379]" -}}
  {{- end -}}
{{- else if or $v.ha.etcd.endpoints $v.ha.etcd.prefix $v.ha.etcd.tls.secretName -}}
  {{- $errs = append $errs "ha.etcd.* is set but ha.enabled is false: set ha.enabled: true, or drop the ha.etcd values" -}}
{{- end -}}
{{- if eq (int $v.service.grpcPort) (int $v.service.metricsPort) -}}{{- $errs = append $errs "service.grpcPort and service.metricsPort must differ" -}}{{- end -}}
{{- if $errs -}}
{{- fail (printf "\n%s" (join "\n" $errs)) -}}
{{- end -}}
{{- end -}}

{{/*
The provider's arguments as a YAML list, one flag per element in
--flag=value form (toYaml quotes whatever needs quoting).
*/}}
{{- define "bigfleet.args" -}}
{{- $hv := include "bigfleet.hypervisor" . -}}
{{- $v := .Values -}}
{{- $a := list (printf "--hypervisor=%s" $hv) (printf "--addr=:%d" ($v.service.grpcPort | int)) (printf "--metrics-addr=:%d" ($v.service.metricsPort | int)) -}}
{{- with $v.provider }}{{ $a = append $a (printf "--provider=%s" .) }}{{ end -}}
{{- with $v.installationId }}{{ $a = append $a (printf "--installation-id=%s" .) }}{{ end -}}
{{- with $v.defaultZone }}{{ $a = append $a (printf "--default-zone=%s" .) }}{{ end -}}
{{- if $v.simulator }}{{ $a = append $a "--use-fake-backend" }}{{ end -}}
{{- if eq $hv "libvirt" -}}
  {{- with $v.connect }}{{ $a = append $a (printf "--connect=%s" .) }}{{ end -}}
  {{- with $v.libvirt.image }}{{ $a = append $a (printf "--image=%s" .) }}{{ end -}}
  {{- $a = append $a (printf "--storage-pool=%s" $v.libvirt.storagePool) -}}
  {{- $a = append $a (printf "--network=%s" $v.libvirt.network) -}}
  {{- $a = append $a (printf "--domain-type=%s" $v.libvirt.domainType) -}}
  {{- $a = append $a (printf "--capacity-type=%s" $v.libvirt.capacityType) -}}
  {{- if $v.libvirt.baseUserData }}{{ $a = append $a "--base-user-data=/etc/bigfleet/cloud-init/user-data" }}{{ end -}}
  {{- with $v.libvirt.kernel }}{{ $a = append $a (printf "--kernel=%s" .) }}{{ end -}}
  {{- with $v.libvirt.initrd }}{{ $a = append $a (printf "--initrd=%s" .) }}{{ end -}}
  {{- with $v.libvirt.kernelCmdline }}{{ $a = append $a (printf "--kernel-cmdline=%s" .) }}{{ end -}}
{{- else -}}
  {{- with $v.proxmox.apiUrl }}{{ $a = append $a (printf "--proxmox-api-url=%s" .) }}{{ end -}}
  {{- with $v.proxmox.tokenId }}{{ $a = append $a (printf "--proxmox-token-id=%s" .) }}{{ end -}}
  {{- if $v.proxmox.tokenSecret.name }}{{ $a = append $a "--proxmox-token-file=/etc/bigfleet/proxmox-token/token" }}{{ end -}}
  {{- if or $v.proxmox.ca.content $v.proxmox.ca.configMapName }}{{ $a = append $a "--proxmox-ca-file=/etc/bigfleet/proxmox-ca/ca.pem" }}{{ end -}}
  {{- with $v.proxmox.fingerprint }}{{ $a = append $a (printf "--proxmox-tls-fingerprint=%s" .) }}{{ end -}}
  {{- with $v.proxmox.nodes }}{{ $a = append $a (printf "--nodes=%s" (join "," .)) }}{{ end -}}
  {{- with $v.proxmox.pool }}{{ $a = append $a (printf "--proxmox-pool=%s" .) }}{{ end -}}
  {{- $a = append $a (printf "--template-vmid=%d" ($v.proxmox.templateVmid | int)) -}}
  {{- $a = append $a (printf "--bootstrap-path=%s" $v.proxmox.bootstrapPath) -}}
  {{- $a = append $a (printf "--bootstrap-exec=%s" (join "," $v.proxmox.bootstrapExec)) -}}
{{- end -}}
{{- if $v.ha.enabled -}}
  {{- $a = append $a (printf "--state=etcd://%s%s" (join "," $v.ha.etcd.endpoints) (include "bigfleet.etcdPrefix" .)) -}}
  {{- if $v.ha.etcd.tls.secretName -}}
    {{- $a = append $a "--etcd-ca-file=/etc/bigfleet/etcd-tls/ca.crt" -}}
    {{- if $v.ha.etcd.tls.clientCert -}}
      {{- $a = append $a "--etcd-cert-file=/etc/bigfleet/etcd-tls/tls.crt" -}}
      {{- $a = append $a "--etcd-key-file=/etc/bigfleet/etcd-tls/tls.key" -}}
    {{- end -}}
  {{- end -}}
  {{- $a = append $a (printf "--leader-lease=%s" $v.ha.leaderLease) -}}
  {{- /* POD_IP is the container's env from the downward API; the kubelet expands $(POD_IP). */ -}}
  {{- $a = append $a (printf "--advertise-addr=$(POD_IP):%d" ($v.service.grpcPort | int)) -}}
{{- else if $v.state.enabled }}{{ $a = append $a "--state=/var/lib/bigfleet/state" }}{{ end -}}
{{- if $v.offerings.content -}}
  {{- $a = append $a "--offerings=/etc/bigfleet/offerings/offerings.json" -}}
{{- else if $v.seedCount -}}
  {{- $a = append $a (printf "--seed-count=%d" ($v.seedCount | int)) -}}
{{- end -}}
{{- if $v.instanceTypes.content }}{{ $a = append $a "--instance-types=/etc/bigfleet/instance-types/instance-types.json" }}{{ end -}}
{{- if $v.prices -}}
  {{- $pairs := list -}}
  {{- range $name := keys $v.prices | sortAlpha }}{{ $pairs = append $pairs (printf "%s=%v" $name (index $v.prices $name)) }}{{ end -}}
  {{- $a = append $a (printf "--prices=%s" (join "," $pairs)) -}}
{{- end -}}
{{- if ne (toString $v.pricePerVcpuHour) "" }}{{ $a = append $a (printf "--price-per-vcpu-hour=%v" $v.pricePerVcpuHour) }}{{ end -}}
{{- if ne (toString $v.pricePerGibHour) "" }}{{ $a = append $a (printf "--price-per-gib-hour=%v" $v.pricePerGibHour) }}{{ end -}}
{{- $a = append $a (printf "--reconcile-interval=%s" $v.reconcileInterval) -}}
{{- $a = append $a (printf "--reflection=%t" $v.reflection) -}}
{{- $a = append $a (printf "--log-format=%s" $v.log.format) -}}
{{- $a = append $a (printf "--log-level=%s" $v.log.level) -}}
{{- if $v.tls.enabled -}}
  {{- $a = append $a "--tls-cert=/etc/bigfleet/tls/tls.crt" -}}
  {{- $a = append $a "--tls-key=/etc/bigfleet/tls/tls.key" -}}
  {{- if $v.tls.mtls }}{{ $a = append $a "--tls-ca=/etc/bigfleet/tls/ca.crt" }}{{ end -}}
{{- end -}}
{{- range $v.extraArgs }}{{ $a = append $a . }}{{ end -}}
{{- toYaml $a -}}
{{- end -}}

{{/* The etcd key prefix of an HA release: ha.etcd.prefix, or
/bigfleet/<namespace>/<fullname>. */}}
{{- define "bigfleet.etcdPrefix" -}}
{{- default (printf "/bigfleet/%s/%s" .Release.Namespace (include "bigfleet.fullname" .)) .Values.ha.etcd.prefix -}}
{{- end -}}

{{/* The pod's affinity: the operator's, plus, in HA mode, anti-affinity
between the replicas unless the operator set podAntiAffinity. */}}
{{- define "bigfleet.affinity" -}}
{{- $aff := deepCopy (default dict .Values.affinity) -}}
{{- if and .Values.ha.enabled (not (hasKey $aff "podAntiAffinity")) -}}
  {{- $term := dict "labelSelector" (dict "matchLabels" (fromYaml (include "bigfleet.selectorLabels" .))) "topologyKey" .Values.ha.antiAffinity.topologyKey -}}
  {{- if eq .Values.ha.antiAffinity.mode "required" -}}
    {{- $_ := set $aff "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
  {{- else -}}
    {{- $_ := set $aff "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
  {{- end -}}
{{- end -}}
{{- if $aff }}{{ toYaml $aff }}{{ end -}}
{{- end -}}
