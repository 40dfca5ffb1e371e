package libvirt

import (
	"encoding/base64"
	"encoding/xml"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"libvirt.org/go/libvirtxml"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
	"github.com/bigfleet-vm/provider/observed"
)

// Namespace is the XML namespace of the ownership metadata element.
const Namespace = "https://bigfleet-vm.dev/provider/v1"

// nsPrefix is the prefix libvirt stores the metadata element under.
const nsPrefix = "bf"

// GuestAgentChannel is the virtio-serial port name of the qemu guest agent.
const GuestAgentChannel = "org.qemu.guest_agent.0"

// Domain and volume XML come from libvirtxml, the libvirt project's own
// schema model. Only the ownership marker is this project's schema.

// markerField is one marker value. A value XML cannot carry byte for
// byte (control characters, invalid UTF-8, or leading, trailing or only
// whitespace, which parsers may drop or normalise) is stored base64
// encoded with enc="base64", so every byte survives the round trip
// through libvirt. Plain values stay readable in virsh dumpxml.
type markerField struct {
	Enc   string `xml:"enc,attr,omitempty"`
	Value string `xml:",chardata"`
}

// encField encodes a marker value; "" is nil (element omitted).
func encField(v string) *markerField {
	if v == "" {
		return nil
	}
	if xmlSafe(v) {
		return &markerField{Value: v}
	}
	return &markerField{Enc: "base64", Value: base64.StdEncoding.EncodeToString([]byte(v))}
}

// decField decodes a marker value; an undecodable one reads as "" (the
// marker then lacks that field, and a marker without installation or
// machine id is no marker).
func decField(f *markerField) string {
	if f == nil {
		return ""
	}
	switch f.Enc {
	case "":
		return f.Value
	case "base64":
		b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(f.Value))
		if err != nil {
			return ""
		}
		return string(b)
	}
	return ""
}

// xmlSafe reports whether v survives XML text content unchanged: valid
// UTF-8, printable characters, tab or newline only, and no leading or
// trailing whitespace.
func xmlSafe(v string) bool {
	if !utf8.ValidString(v) || strings.TrimSpace(v) != v {
		return false
	}
	for _, r := range v {
		switch {
		case r == '\t' || r == '\n':
		case r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f:
			return false
		case r == 0xfffe || r == 0xffff || !unicode.IsPrint(r) && !unicode.IsSpace(r):
			return false
		}
	}
	return true
}

// markerXML is the body of the metadata element. Define writes it with the
// bf prefix (markerDefineXML); DomainSetMetadata is given it unprefixed
// (libvirt adds the namespace); readers match it by namespace, whatever
// the prefix.
type markerXML struct {
	XMLName      xml.Name     `xml:"marker"`
	Installation *markerField `xml:"installation"`
	MachineID    *markerField `xml:"machine-id"`
	OpID         *markerField `xml:"op-id,omitempty"`
	InstanceType *markerField `xml:"instance-type,omitempty"`
	Cluster      *markerField `xml:"cluster,omitempty"`
}

// markerDefineXML is markerXML as it appears inside <metadata> of a
// definition: a prefixed element declaring the namespace.
type markerDefineXML struct {
	XMLName      xml.Name     `xml:"bf:marker"`
	NS           string       `xml:"xmlns:bf,attr"`
	Installation *markerField `xml:"bf:installation"`
	MachineID    *markerField `xml:"bf:machine-id"`
	OpID         *markerField `xml:"bf:op-id,omitempty"`
	InstanceType *markerField `xml:"bf:instance-type,omitempty"`
	Cluster      *markerField `xml:"bf:cluster,omitempty"`
}

// markerReadXML matches the marker by namespace, whatever its prefix.
type markerReadXML struct {
	XMLName      xml.Name     `xml:"https://bigfleet-vm.dev/provider/v1 marker"`
	Installation *markerField `xml:"installation"`
	MachineID    *markerField `xml:"machine-id"`
	OpID         *markerField `xml:"op-id"`
	InstanceType *markerField `xml:"instance-type"`
	Cluster      *markerField `xml:"cluster"`
}

// markerBody renders the element DomainSetMetadata takes.
func markerBody(m observed.Marker) (string, error) {
	b, err := xml.Marshal(markerXML{Installation: encField(m.Installation), MachineID: encField(m.MachineID),
		OpID: encField(m.OpID), InstanceType: encField(m.InstanceType), Cluster: encField(m.Cluster)})
	if err != nil {
		return "", fmt.Errorf("marshal marker: %w", err)
	}
	return string(b), nil
}

