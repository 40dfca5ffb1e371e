package hypervisors

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"github.com/bigfleet-vm/provider/observed"
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
	inst := slug(installation)
	if len(inst) > 12 {
		inst = strings.Trim(inst[:12], "-")
	}
	tail := fmt.Sprintf("-%s-c%d", h, cycle)
	head := "bf-" + inst + "-"
	room := maxNameLen - len(head) - len(tail)
	id := slug(machineID)
	if len(id) > room {
		id = strings.Trim(id[:room], "-")
	}
	return head + id + tail
}

// OverlayVolume is the name of a domain's copy-on-write disk volume.
func OverlayVolume(vmName string) string { return vmName + "-disk.qcow2" }

// SeedVolume is the name of a domain's cloud-init NoCloud ISO volume.
func SeedVolume(vmName string) string { return vmName + "-cidata.iso" }

// VolumePrefix is the prefix of every volume this project creates.
const VolumePrefix = "bf-"

// Proxmox tags. TagOwned marks every VM this project made; InstallationTag
// names the installation; MachineTag names the machine (lossy: the exact id
// lives in the description).
const TagOwned = "bigfleet"

// InstallationTag is the per-installation Proxmox tag.
func InstallationTag(installation string) string { return "bigfleet-inst-" + slug(installation) }

// MachineTag is the per-machine Proxmox tag.
func MachineTag(machineID string) string { return "bigfleet-" + slug(machineID) }

// Tags returns the sorted Proxmox tag set for a marker.
func Tags(m observed.Marker) []string {
	return []string{TagOwned, MachineTag(m.MachineID), InstallationTag(m.Installation)}
}

// descriptionKey starts the marker line in a Proxmox VM description.
const descriptionKey = "bigfleet-marker: "

// Description renders a marker as a Proxmox VM description: a human line
// and one machine-readable line with URL-encoded values.
func Description(m observed.Marker) string {
	v := url.Values{}
	v.Set("installation", m.Installation)
	v.Set("machine_id", m.MachineID)
	if m.OpID != "" {
		v.Set("operation_id", m.OpID)
	}
	if m.InstanceType != "" {
		v.Set("instance_type", m.InstanceType)
	}
	if m.Cluster != "" {
		v.Set("cluster", m.Cluster)
	}
	return "BigFleet managed VM. Do not edit the next line.\n" + descriptionKey + v.Encode() + "\n"
}

// ParseDescription recovers a marker from a Proxmox VM description, or nil
// if it carries none.
func ParseDescription(desc string) *observed.Marker {
	for _, line := range strings.Split(desc, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, descriptionKey) {
			continue
		}
		v, err := url.ParseQuery(strings.TrimPrefix(line, descriptionKey))
		if err != nil || v.Get("installation") == "" || v.Get("machine_id") == "" {
			return nil
		}
		return &observed.Marker{
			Installation: v.Get("installation"),
			MachineID:    v.Get("machine_id"),
			OpID:         v.Get("operation_id"),
			InstanceType: v.Get("instance_type"),
			Cluster:      v.Get("cluster"),
		}
	}
	return nil
}

// HasOwnershipTags reports whether a Proxmox tag list carries both the
// project tag and this installation's tag.
func HasOwnershipTags(tags []string, installation string) bool {
	var owned, inst bool
	want := InstallationTag(installation)
	for _, t := range tags {
		switch t {
		case TagOwned:
			owned = true
		case want:
			inst = true
		}
	}
	return owned && inst
}

// slug lowercases s and replaces every run of characters outside [a-z0-9]
// with one '-'.
func slug(s string) string {
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
