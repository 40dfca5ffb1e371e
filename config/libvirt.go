package config

import (
	"path"
	"strings"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvuri"
	"github.com/bigfleet-vm/provider/inventory"
)

// resolveLibvirt fills c.Libvirt. It returns the --connect zones when the
// real backend is selected and --connect parsed cleanly (else nil), and
// the capacity type of the default offerings.
func (f *Flags) resolveLibvirt(c *Config, real bool, defaultZone string, p *problems) ([]string, inventory.CapacityType) {
	l := &c.Libvirt
	conns, connErr := lvuri.ParseConnect(*f.connect, defaultZone)
	if connErr != nil {
		p.addErr("connect", connErr)
	}
	l.Connect = conns
	if real && strings.TrimSpace(*f.connect) == "" {
		p.add("connect", "is required by the libvirt backend: pass one URI such as qemu:///system, or zone=uri pairs such as rack1=qemu+libssh://bigfleet@host-a/system?keyfile=...&known_hosts=...")
	}
	l.Image = strings.TrimSpace(*f.image)
	if real && l.Image == "" {
		p.add("image", "is required by the libvirt backend: name the golden base-image volume in --storage-pool, e.g. ubuntu-24.04.qcow2")
	}
	l.StoragePool, l.ZonePools = parseStoragePool(*f.storagePool, conns, p)
	l.Network = strings.TrimSpace(*f.network)
	if l.Network == "" {
		p.add("network", "is empty; name the libvirt network the NIC attaches to (default: default)")
	}
	switch dt := strings.ToLower(strings.TrimSpace(*f.domainType)); dt {
	case "kvm", "qemu":
		l.DomainType = dt
	default:
		p.add("domain-type", "unknown domain type %q; use kvm (hardware virtualisation) or qemu (emulation)", *f.domainType)
	}
	l.Kernel, l.Initrd, l.Cmdline = *f.kernel, *f.initrd, *f.kernelCmdline
	l.CallTimeout = *f.libvirtCallTimeout
	p.duration("libvirt-call-timeout", l.CallTimeout)
	for _, k := range []struct{ name, v string }{{"kernel", l.Kernel}, {"initrd", l.Initrd}} {
		if k.v != "" && !path.IsAbs(k.v) {
			p.add(k.name, "%q must be an absolute path on the libvirt host", k.v)
		}
	}
	if l.Kernel == "" {
		for _, k := range []struct{ name, v string }{{"initrd", l.Initrd}, {"kernel-cmdline", l.Cmdline}} {
			if k.v != "" {
				p.add(k.name, "only applies to direct kernel boot; also pass --kernel, or drop it")
			}
		}
	}
	if *f.baseUserData != "" {
		data, err := conffile.Read(*f.baseUserData, conffile.MaxUserDataBytes)
		if err != nil {
			p.add("base-user-data", "cannot read the cloud-init file: %v", err)
		}
		l.BaseUserData = data
	}
	capacity, err := inventory.ParseCapacityType(*f.capacityType, c.Hypervisor)
	if err != nil {
		p.addErr("capacity-type", err)
		capacity = inventory.OnDemand
	}
	if !real || connErr != nil || len(conns) == 0 {
		return nil, capacity
	}
	zones := make([]string, len(conns))
	for i, zu := range conns {
		zones[i] = zu.Zone
	}
	return zones, capacity
}

// parseStoragePool reads --storage-pool: one pool for every host, or
// zone=pool pairs (hosts not named use "default").
func parseStoragePool(v string, conns []ZoneURI, p *problems) (string, map[string]string) {
	v = strings.TrimSpace(v)
	if v == "" {
		p.add("storage-pool", "is empty; name the libvirt storage pool for overlay and seed volumes (default: default)")
		return "", nil
	}
	if !strings.Contains(v, "=") {
		return v, nil
	}
	zones := map[string]bool{}
	for _, c := range conns {
		zones[c.Zone] = true
	}
	pools := map[string]string{}
	for _, entry := range strings.Split(v, ",") {
		zone, pool, ok := strings.Cut(strings.TrimSpace(entry), "=")
		zone, pool = strings.TrimSpace(zone), strings.TrimSpace(pool)
		switch {
		case !ok || zone == "" || pool == "":
			p.add("storage-pool", "entry %q is not zone=pool", entry)
		case pools[zone] != "":
			p.add("storage-pool", "zone %q is named twice", zone)
		case len(conns) > 0 && !zones[zone]:
			p.add("storage-pool", "zone %q is not a --connect zone", zone)
		default:
			pools[zone] = pool
		}
	}
	return "default", pools
}