// markerDefinition renders the marker for a domain's <metadata>.
func markerDefinition(m observed.Marker) (string, error) {
	b, err := xml.MarshalIndent(markerDefineXML{NS: Namespace, Installation: encField(m.Installation), MachineID: encField(m.MachineID),
		OpID: encField(m.OpID), InstanceType: encField(m.InstanceType), Cluster: encField(m.Cluster)}, "    ", "  ")
	if err != nil {
		return "", fmt.Errorf("marshal marker: %w", err)
	}
	return "\n" + string(b) + "\n  ", nil
}

// domainDefinition renders a DomainSpec as libvirt domain XML. The spec is
// complete (the planner fills every field from the flags); an empty
// Network, or "user", means a user-mode NIC. It is a pure
// function of its arguments.
func domainDefinition(spec lvspec.DomainSpec) (string, error) {
	if spec.Name == "" || spec.VCPU <= 0 || spec.MemoryMiB <= 0 || spec.Pool == "" || spec.Overlay == "" {
		return "", fmt.Errorf("domain spec %q: name, vcpu, memory, pool and overlay are required: %w", spec.Name, hypervisors.ErrInvalid)
	}
	if spec.Marker.Installation == "" || spec.Marker.MachineID == "" {
		return "", fmt.Errorf("domain spec %q: marker needs installation and machine id: %w", spec.Name, hypervisors.ErrInvalid)
	}
	typ := spec.DomainType
	if typ != "kvm" && typ != "qemu" {
		return "", fmt.Errorf("domain spec %q: domain type %q is not kvm or qemu: %w", spec.Name, typ, hypervisors.ErrInvalid)
	}
	network := spec.Network
	marker, err := markerDefinition(spec.Marker)
	if err != nil {
		return "", err
	}
	port := uint(0)
	d := libvirtxml.Domain{
		Type:          typ,
		Name:          spec.Name,
		Metadata:      &libvirtxml.DomainMetadata{XML: marker},
		Memory:        &libvirtxml.DomainMemory{Unit: "MiB", Value: uint(spec.MemoryMiB)},
		CurrentMemory: &libvirtxml.DomainCurrentMemory{Unit: "MiB", Value: uint(spec.MemoryMiB)},
		VCPU:          &libvirtxml.DomainVCPU{Value: uint(spec.VCPU)},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
			Kernel:  spec.Kernel,
			Initrd:  spec.Initrd,
			Cmdline: spec.Cmdline,
		},
		Features:   &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices:    &libvirtxml.DomainDeviceList{},
	}
	if spec.Kernel == "" {
		d.OS.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	}
	dev := d.Devices
	dev.Disks = append(dev.Disks, libvirtxml.DomainDisk{
		Device: "disk",
		Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2"},
		Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: spec.Pool, Volume: spec.Overlay}},
		Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
	})
	if spec.Seed != "" {
		dev.Disks = append(dev.Disks, libvirtxml.DomainDisk{
			Device:   "cdrom",
			Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
			Source:   &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: spec.Pool, Volume: spec.Seed}},
			Target:   &libvirtxml.DomainDiskTarget{Dev: "sda", Bus: "sata"},
			ReadOnly: &libvirtxml.DomainDiskReadOnly{},
		})
	}
	nic := libvirtxml.DomainInterface{Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"}}
	if network == "" || network == "user" {
		nic.Source = &libvirtxml.DomainInterfaceSource{User: &libvirtxml.DomainInterfaceSourceUser{}}
	} else {
		nic.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: network}}
	}
	dev.Interfaces = []libvirtxml.DomainInterface{nic}
	dev.Channels = []libvirtxml.DomainChannel{{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: GuestAgentChannel}},
	}}
	dev.Serials = []libvirtxml.DomainSerial{{
		Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
		Target: &libvirtxml.DomainSerialTarget{Port: &port},
	}}
	dev.Consoles = []libvirtxml.DomainConsole{{
		Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}},
		Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &port},
	}}
	s, err := d.Marshal()
	if err != nil {
		return "", fmt.Errorf("marshal domain %s: %w", spec.Name, err)
	}
	return s, nil
}

// domainRead is what Observe and Lookup read from a domain's XML.
type domainRead struct {
	Name      string
	VCPU      int
	MemoryMiB int
	Volumes   []string
	Marker    *observed.Marker
}

