package config

import (
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fakeArgs selects the fake backend so only the flags under test fail.
var fakeArgs = []string{"--use-fake-backend"}

func TestErrors(t *testing.T) {
	f := newFiles(t)
	realPX := []string{"--proxmox-api-url", "https://pve:8006/api2/json", "--proxmox-token-id", "a@pve!b", "--proxmox-token-file", f.token, "--proxmox-ca-file", f.pveCA, "--nodes", "pve1"}
	realLV := []string{"--connect", "qemu:///system", "--image", "base.qcow2"}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	tests := []struct {
		name string
		args []string
		want []string
	}{
		// Hypervisor choice.
		{"unknown hypervisor", with(fakeArgs, "--hypervisor", "xen"), []string{
			`--hypervisor: unknown hypervisor "xen"; use libvirt or proxmox (or omit it to infer from the flags)`,
		}},
		{"explicit libvirt with proxmox flags", with(fakeArgs, "--hypervisor", "libvirt", "--nodes", "a", "--template-vmid", "9001"), []string{
			"--hypervisor: is libvirt, but Proxmox-only flags are set (--nodes, --template-vmid); drop them or use --hypervisor=proxmox",
		}},
		{"explicit proxmox with libvirt flags", with(fakeArgs, "--hypervisor", "proxmox", "--image", "x"), []string{
			"--hypervisor: is proxmox, but libvirt-only flags are set (--image); drop them or use --hypervisor=libvirt",
		}},
		{"both sides inferred", with(fakeArgs, "--connect", "qemu:///system", "--image", "x", "--nodes", "pve1"), []string{
			"--hypervisor: cannot infer the hypervisor: libvirt-only flags (--connect, --image) and Proxmox-only flags (--nodes) are both set; run one process per hypervisor and drop one side's flags, or pass --hypervisor",
		}},

		// Backend.
		{"libvirt auto without connect", nil, []string{
			"--libvirt-backend: is auto but no --connect is set, so there is no real libvirt host to manage: pass --connect to use real hosts, or pass --use-fake-backend to run on the built-in simulator",
		}},
		{"proxmox auto without api url", []string{"--hypervisor", "proxmox"}, []string{
			"--proxmox-backend: is auto but no --proxmox-api-url is set, so there is no real Proxmox cluster to manage: pass --proxmox-api-url to use real Proxmox, or pass --use-fake-backend to run on the built-in simulator",
		}},
		{"docs smoke test without the fake flag", []string{"--seed-count", "32", "--addr", ":9000", "--metrics-addr", ":9090"}, []string{
			"--libvirt-backend: is auto but no --connect is set, so there is no real libvirt host to manage: pass --connect to use real hosts, or pass --use-fake-backend to run on the built-in simulator",
		}},
		{"storage pools per zone", with(realLV[:0], "--connect", "a=qemu:///system,b=qemu:///system", "--image", "x", "--storage-pool", "a=p1,a=p2,c=p3,bad"), []string{
			`--storage-pool: zone "a" is named twice`,
			`--storage-pool: zone "c" is not a --connect zone`,
			`--storage-pool: entry "bad" is not zone=pool`,
		}},
		{"unknown libvirt backend", with(fakeArgs, "--libvirt-backend", "qemu"), []string{
			`--libvirt-backend: unknown backend "qemu"; use libvirt, fake or auto`,
		}},
		{"unknown proxmox backend", with(fakeArgs, "--proxmox-backend", "pve"), []string{
			`--proxmox-backend: unknown backend "pve"; use proxmox, fake or auto`,
		}},
		{"real backend and fake flag", with(realLV, "--libvirt-backend", "libvirt", "--use-fake-backend"), []string{
			"--use-fake-backend: contradicts --libvirt-backend=libvirt; drop one of them",
		}},
		{"fake-only flags on a real backend", with(realLV, "--fake-latency", "1s", "--fake-faults", "--fake-admin"), []string{
			"--fake-latency: only applies to the fake backend, but the libvirt backend is selected; drop it or pass --use-fake-backend",
			"--fake-faults: only applies to the fake backend, but the libvirt backend is selected; drop it or pass --use-fake-backend",
			"--fake-admin: only applies to the fake backend, but the libvirt backend is selected; drop it or pass --use-fake-backend",
		}},

		// Metrics listener and drift repair.
		{"metrics tls without a certificate", with(fakeArgs, "--metrics-tls"), []string{
			"--metrics-tls: reuses the gRPC certificate: also pass --tls-cert and --tls-key",
		}},
		{"metrics tls and admin with the listener disabled", with(fakeArgs, "--metrics-addr", "", "--metrics-tls", "--fake-admin"), []string{
			"--metrics-tls: is set but the metrics listener is disabled (--metrics-addr is empty)",
			"--fake-admin: serves on the metrics listener, which is disabled (--metrics-addr is empty)",
		}},
		{"drift repair delay out of range", with(fakeArgs, "--drift-repair-delay", "-1s"), []string{
			"--drift-repair-delay: must be between 0s and 1h0m0s, got -1s (0 repairs at once)",
		}},
		{"history bounds", with(fakeArgs, "--history-events", "0", "--history-total-events", "10", "--history-retention", "0s"), []string{
			"--history-events: must be between 1 and 1000, got 0 (events kept per machine; every commit of a machine rewrites its ring)",
			"--history-total-events: must be between 1000 and 10000000, got 10 (events kept for all machines together, about 200 bytes each in memory and in the state)",
			"--history-retention: must be between 1m0s and 720h0m0s, got 0s (how long a removed machine's history is kept)",
		}},
		{"capacity check", with(fakeArgs, "--capacity-check", "maybe", "--capacity-overcommit", "0", "--fake-host-cpus", "-1"), []string{
			"--capacity-check: unknown mode \"maybe\"; use off, warn or refuse",
			"--capacity-overcommit: must be above 0, got 0",
			"--fake-host-cpus: the simulated host's CPUs (-1) and memory GiB (0) must not be negative",
		}},
		{"drift repair delay too long", with(fakeArgs, "--drift-repair-delay", "2h"), []string{
			"--drift-repair-delay: must be between 0s and 1h0m0s, got 2h0m0s (0 repairs at once)",
		}},

		// Common flags.
		{"provider blank", with(fakeArgs, "--provider", " "), []string{
			`--provider: " " must be a non-empty label without whitespace, e.g. libvirt-dc1`,
		}},
		{"provider with space", with(fakeArgs, "--provider", "dc 1"), []string{
			`--provider: "dc 1" must be a non-empty label without whitespace, e.g. libvirt-dc1`,
		}},
		{"default zone with slash", with(fakeArgs, "--default-zone", "a/b"), []string{
			`--default-zone: "a/b" is not a usable zone name: it must be non-empty, at most 61 bytes, without '/', ':' or whitespace`,
		}},
		{"default zone empty", with(fakeArgs, "--default-zone", ""), []string{
			`--default-zone: "" is not a usable zone name: it must be non-empty, at most 61 bytes, without '/', ':' or whitespace`,
		}},
		{"installation id", with(fakeArgs, "--installation-id", "Prod_1"), []string{
			`--installation-id: "Prod_1" must be 1-32 lowercase letters, digits or '-', starting and ending with a letter or digit (or omit it to derive one)`,
		}},
		{"addr not host:port", with(fakeArgs, "--addr", "9000"), []string{
			`--addr: "9000" is not host:port (e.g. :9000 or 127.0.0.1:9000)`,
		}},
		{"addr bad port", with(fakeArgs, "--addr", ":http"), []string{
			`--addr: ":http" has port "http"; use a number from 0 to 65535`,
		}},
		{"metrics addr", with(fakeArgs, "--metrics-addr", "localhost"), []string{
			`--metrics-addr: "localhost" is not host:port (e.g. :9000 or 127.0.0.1:9000) (or pass an empty value to disable metrics)`,
		}},
		{"metrics addr equals addr", with(fakeArgs, "--addr", ":9000", "--metrics-addr", ":9000"), []string{
			`--metrics-addr: ":9000" is also the gRPC --addr; give each listener its own port`,
		}},
		{"log format and level", with(fakeArgs, "--log-format", "xml", "--log-level", "trace"), []string{
			`--log-format: unknown format "xml"; use text or json`,
			`--log-level: unknown level "trace"; use debug, info, warn or error`,
		}},
		{"durations", with(fakeArgs, "--reconcile-interval", "-1s", "--shutdown-grace", "-1s", "--fake-latency", "-1ms", "--create-timeout", "0s", "--configure-timeout", "-1m", "--drain-timeout", "0s", "--delete-timeout", "0s"), []string{
			"--create-timeout: must be between 1s and 24h0m0s, got 0s",
			"--configure-timeout: must be between 1s and 24h0m0s, got -1m0s",
			"--drain-timeout: must be between 1s and 24h0m0s, got 0s",
			"--delete-timeout: must be between 1s and 24h0m0s, got 0s",
			"--reconcile-interval: must be 0 (off) or between 500ms and 24h0m0s, got -1s (a full pass lists every host; 0 turns background passes off)",
			"--shutdown-grace: must be between 0s and 1h0m0s, got -1s",
			"--fake-latency: must be between 0s and 1m0s, got -1ms (0 is instant)",
		}},
		{"intervals below their floor", with(fakeArgs, "--reconcile-interval", "1ns", "--repair-timeout", "0s", "--repair-attempts", "0"), []string{
			"--reconcile-interval: must be 0 (off) or between 500ms and 24h0m0s, got 1ns (a full pass lists every host; 0 turns background passes off)",
			"--repair-timeout: must be between 1s and 1h0m0s, got 0s (a drift repair gives up after this long and is retried with backoff)",
			"--repair-attempts: must be between 1 and 100, got 0 (attempts per step of a drift repair before it is retried with backoff)",
		}},
		{"max concurrent", with(fakeArgs, "--max-concurrent-per-zone", "0"), []string{
			"--max-concurrent-per-zone: must be between 1 and 1024, got 0",
		}},
		{"node ready exec", with(fakeArgs, "--node-ready-exec", "/bin/check,,x"), []string{
			`--node-ready-exec: "/bin/check,,x" has an empty element at position 1; write the argv as program,arg1,arg2 (arguments cannot contain commas)`,
		}},
		{"state is a directory", with(fakeArgs, "--state", "$DIR"), []string{
			`--state: "$DIR" is a directory; name the state file inside it, e.g. "$DIR/state"`,
		}},
		{"state ends in a slash", with(fakeArgs, "--state", "$DIR/new/"), []string{
			`--state: "$DIR/new/" ends in '/'; name the state file, not its directory, e.g. "$DIR/new/state"`,
		}},
		{"state is a malformed etcd URL", with(fakeArgs, "--state", "etcd://127.0.0.1:2379"), []string{
			`--state: etcd state URL "etcd://127.0.0.1:2379": no key prefix (want etcd://HOST:PORT/PREFIX)`,
		}},
		{"etcd flags without an etcd state", with(fakeArgs, "--leader-lease", "3s", "--etcd-ca-file", f.clientCA), []string{
			"--etcd-ca-file: only applies to an etcd state (--state etcd://HOST:PORT[,HOST:PORT...]/PREFIX)",
			"--leader-lease: only applies to an etcd state (--state etcd://HOST:PORT[,HOST:PORT...]/PREFIX)",
		}},
		{"etcd lease and client files", with(fakeArgs, "--state", "etcd://127.0.0.1:2379/bf", "--leader-lease", "2500ms", "--etcd-cert-file", f.serverCert), []string{
			"--etcd-cert-file: etcd client certificate given without --etcd-key-file",
			"--leader-lease: must be whole seconds between 2s and 1m0s, got 2.5s (etcd leases count whole seconds)",
		}},
		{"state is an etcd URL without slashes", with(fakeArgs, "--state", "etcd:/x"), []string{
			`--state: "etcd:/x" looks like an etcd URL but does not start with etcd://; write etcd://HOST:PORT/PREFIX, or ./etcd:/x for a file of that name`,
		}},
		{"state is an etcd URL without a path", with(fakeArgs, "--state", "ETCD:state"), []string{
			`--state: "ETCD:state" looks like an etcd URL but does not start with etcd://; write etcd://HOST:PORT/PREFIX, or ./ETCD:state for a file of that name`,
		}},
		{"state is a file URL", with(fakeArgs, "--state", "file:/var/lib/state"), []string{
			`--state: "file:/var/lib/state" looks like a file: URL, which is not a state store this build supports; pass a file path such as /var/lib/bigfleet/state, or etcd://HOST:PORT/PREFIX (./file:/var/lib/state for a file of that name)`,
		}},
		{"state is a dash", with(fakeArgs, "--state", "-"), []string{
			`--state: "-": the path starts with '-', which reads as standard input or a flag; write ./- for a file of that name`,
		}},
		{"state is blank", with(fakeArgs, "--state", " "), []string{
			`--state: " ": the path is blank`,
		}},
		{"state has surrounding blanks", with(fakeArgs, "--state", " /var/lib/state"), []string{
			`--state: " /var/lib/state": the path starts or ends with white space; quote it correctly`,
		}},
		{"state holds a control character", with(fakeArgs, "--state", "/tmp/a\x1b[2Jb"), []string{
			`--state: "/tmp/a\x1b[2Jb": the path holds a control character`,
		}},
		{"state is a device", with(fakeArgs, "--state", "/dev/null"), []string{
			`--state: "/dev/null": the path is a character device, not a regular file; the state needs files of its own next to it`,
		}},
		{"state is in /dev", with(fakeArgs, "--state", "/dev/bigfleet-state"), []string{
			`--state: "/dev/bigfleet-state": /dev is on the kernel's /dev file system, where a state's files cannot live`,
		}},
		{"state is in /proc", with(fakeArgs, "--state", "/proc/state"), []string{
			`--state: "/proc/state": /proc is on the kernel's /proc file system, where a state's files cannot live`,
		}},
		{"state-recover with an unknown value", with(fakeArgs, "--state", "$DIR/state", "--state-recover", "yes"), []string{
			`--state-recover: unknown value "yes"; the only one is truncate`,
		}},
		{"state-recover without a file state", with(fakeArgs, "--state-recover", "truncate"), []string{
			"--state-recover: only applies to a file --state (an etcd state does not lose acknowledged records this way)",
		}},
		{"state-recover with an etcd state", with(fakeArgs, "--state", "etcd://127.0.0.1:2379/bf", "--state-recover", "truncate"), []string{
			"--state-recover: only applies to a file --state (an etcd state does not lose acknowledged records this way)",
		}},
		{"state is another URL", with(fakeArgs, "--state", "S3://bucket/state"), []string{
			`--state: "S3://bucket/state" looks like a s3:// URL, which is not a state store this build supports; pass a file path such as /var/lib/bigfleet/state, or etcd://HOST:PORT/PREFIX`,
		}},
		{"seed count", with(fakeArgs, "--seed-count", "0"), []string{
			"--seed-count: must be between 1 and 1000000, got 0 (each slot costs memory and state; split a larger host-set across providers)",
		}},
		{"synthetic rates", with(fakeArgs, "--price-per-vcpu-hour", "-0.1", "--price-per-gib-hour", "NaN"), []string{
			"--price-per-vcpu-hour: must be a finite number from 0 to 1000000, got -0.1 (0 makes that dimension free)",
			"--price-per-gib-hour: must be a finite number from 0 to 1000000, got NaN (0 makes that dimension free)",
		}},
		{"prices", with(fakeArgs, "--prices", "kvm.tiny=1,kvm.small"), []string{
			`--prices: "kvm.tiny" is not in the instance-type catalog (known: kvm.large, kvm.medium, kvm.small, kvm.xlarge)`,
			`--prices: entry "kvm.small" must be type=usd, e.g. kvm.small=0.05`,
		}},
		{"catalog file", with(fakeArgs, "--instance-types", f.garbage, "--prices", "kvm.nope=1"), []string{
			"--instance-types: $DIR/garbage: not valid JSON: invalid character 'o' in literal null (expecting 'u')",
		}},
		{"catalog file missing", with(fakeArgs, "--instance-types", f.noDir), []string{
			"--instance-types: read instance types: open $DIR/missing/file: no such file or directory",
		}},
		{"offerings file missing", with(fakeArgs, "--offerings", f.noDir), []string{
			"--offerings: read offerings: open $DIR/missing/file: no such file or directory",
		}},
		{"offerings file invalid", with(fakeArgs, "--offerings", f.catalog), []string{
			"--offerings: $DIR/types.json: must be a JSON array of offering objects",
		}},
		{"seed count past the slot cap", with(fakeArgs, "--seed-count", "9223372036854775807"), []string{
			"--seed-count: must be between 1 and 1000000, got 9223372036854775807 (each slot costs memory and state; split a larger host-set across providers)",
		}},
		{"offerings past the slot cap", with(fakeArgs, "--offerings", f.hugeOfferings), []string{
			"--offerings: $DIR/offerings-huge.json: offerings[0]: count 9223372036854775807 exceeds the cap of 1000000 slots per provider",
			"--offerings: $DIR/offerings-huge.json: offerings describe 1000002 slots in all; the cap is 1000000 per provider (each slot costs memory and state); split the host-set across providers",
		}},

		// libvirt.
		{"libvirt backend needs connect and image", []string{"--libvirt-backend", "libvirt"}, []string{
			"--connect: is required by the libvirt backend: pass one URI such as qemu:///system, or zone=uri pairs such as rack1=qemu+libssh://bigfleet@host-a/system?keyfile=...&known_hosts=...",
			"--image: is required by the libvirt backend: name the golden base-image volume in --storage-pool, e.g. ubuntu-24.04.qcow2",
		}},
		{"libvirt needs image", []string{"--connect", "qemu:///system"}, []string{
			"--image: is required by the libvirt backend: name the golden base-image volume in --storage-pool, e.g. ubuntu-24.04.qcow2",
		}},
		{"libvirt empty pool, network, domain type", with(fakeArgs, "--storage-pool", "", "--network", " ", "--domain-type", "xen"), []string{
			"--storage-pool: is empty; name the libvirt storage pool for overlay and seed volumes (default: default)",
			"--network: is empty; name the libvirt network the NIC attaches to (default: default)",
			`--domain-type: unknown domain type "xen"; use kvm (hardware virtualisation) or qemu (emulation)`,
		}},
		{"libvirt call timeout out of range", with(fakeArgs, "--libvirt-call-timeout", "500ms"), []string{
			"--libvirt-call-timeout: must be between 1s and 1m0s, got 500ms (one libvirt RPC; keep it well below the 30s observe budget)",
		}},
		{"libvirt call timeout too long", with(fakeArgs, "--libvirt-call-timeout", "2m"), []string{
			"--libvirt-call-timeout: must be between 1s and 1m0s, got 2m0s (one libvirt RPC; keep it well below the 30s observe budget)",
		}},
		{"kernel paths", with(fakeArgs, "--kernel", "vmlinuz", "--initrd", "initrd.img"), []string{
			`--kernel: "vmlinuz" must be an absolute path on the libvirt host`,
			`--initrd: "initrd.img" must be an absolute path on the libvirt host`,
		}},
		{"initrd and cmdline without kernel", with(fakeArgs, "--initrd", "/boot/initrd", "--kernel-cmdline", "console=ttyS0"), []string{
			"--initrd: only applies to direct kernel boot; also pass --kernel, or drop it",
			"--kernel-cmdline: only applies to direct kernel boot; also pass --kernel, or drop it",
		}},
		{"base user data unreadable", with(fakeArgs, "--base-user-data", f.noDir), []string{
			"--base-user-data: cannot read the cloud-init file: open $DIR/missing/file: no such file or directory",
		}},
		{"capacity type spot", with(fakeArgs, "--capacity-type", "spot"), []string{
			`--capacity-type: capacity_type "spot" is not supported: a libvirt host has no preemption market; use on_demand`,
		}},
		{"capacity type reserved", with(fakeArgs, "--capacity-type", "reserved"), []string{
			`--capacity-type: capacity_type "reserved" is not supported: a libvirt host has no reservation or commitment billing; use on_demand`,
		}},
		{"bare uri with bad default zone", []string{"--connect", "qemu:///system", "--image", "x", "--default-zone", "a:b"}, []string{
			`--connect: the bare URI goes to --default-zone, but zone "a:b" contains '/' or ':', which machine ids and host refs use as separators; rename it`,
		}},
		{"connect entries", with(realLV[2:], "--connect", "rack1,=qemu:///system,rack2=,rack 3=qemu:///system,r/4=qemu:///system"), []string{
			`--connect: entry "rack1" has no '=': write zone=uri, e.g. rack1=qemu+libssh://bigfleet@host-a/system`,
			`--connect: entry "=qemu:///system" has an empty zone before '='`,
			`--connect: zone "rack2" has an empty URI after '='`,
			`--connect: zone "rack 3" contains whitespace; rename it`,
			`--connect: zone "r/4" contains '/' or ':', which machine ids and host refs use as separators; rename it`,
		}},
		{"connect duplicate zone", with(realLV[2:], "--connect", "a=qemu:///system,a=qemu:///session"), []string{
			`--connect: zone "a" is listed twice; each zone is one host, keep one entry`,
		}},
		{"connect uri syntax", with(realLV[2:], "--connect", "a=qemu://host:port/system,b=/system,c=mailto:x@y,d=qemu:///other,e=test:///,f=xen:///system"), []string{
			`--connect: zone "a": URI "qemu://host:port/system" does not parse: invalid port ":port" after host`,
			`--connect: zone "b": URI "/system" has no scheme; write e.g. qemu:///system or qemu+libssh://user@host/system`,
			`--connect: zone "c": URI "mailto:x@y" is not of the form driver[+transport]://[user@][host]/path`,
			`--connect: zone "d": URI "qemu:///other" has path "/other"; a qemu URI ends in /system or /session`,
			`--connect: zone "e": URI "test:///" names no test driver configuration; use test:///default`,
			`--connect: zone "f": URI "xen:///system" uses driver "xen"; this provider drives QEMU/KVM domains (qemu://...) or libvirt's test driver (test:///default)`,
		}},
		{"connect transports", with(realLV[2:], "--connect",
			"a=qemu+tcp://h/system,b=qemu+tls://h/system?no_verify=1,c=qemu+ssh://h/system?no_verify=yes,d=qemu+ssh://h/system?known_hosts=/k&sshauth=agent,e=qemu+libssh://h/system?no_verify=0,f=qemu+libssh2://h/system?known_hosts_verify=ignore,g=qemu+ext://h/system,h=qemu+unix://h/system,i=qemu+libssh:///system,j=qemu://h/system?no_verify=1"), []string{
			`--connect: zone "a": URI "qemu+tcp://h/system" uses plain TCP, which carries libvirt RPC (and the bootstrap blob) unauthenticated and unencrypted; use qemu+tls:// or qemu+libssh://`,
			`--connect: zone "b": URI "qemu+tls://h/system?no_verify=1" sets no_verify, which disables verification of the host's TLS certificate; remove it and trust the host's CA via pkipath`,
			`--connect: zone "c": URI "qemu+ssh://h/system?no_verify=yes" sets no_verify, which disables SSH host-key checking; remove it`,
			`--connect: zone "d": URI "qemu+ssh://h/system?known_hosts=/k&sshauth=agent" sets known_hosts, sshauth, which the pure-Go client honours only on the libssh transport; use qemu+libssh:// instead`,
			`--connect: zone "e": URI "qemu+libssh://h/system?no_verify=0" sets no_verify, which the libssh transport does not accept; remove it and pin the host key with known_hosts`,
			`--connect: zone "f": URI "qemu+libssh2://h/system?known_hosts_verify=ignore" sets known_hosts_verify=ignore, which disables or weakens SSH host-key checking; use known_hosts_verify=normal with a known_hosts file`,
			`--connect: zone "g": URI "qemu+ext://h/system" uses transport "ext", which is unknown or insecure; use qemu:///system (local), qemu+libssh:// or qemu+tls://`,
			`--connect: zone "h": URI "qemu+unix://h/system" uses the local unix socket but names host "h"; drop the host or use qemu+libssh://`,
			`--connect: zone "i": URI "qemu+libssh:///system" uses the libssh transport but names no host`,
			`--connect: zone "j": URI "qemu://h/system?no_verify=1" sets no_verify, which disables verification of the host's TLS certificate; remove it and trust the host's CA via pkipath`,
		}},

		// Proxmox.
		{"proxmox backend needs everything", []string{"--proxmox-backend", "proxmox"}, []string{
			"--proxmox-api-url: is required by the proxmox backend, e.g. https://pve1.example.internal:8006/api2/json",
			"--proxmox-token-id: is required by the proxmox backend, e.g. bigfleet@pve!autoscaler",
			"--proxmox-token-file: a token secret is required by the proxmox backend: pass --proxmox-token-file (preferred) or --proxmox-token-secret",
			"--proxmox-ca-file: the proxmox backend needs a way to verify the API certificate: pass --proxmox-ca-file (e.g. /etc/pve/pve-root-ca.pem) and/or --proxmox-tls-fingerprint",
			"--nodes: lists no node names; pass the cluster's nodes, e.g. --nodes pve1,pve2,pve3",
		}},
		{"proxmox url http", with(realPX, "--proxmox-api-url", "http://pve:8006/api2/json"), []string{
			`--proxmox-api-url: "http://pve:8006/api2/json" uses http://, which would send the API token in clear text; use https://`,
		}},
		{"proxmox url scheme", with(realPX, "--proxmox-api-url", "pve:8006"), []string{
			`--proxmox-api-url: "pve:8006" must be an https:// URL, e.g. https://pve1.example.internal:8006/api2/json`,
		}},
		{"proxmox url credentials", with(realPX, "--proxmox-api-url", "https://root:hunter2@pve:8006/api2/json"), []string{
			`--proxmox-api-url: "https://root:xxxxx@pve:8006/api2/json" embeds credentials; remove them and use --proxmox-token-id with --proxmox-token-file`,
		}},
		{"proxmox url no host", with(realPX, "--proxmox-api-url", "https:///api2/json"), []string{
			`--proxmox-api-url: "https:///api2/json" names no host`,
		}},
		{"proxmox url parse", with(realPX, "--proxmox-api-url", "https://pve:port/api2/json"), []string{
			`--proxmox-api-url: "https://pve:port/api2/json" does not parse as a URL: invalid port ":port" after host`,
		}},
		{"token id shape", with(realPX, "--proxmox-token-id", "bigfleet@pve"), []string{
			"--proxmox-token-id: does not have the USER@REALM!TOKENID shape, e.g. bigfleet@pve!autoscaler (the value is not shown in case it holds the secret; pass the secret with --proxmox-token-file)",
		}},
		{"token file unreadable", with(realPX, "--proxmox-token-file", f.noDir), []string{
			"--proxmox-token-file: cannot read the token secret: open $DIR/missing/file: no such file or directory",
		}},
		{"token file empty", with(realPX, "--proxmox-token-file", f.empty), []string{
			"--proxmox-token-file: file $DIR/empty is empty; write the API token secret into it",
		}},
		{"token secret empty", with(fakeArgs, "--proxmox-token-secret", " "), []string{
			"--proxmox-token-secret: is empty; pass the secret with --proxmox-token-file instead",
		}},
		{"ca file problems", with(realPX, "--proxmox-ca-file", f.garbage), []string{
			"--proxmox-ca-file: $DIR/garbage holds no PEM certificate; point it at a PEM CA bundle",
		}},
		{"ca file unreadable", with(realPX, "--proxmox-ca-file", f.noDir), []string{
			"--proxmox-ca-file: cannot read the CA bundle: open $DIR/missing/file: no such file or directory",
		}},
		{"fingerprint", with(fakeArgs, "--proxmox-tls-fingerprint", "AB:CD"), []string{
			`--proxmox-tls-fingerprint: "AB:CD" is not a SHA-256 fingerprint: want 64 hex digits, optionally separated by ':' (e.g. the output of openssl x509 -noout -fingerprint -sha256)`,
		}},
		{"nodes name", with(realPX, "--nodes", "pve1,pve/2"), []string{
			`--nodes: node name: zone "pve/2" contains '/' or ':', which machine ids and host refs use as separators; rename it`,
		}},
		{"nodes duplicate", with(realPX, "--nodes", "pve1, pve1"), []string{
			`--nodes: node "pve1" is listed twice; list each node once`,
		}},
		{"nodes empty", with(fakeArgs, "--nodes", " , "), []string{
			"--nodes: lists no node names; pass the cluster's nodes, e.g. --nodes pve1,pve2,pve3",
		}},
		{"template vmid and pool and bootstrap", with(fakeArgs, "--template-vmid", "0", "--proxmox-pool", "a b", "--bootstrap-path", "run/x", "--bootstrap-exec", ""), []string{
			"--template-vmid: must be between 100 and 999999999, got 0 (the Proxmox VMID range)",
			`--proxmox-pool: "a b" is not a Proxmox pool name (no '/', ',' or whitespace)`,
			`--bootstrap-path: "run/x" must be an absolute in-guest path, e.g. /run/bigfleet-bootstrap`,
			`--bootstrap-exec: "" has an empty element at position 0; write the argv as program,arg1,arg2 (arguments cannot contain commas)`,
		}},
		{"proxmox poll interval", with(fakeArgs, "--proxmox-poll-interval", "100ms"), []string{
			"--proxmox-poll-interval: must be 0 (off) or between 250ms and 1m0s, got 100ms (each poll makes PVE build a listing of every VM)",
		}},
		{"offering on an unknown node", with(realPX, "--offerings", f.pxOfferings), []string{
			`--offerings: $DIR/offerings-proxmox.json: offerings[1]: zone "pve2" is not one of the configured zones (--nodes: pve1); add it there or place the offering on a configured zone`,
		}},
		{"proxmox bare metal capacity in offerings", with(fakeArgs, "--hypervisor", "proxmox", "--offerings", "$DIR/metal.json"), []string{
			`--offerings: $DIR/metal.json: offerings[0]: capacity_type "metal" is not supported on Proxmox: its VMs are deletable clones, not a fixed free pool; use on_demand`,
		}},

		// TLS.
		{"tls cert without key", with(fakeArgs, "--tls-cert", f.serverCert), []string{
			"--tls-cert: is set without --tls-key; pass both to enable TLS, or neither",
		}},
		{"tls key without cert", with(fakeArgs, "--tls-key", f.serverKey), []string{
			"--tls-key: is set without --tls-cert; pass both to enable TLS, or neither",
		}},
		{"tls ca alone", with(fakeArgs, "--tls-ca", f.clientCA), []string{
			"--tls-ca: enables mTLS, which needs a server certificate: also pass --tls-cert and --tls-key",
		}},
		{"tls keypair and ca bad", with(fakeArgs, "--tls-cert", f.serverCert, "--tls-key", f.serverCert, "--tls-ca", f.garbage), []string{
			"--tls-cert: cannot load the keypair $DIR/server.pem / $DIR/server.pem: tls: found a certificate rather than a key in the PEM for the private key",
			"--tls-ca: $DIR/garbage holds no PEM certificate; point it at a PEM CA bundle",
		}},
		{"tls files missing", with(fakeArgs, "--tls-cert", f.noDir, "--tls-key", f.serverKey, "--tls-ca", f.noDir), []string{
			"--tls-cert: cannot load the keypair $DIR/missing/file / $DIR/server-key.pem: $DIR/missing/file: no such file or directory",
			"--tls-ca: cannot read the CA bundle: open $DIR/missing/file: no such file or directory",
		}},

		// Parse.
		{"unknown flag", []string{"--conect", "qemu:///system"}, []string{
			"parse flags: flag provided but not defined: -conect",
		}},
		{"positional argument", with(fakeArgs, "serve"), []string{
			`unexpected argument "serve": the provider takes flags only (did you forget a -- on a flag?)`,
		}},
	}
	writeFile(t, f.dir+"/metal.json", []byte(`[{"instance_type": "pve.small", "zone": "pve-a", "capacity_type": "metal", "count": 1}]`))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := make([]string, len(tt.args))
			for i, a := range tt.args {
				args[i] = strings.ReplaceAll(a, "$DIR", f.dir)
			}
			_, err := parse(args, io.Discard)
			if err == nil {
				t.Fatal("Parse succeeded, want an error")
			}
			got := lines(err)
			for i := range got {
				got[i] = strings.ReplaceAll(got[i], f.dir, "$DIR")
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestBareConnectOnFakeWithBadDefaultZone(t *testing.T) {
	_, err := parse([]string{"--connect", "qemu:///system", "--use-fake-backend", "--default-zone", "a:b"}, io.Discard)
	want := []string{`--connect: the bare URI goes to --default-zone, but zone "a:b" contains '/' or ':', which machine ids and host refs use as separators; rename it`}
	if diff := cmp.Diff(want, lines(err)); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
}

// TestStatePathAccepted pins what --state checks must let through: file
// paths that do not exist yet, existing files, and names with a colon
// that are not URLs.
func TestStatePathAccepted(t *testing.T) {
	f := newFiles(t)
	for _, path := range []string{"", f.dir + "/state", f.empty, "./etcd:state", "./etcd:/x", "./-", "state:v2", "./a/b://c", "state", "/dev/shm/state"} {
		t.Run(path, func(t *testing.T) {
			c, err := parse(append(append([]string{}, fakeArgs...), "--state", path), io.Discard)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if c.StatePath != path {
				t.Errorf("StatePath = %q, want %q", c.StatePath, path)
			}
		})
	}
	c, err := parse(append(append([]string{}, fakeArgs...), "--state", f.dir+"/state", "--state-recover", "truncate"), io.Discard)
	if err != nil || !c.StateRecover {
		t.Errorf("--state-recover truncate: %v, StateRecover %t", err, c != nil && c.StateRecover)
	}
}
