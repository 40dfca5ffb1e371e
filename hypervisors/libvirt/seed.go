package libvirt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/kdomanski/iso9660"
	"gopkg.in/yaml.v3"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/naming"
)

// seedLabel is the volume label cloud-init's NoCloud datasource looks for.
const seedLabel = "cidata"

// defaultUserData is written when a SeedSpec carries no user-data.
const defaultUserData = "#cloud-config\n"

// Seed volumes are the NoCloud ISO followed by one trailer sector that
// records what the ISO was built from (hypervisors.SeedIdentity), its
// length and its SHA-256. ISO 9660 readers stop at the volume space size
// the ISO declares, so the guest never sees the trailer. The trailer is
// the last thing one sequential upload writes: a volume that was created
// but never (or only partly) uploaded has none and observes with an empty
// identity, so the planner rebuilds it instead of attaching it.
const (
	trailerSize  = 2048
	trailerMagic = "BIGFLEET-SEED v1\n"
)

// metaDataDoc is NoCloud meta-data.
type metaDataDoc struct {
	InstanceID    string `yaml:"instance-id"`
	LocalHostname string `yaml:"local-hostname"`
}

// metaData renders NoCloud meta-data as YAML; yaml.v3 quotes whatever
// needs quoting.
func metaData(instanceID, hostname string) (string, error) {
	b, err := yaml.Marshal(metaDataDoc{InstanceID: instanceID, LocalHostname: hostname})
	if err != nil {
		return "", fmt.Errorf("render meta-data: %w", err)
	}
	return string(b), nil
}

// buildISO builds the NoCloud ISO (label "cidata", files user-data and
// meta-data) for spec.
func buildISO(spec hypervisors.SeedSpec) ([]byte, error) {
	if spec.InstanceID == "" || spec.Hostname == "" {
		return nil, fmt.Errorf("seed %s: instance id and hostname are required: %w", spec.Name, hypervisors.ErrInvalid)
	}
	userData := spec.UserData
	if userData == "" {
		userData = defaultUserData
	}
	md, err := metaData(spec.InstanceID, spec.Hostname)
	if err != nil {
		return nil, fmt.Errorf("seed %s: %w", spec.Name, err)
	}
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("seed %s: new ISO writer: %w", spec.Name, err)
	}
	defer func() { _ = w.Cleanup() }()
	if err := w.AddFile(strings.NewReader(userData), "user-data"); err != nil {
		return nil, fmt.Errorf("seed %s: add user-data: %w", spec.Name, err)
	}
	if err := w.AddFile(strings.NewReader(md), "meta-data"); err != nil {
		return nil, fmt.Errorf("seed %s: add meta-data: %w", spec.Name, err)
	}
	var buf bytes.Buffer
	if err := w.WriteTo(&buf, seedLabel); err != nil {
		return nil, fmt.Errorf("seed %s: write ISO: %w", spec.Name, err)
	}
	return buf.Bytes(), nil
}

// buildSeed returns the bytes of a seed volume: the ISO plus its trailer.
func buildSeed(spec hypervisors.SeedSpec) ([]byte, error) {
	iso, err := buildISO(spec)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(iso)
	t := trailerMagic +
		"identity=" + hypervisors.SeedIdentity(spec) + "\n" +
		"iso-bytes=" + strconv.Itoa(len(iso)) + "\n" +
		"iso-sha256=" + hex.EncodeToString(sum[:]) + "\n"
	out := make([]byte, len(iso)+trailerSize)
	copy(out, iso)
	copy(out[len(iso):], t)
	return out, nil
}

// seedIdentity reads the identity from a seed volume's last trailerSize
// bytes, given the volume's capacity. It is "" unless the trailer is
// intact and its recorded ISO length accounts for the whole volume.
func seedIdentity(tail []byte, capacity uint64) string {
	if len(tail) != trailerSize || !bytes.HasPrefix(tail, []byte(trailerMagic)) {
		return ""
	}
	body, _, _ := bytes.Cut(tail[len(trailerMagic):], []byte{0})
	fields := map[string]string{}
	for _, line := range strings.Split(string(body), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			fields[k] = v
		}
	}
	n, err := strconv.ParseUint(fields["iso-bytes"], 10, 64)
	if err != nil || n+trailerSize != capacity || len(fields["iso-sha256"]) != 64 {
		return ""
	}
	id := fields["identity"]
	if !strings.HasPrefix(id, "seed1-") || len(id) > 64 {
		return ""
	}
	return id
}

// isSeedVolume reports whether a volume name is a seed volume's.
func isSeedVolume(name string) bool { return strings.HasSuffix(name, naming.SeedVolume("")) }
