package libvirt

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/kdomanski/iso9660"
	"gopkg.in/yaml.v3"

	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/hypervisors/libvirt/lvspec"
)

// seedLabel is the volume label cloud-init's NoCloud datasource looks for.
const seedLabel = "cidata"

// defaultUserData is written when a SeedSpec carries no user-data.
const defaultUserData = "#cloud-config\n"

// A seed volume is the NoCloud ISO. What it was built from
// (lvspec.SeedIdentity) and its size in bytes are carried by the name
// of an empty sibling volume, its identity tag:
//
//	<seed volume name>.<identity>.<bytes>
//
// so that observation reads a seed's identity from the pool's volume
// listing, never from the volume's bytes (a download stream per seed, which
// go-libvirt mishandles: docs/libvirt-connections.md). CreateSeed removes the
// seed's tags before it writes the volume and adds the tag after the
// upload completed, so a seed created but never (or only partly) uploaded
// has no tag and observes with an empty identity: the planner rebuilds it
// instead of attaching it. A tag whose size differs from the volume's (the
// volume was replaced out of band) does not count either. DeleteVolume
// removes a seed's tags before the seed, so a crash between the two leaves
// no tag without its seed.
const tagSep = "."

// seedTag is the name of the identity tag of seed (a volume name) built
// from identity, size bytes long.
func seedTag(seed, identity string, size uint64) string {
	return seed + tagSep + identity + tagSep + strconv.FormatUint(size, 10)
}

// seedTagInfo is what an identity tag's name says.
type seedTagInfo struct {
	name, seed, identity string
	size                 uint64
}

// parseSeedTag reads a volume name as an identity tag.
func parseSeedTag(name string) (seedTagInfo, bool) {
	suffix := lvspec.SeedVolume("") + tagSep
	i := strings.LastIndex(name, suffix)
	if i < 0 {
		return seedTagInfo{}, false
	}
	seed, rest := name[:i+len(suffix)-len(tagSep)], name[i+len(suffix):]
	id, size, ok := strings.Cut(rest, tagSep)
	if !ok || !validIdentity(id) {
		return seedTagInfo{}, false
	}
	n, err := strconv.ParseUint(size, 10, 64)
	if err != nil || strconv.FormatUint(n, 10) != size {
		return seedTagInfo{}, false
	}
	return seedTagInfo{name: name, seed: seed, identity: id, size: n}, true
}

// validIdentity reports whether id has the form lvspec.SeedIdentity
// gives: "seed1-" and 32 lowercase hex digits.
func validIdentity(id string) bool {
	h, ok := strings.CutPrefix(id, "seed1-")
	if !ok || len(h) != 32 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// seedTags groups the identity tags among a listing by seed name.
func seedTags(names []string) map[string][]seedTagInfo {
	out := map[string][]seedTagInfo{}
	for _, n := range names {
		if t, ok := parseSeedTag(n); ok {
			out[t.seed] = append(out[t.seed], t)
		}
	}
	return out
}

// seedIdentity is the identity of a seed volume of capacity bytes given
// its tags: the one tag's identity when there is exactly one and it
// records that size, else "".
func seedIdentity(tags []seedTagInfo, capacity uint64) string {
	if len(tags) != 1 || tags[0].size != capacity {
		return ""
	}
	return tags[0].identity
}

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
func buildISO(spec lvspec.SeedSpec) ([]byte, error) {
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

// buildSeed returns the bytes of a seed volume: the NoCloud ISO.
func buildSeed(spec lvspec.SeedSpec) ([]byte, error) { return buildISO(spec) }

// isSeedVolume reports whether a volume name is a seed volume's.
func isSeedVolume(name string) bool { return strings.HasSuffix(name, lvspec.SeedVolume("")) }
