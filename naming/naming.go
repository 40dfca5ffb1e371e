package naming

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// maxNameLen keeps names valid as DNS labels (Proxmox VM names, hostnames).
const maxNameLen = 63

// VMName derives the VM (domain) name for one create cycle of a machine:
// "bf-<installation>-<machine slug>-<hash>-c<cycle>". The hash of the exact
// installation and machine id keeps two ids that sanitise alike apart; the
// cycle keeps a recreated slot from reusing a name a leaked VM may hold.
func VMName(installation, machineID string, cycle int) string {
	sum := sha256.Sum256([]byte(installation + "\x00" + machineID))
	h := hex.EncodeToString(sum[:])[:8]
	inst := Slug(installation)
	if len(inst) > 12 {
		inst = strings.Trim(inst[:12], "-")
	}
	tail := fmt.Sprintf("-%s-c%d", h, cycle)
	head := Prefix + inst + "-"
	room := maxNameLen - len(head) - len(tail)
	id := Slug(machineID)
	if len(id) > room {
		id = strings.Trim(id[:room], "-")
	}
	return head + id + tail
}

// Prefix starts every VM name (and so every name a hypervisor derives
// from one, such as libvirt's volumes).
const Prefix = "bf-"

// Slug lowercases s and replaces every run of characters outside [a-z0-9]
// with one '-', trimmed at both ends, so a name part built from it uses
// only characters valid in a DNS label and a Proxmox tag.
func Slug(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.Trim(b.String(), "-")
}
