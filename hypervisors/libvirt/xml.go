package libvirt

import (
	"encoding/xml"
	"fmt"
	"strings"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/observed"
)

// Namespace is the XML namespace of the ownership metadata element.
const Namespace = "https://bigfleet-vm.dev/provider/v1"

// nsPrefix is the prefix libvirt stores the metadata element under.
const nsPrefix = "bf"

// GuestAgentChannel is the virtio-serial port name of the qemu guest agent.
const GuestAgentChannel = "org.qemu.guest_agent.0"

// markerXML is the body of the metadata element. Define writes it with the
// bf prefix; DomainSetMetadata is given it unprefixed (libvirt adds the
// namespace); readers match it by namespace, whatever the prefix.
type markerXML struct {
	XMLName      xml.Name `xml:"marker"`
	Installation string   `xml:"installation"`
	MachineID    string   `xml:"machine-id"`
	OpID         string   `xml:"op-id,omitempty"`
	InstanceType string   `xml:"instance-type,omitempty"`
	Cluster      string   `xml:"cluster,omitempty"`
}

// markerDefineXML is markerXML as it appears inside <metadata> of a
// definition: a prefixed element declaring the namespace.
type markerDefineXML struct {
	XMLName      xml.Name `xml:"bf:marker"`
	NS           string   `xml:"xmlns:bf,attr"`
	Installation string   `xml:"bf:installation"`
	MachineID    string   `xml:"bf:machine-id"`
	OpID         string   `xml:"bf:op-id,omitempty"`
	InstanceType string   `xml:"bf:instance-type,omitempty"`
	Cluster      string   `xml:"bf:cluster,omitempty"`
}

func toMarkerXML(m observed.Marker) markerXML {
	return markerXML{Installation: m.Installation, MachineID: m.MachineID, OpID: m.OpID,
		InstanceType: m.InstanceType, Cluster: m.Cluster}
}

// markerBody renders the element DomainSetMetadata takes.
func markerBody(m observed.Marker) (string, error) {
	b, err := xml.Marshal(toMarkerXML(m))
	if err != nil {
		return "", fmt.Errorf("marshal marker: %w", err)
	}
	return string(b), nil
}

// Domain XML (the subset this adapter writes).
type domainXML struct {
	XMLName       xml.Name     `xml:"domain"`
	Type          string       `xml:"type,attr"`
	Name          string       `xml:"name"`
	Metadata      *metadataXML `xml:"metadata,omitempty"`
	Memory        sizeXML      `xml:"memory"`
	CurrentMemory sizeXML      `xml:"currentMemory"`
	VCPU          int          `xml:"vcpu"`
	OS            osXML        `xml:"os"`
	Features      featuresXML  `xml:"features"`
	Clock         clockXML     `xml:"clock"`
	OnPoweroff    string       `xml:"on_poweroff"`
	OnReboot      string       `xml:"on_reboot"`
	OnCrash       string       `xml:"on_crash"`
	Devices       devicesXML   `xml:"devices"`
}

type metadataXML struct {
	Marker markerDefineXML
}

type sizeXML struct {
	Unit  string `xml:"unit,attr,omitempty"`
	Value uint64 `xml:",chardata"`
}

type osXML struct {
	Type    osTypeXML `xml:"type"`
	Kernel  string    `xml:"kernel,omitempty"`
	Initrd  string    `xml:"initrd,omitempty"`
	Cmdline string    `xml:"cmdline,omitempty"`
	Boot    []bootXML `xml:"boot,omitempty"`
}

type osTypeXML struct {
	Arch    string `xml:"arch,attr"`
	Machine string `xml:"machine,attr,omitempty"`
	Value   string `xml:",chardata"`
}

type bootXML struct {
	Dev string `xml:"dev,attr"`
}

type featuresXML struct {
	ACPI *struct{} `xml:"acpi"`
	APIC *struct{} `xml:"apic"`
}

type clockXML struct {
	Offset string `xml:"offset,attr"`
}

type devicesXML struct {
	Disks      []diskXML      `xml:"disk"`
	Interfaces []interfaceXML `xml:"interface"`
	Channels   []channelXML   `xml:"channel"`
	Serials    []serialXML    `xml:"serial"`
	Consoles   []consoleXML   `xml:"console"`
}

type diskXML struct {
	Type     string         `xml:"type,attr"`
	Device   string         `xml:"device,attr"`
	Driver   *diskDriverXML `xml:"driver"`
	Source   diskSourceXML  `xml:"source"`
	Target   diskTargetXML  `xml:"target"`
	ReadOnly *struct{}      `xml:"readonly"`
}

type diskDriverXML struct {
	Name string `xml:"name,attr"`
	Type string `xml:"type,attr"`
}

type diskSourceXML struct {
	Pool   string `xml:"pool,attr,omitempty"`
	Volume string `xml:"volume,attr,omitempty"`
	File   string `xml:"file,attr,omitempty"`
}

type diskTargetXML struct {
	Dev string `xml:"dev,attr"`
	Bus string `xml:"bus,attr"`
}

