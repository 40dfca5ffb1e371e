package inventory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/hashicorp/go-multierror"
)

// InstanceType is a named VM flavour. Source is what the hypervisor
// clones a VM of this type from, opaque to the core: what the plug-in's
// CatalogRules.Source made of the entry's template_vmid key (a Proxmox
// template VMID); zero for hypervisors that build VMs from an image.
type InstanceType struct {
	Name      string `json:"name"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int    `json:"memory_mib"`
	Source    int    `json:"template_vmid,omitempty"`
}

// Catalog maps an instance-type name to its definition; the key always
// equals the value's Name.
type Catalog map[string]InstanceType

// CatalogRules is what a hypervisor says about its instance types.
type CatalogRules struct {
	// Prefix starts the built-in types' names: Prefix+"small", "medium",
	// "large" and "xlarge".
	Prefix string
	// DefaultSource is the Source of the built-in types.
	DefaultSource int
	// Source reads an entry's optional template_vmid key (nil: absent)
	// and returns the type's Source, or why the key is refused.
	Source func(v *int) (int, error)
	// Keys lists the keys an entry allows, for the strict-decoding error
	// ("vcpu, memory_mib").
	Keys string
}

// Builtin returns the built-in catalog of a hypervisor: r.Prefix followed
// by small, medium, large and xlarge, all with r.DefaultSource.
func Builtin(r CatalogRules) Catalog {
	c := Catalog{}
	for _, s := range []struct {
		size      string
		vcpu, mib int
	}{{"small", 2, 4096}, {"medium", 4, 8192}, {"large", 8, 16384}, {"xlarge", 16, 32768}} {
		name := r.Prefix + s.size
		c[name] = InstanceType{Name: name, VCPU: s.vcpu, MemoryMiB: s.mib, Source: r.DefaultSource}
	}
	return c
}

// Names returns the catalog's type names in byte-wise order.
func (c Catalog) Names() []string {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// BySize returns the catalog's types ordered by vCPU count, then name.
func (c Catalog) BySize() []InstanceType {
	types := make([]InstanceType, 0, len(c))
	for _, it := range c {
		types = append(types, it)
	}
	sort.Slice(types, func(i, j int) bool {
		if types[i].VCPU != types[j].VCPU {
			return types[i].VCPU < types[j].VCPU
		}
		return types[i].Name < types[j].Name
	})
	return types
}

// catalogEntry is the JSON form of one catalog entry. Pointers tell an
// omitted key from a zero value.
type catalogEntry struct {
	VCPU         *int `json:"vcpu"`
	MemoryMiB    *int `json:"memory_mib"`
	TemplateVMID *int `json:"template_vmid"`
}

// LoadCatalog reads and parses a catalog file (see ParseCatalog): a
// regular file of at most conffile.MaxJSONBytes. Every problem is reported
// on its own, led by the file's path.
func LoadCatalog(path string, r CatalogRules) (Catalog, error) {
	data, err := conffile.Read(path, conffile.MaxJSONBytes)
	if err != nil {
		return nil, fmt.Errorf("read instance types: %w", err)
	}
	c, err := ParseCatalog(data, r)
	if err != nil {
		return nil, inFile(path, err)
	}
	return c, nil
}

// ParseCatalog decodes a JSON object of name -> {vcpu, memory_mib[,
// template_vmid]} that replaces the built-in catalog. Decoding is strict:
// unknown keys, a key given twice in one object (a type name included),
// trailing data and an empty object are errors. vcpu and memory_mib are
// required, positive and at most MaxVCPU and MaxMemoryMiB. template_vmid
// is what r.Source makes of it. Every problem found is reported.
func ParseCatalog(data []byte, r CatalogRules) (Catalog, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil {
		return nil, notJSON(err)
	} else if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New(`must be a JSON object of name -> {"vcpu": N, "memory_mib": N}`)
	}
	var errs *multierror.Error
	for _, err := range duplicateKeys(data) {
		errs = multierror.Append(errs, err)
	}
	c := Catalog{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notJSON(err)
		}
		name := tok.(string) // object keys are always strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("instance type %q: %w", name, notJSON(err))
		}
		if seen[name] {
			continue // duplicateKeys reported it, with both lines
		}
		seen[name] = true
		if err := ValidateTypeName(name); err != nil {
			errs = multierror.Append(errs, err)
		}
		it, err := parseCatalogEntry(name, raw, r)
		if err != nil {
			errs = multierror.Append(errs, err)
			continue
		}
		c[name] = it
	}
	if _, err := dec.Token(); err != nil {
		return nil, notJSON(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the catalog object; the file must hold exactly one JSON object")
	}
	if len(seen) == 0 {
		return nil, errors.New("defines no instance types; add at least one or omit --instance-types to use the built-in catalog")
	}
	if err := finish(errs); err != nil {
		return nil, err
	}
	return c, nil
}

func parseCatalogEntry(name string, raw json.RawMessage, r CatalogRules) (InstanceType, error) {
	var errs *multierror.Error
	var e catalogEntry
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return InstanceType{}, fmt.Errorf("instance type %q: %v (allowed keys: %s)", name, jsonError(err), r.Keys)
	}
	it := InstanceType{Name: name}
	if e.VCPU == nil {
		errs = multierror.Append(errs, errors.New("vcpu is required"))
	} else {
		it.VCPU = *e.VCPU
		if err := CheckVCPU(it.VCPU); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if e.MemoryMiB == nil {
		errs = multierror.Append(errs, errors.New("memory_mib is required"))
	} else {
		it.MemoryMiB = *e.MemoryMiB
		if err := CheckMemoryMiB(it.MemoryMiB); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if r.Source != nil {
		src, err := r.Source(e.TemplateVMID)
		if err != nil {
			errs = multierror.Append(errs, err)
		}
		it.Source = src
	} else if e.TemplateVMID != nil {
		errs = multierror.Append(errs, errors.New("template_vmid is not a setting of this hypervisor; remove the key"))
	}
	if errs != nil {
		return InstanceType{}, prefixed(fmt.Sprintf("instance type %q", name), errs.Errors)
	}
	return it, nil
}

// Allocatable is the hardware capacity of one machine of type it, as
// Kubernetes quantities: cpu is the vCPU count; memory is "<n>Gi" when the
// memory is a whole number of GiB, else "<n>Mi", so it round-trips exactly.
func Allocatable(it InstanceType) map[string]string {
	mem := strconv.Itoa(it.MemoryMiB) + "Mi"
	if it.MemoryMiB%1024 == 0 {
		mem = strconv.Itoa(it.MemoryMiB/1024) + "Gi"
	}
	return map[string]string{"cpu": strconv.Itoa(it.VCPU), "memory": mem}
}
