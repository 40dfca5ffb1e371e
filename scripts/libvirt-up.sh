#!/usr/bin/env bash
# libvirt-up.sh: bring up a real libvirtd (no systemd) plus everything the
# libvirt adapter's integration tests need, idempotently and without stdin.
#
# libvirtd also listens for qemu+tls:// on 127.0.0.1:$TLS_PORT with
# certificates this script generates under $BIGFLEET_TEST_DIR/tls (a CA, a
# server certificate for 127.0.0.1, a client certificate, and a second
# "foreign" CA for the refusal tests); client certificates are required.
# The read-write unix socket is group "libvirt" (mode 0770, no polkit here),
# so the ssh test user reaches it through sshd (scripts/sshd-up.sh).
#
# It installs the Debian packages named in docs (real-substrate.md), applies
# the three fix-ups (log dir, libvirt-qemu user/group, qemu runs as root),
# starts virtlogd and libvirtd in the background, waits for a real call to
# work, defines two dir pools and an IP-less isolated network, and builds a
# tiny guest (Debian cloud kernel + busybox initramfs running the host's real
# qemu-ga on org.qemu.guest_agent.0, with /opt/bigfleet/bootstrap).
#
# Everything it creates lives under $BIGFLEET_TEST_DIR (default
# /var/lib/bigfleet-test); it writes $BIGFLEET_TEST_DIR/env for the tests
# (source it, then `go test -tags integration ./hypervisors/libvirt/...`).
# It exits non-zero with a clear message if the daemon cannot be started.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

STATE=${BIGFLEET_TEST_DIR:-/var/lib/bigfleet-test}
URI=qemu:///system
POOL_A=bigfleet-test-a
POOL_B=bigfleet-test-b
NET=bigfleet-isolated
BRIDGE=virbr-bftest
TLS_PORT=${BIGFLEET_TLS_PORT:-16514}
LIBVIRTD_ARGS="-d --listen"

die() { echo "libvirt-up: FATAL: $*" >&2; exit 1; }
log() { echo "libvirt-up: $*" >&2; }

[ "$(id -u)" = 0 ] || die "must run as root"
mkdir -p "$STATE"/{debs,guest,pool-a,pool-b}

# 1. Packages (never libvirt-daemon-system: it pulls in systemd).
PKGS=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients qemu-system-x86 qemu-utils qemu-guest-agent)
missing=()
for p in "${PKGS[@]}"; do
	status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
	[[ $status == *"install ok installed"* ]] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt-get update -qq </dev/null
	apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 "${missing[@]}" </dev/null >/dev/null ||
		die "apt-get install ${missing[*]} failed"
fi

# 2. Fix-ups for a daemon without systemd.
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
id libvirt-qemu >/dev/null 2>&1 || useradd -r -g libvirt-qemu -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
printf 'user = "root"\ngroup = "root"\n' >/etc/libvirt/qemu.conf
mkdir -p /var/log/libvirt /var/lib/libvirt /run/libvirt

getent group libvirt >/dev/null || groupadd -r libvirt

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# 2b. TLS PKI (RSA: libvirt's GnuTLS checks insist on keyEncipherment).
T=$STATE/tls
mkca() { # dir cn
	mkdir -p "$1"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1/cakey.pem" -out "$1/cacert.pem" -days 3650 -subj "/CN=$2" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null || die "openssl CA $2"
}
mkcert() { # ca-dir out-cert out-key cn extensions
	local csr ext
	csr=$(mktemp) ext=$(mktemp)
	printf '%s\n' "$5" >"$ext"
	openssl req -newkey rsa:2048 -nodes -keyout "$3" -out "$csr" -subj "/CN=$4" 2>/dev/null || die "openssl key $4"
	openssl x509 -req -in "$csr" -CA "$1/cacert.pem" -CAkey "$1/cakey.pem" -CAcreateserial -out "$2" -days 3650 \
		-extfile "$ext" 2>/dev/null || die "openssl sign $4"
	rm -f "$csr" "$ext"
}
if [ ! -s "$T/client-foreign/clientcert.pem" ]; then
	log "generating TLS certificates under $T"
	rm -rf "$T" && mkdir -p "$T"/{server,client,client-wrongca,client-nocert,client-foreign}
	mkca "$T/ca" bigfleet-test-ca
	mkca "$T/foreignca" bigfleet-foreign-ca
	usage="keyUsage=critical,digitalSignature,keyEncipherment"
	mkcert "$T/ca" "$T/server/servercert.pem" "$T/server/serverkey.pem" 127.0.0.1 \
		"$usage
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
	mkcert "$T/ca" "$T/client/clientcert.pem" "$T/client/clientkey.pem" bigfleet-provider "$usage