type interfaceXML struct {
	Type   string              `xml:"type,attr"`
	Source *interfaceSourceXML `xml:"source"`
	Model  modelXML            `xml:"model"`
}

type interfaceSourceXML struct {
	Network string `xml:"network,attr"`
}

type modelXML struct {
	Type string `xml:"type,attr"`
}

type channelXML struct {
	Type   string           `xml:"type,attr"`
	Target channelTargetXML `xml:"target"`
}

type channelTargetXML struct {
	Type string `xml:"type,attr"`
	Name string `xml:"name,attr"`
}

type serialXML struct {
	Type   string          `xml:"type,attr"`
	Target serialTargetXML `xml:"target"`
}

type serialTargetXML struct {
	Port int `xml:"port,attr"`
}

type consoleXML struct {
	Type   string           `xml:"type,attr"`
	Target consoleTargetXML `xml:"target"`
}

type consoleTargetXML struct {
	Type string `xml:"type,attr"`
	Port int    `xml:"port,attr"`
}

// domainDefinition renders a DomainSpec as libvirt domain XML. defaultType
// and defaultNetwork apply when the spec leaves them empty. It is a pure
// function of its arguments.
func domainDefinition(spec hypervisors.DomainSpec, defaultType, defaultNetwork string) (string, error) {
	if spec.Name == "" || spec.VCPU <= 0 || spec.MemoryMiB <= 0 || spec.Pool == "" || spec.Overlay == "" {
		return "", fmt.Errorf("domain spec %q: name, vcpu, memory, pool and overlay are required: %w", spec.Name, hypervisors.ErrInvalid)
	}
	if spec.Marker.Installation == "" || spec.Marker.MachineID == "" {
		return "", fmt.Errorf("domain spec %q: marker needs installation and machine id: %w", spec.Name, hypervisors.ErrInvalid)
	}
	typ := spec.DomainType
	if typ == "" {
		typ = defaultType
	}
	if typ != "kvm" && typ != "qemu" {
		return "", fmt.Errorf("domain spec %q: domain type %q is not kvm or qemu: %w", spec.Name, typ, hypervisors.ErrInvalid)
	}
	network := spec.Network
	if network == "" {
		network = defaultNetwork
	}
	m := spec.Marker
	d := domainXML{
		Type: typ,
		Name: spec.Name,
		Metadata: &metadataXML{Marker: markerDefineXML{
			NS: Namespace, Installation: m.Installation, MachineID: m.MachineID,
			OpID: m.OpID, InstanceType: m.InstanceType, Cluster: m.Cluster,
		}},
		Memory:        sizeXML{Unit: "MiB", Value: uint64(spec.MemoryMiB)},
		CurrentMemory: sizeXML{Unit: "MiB", Value: uint64(spec.MemoryMiB)},
		VCPU:          spec.VCPU,
		OS: osXML{
			Type:    osTypeXML{Arch: "x86_64", Machine: "q35", Value: "hvm"},
			Kernel:  spec.Kernel,
			Initrd:  spec.Initrd,
			Cmdline: spec.Cmdline,
		},
		Features:   featuresXML{ACPI: &struct{}{}, APIC: &struct{}{}},
		Clock:      clockXML{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
	}
	if spec.Kernel == "" {
		d.OS.Boot = []bootXML{{Dev: "hd"}}
	}
	d.Devices.Disks = append(d.Devices.Disks, diskXML{
		Type: "volume", Device: "disk",
		Driver: &diskDriverXML{Name: "qemu", Type: "qcow2"},
		Source: diskSourceXML{Pool: spec.Pool, Volume: spec.Overlay},
		Target: diskTargetXML{Dev: "vda", Bus: "virtio"},
	})
	if spec.Seed != "" {
		d.Devices.Disks = append(d.Devices.Disks, diskXML{
			Type: "volume", Device: "cdrom",
			Driver:   &diskDriverXML{Name: "qemu", Type: "raw"},
			Source:   diskSourceXML{Pool: spec.Pool, Volume: spec.Seed},
			Target:   diskTargetXML{Dev: "sda", Bus: "sata"},
			ReadOnly: &struct{}{},
		})
	}
	if network == "" || network == "user" {
		d.Devices.Interfaces = []interfaceXML{{Type: "user", Model: modelXML{Type: "virtio"}}}
	} else {
		d.Devices.Interfaces = []interfaceXML{{Type: "network", Source: &interfaceSourceXML{Network: network}, Model: modelXML{Type: "virtio"}}}
	}
	d.Devices.Channels = []channelXML{{Type: "unix", Target: channelTargetXML{Type: "virtio", Name: GuestAgentChannel}}}
	d.Devices.Serials = []serialXML{{Type: "pty", Target: serialTargetXML{Port: 0}}}
	d.Devices.Consoles = []consoleXML{{Type: "pty", Target: consoleTargetXML{Type: "serial", Port: 0}}}
	b, err := xml.MarshalIndent(d, "", "  ")
	if err != nil {
		return "", fmt.Errorf("marshal domain %s: %w", spec.Name, err)
	}
	return string(b), nil
}

// domainRead is what Observe and Lookup read from a domain's XML.
type domainRead struct {
	Name     string  `xml:"name"`
	UUID     string  `xml:"uuid"`
	Memory   sizeXML `xml:"memory"`
	VCPU     int     `xml:"vcpu"`
	Metadata struct {
		Markers []markerXML `xml:"https://bigfleet-vm.dev/provider/v1 marker"`
	} `xml:"metadata"`
	Disks []struct {
		Source diskSourceXML `xml:"source"`
	} `xml:"devices>disk"`
}

// parseDomain reads the fields the adapter needs from domain XML.
func parseDomain(s string) (*domainRead, error) {
	var d domainRead
	if err := xml.Unmarshal([]byte(s), &d); err != nil {
		return nil, fmt.Errorf("parse domain XML: %w", err)
	}
	return &d, nil
}

// marker returns the domain's ownership marker, or nil if it has none.
func (d *domainRead) marker() *observed.Marker {
	for _, m := range d.Metadata.Markers {
		if m.Installation == "" || m.MachineID == "" {
			continue
		}
		return &observed.Marker{Installation: m.Installation, MachineID: m.MachineID,
			OpID: m.OpID, InstanceType: m.InstanceType, Cluster: m.Cluster}
	}
	return nil
}

// memoryMiB converts the <memory> element to MiB.
func (d *domainRead) memoryMiB() int {
	return int(toBytes(d.Memory) >> 20)
}

// volumes lists the volume (or file base) names the disks point at.
func (d *domainRead) volumes() []string {
	var out []string
	for _, disk := range d.Disks {
		switch {
		case disk.Source.Volume != "":
			out = append(out, disk.Source.Volume)
		case disk.Source.File != "":
			out = append(out, disk.Source.File[strings.LastIndex(disk.Source.File, "/")+1:])
		}
	}
	return out
}

// toBytes converts a libvirt scaled integer (default unit KiB for memory;
// callers of volumes always get unit='bytes') to bytes.
func toBytes(s sizeXML) uint64 {
	mult := uint64(1)
	switch strings.ToLower(s.Unit) {
	case "b", "bytes":
	case "", "k", "kib":
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
	}
	return s.Value * mult
}

// Volume XML (create and read).
type volumeXML struct {
	XMLName      xml.Name       `xml:"volume"`
	Type         string         `xml:"type,attr,omitempty"`
	Name         string         `xml:"name"`
	Key          string         `xml:"key,omitempty"`
	Capacity     volSizeXML     `xml:"capacity"`
	Allocation   *volSizeXML    `xml:"allocation,omitempty"`
	Target       volTargetXML   `xml:"target"`
	BackingStore *volBackingXML `xml:"backingStore,omitempty"`
}

type volSizeXML struct {
	Unit  string `xml:"unit,attr,omitempty"`
	Value uint64 `xml:",chardata"`
}

type volTargetXML struct {
	Path   string     `xml:"path,omitempty"`
	Format *formatXML `xml:"format,omitempty"`
}

type volBackingXML struct {
	Path   string     `xml:"path"`
	Format *formatXML `xml:"format,omitempty"`
}

type formatXML struct {
	Type string `xml:"type,attr"`
}

// volumeBytes returns a volume size in bytes (libvirt's default unit for
// volumes is bytes).
func volumeBytes(s volSizeXML) uint64 {
	if s.Unit == "" {
		return s.Value
	}
	return toBytes(sizeXML{Unit: s.Unit, Value: s.Value})
}

func parseVolume(s string) (*volumeXML, error) {
	var v volumeXML
	if err := xml.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("parse volume XML: %w", err)
	}
	return &v, nil
}

