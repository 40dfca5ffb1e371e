package providertest

import (
	"io"
	"net/http"
	"os"
	"testing"
)

// SaveProfile fetches url (a provider's /debug/pprof/ endpoint) with
// client, whose timeout bounds it, and writes the body to file; a failure
// is reported on tb and ends nothing else.
func SaveProfile(tb testing.TB, client *http.Client, url, file string) {
	resp, err := client.Get(url)
	if err != nil {
		tb.Errorf("profiling: %s: %v", url, err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Errorf("profiling: %s: %s %v %.200s", url, resp.Status, err, body)
		return
	}
	if err := os.WriteFile(file, body, 0o644); err != nil {
		tb.Error(err)
	}
}