extendedKeyUsage=clientAuth"
	mkcert "$T/foreignca" "$T/client-foreign/clientcert.pem" "$T/client-foreign/clientkey.pem" bigfleet-provider "$usage
extendedKeyUsage=clientAuth"
	cp "$T/ca/cacert.pem" "$T/server/cacert.pem"
	cp "$T/ca/cacert.pem" "$T/client/cacert.pem"
	cp "$T/ca/cacert.pem" "$T/client-nocert/cacert.pem"
	cp "$T/ca/cacert.pem" "$T/client-foreign/cacert.pem"
	cp "$T/foreignca/cacert.pem" "$T/client-wrongca/cacert.pem"
	cp "$T/client/clientcert.pem" "$T/client/clientkey.pem" "$T/client-wrongca/"
	chmod 600 "$T"/*/*key.pem
fi
CONF=$(cat <<EOF
# Written by scripts/libvirt-up.sh for the integration suites.
listen_tls = 1
listen_tcp = 0
listen_addr = "127.0.0.1"
tls_port = "$TLS_PORT"
key_file = "$T/server/serverkey.pem"
cert_file = "$T/server/servercert.pem"
ca_file = "$T/server/cacert.pem"
tls_no_verify_certificate = 0
auth_tls = "none"
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
EOF
)
if [ "$(cat /etc/libvirt/libvirtd.conf 2>/dev/null)" != "$CONF" ]; then
	printf '%s\n' "$CONF" >/etc/libvirt/libvirtd.conf
	if alive /run/libvirtd.pid; then
		log "libvirtd.conf changed: restarting libvirtd"
		pid=$(cat /run/libvirtd.pid)
		kill "$pid"
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
	fi
fi

# 3. Daemons, in the background, by PID file.
alive /run/virtlogd.pid || { log "starting virtlogd"; virtlogd -d || die "virtlogd failed to start"; }
start_libvirtd() {
	log "starting libvirtd"
	# shellcheck disable=SC2086
	libvirtd $LIBVIRTD_ARGS || die "libvirtd failed to start (see /var/log/libvirt/libvirtd.log)"
	local ok=""
	for _ in $(seq 300); do
		if virsh -c "$URI" uri >/dev/null 2>&1; then ok=1; break; fi
		alive /run/libvirtd.pid || break
		sleep 0.1
	done
	if [ -z "$ok" ]; then
		tail -20 /var/log/libvirt/libvirtd.log >&2 2>/dev/null || true
		die "libvirtd is not answering on $URI"
	fi
}
stop_libvirtd() {
	local pid
	pid=$(cat /run/libvirtd.pid)
	kill "$pid" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -9 "$pid" 2>/dev/null || true
}
if alive /run/libvirtd.pid && ! virsh -c "$URI" uri >/dev/null 2>&1; then
	log "libvirtd (pid $(cat /run/libvirtd.pid)) does not answer on $URI: restarting it"
	stop_libvirtd
fi
alive /run/libvirtd.pid || start_libvirtd
# A live PID file proves nothing about the TLS listener the tests need: a
# libvirtd started without --listen (by hand, or by another script)
# answers on the unix socket only. Ask the listener itself.
TLS_URI="qemu+tls://127.0.0.1:$TLS_PORT/system?pkipath=$T/client"
tls_ok() { virsh -c "$TLS_URI" uri >/dev/null 2>&1; }
if ! tls_ok; then
	log "libvirtd (pid $(cat /run/libvirtd.pid)) answers on $URI but not on $TLS_URI: restarting it with '$LIBVIRTD_ARGS'"
	stop_libvirtd
	start_libvirtd
	if ! tls_ok; then
		virsh -c "$TLS_URI" uri >&2 || true
		die "libvirtd's TLS listener on 127.0.0.1:$TLS_PORT does not answer (libvirtd $LIBVIRTD_ARGS, /etc/libvirt/libvirtd.conf listen_tls = 1)"
	fi
fi
# The first capabilities probe takes ~7 s once; pay it here, not in a test.
virsh -c "$URI" version >/dev/null || die "virsh version failed"
virsh -c "$URI" list >/dev/null || die "virsh list failed"

# 4. Guest artefacts (cached).
G=$STATE/guest
if [ ! -s "$G/vmlinuz" ] || [ ! -s "$G/initrd.gz" ]; then
	log "building tiny guest"
	cd "$STATE/debs"
	abi_pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
	[ -n "$abi_pkg" ] || { apt-get update -qq </dev/null; abi_pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); }
	[ -n "$abi_pkg" ] || die "cannot resolve the cloud kernel package"
	ls "$abi_pkg"_*.deb >/dev/null 2>&1 || apt-get download "$abi_pkg" </dev/null >/dev/null || die "download $abi_pkg"
	ls busybox-static_*.deb >/dev/null 2>&1 || apt-get download busybox-static </dev/null >/dev/null || die "download busybox-static"
	rm -rf "$G/x" "$G/root" && mkdir -p "$G/x" "$G/root"
	dpkg-deb --fsys-tarfile "$abi_pkg"_*.deb | tar -x -C "$G/x" --wildcards './boot/vmlinuz-*' \
		'./lib/modules/*/kernel/drivers/virtio/*' './lib/modules/*/kernel/drivers/char/virtio_console.ko'
	dpkg-deb -x busybox-static_*.deb "$G/x"
	R=$G/root
	mkdir -p "$R"/{bin,sbin,proc,sys,dev,run,tmp,etc,lib/bfmod,opt/bigfleet,var/lib/bigfleet,usr/bin}
	cp "$G/x/bin/busybox" "$R/bin/busybox"
	for a in $("$R/bin/busybox" --list); do [ -e "$R/bin/$a" ] || ln -s busybox "$R/bin/$a"; done
	find "$G/x/lib/modules" -name '*.ko' -exec cp {} "$R/lib/bfmod/" \;
	QGA=$(command -v qemu-ga) || die "qemu-ga not found"
	cp "$QGA" "$R/usr/bin/qemu-ga"
	for lib in $(ldd "$QGA" | grep -o '/[^ ]*'); do
		mkdir -p "$R$(dirname "$lib")" && cp -L "$lib" "$R$lib"
	done
	cat >"$R/init" <<'EOF'
