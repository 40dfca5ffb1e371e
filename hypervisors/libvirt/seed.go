package libvirt

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/kdomanski/iso9660"

	"github.com/bigfleet-vm/provider/hypervisors"
)

// seedLabel is the volume label cloud-init's NoCloud datasource looks for.
const seedLabel = "cidata"

// defaultUserData is written when a SeedSpec carries no user-data.
const defaultUserData = "#cloud-config\n"

// metaData renders NoCloud meta-data. Values are quoted as YAML strings.
func metaData(instanceID, hostname string) string {
	return fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", yamlQuote(instanceID), yamlQuote(hostname))
}

// yamlQuote renders s as a double-quoted YAML scalar.
func yamlQuote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\r", `\r`, "\t", `\t`)
	return `"` + r.Replace(s) + `"`
}

// buildSeed builds the NoCloud ISO (label "cidata", files user-data and
// meta-data) for spec.
func buildSeed(spec hypervisors.SeedSpec) ([]byte, error) {
	if spec.InstanceID == "" || spec.Hostname == "" {
		return nil, fmt.Errorf("seed %s: instance id and hostname are required: %w", spec.Name, hypervisors.ErrInvalid)
	}
	userData := spec.UserData
	if userData == "" {
		userData = defaultUserData
	}
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("seed %s: new ISO writer: %w", spec.Name, err)
	}
	defer func() { _ = w.Cleanup() }()
	if err := w.AddFile(strings.NewReader(userData), "user-data"); err != nil {
		return nil, fmt.Errorf("seed %s: add user-data: %w", spec.Name, err)
	}
	if err := w.AddFile(strings.NewReader(metaData(spec.InstanceID, spec.Hostname)), "meta-data"); err != nil {
		return nil, fmt.Errorf("seed %s: add meta-data: %w", spec.Name, err)
	}
	var buf bytes.Buffer
	if err := w.WriteTo(&buf, seedLabel); err != nil {
		return nil, fmt.Errorf("seed %s: write ISO: %w", spec.Name, err)
	}
	return buf.Bytes(), nil
}
