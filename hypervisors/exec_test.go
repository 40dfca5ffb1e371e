package hypervisors

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTail(t *testing.T) {
	if diff := cmp.Diff([]byte("def"), Tail([]byte("abcdef"), 3)); diff != "" {
		t.Error(diff)
	}
	if Tail(nil, 3) != nil {
		t.Error("Tail(nil) != nil")
	}
}
