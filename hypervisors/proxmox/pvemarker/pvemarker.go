package pvemarker

import (
	"net/url"
	"strings"

	"github.com/bigfleet-vm/provider/naming"
	"github.com/bigfleet-vm/provider/observed"
)

// Proxmox tags. TagOwned marks every VM this project made; InstallationTag
// names the installation; MachineTag names the machine (lossy: the exact id
// lives in the description).
const TagOwned = "bigfleet"

// InstallationTag is the per-installation Proxmox tag.
func InstallationTag(installation string) string { return "bigfleet-inst-" + naming.Slug(installation) }

// MachineTag is the per-machine Proxmox tag.
func MachineTag(machineID string) string { return "bigfleet-" + naming.Slug(machineID) }

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
