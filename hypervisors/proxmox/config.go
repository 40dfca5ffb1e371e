package proxmox

import (
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"

	"github.com/bigfleet-vm/provider/conffile"
)

// Bounds of Config.PollInterval when the poller is on.
const (
	MinPollInterval = 10 * time.Millisecond
	MaxPollInterval = time.Hour
)

// Config configures an Adapter.
type Config struct {
	// APIURL is the API base, e.g. https://pve1:8006/api2/json ("/api2/json"
	// is appended when missing). Only https is accepted.
	APIURL string
	// TokenID is USER@REALM!TOKENID; TokenSecret its secret (never logged).
	TokenID     string
	TokenSecret string
	// CAFile is a PEM bundle verifying the API certificate (chain and host
	// name).
	CAFile string
	// Fingerprint pins the API leaf certificate: the hex SHA-256 of its DER
	// (colons and case are ignored). With CAFile both checks must pass;
	// alone it replaces chain verification.
	Fingerprint string
	// Pool is the resource pool clones are placed in ("" for none).
	Pool string
	// Storage is the target storage of full clones ("" keeps the
	// template's); it is also the path of the Datastore.AllocateSpace check.
	Storage string
	// Templates are the VMIDs clones are made from (the catalog's). With
	// Storage empty, the storages of their disks are the target storage
	// ReadCapacity reads.
	Templates []int
	// Nodes are the cluster nodes managed, one zone each.
	Nodes []string
	// Installation names this provider installation (ownership tag and
	// marker).
	Installation string

	// HTTPTimeout bounds one API request (default 30 s).
	HTTPTimeout time.Duration
	// CloneConcurrency bounds concurrent clones per node (default 2).
	CloneConcurrency int
	// ListingTTL is how long one /cluster/resources listing serves Observe
	// calls for other zones (default 2 s).
	ListingTTL time.Duration
	// PollInterval is how often the poller lists the cluster (one GET
	// /cluster/resources) to report VM changes as events and node health
	// (default 1 s; negative: no poller, no events, and ZoneHealth returns
	// nil).
	PollInterval time.Duration
	// PollTimeout bounds one poll (default 2 s). A poll that fails or times
	// out shows every node down until a poll answers again.
	PollTimeout time.Duration
	// StallAfter is how long a poll may go unanswered before every node
	// shows down while it is still in flight (default 1 s).
	StallAfter time.Duration
	// ConfigTTL forces a config re-read of an unchanged owned VM after this
	// age, to catch out-of-band description edits (default 10 min).
	ConfigTTL time.Duration
	// PollMin and PollMax bound the waits between polls of a task, a clone
	// lock or a guest process (defaults 100 ms doubling to 2 s, jittered).
	// The adapter retries no failed request: the executor retries steps by
	// error class (package retry).
	PollMin, PollMax time.Duration
	// OutputLimit bounds the stdout/stderr tail kept from an exec (default
	// 64 KiB each).
	OutputLimit int
	// VMIDMin and VMIDMax bound the VMIDs the allocator hands out (defaults
	// 100 and 999999999).
	VMIDMin, VMIDMax int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.HTTPTimeout == 0 {
		c.HTTPTimeout = 30 * time.Second
	}
	if c.CloneConcurrency == 0 {
		c.CloneConcurrency = 2
	}
	if c.ListingTTL == 0 {
		c.ListingTTL = 2 * time.Second
	}
	if c.PollInterval == 0 {
		c.PollInterval = time.Second
	}
	if c.PollTimeout == 0 {
		c.PollTimeout = 2 * time.Second
	}
	if c.StallAfter == 0 {
		c.StallAfter = time.Second
	}
	if c.ConfigTTL == 0 {
		c.ConfigTTL = 10 * time.Minute
	}
	if c.PollMin == 0 {
		c.PollMin = 100 * time.Millisecond
	}
	if c.PollMax == 0 {
		c.PollMax = 2 * time.Second
	}
	if c.OutputLimit == 0 {
		c.OutputLimit = 64 << 10
	}
	if c.VMIDMin == 0 {
		c.VMIDMin = 100
	}
	if c.VMIDMax == 0 {
		c.VMIDMax = 999999999
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every configuration problem at once.
func (c *Config) Validate() error {
	var errs *multierror.Error
	u, err := url.Parse(c.APIURL)
	switch {
	case c.APIURL == "":
		errs = multierror.Append(errs, errors.New("api url is required"))
	case err != nil:
		errs = multierror.Append(errs, fmt.Errorf("api url: %w", err))
	case u.Scheme != "https":
		errs = multierror.Append(errs, fmt.Errorf("api url %q: scheme %q refused: only https keeps the token and bootstrap data private", redactURL(u), u.Scheme))
	case u.Host == "":
		errs = multierror.Append(errs, fmt.Errorf("api url %q has no host", redactURL(u)))
	}
	if c.TokenID == "" || !strings.Contains(c.TokenID, "@") || !strings.Contains(c.TokenID, "!") {
		errs = multierror.Append(errs, fmt.Errorf("token id %q must look like USER@REALM!TOKENID", c.TokenID))
	}
	if c.TokenSecret == "" {
		errs = multierror.Append(errs, errors.New("token secret is required"))
	}
	if c.CAFile == "" && c.Fingerprint == "" {
		errs = multierror.Append(errs, errors.New("set a CA file or a certificate fingerprint: the API certificate must be verified"))
	}
	if c.Fingerprint != "" {
		if _, err := parseFingerprint(c.Fingerprint); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	if len(c.Nodes) == 0 {
		errs = multierror.Append(errs, errors.New("at least one node is required"))
	}
	if c.Installation == "" {
		errs = multierror.Append(errs, errors.New("installation is required"))
	}
	if c.PollInterval > 0 && (c.PollInterval < MinPollInterval || c.PollInterval > MaxPollInterval) {
		errs = multierror.Append(errs, fmt.Errorf("poll interval %s is outside %s..%s (negative: off)", c.PollInterval, MinPollInterval, MaxPollInterval))
	}
	if c.PollTimeout < 0 || c.StallAfter < 0 {
		errs = multierror.Append(errs, fmt.Errorf("poll timeout %s and stall time %s must not be negative", c.PollTimeout, c.StallAfter))
	}
	if c.VMIDMin != 0 && c.VMIDMin < 100 {
		errs = multierror.Append(errs, fmt.Errorf("vmid minimum %d is below 100", c.VMIDMin))
	}
	return errs.ErrorOrNil()
}

func redactURL(u *url.URL) string {
	c := *u
	c.User = nil
	return c.String()
}

func parseFingerprint(s string) ([]byte, error) {
	h := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("fingerprint %q is not a hex SHA-256 (64 hex digits, colons allowed)", s)
	}
	return b, nil
}

// ErrFingerprintMismatch is returned (wrapped, with ErrPermission) when the
// API server's leaf certificate does not match the pinned fingerprint.
var ErrFingerprintMismatch = errors.New("certificate fingerprint mismatch")

// httpClient builds the TLS-verifying HTTP client for the API.
func (c *Config) httpClient() (*http.Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pem, err := conffile.Read(c.CAFile, conffile.MaxPEMBytes)
		if err != nil {
			return nil, fmt.Errorf("read CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", c.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.Fingerprint != "" {
		want, err := parseFingerprint(c.Fingerprint)
		if err != nil {
			return nil, err
		}
		// Without a CA file the chain is not verified; the pin is the trust.
		tc.InsecureSkipVerify = c.CAFile == ""
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: server sent no certificate", ErrFingerprintMismatch)
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return fmt.Errorf("%w: server presented %s, pinned %s", ErrFingerprintMismatch,
					hex.EncodeToString(got[:]), hex.EncodeToString(want))
			}
			return nil
		}
	}
	tr := &http.Transport{
		Proxy:                 nil, // never send the token through an environment proxy
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: c.HTTPTimeout,
	}
	return &http.Client{Transport: deniedTransport{tr}, Timeout: c.HTTPTimeout}, nil
}

// DeniedError is a 401 or 403 answer with PVE's reason phrase, which names
// the path and privilege ("Permission check failed (/vms/100,
// VM.Config.CPU)"). go-proxmox replaces both statuses with a bare
// ErrNotAuthorized; deniedTransport surfaces them as this error instead so
// last_error says what is missing.
type DeniedError struct {
	Code   int
	Reason string
}

func (e *DeniedError) Error() string { return fmt.Sprintf("%d %s", e.Code, e.Reason) }

// StatusError is an error answer that go-proxmox would take for success.
// It returns an error only for 400, 401, 403, 500 and 501 and decodes the
// body of any other status into the result, so PVE's `{"data":null}` body
// of a 502, 503, 504 or proxy error (595, 596) became an empty listing or
// a zero-valued VM. deniedTransport surfaces those statuses as this error.
type StatusError struct {
	Code   int
	Reason string
}

func (e *StatusError) Error() string { return fmt.Sprintf("%d %s", e.Code, e.Reason) }

// maxReason bounds the reason phrase kept from an error answer.
const maxReason = 200

// deniedTransport turns the error answers go-proxmox mishandles into
// errors: 401 and 403 into *DeniedError, and every other status of 400 or
// more except those go-proxmox reports itself (400, 500, 501) into
// *StatusError.
type deniedTransport struct{ http.RoundTripper }

func (t deniedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := t.RoundTripper.RoundTrip(r)
	if err != nil || res.StatusCode < 400 {
		return res, err
	}
	switch res.StatusCode {
	case http.StatusBadRequest, http.StatusInternalServerError, http.StatusNotImplemented:
		return res, nil
	}
	res.Body.Close()
	reason := strings.TrimSpace(strings.TrimPrefix(res.Status, strconv.Itoa(res.StatusCode)))
	if len(reason) > maxReason {
		reason = reason[:maxReason] + "..."
	}
	if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
		return nil, &DeniedError{Code: res.StatusCode, Reason: reason}
	}
	return nil, &StatusError{Code: res.StatusCode, Reason: reason}
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// wrapped transport.
func (t deniedTransport) CloseIdleConnections() {
	if c, ok := t.RoundTripper.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (c *Config) baseURL() string {
	u := strings.TrimRight(c.APIURL, "/")
	if !strings.HasSuffix(u, "/api2/json") {
		u += "/api2/json"
	}
	return u
}