// parseDomain reads the fields the adapter needs from domain XML.
func parseDomain(s string) (*domainRead, error) {
	var d libvirtxml.Domain
	if err := d.Unmarshal(s); err != nil {
		return nil, fmt.Errorf("parse domain XML: %w", err)
	}
	out := &domainRead{Name: d.Name}
	if d.VCPU != nil {
		out.VCPU = int(d.VCPU.Value)
	}
	if d.Memory != nil {
		out.MemoryMiB = int(scaled(uint64(d.Memory.Value), d.Memory.Unit, 1<<10) >> 20)
	}
	if d.Devices != nil {
		for _, disk := range d.Devices.Disks {
			switch src := disk.Source; {
			case src == nil:
			case src.Volume != nil && src.Volume.Volume != "":
				out.Volumes = append(out.Volumes, src.Volume.Volume)
			case src.File != nil && src.File.File != "":
				out.Volumes = append(out.Volumes, src.File.File[strings.LastIndex(src.File.File, "/")+1:])
			}
		}
	}
	if d.Metadata != nil {
		out.Marker = parseMarker(d.Metadata.XML)
	}
	return out, nil
}

// parseMarker finds the first complete marker in the inner XML of a
// domain's <metadata>, or nil.
func parseMarker(inner string) *observed.Marker {
	var md struct {
		Markers []markerReadXML `xml:"https://bigfleet-vm.dev/provider/v1 marker"`
	}
	if err := xml.Unmarshal([]byte("<metadata>"+inner+"</metadata>"), &md); err != nil {
		return nil
	}
	for _, m := range md.Markers {
		mk := &observed.Marker{Installation: decField(m.Installation), MachineID: decField(m.MachineID),
			OpID: decField(m.OpID), InstanceType: decField(m.InstanceType), Cluster: decField(m.Cluster)}
		if mk.Installation != "" && mk.MachineID != "" {
			return mk
		}
	}
	return nil
}

// marker returns the domain's ownership marker, or nil if it has none.
func (d *domainRead) marker() *observed.Marker {
	if d.Marker == nil {
		return nil
	}
	m := *d.Marker
	return &m
}

// memoryMiB is the domain's <memory> in MiB.
func (d *domainRead) memoryMiB() int { return d.MemoryMiB }

// volumes lists the volume (or file base) names the disks point at.
func (d *domainRead) volumes() []string { return d.Volumes }

// scaled converts a libvirt scaled integer to bytes; def is the
// multiplier of an empty unit (KiB for memory, bytes for volumes).
func scaled(v uint64, unit string, def uint64) uint64 {
	mult := def
	switch strings.ToLower(unit) {
	case "":
	case "b", "bytes":
		mult = 1
	case "k", "kib":
		mult = 1 << 10
	case "kb":
		mult = 1000
	case "m", "mib":
		mult = 1 << 20
	case "mb":
		mult = 1000 * 1000
	case "g", "gib":
		mult = 1 << 30
	case "gb":
		mult = 1000 * 1000 * 1000
	case "t", "tib":
		mult = 1 << 40
	case "tb":
		mult = 1000 * 1000 * 1000 * 1000
	}
	return v * mult
}

// volumeRead is what the adapter reads from volume XML.
type volumeRead struct {
	capacity      uint64
	path          string
	format        string
	backingFormat string
}

func parseVolume(s string) (*volumeRead, error) {
	var v libvirtxml.StorageVolume
	if err := v.Unmarshal(s); err != nil {
		return nil, fmt.Errorf("parse volume XML: %w", err)
	}
	out := &volumeRead{}
	if v.Capacity != nil {
		out.capacity = scaled(v.Capacity.Value, v.Capacity.Unit, 1)
	}
	if v.Target != nil {
		out.path = v.Target.Path
		if v.Target.Format != nil {
			out.format = v.Target.Format.Type
		}
	}
	if v.BackingStore != nil && v.BackingStore.Format != nil {
		out.backingFormat = v.BackingStore.Format.Type
	}
	return out, nil
}

// overlayDefinition renders a qcow2 overlay volume backed by basePath in
// baseFormat.
func overlayDefinition(name string, capacity uint64, basePath, baseFormat string) (string, error) {
	v := libvirtxml.StorageVolume{
		Name:         name,
		Capacity:     &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacity},
		Allocation:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: 0},
		Target:       &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}},
		BackingStore: &libvirtxml.StorageVolumeBackingStore{Path: basePath, Format: &libvirtxml.StorageVolumeTargetFormat{Type: baseFormat}},
	}
	s, err := v.Marshal()
	if err != nil {
		return "", fmt.Errorf("marshal volume %s: %w", name, err)
	}
	return s, nil
}

// rawDefinition renders a raw volume of exactly size bytes.
func rawDefinition(name string, size uint64) (string, error) {
	v := libvirtxml.StorageVolume{
		Name:       name,
		Capacity:   &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: size},
		Allocation: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: size},
		Target:     &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "raw"}},
	}
	s, err := v.Marshal()
	if err != nil {
		return "", fmt.Errorf("marshal volume %s: %w", name, err)
	}
	return s, nil
}
