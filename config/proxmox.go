package config

import (
	"encoding/hex"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"
	"unicode"

	"github.com/bigfleet-vm/provider/conffile"
	"github.com/bigfleet-vm/provider/hypervisors"
	"github.com/bigfleet-vm/provider/inventory"
)

// tokenIDRE is the USER@REALM!TOKENID shape of a Proxmox API token id.
var tokenIDRE = regexp.MustCompile(`^[^\s@!=]+@[^\s@!=]+![^\s@!=]+$`)

// resolveProxmox fills c.Proxmox. It returns --nodes when the real
// backend is selected and the nodes parsed cleanly (else nil). The token
// secret never reaches an error message.
func (f *Flags) resolveProxmox(c *Config, set map[string]bool, real bool, p *problems) []string {
	x := &c.Proxmox
	x.TemplateVMID = *f.templateVMID
	p.integer("template-vmid", x.TemplateVMID)
	x.Pool = strings.TrimSpace(*f.pool)
	if strings.ContainsAny(x.Pool, "/,") || strings.ContainsFunc(x.Pool, unicode.IsSpace) {
		p.add("proxmox-pool", "%q is not a Proxmox pool name (no '/', ',' or whitespace)", x.Pool)
	}
	x.BootstrapPath = *f.bootstrapPath
	if !path.IsAbs(x.BootstrapPath) {
		p.add("bootstrap-path", "%q must be an absolute in-guest path, e.g. /run/bigfleet-bootstrap", x.BootstrapPath)
	}
	if argv, err := parseArgv(*f.bootstrapExec); err != nil {
		p.add("bootstrap-exec", "%v", err)
	} else {
		x.BootstrapExec = argv
	}
	x.PollInterval = *f.pollInterval
	p.duration("proxmox-poll-interval", x.PollInterval)

	if raw := strings.TrimSpace(*f.apiURL); raw != "" {
		if err := checkAPIURL(raw); err != nil {
			p.add("proxmox-api-url", "%v", err)
		}
		x.APIURL = raw
	} else if real {
		p.add("proxmox-api-url", "is required by the proxmox backend, e.g. https://pve1.example.internal:8006/api2/json")
	}

	x.TokenID = strings.TrimSpace(*f.tokenID)
	switch {
	case x.TokenID != "" && !tokenIDRE.MatchString(x.TokenID):
		// Never echo the value: people paste USER@REALM!TOKENID=SECRET.
		p.add("proxmox-token-id", "does not have the USER@REALM!TOKENID shape, e.g. bigfleet@pve!autoscaler (the value is not shown in case it holds the secret; pass the secret with --proxmox-token-file)")
	case x.TokenID == "" && real:
		p.add("proxmox-token-id", "is required by the proxmox backend, e.g. bigfleet@pve!autoscaler")
	}

	switch {
	case *f.tokenFile != "":
		data, err := conffile.Read(*f.tokenFile, conffile.MaxSecretBytes)
		switch {
		case err != nil:
			p.add("proxmox-token-file", "cannot read the token secret: %v", err)
		case strings.TrimSpace(string(data)) == "":
			p.add("proxmox-token-file", "file %s is empty; write the API token secret into it", *f.tokenFile)
		default:
			x.TokenSecret = Secret(strings.TrimSpace(string(data)))
		}
	case strings.TrimSpace(*f.tokenSecret) != "":
		x.TokenSecret = Secret(strings.TrimSpace(*f.tokenSecret))
	case set["proxmox-token-secret"]:
		p.add("proxmox-token-secret", "is empty; pass the secret with --proxmox-token-file instead")
	case real:
		p.add("proxmox-token-file", "a token secret is required by the proxmox backend: pass --proxmox-token-file (preferred) or --proxmox-token-secret")
	}

	x.CAFile = *f.caFile
	if x.CAFile != "" {
		warnings, err := checkCABundle(x.CAFile, time.Now())
		if err != nil {
			p.add("proxmox-ca-file", "%v", err)
		}
		c.CAWarnings = append(c.CAWarnings, warnings...)
	}
	if *f.fingerprint != "" {
		fp, err := normaliseFingerprint(*f.fingerprint)
		if err != nil {
			p.add("proxmox-tls-fingerprint", "%v", err)
		}
		x.Fingerprint = fp
	}
	if real && x.CAFile == "" && *f.fingerprint == "" {
		p.add("proxmox-ca-file", "the proxmox backend needs a way to verify the API certificate: pass --proxmox-ca-file (e.g. /etc/pve/pve-root-ca.pem) and/or --proxmox-tls-fingerprint")
	}

	nodes, err := parseNodes(*f.nodes)
	switch {
	case err != nil:
		p.add("nodes", "%v", err)
	case nodes == nil && (real || set["nodes"]):
		p.add("nodes", "lists no node names; pass the cluster's nodes, e.g. --nodes pve1,pve2,pve3")
	}
	x.Nodes = nodes
	if !real || err != nil {
		return nil
	}
	return nodes
}

// checkAPIURL accepts only https URLs with a host and no credentials.
func checkAPIURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q does not parse as a URL: %v", hypervisors.RedactURL(raw), urlErrorReason(err))
	}
	switch {
	case strings.EqualFold(u.Scheme, "http"):
		return fmt.Errorf("%q uses http://, which would send the API token in clear text; use https://", u.Redacted())
	case !strings.EqualFold(u.Scheme, "https"):
		return fmt.Errorf("%q must be an https:// URL, e.g. https://pve1.example.internal:8006/api2/json", u.Redacted())
	case u.User != nil:
		return fmt.Errorf("%q embeds credentials; remove them and use --proxmox-token-id with --proxmox-token-file", u.Redacted())
	case u.Hostname() == "":
		return fmt.Errorf("%q names no host", u.Redacted())
	}
	return nil
}

// normaliseFingerprint turns a SHA-256 fingerprint with optional ':' or
// whitespace separators, in either case, into 64 lowercase hex digits.
func normaliseFingerprint(s string) (string, error) {
	fp := strings.ToLower(strings.Map(func(r rune) rune {
		if r == ':' || unicode.IsSpace(r) {
			return -1
		}
		return r
	}, s))
	if _, err := hex.DecodeString(fp); err != nil || len(fp) != 64 {
		return "", fmt.Errorf("%q is not a SHA-256 fingerprint: want 64 hex digits, optionally separated by ':' (e.g. the output of openssl x509 -noout -fingerprint -sha256)", s)
	}
	return fp, nil
}

// parseNodes splits --nodes: entries trimmed, empty ones skipped, each a
// valid zone name, no duplicates. No names at all yields nil, nil.
func parseNodes(s string) ([]string, error) {
	var nodes []string
	for n := range strings.SplitSeq(s, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if err := inventory.ValidateZone(n); err != nil {
			return nil, fmt.Errorf("node name: %w", err)
		}
		for _, seen := range nodes {
			if seen == n {
				return nil, fmt.Errorf("node %q is listed twice; list each node once", n)
			}
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// urlErrorReason drops the *url.Error wrapper, which repeats the URL.
func urlErrorReason(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}