#!/bin/sh
# Tiny BigFleet test guest: starts the real qemu-ga on org.qemu.guest_agent.0.
export PATH=/bin:/sbin:/usr/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs run /run; mount -t tmpfs tmp /tmp
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_console; do
	[ -f /lib/bfmod/$m.ko ] && insmod /lib/bfmod/$m.ko 2>/dev/null
done
hostname bigfleet-guest
port=""
for _ in $(seq 200); do
	for n in /sys/class/virtio-ports/*/name; do
		[ -f "$n" ] && [ "$(cat "$n")" = org.qemu.guest_agent.0 ] && port=$(basename "$(dirname "$n")")
	done
	[ -n "$port" ] && [ -e "/dev/$port" ] && break
	sleep 0.05
done
echo "BIGFLEET-GUEST agent port=$port"
mkdir -p /run/qga
while true; do
	qemu-ga -m virtio-serial -p "/dev/$port" -t /run/qga
	echo "BIGFLEET-GUEST qemu-ga exited $?"; sleep 1
done
EOF
	cat >"$R/sbin/shutdown" <<'EOF'
#!/bin/sh
sync; poweroff -f
EOF
	# The bootstrap hook: argv[1] is the cluster id, argv[2] (optional) the
	# blob path (default /opt/bigfleet/bootstrap.blob). It records what it
	# received under /var/lib/bigfleet/received and prints a summary. Cluster
	# "fail" makes it exit 3 (to test non-zero hooks).
	cat >"$R/opt/bigfleet/bootstrap" <<'EOF'
#!/bin/sh
cluster="$1"; blob="${2:-/opt/bigfleet/bootstrap.blob}"
out=/var/lib/bigfleet/received
mkdir -p "$out"
printf '%s' "$cluster" >"$out/cluster"
if [ -f "$blob" ]; then
	cp "$blob" "$out/blob"
	sum=$(sha256sum "$blob" | cut -d' ' -f1)
	size=$(wc -c <"$blob" | tr -d ' ')
	mode=$(stat -c %a "$blob")
else
	sum=none; size=0; mode=none
fi
printf 'cluster=%s sha256=%s size=%s mode=%s\n' "$cluster" "$sum" "$size" "$mode" | tee "$out/summary"
if [ "$cluster" = fail ]; then echo "bootstrap: refusing cluster fail" >&2; exit 3; fi
exit 0
EOF
	chmod 0755 "$R/init" "$R/sbin/shutdown" "$R/opt/bigfleet/bootstrap"
	cp "$G"/x/boot/vmlinuz-* "$G/vmlinuz.tmp" && mv "$G/vmlinuz.tmp" "$G/vmlinuz"
	(cd "$R" && find . | "$R/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -1 >"$G/initrd.gz.tmp") && mv "$G/initrd.gz.tmp" "$G/initrd.gz"
	rm -rf "$G/x"
fi

# 5. Golden images (a qcow2 in both pools, a raw one in pool A).
for d in pool-a pool-b; do
	[ -f "$STATE/$d/golden.qcow2" ] || qemu-img create -q -f qcow2 "$STATE/$d/golden.qcow2" 64M
done
[ -f "$STATE/pool-a/golden.raw" ] || qemu-img create -q -f raw "$STATE/pool-a/golden.raw" 32M

# 6. Pools and the IP-less isolated network.
ensure_pool() {
	local name=$1 dir=$2
	if ! virsh -c "$URI" pool-info "$name" >/dev/null 2>&1; then
		virsh -c "$URI" pool-define-as "$name" dir --target "$dir" >/dev/null || die "pool-define $name"
	fi
	# (capture first: grep -q under pipefail would SIGPIPE virsh)
	local info
	info=$(virsh -c "$URI" pool-info "$name" 2>/dev/null || true)
	if ! grep -Eq 'State: *running' <<<"$info"; then
		virsh -c "$URI" pool-start "$name" >/dev/null || die "pool-start $name"
	fi
	virsh -c "$URI" pool-refresh "$name" >/dev/null || die "pool-refresh $name"
}
ensure_pool "$POOL_A" "$STATE/pool-a"
ensure_pool "$POOL_B" "$STATE/pool-b"
# libvirt 9.0 inserts iptables rules even for an IP-less network, so the
# network is only made when iptables is present (BIGFLEET_TEST_NETWORK=1
# installs it); otherwise the tests use a user-mode NIC ("user").
if [ "${BIGFLEET_TEST_NETWORK:-0}" = 1 ] && ! command -v iptables >/dev/null; then
	apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 iptables </dev/null >/dev/null || die "install iptables"
fi
if command -v iptables >/dev/null; then
	if ! virsh -c "$URI" net-info "$NET" >/dev/null 2>&1; then
		cat >"$STATE/net.xml" <<EOF
<network><name>$NET</name><bridge name='$BRIDGE' stp='off'/></network>
EOF
		virsh -c "$URI" net-define "$STATE/net.xml" >/dev/null || die "net-define $NET"
	fi
	grep -Eq 'Active: *yes' <<<"$(virsh -c "$URI" net-info "$NET")" || virsh -c "$URI" net-start "$NET" >/dev/null || die "net-start $NET"
else
	virsh -c "$URI" net-undefine "$NET" >/dev/null 2>&1 || true
	log "iptables not installed: no isolated network, tests use a user-mode NIC"
	NET=user
fi

cat >"$STATE/env" <<EOF
export BIGFLEET_LIBVIRT_URI=$URI
export BIGFLEET_LIBVIRT_POOL=$POOL_A
export BIGFLEET_LIBVIRT_POOL2=$POOL_B
export BIGFLEET_LIBVIRT_NETWORK=$NET
export BIGFLEET_LIBVIRT_IMAGE=golden.qcow2
export BIGFLEET_LIBVIRT_IMAGE_RAW=golden.raw
export BIGFLEET_LIBVIRT_KERNEL=$G/vmlinuz
export BIGFLEET_LIBVIRT_INITRD=$G/initrd.gz
export BIGFLEET_LIBVIRT_STATE=$STATE
export BIGFLEET_LIBVIRTD_ARGS="$LIBVIRTD_ARGS"
export BIGFLEET_TLS_PORT=$TLS_PORT
export BIGFLEET_TLS_DIR=$T
EOF
log "up: libvirtd pid $(cat /run/libvirtd.pid), env in $STATE/env"
