#!/usr/bin/env bash
# sshd-up.sh: start two OpenSSH daemons on 127.0.0.1 (no systemd) through
# which the integration suites reach this machine's libvirtd with the
# qemu+libssh:// and qemu+ssh:// transports, as operators reach remote
# hosts. Idempotent, no stdin; run after libvirt-up.sh.
#
#  - user bfssh (group libvirt, so it may use the read-write libvirt socket),
#    public-key login only, with a key generated here;
#  - sshd "libssh" on $LIBSSH_PORT and sshd "ssh" on $SSH_PORT, each with
#    its own config and PID file, so a test can stop one transport alone;
#  - known_hosts files for qemu+libssh (known_hosts_verify=normal): the
#    right host key, an empty one (unknown host) and one with another key
#    (changed host key);
#  - qemu+ssh has no known_hosts option (go-libvirt, like libvirt, reads
#    the user's ~/.ssh/known_hosts), so the host key of the "ssh" daemon's
#    port is appended to /root/.ssh/known_hosts with the comment
#    "bigfleet-test"; sshd-down.sh removes exactly those lines.
#
# Appends the paths to $BIGFLEET_TEST_DIR/env.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
STATE=${BIGFLEET_TEST_DIR:-/var/lib/bigfleet-test}
S=$STATE/ssh
LIBSSH_PORT=${BIGFLEET_SSHD_LIBSSH_PORT:-2222}
SSH_PORT=${BIGFLEET_SSHD_SSH_PORT:-2223}
USER_NAME=bfssh
die() { echo "sshd-up: FATAL: $*" >&2; exit 1; }
log() { echo "sshd-up: $*" >&2; }
[ "$(id -u)" = 0 ] || die "must run as root"
[ -f "$STATE/env" ] || die "run libvirt-up.sh first"

if [ ! -x /usr/sbin/sshd ]; then
	log "installing openssh-server"
	apt-get update -qq </dev/null
	apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=600 openssh-server </dev/null >/dev/null ||
		die "apt-get install openssh-server failed"
fi
getent group libvirt >/dev/null || groupadd -r libvirt
id "$USER_NAME" >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /bin/sh -G libvirt "$USER_NAME"
# "*": no password can match, yet the account is not "locked" (sshd without
# PAM refuses key logins to locked accounts).
usermod -p "*" "$USER_NAME"
mkdir -p "$S" /run/sshd
chmod 755 "$STATE" "$S"
[ -s "$S/id_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C bigfleet-provider -f "$S/id_ed25519"
[ -s "$S/host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C bigfleet-test-host -f "$S/host_ed25519"
[ -s "$S/other_host_ed25519" ] || ssh-keygen -q -t ed25519 -N "" -C bigfleet-other-host -f "$S/other_host_ed25519"
install -m 644 "$S/id_ed25519.pub" "$S/authorized_keys"

hostkey=$(cut -d' ' -f1,2 "$S/host_ed25519.pub")
otherkey=$(cut -d' ' -f1,2 "$S/other_host_ed25519.pub")
echo "[127.0.0.1]:$LIBSSH_PORT $hostkey" >"$S/known_hosts"
: >"$S/known_hosts_empty"
echo "[127.0.0.1]:$LIBSSH_PORT $otherkey" >"$S/known_hosts_changed"
mkdir -p /root/.ssh && chmod 700 /root/.ssh
touch /root/.ssh/known_hosts
sed -i '/ bigfleet-test$/d' /root/.ssh/known_hosts
echo "[127.0.0.1]:$SSH_PORT $hostkey bigfleet-test" >>/root/.ssh/known_hosts

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
for name in libssh ssh; do
	port=$LIBSSH_PORT
	[ "$name" = ssh ] && port=$SSH_PORT
	cat >"$S/sshd_$name.conf" <<EOF
# Written by scripts/sshd-up.sh for the integration suites.
ListenAddress 127.0.0.1:$port
HostKey $S/host_ed25519
PidFile $S/sshd_$name.pid
AuthorizedKeysFile $S/authorized_keys
AllowUsers $USER_NAME
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
AllowStreamLocalForwarding local
# OpenSSH disables all local forwarding, unix sockets included, unless
# local TCP forwarding is allowed too.
AllowTcpForwarding local
X11Forwarding no
PermitTTY no
LogLevel INFO
EOF
	/usr/sbin/sshd -t -f "$S/sshd_$name.conf" || die "sshd config $name invalid"
	if ! alive "$S/sshd_$name.pid"; then
		/usr/sbin/sshd -f "$S/sshd_$name.conf" -E "$S/sshd_$name.log" || die "sshd $name failed to start"
	fi
done
for _ in $(seq 50); do
	listening=$(ss -ltn)
	[[ $listening == *"127.0.0.1:$LIBSSH_PORT "* && $listening == *"127.0.0.1:$SSH_PORT "* ]] && break
	sleep 0.1
done

sed -i '/^export BIGFLEET_SSH/d' "$STATE/env"
cat >>"$STATE/env" <<EOF
export BIGFLEET_SSH_USER=$USER_NAME
export BIGFLEET_SSH_KEY=$S/id_ed25519
export BIGFLEET_SSH_KNOWN_HOSTS=$S/known_hosts
export BIGFLEET_SSH_KNOWN_HOSTS_EMPTY=$S/known_hosts_empty
export BIGFLEET_SSH_KNOWN_HOSTS_CHANGED=$S/known_hosts_changed
export BIGFLEET_SSHD_LIBSSH_PORT=$LIBSSH_PORT
export BIGFLEET_SSHD_LIBSSH_CONF=$S/sshd_libssh.conf
export BIGFLEET_SSHD_LIBSSH_PID=$S/sshd_libssh.pid
export BIGFLEET_SSHD_SSH_PORT=$SSH_PORT
export BIGFLEET_SSHD_SSH_CONF=$S/sshd_ssh.conf
export BIGFLEET_SSHD_SSH_PID=$S/sshd_ssh.pid
EOF
log "up: sshd libssh on $LIBSSH_PORT (pid $(cat "$S/sshd_libssh.pid")), ssh on $SSH_PORT (pid $(cat "$S/sshd_ssh.pid"))"
