package inventory

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// maxNameLen bounds zone and instance-type names; they appear in machine
// ids, metrics labels and VM names.
const maxNameLen = 63

// ValidateZone reports why zone cannot be used as a zone name, or nil. A
// zone is a libvirt host label or a Proxmox node name: non-empty, at most
// 63 bytes, without '/', ':' or whitespace.
func ValidateZone(zone string) error {
	return validateName("zone", zone)
}

// ValidateTypeName reports why name cannot be used as an instance-type
// name, or nil. The rules are those of ValidateZone.
func ValidateTypeName(name string) error {
	return validateName("instance type name", name)
}

func validateName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%s is empty", what)
	case len(s) > maxNameLen:
		return fmt.Errorf("%s %q is %d bytes long; use at most %d", what, s, len(s), maxNameLen)
	case strings.ContainsAny(s, "/:"):
		return fmt.Errorf("%s %q contains '/' or ':', which machine ids and host refs use as separators; rename it", what, s)
	case strings.IndexFunc(s, unicode.IsSpace) >= 0:
		return fmt.Errorf("%s %q contains whitespace; rename it", what, s)
	case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("%s %q contains a non-printable character; rename it", what, s)
	}
	return nil
}

// MachineID returns the id of slot index of the (zone, instanceType)
// offering: "<zone>/<instance_type>/<index>", index zero-padded to three
// digits and wider from 1000 on. The padding depends only on the index,
// never on the offering's count, so growing an offering never renames an
// existing slot.
func MachineID(zone, instanceType string, index int) string {
	return fmt.Sprintf("%s/%s/%03d", zone, instanceType, index)
}

// ParseMachineID splits an id made by MachineID, including ids of slots
// whose offering has since been removed. ok is false for anything MachineID
// cannot have produced (wrong shape, invalid names, a non-canonical index).
// It does not consult any catalog or offering.
func ParseMachineID(id string) (zone, instanceType string, index int, ok bool) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return "", "", 0, false
	}
	zone, instanceType, digits := parts[0], parts[1], parts[2]
	if ValidateZone(zone) != nil || ValidateTypeName(instanceType) != nil {
		return "", "", 0, false
	}
	if len(digits) < 3 || strings.TrimLeft(digits, "0123456789") != "" {
		return "", "", 0, false
	}
	n, err := strconv.Atoi(digits)
	if err != nil || MachineID(zone, instanceType, n) != id {
		return "", "", 0, false
	}
	return zone, instanceType, n, true
}