func (v *volumeXML) format() string {
	if v.Target.Format == nil {
		return ""
	}
	return v.Target.Format.Type
}

func (v *volumeXML) backingFormat() string {
	if v.BackingStore == nil || v.BackingStore.Format == nil {
		return ""
	}
	return v.BackingStore.Format.Type
}

// overlayDefinition renders a qcow2 overlay volume backed by basePath in
// baseFormat.
func overlayDefinition(name string, capacity uint64, basePath, baseFormat string) (string, error) {
	v := volumeXML{
		Name:         name,
		Capacity:     volSizeXML{Unit: "bytes", Value: capacity},
		Allocation:   &volSizeXML{Unit: "bytes", Value: 0},
		Target:       volTargetXML{Format: &formatXML{Type: "qcow2"}},
		BackingStore: &volBackingXML{Path: basePath, Format: &formatXML{Type: baseFormat}},
	}
	b, err := xml.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("marshal volume %s: %w", name, err)
	}
	return string(b), nil
}

// rawDefinition renders a raw volume of exactly size bytes.
func rawDefinition(name string, size uint64) (string, error) {
	v := volumeXML{
		Name:       name,
		Capacity:   volSizeXML{Unit: "bytes", Value: size},
		Allocation: &volSizeXML{Unit: "bytes", Value: size},
		Target:     volTargetXML{Format: &formatXML{Type: "raw"}},
	}
	b, err := xml.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("marshal volume %s: %w", name, err)
	}
	return string(b), nil
}
